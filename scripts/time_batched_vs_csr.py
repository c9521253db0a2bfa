"""When does the one-program-per-graph batched SpMM beat the tuned CSR kernels? Both timed on
block-diagonal batches (real ones and molecule-like stand-ins), kernel only (cudagraph-free
``do_bench``, the tuner's decision taken first), with the padding waste ``B * MAXN / N``::

    python scripts/time_batched_vs_csr.py --out batched_vs_csr.json
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import triton

from sparsegnn import Graph
from sparsegnn.bench.harness import bench_graph
from sparsegnn.datasets.synthetic import small_graph_batch
from sparsegnn.kernels import spmm_batched
from sparsegnn.ops import _dispatch


def cases(device):
    for name in ("ENZYMES", "reddit-threads-10k", "tox21", "PROTEINS_full"):
        yield name, bench_graph(name, device=device, real=True)
    for graphs, lo, hi, kind in ((200, 25, 50, "molecule"), (1000, 25, 50, "molecule"), (200, 10, 30, "molecule"),
                                 (1000, 10, 60, "molecule"), (200, 20, 120, "molecule"), (200, 10, 40, "dense")):
        edge_index, ptr = small_graph_batch(graphs, lo, hi, kind=kind)
        g = Graph.from_edge_index(edge_index.to(device), num_nodes=int(ptr[-1]))
        yield f"{kind} {graphs}x{lo}-{hi}", Graph(g.rowptr, g.col, None, g.num_nodes, ptr=ptr.to(device))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", default="32,64,128,256")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    rows = []
    for name, g in cases(device):
        stats = g.batch_stats() if g.ptr is not None else None
        if stats is None or not stats[2]:
            print(f"{name}: not a block-diagonal batch", flush=True)
            continue
        graphs = g.ptr.numel() - 1
        maxn = max(16, triton.next_power_of_2(stats[0]))
        waste = graphs * maxn / max(g.num_nodes, 1)
        plain = Graph(g.rowptr, g.col, None, g.num_nodes)          # no ptr: the tuned CSR path
        for f in [int(d) for d in args.dims.split(",")]:
            x = torch.randn(g.num_nodes, f, device=device)
            cfg = spmm_batched.batched_config(stats[0], f, stats[1], "sum")
            batched = lambda: spmm_batched.spmm_batched(g.ptr, g.rowptr, g.col, None, x, cfg, "sum")  # noqa: E731
            csr = lambda: _dispatch.aggregate("triton", plain, x, None, "sum")  # noqa: E731
            torch.testing.assert_close(batched(), csr(), rtol=1e-4, atol=1e-4)
            tb = triton.testing.do_bench(batched, return_mode="median")
            tc = triton.testing.do_bench(csr, return_mode="median")
            row = dict(case=name, nodes=g.num_nodes, graphs=graphs, max_nodes=stats[0], mean_degree=stats[1],
                       maxn=maxn, waste=waste, F=f, batched_ms=tb, csr_ms=tc, csr_over_batched=tc / tb)
            rows.append(row)
            print(f"{name:24s} N={g.num_nodes:7d} B={graphs:6d} max={stats[0]:4d} waste={waste:4.1f} F={f:3d} "
                  f"batched {tb * 1e3:7.1f} us  csr {tc * 1e3:7.1f} us  csr/batched {tc / tb:5.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
