"""How close the bf16 row kernel is to the gather ceiling on the L2-resident paper stand-ins.

For each graph and width: every config of our planned SpMM's candidate list (``spmm_planned``),
and a ceiling kernel that only gathers ``x[col[e]]`` in CSR order and sums each program's
``BLOCK_E x STEPS`` edges into one row (perfect balance, no row bookkeeping, one output row per
program), all timed as CUDA-graph replays after an L2 flush (``tune.autotune.measure``).
Prints ms and the rate of gathered feature bytes (``E F 2`` / time).

    PYTHONPATH=src python scripts/probe_gather.py --graphs artist,ppi,soc-BlogCatalog,flickr --dims 128,256
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from sparsegnn.bench.harness import bench_graph
from sparsegnn.kernels._launch import launch
from sparsegnn.kernels.configs import spmm_candidates
from sparsegnn.kernels.spmm_csr import spmm_planned
from sparsegnn.ops._dispatch import plan_of
from sparsegnn.tune.autotune import measure


@triton.jit
def _gather_sum(col_ptr, x_ptr, out_ptr, num_edges, F: tl.constexpr, BLOCK_E: tl.constexpr, STEPS: tl.constexpr):
    pid = tl.program_id(0)
    feat = tl.arange(0, F)
    acc = tl.zeros([BLOCK_E, F], dtype=tl.float32)
    base = pid * BLOCK_E * STEPS
    for s in range(STEPS):
        e = base + s * BLOCK_E + tl.arange(0, BLOCK_E)
        m = e < num_edges
        c = tl.load(col_ptr + e, mask=m, other=0).to(tl.int64)
        acc += tl.load(x_ptr + c[:, None] * F + feat[None, :], mask=m[:, None], other=0.0).to(tl.float32)
    tl.store(out_ptr + pid.to(tl.int64) * F + feat, tl.sum(acc, axis=0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graphs", default="artist,ppi,soc-BlogCatalog,flickr")
    parser.add_argument("--dims", default="128,256")
    args = parser.parse_args()
    for name in args.graphs.split(","):
        g = bench_graph(name, device="cuda")
        g = g.with_values(torch.rand(g.num_edges, device="cuda") + 0.5)
        plan = plan_of(g)
        col32 = plan.col32
        for f in [int(d) for d in args.dims.split(",")]:
            x = torch.randn(g.num_src, f, device="cuda").bfloat16()
            gbytes = g.num_edges * f * 2 / 1e9
            cands = spmm_candidates(g.num_nodes, g.num_edges, f, 2, plan.max_degree)
            ours = measure(lambda cfg: spmm_planned(g.rowptr, plan, g.edge_val, x, "sum", config=cfg), cands, "cuda")
            best = min(range(len(cands)), key=lambda i: ours[i][0])
            ceil_cfgs = [{"BLOCK_E": be, "STEPS": st, "w": w} for be in (4, 8, 16, 32) for st in (4, 16)
                         for w in (1, 2, 4) if be * f <= 8192]
            outs = {}

            def ceiling(cfg):
                per = cfg["BLOCK_E"] * cfg["STEPS"]
                progs = triton.cdiv(g.num_edges, per)
                out = outs.get(progs)
                if out is None:
                    out = outs[progs] = torch.empty(progs, f, device="cuda")
                launch(_gather_sum, (progs,), (col32, x, out, g.num_edges),
                       dict(F=f, BLOCK_E=cfg["BLOCK_E"], STEPS=cfg["STEPS"]), cfg["w"])
            ceil = measure(ceiling, ceil_cfgs, "cuda")
            cbest = min(range(len(ceil_cfgs)), key=lambda i: ceil[i][0])
            ranked = sorted(range(len(cands)), key=lambda i: ours[i][0])[:6]
            for i in ranked:
                print(f"   {ours[i][0]:.4f} ms {cands[i]}")
            print(f"{name} N={g.num_nodes} E={g.num_edges} F={f}: ours best {ours[best][0]:.4f} ms "
                  f"({gbytes / ours[best][0]:.2f} TB/s) {cands[best]}; first cand {ours[0][0]:.4f}; "
                  f"ceiling {ceil[cbest][0]:.4f} ms ({gbytes / ceil[cbest][0]:.2f} TB/s) {ceil_cfgs[cbest]}",
                  flush=True)


if __name__ == "__main__":
    main()
