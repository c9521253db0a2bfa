#!/usr/bin/env bash
# The GPU evidence for issue 9 (tensor cores), by stage (device machine, repo root, OUT set):
#   bash scripts/gpu_issue9.sh tests tiles
# tests: translation, reordering and the tile kernels on the GPU; tiles: block statistics, translation
# cost, tile SpMM (tf32 / ieee) and SDDMM against cuSPARSE and our CUDA-core kernels on real graphs.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data}
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
for stage in "$@"; do
  echo "== $stage"
  case $stage in
    tests) python3 -m pytest -q -p no:cacheprovider -p no:logging tests/test_tiles.py tests/test_reorder.py 2>&1 | tail -3 ;;
    tiles) timeout 300 python3 scripts/time_tiles.py --graphs ${GRAPHS:-cora,citeseer,wikipedia,deezer,twitch,reddit-threads-10k} \
             --dims ${DIMS:-32,64,128,256} 2>&1 | tee "$OUT/tiles.md" | tail -30 ;;
  esac
done
