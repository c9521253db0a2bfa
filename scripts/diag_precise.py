"""Diagnostics for ``spmm(precision=...)`` on small real graphs (GPU): host cost per call
(200 calls, no sync), three ``do_bench`` readings per path (their spread), and the tuner's
``spmm_tc`` picks::

    PYTHONPATH=src SPARSEGNN_DATA=.data python scripts/diag_precise.py
"""
import sys
import time

import torch

sys.path.insert(0, "src")
import sparsegnn as sg
from sparsegnn.bench.harness import bench_graph
from sparsegnn.ops import tiles as T
from sparsegnn.kernels.spmm_tiles import spmm_tiles
from triton.testing import do_bench

picks = []
orig = T._run_sum
import sparsegnn.tune.autotune as A
orig_decide = A.decide
def decide(op, graph, detail, f, dtype, device, cands, run, **kw):
    cfg = orig_decide(op, graph, detail, f, dtype, device, cands, run, **kw)
    if op == T.TC_FAMILY and (op, f, str(dtype), graph.num_edges) not in [p[:4] for p in picks]:
        picks.append((op, f, str(dtype), graph.num_edges, cfg))
    return cfg
A.decide = decide
import sparsegnn.tune as TU
TU.decide = decide

for name in ["cora", "citeseer", "wikipedia", "deezer"]:
    g = bench_graph(name, device="cuda", real=True)
    g = g.with_values(torch.rand(g.num_edges, device="cuda") + 0.5)
    for f in (32, 128):
        x = torch.randn(g.num_src, f, device="cuda"); x16 = x.bfloat16()
        fns = {"ieee": lambda: sg.spmm(g, x, edge_weight=g.edge_val),
               "tf32": lambda: sg.spmm(g, x, edge_weight=g.edge_val, precision="tf32"),
               "bf16": lambda: sg.spmm(g, x16, edge_weight=g.edge_val, precision="bf16"),
               "tiles": lambda: spmm_tiles(T.tiles_of_graph(g), x, precision="tf32", block_f=32 if f == 32 else 64, chunk=8),
               "cusp": lambda: torch.sparse.mm(g.to_torch_sparse_csr(), x)}
        for k, fn in fns.items():
            fn(); torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200): fn()
            host = (time.perf_counter() - t0) / 200 * 1e6
            torch.cuda.synchronize()
            b = [do_bench(fn, warmup=10, rep=30) for _ in range(3)]
            print(f"{name:10s} F={f:3d} {k:6s} host {host:6.1f} us  bench {['%.4f' % v for v in b]}", flush=True)
for p in picks:
    print("pick", p)
