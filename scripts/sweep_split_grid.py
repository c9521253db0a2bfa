"""Grid sweep of the single-launch schedules (flat, split) on chosen cases, cold L2, next to
cuSPARSE: where the candidate list loses, which corner of the space wins?

    PYTHONPATH=src python scripts/sweep_split_grid.py wikipedia:128,256 hub-social:128 --out grid.jsonl

Names are real-suite graphs or stand-ins (real first).  Prints the best few per case.
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch

from sparsegnn.bench.harness import bench_graph
from sparsegnn.datasets.suite import REAL_SUITE
from sparsegnn.kernels.configs import SPMM_SPACE, in_space
from sparsegnn.kernels.spmm_csr import spmm_planned
from sparsegnn.ops import reference
from sparsegnn.ops._dispatch import plan_of
from sparsegnn.tune.autotune import time_config


def grid(num_feats: int, hubs: bool):
    out = []
    for block_e, block_f, warps, stages in itertools.product((2, 4, 8, 16), (32, 64, 128, 256), (1, 2, 4), (1, 2, 3)):
        if block_f > max(num_feats, 32) or not 128 * warps <= block_e * block_f <= 2048 * warps:
            continue
        base = {"ROWS": 1, "BLOCK_E": block_e, "BLOCK_F": block_f, "num_warps": warps, "num_stages": stages}
        out.append(dict(base, FLAT=1))
        if hubs:
            out.append(dict(base, SPLIT=1, HEAVY_E=32, PIECE_STEPS=8, LIGHT_STEPS=8, INLINE=1))
    return [c for c in out if in_space(c, SPMM_SPACE)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    with open(args.out, "a") as f:
        for case in args.cases:
            name, _, dims = case.partition(":")
            structure = bench_graph(name, device="cuda", real=name in REAL_SUITE)
            g = structure.with_values(torch.rand(structure.num_edges, device="cuda") + 0.5)
            plan = plan_of(g)
            csr = g.to_torch_sparse_csr(dtype)
            for num_feats in map(int, dims.split(",")):
                x = torch.randn(g.num_nodes, num_feats, device="cuda").to(dtype)
                ref = reference.spmm_sum(g.row, g.col, g.num_nodes, x.double(), g.edge_val.double())
                cus = time_config(lambda c: torch.sparse.mm(csr, x), {})
                res = []
                for cfg in grid(num_feats, plan.max_degree > 64):
                    run = lambda c: spmm_planned(g.rowptr, plan, g.edge_val, x, "sum", config=c)  # noqa: E731
                    err = float((run(cfg).double() - ref).norm() / ref.norm())
                    if not err < 1e-2:
                        print("BAD", cfg, err)
                    res.append((time_config(run, cfg), cfg))
                res.sort(key=lambda r: r[0])
                for ms, cfg in res:
                    f.write(json.dumps({"graph": name, "F": num_feats, "dtype": args.dtype, "config": cfg, "ms": ms,
                                        "cusparse_ms": cus}) + "\n")
                print(f"{name} F={num_feats} cusparse {cus:.4f}  best x{cus / res[0][0]:.2f}:",
                      "; ".join(f"{ms:.4f} {cfg}" for ms, cfg in res[:4]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
