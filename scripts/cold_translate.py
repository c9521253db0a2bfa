"""First translation in a process with an empty Triton cache (compiles included), per path:
``per-window`` (the shipped size classes) or ``sorted`` (stop 37's sorted keys)::

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=src python scripts/cold_translate.py per-window cora,wikipedia,yelp
"""
import sys, time, torch
sys.path.insert(0, "src")
import sparsegnn.kernels.translate as kt
from sparsegnn.bench.harness import bench_graph
from sparsegnn.datasets.suite import REAL_SUITE
from sparsegnn.formats.tiles import translate
if sys.argv[1] == "sorted":
    kt.CAPS = (1,)
for name in sys.argv[2].split(","):
    g = bench_graph(name, device="cuda", real=name in REAL_SUITE)
    for i in range(2):
        torch.cuda.synchronize(); t = time.perf_counter()
        translate(g.rowptr, g.col, g.num_src, g.edge_val, row=g.row, condense=kt.condense)
        torch.cuda.synchronize()
        print(sys.argv[1], name, "call", i, f"{time.perf_counter() - t:.2f} s", flush=True)
