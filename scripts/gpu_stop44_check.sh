#!/usr/bin/env bash
# Stop 44: the GPU tests of the translation (the fused per-window pass), then host and GPU costs of
# the fused pass against the unfused three launches.  Files under $OUT.
export PYTHONPATH=src PYTHONUNBUFFERED=1 SPARSEGNN_DATA=.data SPARSEGNN_TUNE_CACHE=/tmp/tc44
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout ${TEST_S:-300} python -m pytest -q -x -n 8 tests/test_tiles.py -p no:cacheprovider ${TEST_K:+-k "$TEST_K"} 2>&1 | tail -4
timeout 90 python scripts/probe_host_costs.py ${HOST_GRAPHS:-cora,deezer,pubmed,DD,lastfm,ppi,tox21} 2>&1 | tail -8
timeout 150 python scripts/probe_translate.py ${GPU_GRAPHS:-deezer,amazon0505,YeastH,com-amazon,flickr} --variants triton,unfused --no-values --top 2 2>&1 | grep -v Warn | tail -40
