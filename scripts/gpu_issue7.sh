#!/usr/bin/env bash
# The GPU evidence for the real-graph issue, by stage (device machine, repo root, OUT set):
#   bash scripts/gpu_issue7.sh tests real tune      # GPU test suite, real-suite SpMM, tuning report
#   bash scripts/gpu_issue7.sh paper layers         # paper suite SpMM, layer steps vs PyG, first call
# Real graphs are read from $SPARSEGNN_DATA (default .data, a copy of shared/datasets).
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data}
export SPARSEGNN_TUNE_CACHE=${SPARSEGNN_TUNE_CACHE:-/tmp/sparsegnn-tune}
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
bench() { python3 -m sparsegnn bench --ops spmm --providers sparsegnn,cusparse --out "$OUT" "$@" 2>&1 | grep -E "geomean|^\| (F|all)" ; }
for stage in "$@"; do
  echo "== $stage"
  case $stage in
    tests) python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_pytest.log" | tail -4 ;;
    real) bench --suite real --dims 32,64,128,256 --dtypes float32 --tag real_spmm_fp32
          bench --suite real --dims 32,64,128,256 --dtypes bfloat16 --tag real_spmm_bf16 ;;
    tune) python3 -m sparsegnn tune --graphs cora,deezer,wikipedia,twitch,reddit-threads-10k,tox21 --dims 32,128 \
            --out "$OUT/tune_report.json" 2>&1 | tail -14 ;;
    paper) bench --suite paper --dims 32,64,128,256 --dtypes float32 --tag paper_spmm_fp32 ;;
    structure) bench --suite structure --dims 32,64,128,256 --dtypes float32 --tag structure_spmm_fp32 ;;
    layers) timeout 300 python3 scripts/bench_layers.py --graphs all --out "$OUT/layers.json" 2>&1 | tail -26 ;;
    first) timeout 200 python3 scripts/first_call.py --out "$OUT/first_call.json" 2>&1 | tail -6 ;;
  esac
done
