"""Kernel times of the fused GAT / AGNN passes on one graph, next to an SpMM of the same width
(GPU machine): every tuner candidate forward, the backward, and with/without dropout.

    PYTHONPATH=src python scripts/time_attention.py --graph reddit --heads 8 --channels 8
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_layers as layers  # noqa: E402
import bench_train as bt  # noqa: E402

from sparsegnn import spmm  # noqa: E402
from sparsegnn.kernels import attention as att  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--graph", default="reddit")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--channels", type=int, default=8)
    a = p.parse_args()
    dev = torch.device("cuda")
    graph, _ = bt.load_bench_graph(a.graph, dev, None)
    g = layers.bare(graph).add_self_loops()
    n, h, c = g.num_nodes, a.heads, a.channels
    feat = torch.randn(n, h, c, device=dev)
    a_src, a_dst = torch.randn(n, h, device=dev), torch.randn(n, h, device=dev)
    seed = torch.tensor([7], device=dev)
    w = torch.rand(g.num_edges, h, device=dev)
    print(f"{a.graph}: N={n} E={g.num_edges} H={h} C={c}")
    print(f"  spmm multi-head [E,H] weights, F={h * c}: {do_bench(lambda: spmm(g, feat, edge_weight=w)):.3f} ms")
    for cfg in att.gat_candidates(n, g.num_edges, h, c):
        f0 = do_bench(lambda: att.gat_forward(g.rowptr, g.col, feat, a_src, a_dst, 0.2, 0.0, None, cfg))
        f1 = do_bench(lambda: att.gat_forward(g.rowptr, g.col, feat, a_src, a_dst, 0.2, 0.6, seed, cfg))
        out, lse = att.gat_forward(g.rowptr, g.col, feat, a_src, a_dst, 0.2, 0.6, seed, cfg)
        tp = g.transpose_parts()
        b1 = do_bench(lambda: att.gat_backward(g.rowptr, tp, feat, a_src, a_dst, lse, out, out, 0.2, 0.6, seed, cfg))
        print(f"  gat {cfg}: fwd {f0:.3f} ms, fwd+dropout {f1:.3f} ms, bwd+dropout {b1:.3f} ms")


if __name__ == "__main__":
    main()
