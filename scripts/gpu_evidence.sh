#!/usr/bin/env bash
# A stop's GPU evidence, by stage, tarred into $OUT/results.tar (stop 35: tests first; tests tiles):
#   bash scripts/gpu_evidence.sh tests first tune exact   # one device call
#   bash scripts/gpu_evidence.sh tiles                    # the captured tile suite (~250 s)
#   MAIN_S=300 EXTRA_S=150 bash scripts/gpu_evidence.sh sweep   # the cost model's sweep, resumable:
#     rows go straight to $OUT (a run cut short keeps them; --skip-done resumes)
# tests: the GPU tests of what changed ($TESTS: pytest arguments, default below).
# train: our eager GCN ($MODELS) epochs against PyG on the real suite, tf32; profile: profile_step.py
#   on $PROFILE_GRAPHS (host ms of ours and PyG, then a cProfile of our replayed step); costs:
#   step_costs.py on $PROFILE_GRAPHS (host us of each part of the replayed step, no profiler).
# train runs $ROUNDS (default 3) round-robin rounds per graph and reports the median round;
#   train_threads: the same with every backward on the autograd engine's device thread.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data} SPARSEGNN_TUNE_CACHE=/tmp/tc-evidence
FINAL=${OUT:-/tmp/sparsegnn-out}; OUT=/tmp/evidence; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
bench() { timeout 150 python3 -m sparsegnn bench --ops spmm --providers sparsegnn,cusparse --out "$OUT" "$@" 2>&1 \
  | grep -E "geomean" ; }
for stage in "$@"; do
  case $stage in
    tests) if [ -n "${TESTS:-}" ]; then read -ra tests <<< "$TESTS"
           else tests=(tests/test_pack.py tests/test_prewarm.py tests/test_tiles.py tests/test_kernels.py
                       -k "pack or prewarm or precis or launch or candidate or head or source"); fi
           timeout 200 python3 -m pytest -q -p no:cacheprovider "${tests[@]}" 2>&1 | tail -3 ;;
    first) timeout 230 python3 scripts/first_call.py --repeat 2 --profile "$OUT/first_step_profile.txt" \
             --out "$OUT/first_call.json" 2>&1 | tail -14 ;;
    tune) timeout 120 python3 -m sparsegnn tune --graphs cora,deezer,wikipedia,twitch,reddit-threads-10k,tox21 \
            --dims 32,128 --out "$OUT/tune_report.json" 2>&1 | tail -16 ;;
    exact) bench --suite real --dims 32,64,128,256 --dtypes float32 --tag real_spmm_fp32
           bench --suite real --dims 32,64,128,256 --dtypes bfloat16 --tag real_spmm_bf16
           bench --suite paper --dims 32,64,128,256 --dtypes float32 --tag paper_spmm_fp32 ;;
    sweep) for group in main extra; do
             if [ $group = main ]; then groups=real,structure,paper; secs=${MAIN_S:-300}; file=sweep_replay
             else groups=extra; secs=${EXTRA_S:-150}; file=sweep_replay_extra; fi
             timeout $((secs + 60)) python3 scripts/sweep_tune.py --groups $groups --passes 3 --skip-done \
               --max-seconds "$secs" --out "$FINAL/$file.jsonl" > "$FINAL/${file}_log.txt" 2>&1
             tail -2 "$FINAL/${file}_log.txt"
           done ;;
    train|train_threads) extra=(); tag=train_tf32
           if [ $stage = train_threads ]; then extra=(--backward-threads); tag=train_tf32_threads; fi
           timeout ${TRAIN_S:-200} python3 scripts/bench_train.py --models ${MODELS:-gcn} --providers ours,pyg \
             --precision tf32 --graphs real --rounds ${ROUNDS:-3} "${extra[@]}" --out "$OUT/$tag.json" \
             --md "$OUT/$tag.md" 2>&1 | tail -4
           grep -E "geomean \(real|worst" "$OUT/$tag.md" ;;
    profile) for g in ${PROFILE_GRAPHS:-cora twitch}; do
               timeout 90 python3 scripts/profile_step.py --graph "$g" --models gcn --top 30 > "$OUT/profile_$g.txt" 2>&1
               head -3 "$OUT/profile_$g.txt"
             done ;;
    costs) for g in ${PROFILE_GRAPHS:-cora twitch}; do
             timeout 120 python3 scripts/step_costs.py --graph "$g" > "$OUT/step_costs_$g.txt" 2>&1
             tail -45 "$OUT/step_costs_$g.txt"
           done ;;
    tiles) timeout 330 python3 scripts/time_tiles.py --capture --graphs real,paper --max-edges 20000000 \
             --dims 32,64,128,256 --sddmm-dims "" --out "$OUT" --budget-s 290 > "$OUT/tiles_log.txt" 2>&1
           grep -E "^- .*(auto|best|packed)" "$OUT/tiles_log.txt" ;;
  esac
done
ls "$OUT"
tar -cf "$FINAL/results.tar" -C "$OUT" .
