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


@triton.jit
def _seg_sum(v1, r1, v2, r2):
    return tl.where(r1 == r2, v1 + v2, v2), r2


@triton.jit
def _edge_chunks(row_ptr, col_ptr, val_ptr, x_ptr, out_ptr, part_ptr, num_edges, num_feats,
                 BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, STEPS: tl.constexpr):
    """Prototype of an edge-balanced sum: program p reduces edges [p C, (p + 1) C) (C = BLOCK_E
    STEPS) by a segmented scan over their row ids; rows cut by the chunk's ends go to
    part[2 p] (the first row, begun before) and part[2 p + 1] (the last row, going on after)."""
    pid = tl.program_id(0)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = feat < num_feats
    base = pid * (BLOCK_E * STEPS)
    end = tl.minimum(base + BLOCK_E * STEPS, num_edges)
    row_first = tl.load(row_ptr + base)
    row_last = tl.load(row_ptr + end - 1)
    begins_before = tl.load(row_ptr + tl.maximum(base - 1, 0)) == row_first
    begins_before = begins_before & (base > 0)
    ends_after = tl.load(row_ptr + tl.minimum(end, num_edges - 1)) == row_last
    ends_after = ends_after & (end < num_edges)
    idx = tl.arange(0, BLOCK_E)
    carry = tl.zeros([BLOCK_F], dtype=tl.float32)
    carry_row = -1
    for s in tl.static_range(STEPS):
        e = base + s * BLOCK_E + idx
        m = e < end
        r = tl.load(row_ptr + e, mask=m, other=-1)
        r_next = tl.load(row_ptr + e + 1, mask=(e + 1) < end, other=-2)
        c = tl.load(col_ptr + e, mask=m, other=0).to(tl.int64)
        w = tl.load(val_ptr + e, mask=m, other=0.0)
        t = tl.load(x_ptr + c[:, None] * num_feats + feat[None, :], mask=m[:, None] & fmask[None, :],
                    other=0.0).to(tl.float32) * w[:, None]
        t = t + tl.where(((idx == 0) & (r == carry_row))[:, None], carry[None, :], 0.0)
        v, _ = tl.associative_scan((t, tl.broadcast_to(r[:, None], [BLOCK_E, BLOCK_F])), 0, _seg_sum)
        ends = m & (r != r_next)
        zeros = tl.zeros_like(idx)      # scalar flags broadcast as ints (the interpreter rejects bool scalars)
        first_part = (r == row_first) & ((begins_before.to(tl.int32) + zeros) > 0)
        last_part = (e == end - 1) & ((ends_after.to(tl.int32) + zeros) > 0)
        direct = ends & (~first_part) & (~last_part)
        rows = tl.maximum(r, 0).to(tl.int64)
        tl.store(out_ptr + rows[:, None] * num_feats + feat[None, :], v, mask=direct[:, None] & fmask[None, :])
        slot = tl.where(first_part, 2 * pid, 2 * pid + 1).to(tl.int64)
        tl.store(part_ptr + slot[:, None] * num_feats + feat[None, :], v,
                 mask=(ends & (first_part | last_part))[:, None] & fmask[None, :])
        last = idx == BLOCK_E - 1
        carry = tl.sum(tl.where(last[:, None], v, 0.0), axis=0)
        carry_row = tl.sum(tl.where(last, r, 0), axis=0)


