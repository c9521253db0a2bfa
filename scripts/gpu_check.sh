#!/usr/bin/env bash
# One call on a GPU machine: the GPU test suite and the benchmarks, by stage, from the repository root.
#   bash scripts/gpu_check.sh                       # stages tests check (the default)
#   bash scripts/gpu_check.sh tests exact tiles     # any of: tests check exact tiles train first tune
# OUT=<dir> collects logs and results (default /tmp/sparsegnn-out); TESTS=<pytest paths>; WORKERS=<n>;
# SPARSEGNN_DATA=<datasets folder> for the real-graph suites. Copy what should be kept into
# benchmarks/results/<device>/ (see benchmarks/README.md).
set -o pipefail
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m sparsegnn info
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(tests check)
rc=0
for stage in "${stages[@]}"; do
  echo "== $stage"
  case $stage in
    # the whole suite in parallel (serially it does not fit a 10-minute call); -rf lists every failure
    tests) python3 -m pytest -q -rf -n "${WORKERS:-12}" -p no:cacheprovider ${TESTS:-tests} 2>&1 \
             | tee "$OUT/pytest.log" | tail -25 ;;
    # correctness against float64 and timing on the small stand-ins, then Cora training (5 seeds)
    check) python3 -m benchmarks.ops --suite small --out "$OUT" --tag small 2>&1 | grep -E "geomean|rel_err" | head -8
           python3 -m sparsegnn train --dataset cora --model gcn --runs 5 --json 2>&1 | tail -1 ;;
    exact) for spec in "real float32 real_spmm_fp32" "real bfloat16 real_spmm_bf16" "paper float32 paper_spmm_fp32"; do
             read -r suite dtype tag <<< "$spec"
             timeout 200 python3 -m benchmarks.ops --suite "$suite" --ops spmm --providers sparsegnn,cusparse \
               --dims 32,64,128,256 --dtypes "$dtype" --out "$OUT" --tag "$tag" 2>&1 | grep -E "geomean"
           done ;;
    tiles) timeout 330 python3 -m scripts.time_tiles --capture --graphs real,paper --max-edges 20000000 \
             --dims 32,64,128,256 --sddmm-dims "" --out "$OUT" --budget-s 290 > "$OUT/tiles_log.txt" 2>&1
           grep -E "^- .*(auto|best)" "$OUT/tiles_log.txt" ;;
    train) timeout "${TRAIN_S:-200}" python3 -m benchmarks.train --models "${MODELS:-gcn}" --providers ours,pyg \
             --precision tf32 --graphs real --rounds "${ROUNDS:-3}" --out "$OUT/train_tf32.json" \
             --md "$OUT/train_tf32.md" 2>&1 | tail -4 ;;
    first) timeout 230 python3 -m scripts.first_call --repeat 2 --out "$OUT/first_call.json" 2>&1 | tail -14 ;;
    tune) timeout 120 python3 -m sparsegnn tune --graphs cora,deezer,wikipedia,twitch,reddit-threads-10k \
            --dims 32,128 --out "$OUT/tune_report.json" 2>&1 | tail -16 ;;
    *) echo "unknown stage $stage"; rc=2; continue ;;
  esac
  status=${PIPESTATUS[0]}
  echo "$stage rc=$status"
  [ "$status" -ne 0 ] && rc=1
done
exit $rc
