#!/usr/bin/env bash
# The GPU evidence for issue 13 (multi-GPU full-graph training), by stage (nvidia-h200-x2, repo root, OUT set):
#   bash scripts/gpu_issue13.sh topo reddit big
# topo: the GPUs and their link; reddit: Reddit stand-in GraphSAGE 3 x 256 on 1 and 2 GPUs (same code);
# big: papers-16m (16M nodes, 232M edges) on 2 GPUs, then on 1 (expected: out of memory).
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data}
export SPARSEGNN_TUNE_CACHE=${SPARSEGNN_TUNE_CACHE:-/tmp/sparsegnn-tune}
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT/h200x2"
for stage in "$@"; do
  echo "== $stage $(date +%T)"
  case $stage in
    topo) nvidia-smi --query-gpu=name,memory.total --format=csv; nvidia-smi topo -m 2>&1 | head -8 | tee "$OUT/h200x2/topo.txt" ;;
    reddit) timeout 300 python3 scripts/bench_distributed.py --graph reddit --stand-in --nprocs 1,2 --epochs ${EPOCHS:-20} \
              --partition contiguous --gen-device cuda --partition-device cuda --device cuda --out "$OUT/h200x2" 2>&1 | tail -14 ;;
    big) timeout 420 python3 scripts/bench_distributed.py --graph papers-16m --stand-in --nprocs 2,1 --epochs 4 \
           --partition contiguous --gen-device cuda --partition-device cuda --device cuda --out "$OUT/h200x2" 2>&1 | tail -14 ;;
  esac
done
