#!/usr/bin/env bash
# The GPU evidence for issue 8 (end-to-end training), by stage (device machine, repo root, OUT set):
#   bash scripts/gpu_issue8.sh attn layers       # fused-attention tests, layer steps vs PyG
#   bash scripts/gpu_issue8.sh tests train       # GPU test suite, training epochs vs PyG
#   bash scripts/gpu_issue8.sh accuracy first    # Cora test accuracy over 5 seeds, eager and captured; first call
#   bash scripts/gpu_issue8.sh replay             # replay tests, replay state per model and graph, accel vs ours
# Real graphs are read from $SPARSEGNN_DATA (default .data, a copy of shared/datasets).
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data}
export SPARSEGNN_TUNE_CACHE=${SPARSEGNN_TUNE_CACHE:-/tmp/sparsegnn-tune}
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
for stage in "$@"; do
  echo "== $stage"
  case $stage in
    attn) python3 -m pytest -q -p no:cacheprovider tests/test_attention.py $(ls tests/test_compile.py 2>/dev/null) 2>&1 | tail -4 ;;
    tests) python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_pytest.log" | tail -4 ;;
    layers) timeout 300 python3 scripts/bench_layers.py --graphs all --models ${MODELS:-gcn,gat} --out "$OUT/layers.json" 2>&1 | tail -26 ;;
    train) timeout 540 python3 scripts/bench_train.py --graphs all --out "$OUT/train.json" --md "$OUT/train.md" \
             --plot "$OUT/train.png" 2>&1 | tail -60 ;;
    accuracy) for m in gcn agnn gat; do for c in none capture; do
                python3 -m sparsegnn train --dataset cora --model $m --runs 5 --compile $c --json 2>/dev/null \
                  | tee -a "$OUT/accuracy.jsonl" | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); \
print(r['model'], r['compile'], 'test %.2f%%' % (100*r['test_acc']), 'per seed', [round(100*a,1) for a in r['test_acc_per_seed']], 'epoch %.2f ms' % r['mean_epoch_ms'])"
              done; done ;;
    first) timeout 300 python3 scripts/first_call.py --out "$OUT/first_call.json" 2>&1 | tail -12 ;;
    replay) python3 -m pytest -q -p no:cacheprovider tests/test_replay.py -W ignore 2>&1 | grep "^E \|passed\|failed" | head -20
            timeout 200 python3 scripts/replay_status.py --graphs ${GRAPHS:-cora,twitch,reddit-threads-10k,tox21} 2>&1 \
              | grep -v Warn | tail -40
            timeout 300 python3 scripts/time_accel.py --graphs ${GRAPHS:-cora,twitch,reddit-threads-10k,tox21} --rounds 6 \
              --out "$OUT/accel_replay.json" 2>&1 | grep -v "it/s" | tail -24 ;;
  esac
done
