#!/usr/bin/env bash
# The GPU evidence for issue 15 (PyG drop-in), by stage (device machine, repo root, OUT set):
#   bash scripts/gpu_issue15.sh tests train minibatch
# tests: the drop-in, bipartite, sampler and accelerate tests on the GPU; train: training epochs of our
# models, PyG's and PyG's converted by sparsegnn.accelerate; minibatch: sampled GraphSAGE epochs.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data}
export SPARSEGNN_TUNE_CACHE=${SPARSEGNN_TUNE_CACHE:-/tmp/sparsegnn-tune}
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
for stage in "$@"; do
  echo "== $stage"
  case $stage in
    tests) python3 -m pytest -q -p no:cacheprovider -p no:logging tests/test_bipartite.py tests/test_pyg_compat.py \
             tests/test_accelerate.py tests/test_sampling.py tests/test_attention.py tests/test_layer_cache.py \
             2>&1 | tee "$OUT/gpu_pytest_issue15.log" | tail -6 ;;
    train) timeout 420 python3 scripts/bench_train.py --graphs ${GRAPHS:-all} --models ${MODELS:-gcn,sage,gin,gat} \
             --providers ours,pyg,pyg_accel --epochs 10 --warmup 3 --out "$OUT/train_accel.json" \
             --md "$OUT/train_accel.md" 2>&1 | tail -45 ;;
    minibatch) timeout 300 python3 scripts/bench_minibatch.py --graphs ${MB_GRAPHS:-reddit,reddit-threads-10k,wikipedia} \
             --out "$OUT/minibatch.json" --md "$OUT/minibatch.md" 2>&1 | tail -20 ;;
  esac
done