@triton.jit
def _combine(span_row_ptr, span_first_ptr, span_last_ptr, part_ptr, out_ptr, num_feats, BLOCK_F: tl.constexpr):
    i = tl.program_id(0)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = feat < num_feats
    row = tl.load(span_row_ptr + i).to(tl.int64)
    p = tl.load(span_first_ptr + i).to(tl.int64)
    q = tl.load(span_last_ptr + i).to(tl.int64)
    acc = tl.load(part_ptr + (2 * p + 1) * num_feats + feat, mask=fmask, other=0.0)
    for k in range(p + 1, q + 1):
        acc += tl.load(part_ptr + (2 * k) * num_feats + feat, mask=fmask, other=0.0)
    tl.store(out_ptr + row * num_feats + feat, acc, mask=fmask)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graphs", default="artist,ppi,soc-BlogCatalog,flickr")
    parser.add_argument("--dims", default="128,256")
    parser.add_argument("--chunks", default="", help="also time our candidates on plans cut at these piece lengths")
    parser.add_argument("--no-edge", action="store_true", help="skip the edge-chunk prototype")
    parser.add_argument("--wide", action="store_true",
                        help="also time row-group configs gathering whole rows (BLOCK_F = F) at 1-4 warps")
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
            shipped = len(cands)
            if args.wide:
                cands += [{"GROUP_ROWS": gr, "GROUP_E": ge, "BLOCK_F": min(f, 256), "ROWS": 1, "BLOCK_E": be,
                           "num_warps": w, "SEG_WARPS": sw, "LIGHT_STEPS": 64}
                          for gr in (2, 4, 8) for ge in (1, 2) for w in (1, 2, 4) for be in (16, 32) for sw in (4, 8)]
            ours = measure(lambda cfg: spmm_planned(g.rowptr, plan, g.edge_val, x, "sum", config=cfg), cands, "cuda")
            best = min(range(len(cands)), key=lambda i: ours[i][0])
            for chunk in [int(c) for c in args.chunks.split(",") if c]:
                cplan = g.row_plan(chunk)
                ccands = spmm_candidates(g.num_nodes, g.num_edges, f, 2, cplan.max_degree)
                times = measure(lambda cfg: spmm_planned(g.rowptr, cplan, g.edge_val, x, "sum", config=cfg), ccands,
                                "cuda")
                i = min(range(len(ccands)), key=lambda i: times[i][0])
                print(f"   plan chunk {chunk} (default {plan.chunk}): best {times[i][0]:.4f} ms {ccands[i]}", flush=True)
            if args.wide:
                top = sorted(range(len(cands)), key=lambda i: ours[i][0])[:5]
                for i in top:
                    print(f"   {'shipped' if i < shipped else 'wide   '} {ours[i][0]:.4f} ms {cands[i]}", flush=True)
            if args.no_edge:
                print(f"{name} N={g.num_nodes} E={g.num_edges} F={f}: ours best {ours[best][0]:.4f} ms "
                      f"({gbytes / ours[best][0]:.2f} TB/s) {cands[best]}", flush=True)
                continue
            row32 = torch.repeat_interleave(torch.arange(g.num_nodes, device="cuda", dtype=torch.int32),
                                            g.rowptr.diff())
            want = spmm_planned(g.rowptr, plan, g.edge_val, x, "sum", config=cands[best]).float()
            edge_cfgs = [{"BLOCK_E": be, "STEPS": st, "w": w, "BF": bf} for be in (4, 8, 16) for st in (4, 8)
                         for w in (1, 2, 4) for bf in sorted({min(f, 128), f}) if be * bf <= 4096]
            spans = {}

            def edge_run(cfg):
                chunk = cfg["BLOCK_E"] * cfg["STEPS"]
                progs = triton.cdiv(g.num_edges, chunk)
                if chunk not in spans:          # rows whose edges lie in more than one chunk
                    first = g.rowptr[:-1] // chunk
                    last = (g.rowptr[1:] - 1) // chunk
                    sel = (g.rowptr[1:] > g.rowptr[:-1]) & (last > first)
                    rows = sel.nonzero().flatten()
                    spans[chunk] = (rows.to(torch.int32), first[sel].to(torch.int32), last[sel].to(torch.int32),
                                    torch.empty(2 * progs, f, device="cuda"))
                span_rows, span_first, span_last, part = spans[chunk]
                out = torch.zeros(g.num_nodes, f, device="cuda")
                launch(_edge_chunks, (progs, triton.cdiv(f, cfg["BF"])),
                       (row32, col32, g.edge_val, x, out, part, g.num_edges, f),
                       dict(BLOCK_E=cfg["BLOCK_E"], BLOCK_F=cfg["BF"], STEPS=cfg["STEPS"]), cfg["w"])
                if span_rows.numel():
                    launch(_combine, (span_rows.numel(), triton.cdiv(f, cfg["BF"])),
                           (span_rows, span_first, span_last, part, out, f), dict(BLOCK_F=cfg["BF"]), 1)
                return out
            errs = []
            for cfg in edge_cfgs[:3]:
                got = edge_run(cfg)
                errs.append(float((got - want).norm() / want.norm()))
            edge = measure(edge_run, edge_cfgs, "cuda")
            ebest = min(range(len(edge_cfgs)), key=lambda i: edge[i][0])
            print(f"   edge chunks best {edge[ebest][0]:.4f} ms ({gbytes / edge[ebest][0]:.2f} TB/s) "
                  f"{edge_cfgs[ebest]}; rel err vs ours {max(errs):.1e}", flush=True)
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
            print(f"{name} N={g.num_nodes} E={g.num_edges} F={f}: ours best {ours[best][0]:.4f} ms "
                  f"({gbytes / ours[best][0]:.2f} TB/s) {cands[best]}; first cand {ours[0][0]:.4f}; "
                  f"ceiling {ceil[cbest][0]:.4f} ms ({gbytes / ceil[cbest][0]:.2f} TB/s) {ceil_cfgs[cbest]}",
                  flush=True)


if __name__ == "__main__":
    main()
