#!/usr/bin/env bash
# The GPU evidence for issue 11 (batched small graphs), by stage (device machine, repo root, OUT set):
#   bash scripts/gpu_issue11.sh rdkit tests smoke spmm tox21 tu
# rdkit: install RDKit from the carried wheel (.wheels/, scaffold split and featurisation);
# tests: batched SpMM, padding / captured steps, pooling, fused GCN layer and graph models on the GPU;
# smoke: a short Tox21 run, captured against captured-unfused and eager (epoch ms); smoketu: GIN likewise;
# layer: fused GCN layer and Triton pooling against their unfused / segment_reduce forms;
# spmm: batched SpMM against block-diagonal cuSPARSE and padded bmm (cudagraph timing);
# tox21: ChemGCN at batch 50 and 200 against PyG, SEEDS seeds; tu: GIN 10-fold on PROTEINS_full and ENZYMES
# (PyG timed on PYG_FOLDS folds x PYG_EPOCHS epochs).
set -o pipefail
export PYTHONPATH=src${EXTRA_PATH:+:$EXTRA_PATH} PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data}
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
for stage in "$@"; do
  echo "== $stage"
  case $stage in
    rdkit) pip install -q --no-deps --target /tmp/rd .wheels/rdkit*.whl 2>&1 | tail -2
           export PYTHONPATH=$PYTHONPATH:/tmp/rd; python3 -c "import rdkit; print('rdkit', rdkit.__version__)" ;;
    tests) timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -p no:logging tests/test_padded_steps.py \
             tests/test_batched_spmm.py tests/test_pool.py tests/test_graphclass.py tests/test_capture.py \
             $(ls tests/test_gcn_fused.py 2>/dev/null) -k "${TEST_K:-not nothing}" 2>&1 | tail -${TEST_TAIL:-8} ;;
    smoke) timeout 300 python3 scripts/bench_molecules.py --device cuda --epochs ${EPOCHS:-4} \
             --impls ${SMOKE_IMPLS:-ours,ours-unfused,ours-eager} \
             --batch-sizes ${BATCHES:-50} --out "$OUT/smoke" 2>&1 | tail -8 ;;
    smoketu) timeout 300 python3 scripts/bench_molecules.py --model gin --dataset PROTEINS_full --device cuda --epochs 5 \
             --folds 2 --impls ours,ours-eager --out "$OUT/smoke" 2>&1 | tail -7 ;;
    layer) timeout 400 python3 scripts/time_batched_layer.py --out "$OUT" 2>&1 | grep -v '^{' | tail -30 ;;
    spmm) timeout 300 python3 scripts/bench_batched.py --out "$OUT" 2>&1 | tail -12 ;;
    tox21) timeout ${TOX_TIMEOUT:-550} python3 scripts/bench_molecules.py --device cuda --epochs ${EPOCHS:-30} \
             --seeds ${SEEDS:-0,1,2} --batch-sizes ${BATCHES:-50,200} --impls ${IMPLS:-ours,pyg} --out "$OUT" 2>&1 | tail -12 ;;
    tu) for ds in ${TU_DATASETS:-PROTEINS_full ENZYMES}; do
          timeout ${TU_TIMEOUT:-280} python3 scripts/bench_molecules.py --model gin --dataset $ds --device cuda \
            --epochs ${TU_EPOCHS:-350} --folds 10 --pyg-folds ${PYG_FOLDS:-2} --pyg-epochs ${PYG_EPOCHS:-20} \
            --impls ${IMPLS:-ours,pyg} --out "$OUT" 2>&1 | tail -8
        done ;;
  esac
done
