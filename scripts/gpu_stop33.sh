#!/usr/bin/env bash
# One device call for stop 33 (tuner protocol, host routing, prewarm): GPU tests of the change,
# the captured tile suite, the exact SpMM suites and the first call; everything into one tarball.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data} SPARSEGNN_TUNE_CACHE=/tmp/tc-stop33
OUT=${OUT:-/tmp/sparsegnn-out}; R=/tmp/stop33; rm -rf "$R"; mkdir -p "$R" "$OUT"
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_tune.py tests/test_layer_cache.py \
  tests/test_host_routing.py tests/test_prewarm.py 2>&1 | tail -2
timeout 240 python3 scripts/time_tiles.py --capture --graphs real,paper --max-edges 20000000 --dims 32,64,128,256 \
  --sddmm-dims "" --out "$R" --budget-s 200 > "$R/tiles_log.txt" 2>&1
grep -E "^- .*(auto|best)" "$R/tiles_log.txt"
bench() { timeout 150 python3 -m sparsegnn bench --ops spmm --providers sparsegnn,cusparse --out "$R" "$@" 2>&1 \
  | grep -E "geomean" ; }
bench --suite real --dims 32,64,128,256 --dtypes float32 --tag real_spmm_fp32
bench --suite real --dims 32,64,128,256 --dtypes bfloat16 --tag real_spmm_bf16
bench --suite paper --dims 32,64,128,256 --dtypes float32 --tag paper_spmm_fp32
timeout 60 python3 scripts/first_call.py --no-pyg --out "$R/first_call.json" 2>&1 | tail -6
tar -cf "$OUT/results.tar" -C "$R" .
