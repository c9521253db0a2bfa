#!/usr/bin/env bash
# The GPU evidence for issue 9 (tensor cores), by stage (device machine, repo root, OUT set):
#   bash scripts/gpu_issue9.sh tests tiles accuracy train
# tests: translation, reordering, the tile kernels and the layers' precision= on the GPU; tiles: block
# statistics, translation cost, tile SpMM (tf32 / ieee) and SDDMM against cuSPARSE and our CUDA-core
# kernels on real graphs; accuracy: GCN / AGNN test accuracy on Cora and Citeseer, 5 seeds, per
# precision (JSON lines in $OUT/accuracy.jsonl); train: GCN / AGNN epochs vs PyG per precision;
# adam: eager epochs with fused and foreach Adam, interleaved (scripts/time_adam.py); probe: translation's
# kernels, syncs and host time per op (scripts/probe_translate.py); host: host cost of a translation's
# pieces and the fused pass against the three passes (scripts/probe_host_costs.py); fused: GPU time of
# the fused pass against the three passes and its look-back variants (probe_translate.py --top); cudaall:
# host-timed translations as the library builds them, every window's bit set in CUDA against the Triton sorts;
# cudawindows: the one-launch translation (translate_cuda.translate_windows) against the Triton paths, its
# block sizes, and at any waves / words (probe_translate.py variants).
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data}
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
for stage in "$@"; do
  echo "== $stage"
  case $stage in
    tests) python3 -m pytest -q -p no:cacheprovider -p no:logging tests/test_tiles.py tests/test_reorder.py \
             tests/test_precision_layers.py tests/test_compile.py -k "${TEST_K:-not nothing}" 2>&1 | tail -4 ;;
    accuracy) for ds in cora citeseer; do for model in gcn agnn; do for p in ${PRECISIONS:-ieee tf32 bf16}; do
                python3 -m sparsegnn train --dataset $ds --root .data/planetoid --model $model --runs 5 --epochs 200 \
                  --precision $p --json 2>/dev/null | tail -1 | sed "s/^{/{\"tune\": \"${SPARSEGNN_TUNE:-on}\", /" \
                  | tee -a "$OUT/accuracy.jsonl" | cut -c1-160
              done; done; done ;;
    train) for p in ${PRECISIONS:-ieee tf32}; do
             timeout ${TRAIN_TIMEOUT:-400} python3 scripts/bench_train.py --models gcn,agnn --providers ours,ours_capture,pyg \
               --graphs ${TRAIN_GRAPHS:-all} --precision $p --out "$OUT/train_$p.json" --md "$OUT/train_$p.md" 2>&1 | tail -6
           done ;;
    adam) timeout ${ADAM_TIMEOUT:-400} python3 scripts/time_adam.py --models ${ADAM_MODELS:-gcn,agnn} --graphs ${ADAM_GRAPHS:-real} \
            --out "$OUT/adam.json" 2>&1 | tail -16 ;;
    probe) timeout 300 python3 scripts/probe_translate.py ${PROBE_GRAPHS:-citeseer,DD,com-amazon,amazon0601} \
             --trace "$OUT/traces" 2>&1 | tee "$OUT/probe.txt" | tail -60 ;;
    host) timeout 120 python3 scripts/probe_host_costs.py ${HOST_GRAPHS:-cora,deezer,pubmed,DD,lastfm,ppi,tox21} \
            2>&1 | tee "$OUT/host_costs.txt" | tail -8 ;;
    fused) timeout 300 python3 scripts/probe_translate.py ${FUSED_GRAPHS:-cora,deezer,PROTEINS_full,tox21,ppi,flickr} \
             --variants ${VARIANTS:-triton,unfused,look32} --no-values --top 2 2>&1 | grep -v Warn | tee "$OUT/fused.txt" \
             | tail -40 ;;
    cudaall) timeout 400 python3 scripts/probe_translate.py \
               ${CUDAALL_GRAPHS:-soc-BlogCatalog,ppi,artist,flickr,wikipedia,deezer,twitch,pubmed,com-amazon,yelp} \
               --library --variants ${VARIANTS:-no-cuda-all,triton,cuda-all-256,cuda-all-512,cuda-all-w64} ${TOP:+--top $TOP} \
               2>&1 | grep -v Warn | tee "$OUT/cudaall.txt" | tail -60 ;;
    cudawindows) timeout 400 python3 scripts/probe_translate.py \
               ${CUDAWINDOWS_GRAPHS:-cora,lastfm,deezer,pubmed,ppi,soc-BlogCatalog,flickr,tox21,reddit-threads-10k,DD} \
               --library --variants ${VARIANTS:-no-cuda-windows,triton,cuda-windows-64,cuda-windows-256,cuda-windows-any} \
               ${TOP:+--top $TOP} 2>&1 | grep -v Warn | tee "$OUT/cudawindows.txt" | tail -60 ;;
    tiles) timeout 300 python3 scripts/time_tiles.py --graphs ${GRAPHS:-cora,citeseer,wikipedia,deezer,twitch,reddit-threads-10k} \
             --dims ${DIMS:-32,64,128,256} 2>&1 | tee "$OUT/tiles.md" | tail -30 ;;
  esac
done
