#!/usr/bin/env bash
# The GPU evidence for issue 10 (MaxK-GNN), by stage (device machine, repo root, OUT set):
#   bash scripts/gpu_issue10.sh tests spgemm select train accuracy
# tests: maxk, CBSR kernels and MaxK layers on the GPU; spgemm: forward SpGEMM / backward SSpMM on
# the Reddit stand-in per k against cuSPARSE and our SpMM (F = 256); spgemm_real: the same on the real
# graphs (REAL_GRAPHS); ln: layer_norm_maxk (fused) against LayerNorm then maxk; select: the selection kernel
# against relu / topk; train: MaxK GraphSAGE epochs against our ReLU models and PyG (Reddit
# stand-in); accuracy: ReLU vs MaxK (k = 32) test accuracy, 5 seeds, on Cora, Citeseer and the
# labelled real graphs; root: the CBSR root term (X W^T) kernels against cuBLAS; profile: kernel time per name in a k = 32 and a ReLU epoch; ncu: Nsight
# Compute sections of the CBSR kernels; sweep: `sparsegnn maxk-sweep` (accuracy vs epoch time per k) on real graphs.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data}
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
for stage in "$@"; do
  echo "== $stage"
  case $stage in
    tests) python3 -m pytest -q -p no:cacheprovider -p no:logging tests/test_maxk.py \
             $(ls tests/test_maxk_nn.py tests/test_maxk_compile.py 2>/dev/null) -k "${TEST_K:-not nothing}" 2>&1 | tail -${TEST_TAIL:-6} ;;
    spgemm) timeout 400 python3 scripts/time_maxk.py --spgemm reddit --ks ${KS:-8,16,32,64,128} --out "$OUT" 2>&1 \
              | grep -v '^{' | tail -14 ;;
    spgemm_real) for gr in ${REAL_GRAPHS:-deezer lastfm twitch wikipedia reddit-threads-10k}; do
                   echo "-- $gr"
                   timeout 120 python3 scripts/time_maxk.py --spgemm $gr --ks ${KS:-8,16,32} --out "$OUT/spgemm_real/$gr" 2>&1 \
                     | grep -v '^{' | tail -4
                 done ;;
    ln) timeout 200 python3 scripts/time_maxk.py --ln --ks ${KS:-8,32,64} --out "$OUT" 2>&1 | grep -v '^{' | tail -10 ;;
    root) timeout 200 python3 scripts/time_maxk.py --root --ks ${KS:-8,16,32,64,128} --out "$OUT" 2>&1 | grep -v '^{' | tail -9 ;;
    select) timeout 200 python3 scripts/time_maxk.py --ks ${KS:-8,16,32,64,128} --out "$OUT" ${SELECT_ARGS:-} 2>&1 \
              | grep -v '^{' | tail -22 ;;
    train) timeout ${TRAIN_TIMEOUT:-400} python3 scripts/bench_maxk_train.py --out "$OUT" ${TRAIN_ARGS:-} 2>&1 | tail -24 ;;
    accuracy) timeout ${ACC_TIMEOUT:-400} python3 scripts/maxk_accuracy.py --out "$OUT" --device cuda ${ACC_ARGS:-} 2>&1 \
                | tail -14 ;;
    profile) timeout 300 python3 scripts/profile_maxk_epoch.py --k ${K:-32} --top ${TOP:-40} 2>&1 | tail -42
             timeout 300 python3 scripts/profile_maxk_epoch.py --relu --top 25 2>&1 | tail -26 ;;
    ncu) which ncu || ls /usr/local/cuda/bin | grep -i nsight
         timeout 400 ncu --kernel-name regex:cbsr_ --launch-skip 2 --launch-count 2 --section SpeedOfLight \
           --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
           --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum,smsp__inst_executed.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,lts__t_sector_hit_rate.pct \
           python3 scripts/ncu_cbsr.py --k ${K:-32} > "$OUT/ncu_cbsr.txt" 2>&1; tail -5 "$OUT/ncu_cbsr.txt"
         grep -E "cbsr_|Duration|Throughput|Bank|bank|wavefronts|sectors|inst_executed|Stall|Issued|Eligible|Hit|Achieved Occ|Registers" "$OUT/ncu_cbsr.txt" | head -120 ;;
    sweep) for ds in ${SWEEP_DATASETS:-cora wikipedia}; do
             timeout 300 python3 -m sparsegnn maxk-sweep --dataset $ds --lr 0.001 --runs ${SWEEP_RUNS:-3} --epochs 200 \
               --device cuda --out "$OUT/sweep_$ds" 2>&1 | tail -9
           done ;;
  esac
done
