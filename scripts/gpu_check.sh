#!/usr/bin/env bash
# One device call: GPU test suite + correctness/timing report. Usage on the device machine:
#   bash scripts/gpu_check.sh        (OUT=<dir> collects the logs and JSON; TESTS=<paths>, WORKERS=<n>)
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m sparsegnn info
# in parallel (the whole suite serially no longer fits one 10-minute call: ~6 min with 12 workers on
# an H100 host of 16 cores, stop 49); -rf lists every failure in the tail
python3 -m pytest -q -rf -n "${WORKERS:-12}" -p no:cacheprovider ${TESTS:-tests} 2>&1 | tee "$OUT/pytest.log" | tail -25
tests_rc=${PIPESTATUS[0]}
python3 scripts/gpu_report.py 2>&1 | tee "$OUT/report.log"
report_rc=${PIPESTATUS[0]}
echo "pytest rc=$tests_rc report rc=$report_rc"
exit $(( tests_rc || report_rc ))
