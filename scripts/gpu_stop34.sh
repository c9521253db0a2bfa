#!/usr/bin/env bash
# One device call for stop 34: the GPU tests of stop 33's unverified tuner changes, then the cost
# model's training sweep re-timed with the tuner's protocol (CUDA-graph replays), resumable:
#   bash scripts/gpu_stop34.sh [main-seconds] [extra-seconds]
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data} SPARSEGNN_TUNE_CACHE=/tmp/tc-stop34
OUT=${OUT:-/tmp/sparsegnn-out}; R=${R:-$OUT}; mkdir -p "$R"   # straight into $OUT: a run cut short keeps its rows
MAIN_S=${1:-300}; EXTRA_S=${2:-150}
if [ -z "$SKIP_TESTS" ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_tune.py tests/test_prewarm.py 2>&1 | tail -3
fi
timeout $((MAIN_S + 60)) python3 scripts/sweep_tune.py --groups real,structure,paper --passes 3 --skip-done \
  --max-seconds "$MAIN_S" --out "$R/sweep_replay.jsonl" > "$R/sweep_log.txt" 2>&1
tail -2 "$R/sweep_log.txt"
timeout $((EXTRA_S + 60)) python3 scripts/sweep_tune.py --groups extra --passes 3 --skip-done \
  --max-seconds "$EXTRA_S" --out "$R/sweep_replay_extra.jsonl" > "$R/sweep_extra_log.txt" 2>&1
tail -2 "$R/sweep_extra_log.txt"
wc -l "$R"/*.jsonl
