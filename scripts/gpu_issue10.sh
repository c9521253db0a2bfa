#!/usr/bin/env bash
# The GPU evidence for issue 10 (MaxK-GNN), by stage (device machine, repo root, OUT set):
#   bash scripts/gpu_issue10.sh tests spgemm select train accuracy
# tests: maxk, CBSR kernels and MaxK layers on the GPU; spgemm: forward SpGEMM / backward SSpMM on
# the Reddit stand-in per k against cuSPARSE and our SpMM (F = 256); select: the selection kernel
# against relu / topk; train: MaxK GraphSAGE epochs against our ReLU models and PyG (Reddit
# stand-in); accuracy: ReLU vs MaxK (k = 32) test accuracy, 5 seeds, on Cora, Citeseer and the
# labelled real graphs; sweep: `sparsegnn maxk-sweep` (accuracy vs epoch time per k) on real graphs.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data}
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
for stage in "$@"; do
  echo "== $stage"
  case $stage in
    tests) python3 -m pytest -q -p no:cacheprovider -p no:logging tests/test_maxk.py \
             $(ls tests/test_maxk_nn.py 2>/dev/null) -k "${TEST_K:-not nothing}" 2>&1 | tail -${TEST_TAIL:-6} ;;
    spgemm) timeout 400 python3 scripts/time_maxk.py --spgemm reddit --ks ${KS:-8,16,32,64,128} --out "$OUT" 2>&1 \
              | grep -v '^{' | tail -14 ;;
    select) timeout 200 python3 scripts/time_maxk.py --ks ${KS:-8,16,32,64,128} --out "$OUT" ${SELECT_ARGS:-} 2>&1 \
              | grep -v '^{' | tail -22 ;;
    train) timeout ${TRAIN_TIMEOUT:-400} python3 scripts/bench_maxk_train.py --out "$OUT" ${TRAIN_ARGS:-} 2>&1 | tail -24 ;;
    accuracy) timeout ${ACC_TIMEOUT:-400} python3 scripts/maxk_accuracy.py --out "$OUT" --device cuda ${ACC_ARGS:-} 2>&1 \
                | tail -14 ;;
    sweep) for ds in ${SWEEP_DATASETS:-cora wikipedia}; do
             timeout 300 python3 -m sparsegnn maxk-sweep --dataset $ds --lr 0.001 --runs ${SWEEP_RUNS:-3} --epochs 200 \
               --device cuda --out "$OUT/sweep_$ds" 2>&1 | tail -9
           done ;;
  esac
done
