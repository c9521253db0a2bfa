#!/usr/bin/env bash
# Issue 9's translation bar in one lease: translation rows (time_tiles --no-spmm) of $TILE_GRAPHS (default the
# real suite and the paper stand-ins up to $MAX_EDGES, 20M), GCN tf32 epochs of ours and PyG on $GRAPHS
# (bench_train), and the per-graph ratio table (translate_vs_epoch.py). Files under $OUT. TILES_S / TRAIN_S /
# ROUNDS bound the parts. The stand-ins over 20M edges in a second call (each part fits the 10-minute limit):
#   TILE_GRAPHS=reddit,ogbn-proteins,ogbn-products GRAPHS=reddit,ogbn-proteins,ogbn-products ROUNDS=1 \
#     bash scripts/gpu_translate_vs_epoch.sh
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=${SPARSEGNN_DATA:-.data} SPARSEGNN_TUNE_CACHE=/tmp/tc-translate
OUT=${OUT:-/tmp/sparsegnn-out}; mkdir -p "$OUT"
DEFAULT=cora,citeseer,deezer,lastfm,twitch,wikipedia,roadnet-pa-excerpt,reddit-threads-10k,PROTEINS_full,ENZYMES,tox21
DEFAULT=$DEFAULT,pubmed,ppi,OVCAR-8H,Yeast,DD,YeastH,amazon0505,artist,com-amazon,soc-BlogCatalog,amazon0601,flickr,yelp
GRAPHS=${GRAPHS:-$DEFAULT}
timeout $((${TILES_S:-130} + 60)) python3 scripts/time_tiles.py --graphs "${TILE_GRAPHS:-real,paper}" \
  --max-edges "${MAX_EDGES:-20000000}" --no-spmm --sddmm-dims "" --out "$OUT" --budget-s "${TILES_S:-130}" \
  > "$OUT/tiles_log.txt" 2>&1
tail -2 "$OUT/tiles_log.txt"
timeout ${TRAIN_S:-200} python3 scripts/bench_train.py --models gcn --providers ours,pyg --precision tf32 \
  --graphs "$GRAPHS" --rounds ${ROUNDS:-2} --out "$OUT/train_gcn_tf32.json" --md "$OUT/train_gcn_tf32.md" 2>&1 | tail -3
python3 scripts/translate_vs_epoch.py "$OUT/tiles_rows.jsonl" "$OUT/train_gcn_tf32.json" "$OUT/translate_vs_epoch.md"
tail -3 "$OUT/translate_vs_epoch.md"
