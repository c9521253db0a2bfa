"""Does overlapping the dependent ``col -> x`` loads help the bf16 row schedules on the
L2-resident stand-ins?  (notes/spmm.md, stop 36.)

Until stop 35 the best row-group config split a call into two launches: row groups over the
rows of at most 64 edges and one program per heavier row (``_segment_reduce_kernel``; the
groups' loop is ``_groups`` here, with ``PREFETCH=0, UNROLL=1``).  Both drew ~3.9 TB/s
from L2 where a gather-only kernel draws ~7.  ncu showed their warps waiting on the global
loads, and each step of a row is a dependent pair: its column ids, then the rows they name.
This probe times, on each half of the call separately, the shipped kernel's loop against
variants of it: ``pf`` (the next step's ``col`` and values loaded before this step's gather,
carried through the loop), ``u2`` (two steps per iteration, both gathers issued before either
is summed), and ``pfu2`` (both).  Prints ms per variant's best config and checks each against
the shipped output.  (Stop 36: 1.00-1.15x on the heavy half, none on the light half.)

``--order``: the same two halves as two launches (the stop-35 schedule: row groups, then one
4-warp program per heavier row), with the rows in the plan's ascending degree buckets or
heaviest first, in sequence or on two streams, beside the single heaviest-first launch that
replaced them (``spmm_csr._grouped_kernel``, through ``spmm_planned``).

    PYTHONPATH=src python scripts/probe_pipeline.py --graphs artist,ppi,soc-BlogCatalog,flickr --dims 64,128,256
    PYTHONPATH=src python scripts/probe_pipeline.py --order
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from sparsegnn.bench.harness import bench_graph
from sparsegnn.kernels._launch import launch
from sparsegnn.kernels.spmm_csr import _launch as seg_launch
from sparsegnn.kernels.spmm_csr import spmm_planned
from sparsegnn.ops._dispatch import plan_of
from sparsegnn.tune.autotune import measure

VARIANTS = {"base": (0, 1), "pf": (1, 1), "u2": (0, 2), "pfu2": (1, 2)}


@triton.jit
def _step_loads(col_ptr, val_ptr, edge, emask):
    c = tl.load(col_ptr + edge, mask=emask, other=0).to(tl.int64)
    w = tl.load(val_ptr + edge, mask=emask, other=0.0).to(tl.float32)
    return c, w


@triton.jit
def _heavy(rows_ptr, rowptr_ptr, col_ptr, val_ptr, x_ptr, out_ptr, num_feats, stride_x,
           BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, PREFETCH: tl.constexpr, UNROLL: tl.constexpr):
    """One listed row per program, BLOCK_E edges per step (UNROLL steps per iteration)."""
    row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    start = tl.load(rowptr_ptr + row)
    end = tl.load(rowptr_ptr + row + 1)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = feat < num_feats
    acc = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)
    e = start + tl.arange(0, BLOCK_E)
    if PREFETCH:
        c, w = _step_loads(col_ptr, val_ptr, e, e < end)
        if UNROLL == 2:
            c2, w2 = _step_loads(col_ptr, val_ptr, e + BLOCK_E, e + BLOCK_E < end)
        for e0 in range(start, end, BLOCK_E * UNROLL):
            m = (e < end)[:, None] & fmask[None, :]
            t = tl.load(x_ptr + c[:, None] * stride_x + feat[None, :], mask=m, other=0.0)
            if UNROLL == 2:
                m2 = (e + BLOCK_E < end)[:, None] & fmask[None, :]
                t2 = tl.load(x_ptr + c2[:, None] * stride_x + feat[None, :], mask=m2, other=0.0)
            e = e + BLOCK_E * UNROLL
            cn, wn = _step_loads(col_ptr, val_ptr, e, e < end)
            if UNROLL == 2:
                cn2, wn2 = _step_loads(col_ptr, val_ptr, e + BLOCK_E, e + BLOCK_E < end)
                acc += t2.to(tl.float32) * w2[:, None]
                c2, w2 = cn2, wn2
            acc += t.to(tl.float32) * w[:, None]
            c, w = cn, wn
    else:
        for e0 in range(start, end, BLOCK_E * UNROLL):
            ea = e0 + tl.arange(0, BLOCK_E)
            c, w = _step_loads(col_ptr, val_ptr, ea, ea < end)
            if UNROLL == 2:
                c2, w2 = _step_loads(col_ptr, val_ptr, ea + BLOCK_E, ea + BLOCK_E < end)
                t2 = tl.load(x_ptr + c2[:, None] * stride_x + feat[None, :],
                             mask=(ea + BLOCK_E < end)[:, None] & fmask[None, :], other=0.0)
            t = tl.load(x_ptr + c[:, None] * stride_x + feat[None, :], mask=(ea < end)[:, None] & fmask[None, :],
                        other=0.0)
            acc += t.to(tl.float32) * w[:, None]
            if UNROLL == 2:
                acc += t2.to(tl.float32) * w2[:, None]
    tl.store(out_ptr + row * stride_x + feat, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=fmask)


@triton.jit
def _groups(rows_ptr, rowptr_ptr, col_ptr, val_ptr, x_ptr, out_ptr, num_listed, num_feats, stride_x,
            ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, PREFETCH: tl.constexpr,
            UNROLL: tl.constexpr):
    """ROWS listed rows side by side, BLOCK_E edges of each per step (UNROLL steps per iteration)."""
    listed = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    lmask = listed < num_listed
    row = tl.load(rows_ptr + listed, mask=lmask, other=0).to(tl.int64)
    start = tl.load(rowptr_ptr + row, mask=lmask, other=0)
    deg = tl.load(rowptr_ptr + row + 1, mask=lmask, other=0) - start
    max_deg = tl.max(deg, axis=0)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = feat < num_feats
    acc = tl.zeros([ROWS, BLOCK_E, BLOCK_F], dtype=tl.float32)
    slot = tl.arange(0, BLOCK_E)
    if PREFETCH:
        em = slot[None, :] < deg[:, None]
        c, w = _step_loads(col_ptr, val_ptr, start[:, None] + slot[None, :], em)
        if UNROLL == 2:
            em2 = slot[None, :] + BLOCK_E < deg[:, None]
            c2, w2 = _step_loads(col_ptr, val_ptr, start[:, None] + slot[None, :] + BLOCK_E, em2)
        for k in range(0, max_deg, BLOCK_E * UNROLL):
            t = tl.load(x_ptr + c[:, :, None] * stride_x + feat[None, None, :],
                        mask=em[:, :, None] & fmask[None, None, :], other=0.0)
            if UNROLL == 2:
                t2 = tl.load(x_ptr + c2[:, :, None] * stride_x + feat[None, None, :],
                             mask=em2[:, :, None] & fmask[None, None, :], other=0.0)
            s = k + BLOCK_E * UNROLL + slot
            em = s[None, :] < deg[:, None]
            cn, wn = _step_loads(col_ptr, val_ptr, start[:, None] + s[None, :], em)
            if UNROLL == 2:
                em2 = s[None, :] + BLOCK_E < deg[:, None]
                cn2, wn2 = _step_loads(col_ptr, val_ptr, start[:, None] + s[None, :] + BLOCK_E, em2)
                acc += t2.to(tl.float32) * w2[:, :, None]
                c2, w2 = cn2, wn2
            acc += t.to(tl.float32) * w[:, :, None]
            c, w = cn, wn
    else:
        for k in range(0, max_deg, BLOCK_E * UNROLL):
            s = k + slot
            em = s[None, :] < deg[:, None]
            c, w = _step_loads(col_ptr, val_ptr, start[:, None] + s[None, :], em)
            if UNROLL == 2:
                em2 = s[None, :] + BLOCK_E < deg[:, None]
                c2, w2 = _step_loads(col_ptr, val_ptr, start[:, None] + s[None, :] + BLOCK_E, em2)
                t2 = tl.load(x_ptr + c2[:, :, None] * stride_x + feat[None, None, :],
                             mask=em2[:, :, None] & fmask[None, None, :], other=0.0)
            t = tl.load(x_ptr + c[:, :, None] * stride_x + feat[None, None, :],
                        mask=em[:, :, None] & fmask[None, None, :], other=0.0)
            acc += t.to(tl.float32) * w[:, :, None]
            if UNROLL == 2:
                acc += t2.to(tl.float32) * w2[:, :, None]
    tl.store(out_ptr + row[:, None] * stride_x + feat[None, :], tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty),
             mask=lmask[:, None] & fmask[None, :])


def order(graphs: str, dims) -> None:
    """Two launches (ascending / heaviest first, in sequence / on two streams) vs the one launch."""
    for name in graphs.split(","):
        g = bench_graph(name, device="cuda")
        g = g.with_values(torch.rand(g.num_edges, device="cuda") + 0.5)
        plan = plan_of(g)
        col32, val = plan.col32, g.edge_val
        num_light = plan.num_short_below(64)
        light, heavy = plan.short_rows[:num_light], plan.short_rows[num_light:]
        lrev, hrev = light.flip(0).contiguous(), heavy.flip(0).contiguous()
        side = torch.cuda.Stream()
        for f in dims:
            x = torch.randn(g.num_src, f, device="cuda").bfloat16()
            out = torch.zeros(g.num_nodes, f, device="cuda", dtype=torch.bfloat16)
            bf = min(f, 64)

            def H(rows):
                seg_launch(rows, g.rowptr, g.rowptr[1:], col32, val, x, out, None, None, rows.numel(), 0, False,
                           {"BLOCK_E": 32, "BLOCK_F": bf, "num_warps": 4, "ROWS": 1})

            def L(rows):
                launch(_groups, (triton.cdiv(rows.numel(), 4), triton.cdiv(f, bf)),
                       (rows, g.rowptr, col32, val, x, out, rows.numel(), f, x.stride(0)),
                       dict(ROWS=4, BLOCK_E=1, BLOCK_F=bf, PREFETCH=0, UNROLL=1), 1)

            def streams():
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    H(hrev)
                L(light)
                torch.cuda.current_stream().wait_stream(side)
            one = {"GROUP_ROWS": 8, "GROUP_E": 1, "BLOCK_F": bf, "ROWS": 1, "BLOCK_E": 32, "num_warps": 2,
                   "SEG_WARPS": 4, "LIGHT_STEPS": 64}
            cases = {"heavy asc": lambda: H(heavy), "heavy desc": lambda: H(hrev), "light asc": lambda: L(light),
                     "light desc": lambda: L(lrev), "two launches asc": lambda: (L(light), H(heavy)),
                     "heavy desc, light": lambda: (H(hrev), L(light)), "two streams": streams,
                     "one launch": lambda: spmm_planned(g.rowptr, plan, val, x, "sum", config=one)}
            names = list(cases)
            t = measure(lambda c: cases[c["k"]](), [{"k": k} for k in names], "cuda")
            print(f"{name} F={f}: " + "  ".join(f"{k} {t[i][0]:.4f}" for i, k in enumerate(names)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--order", action="store_true", help="launch order / overlap instead of the loop variants")
    parser.add_argument("--graphs", default="artist,ppi,soc-BlogCatalog,flickr")
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--light-steps", type=int, default=64, help="rows of more edges go to the heavy half")
    args = parser.parse_args()
    if args.order:
        return order(args.graphs, [int(d) for d in args.dims.split(",")])
    summary = []
    for name in args.graphs.split(","):
        g = bench_graph(name, device="cuda")
        g = g.with_values(torch.rand(g.num_edges, device="cuda") + 0.5)
        plan = plan_of(g)
        col32, val = plan.col32, g.edge_val
        num_light = plan.num_short_below(args.light_steps)
        light = plan.short_rows[:num_light]
        heavy = plan.short_rows[num_light:]
        assert plan.long_rows.numel() == 0, "probe assumes no rows longer than the plan's chunk"
        he = int((g.rowptr[heavy.long() + 1] - g.rowptr[heavy.long()]).sum())
        print(f"{name}: N={g.num_nodes} E={g.num_edges}; light rows {num_light} ({g.num_edges - he} edges), "
              f"heavy rows {heavy.numel()} ({he} edges)", flush=True)
        for f in [int(d) for d in args.dims.split(",")]:
            x = torch.randn(g.num_src, f, device="cuda").bfloat16()
            out = torch.zeros(g.num_nodes, f, device="cuda", dtype=torch.bfloat16)
            ref = torch.zeros(g.num_nodes, f, device="cuda", dtype=torch.float64)
            row_of = torch.repeat_interleave(torch.arange(g.num_nodes, device="cuda"), g.rowptr.diff())
            ref.index_add_(0, row_of, x.double()[col32.long()] * val.double()[:, None])
            # shipped kernels, the two halves
            seg_cfgs = [{"BLOCK_E": be, "BLOCK_F": bf, "num_warps": w, "ROWS": 1}
                        for be in (16, 32, 64) for bf in sorted({min(64, f), min(128, f)}) for w in (2, 4, 8)
                        if be * bf <= 8192]
            grp_cfgs = [{"ROWS": r, "BLOCK_E": ge, "BLOCK_F": bf, "num_warps": w}
                        for r in (4, 8) for ge in (1, 2) for bf in sorted({min(64, f), min(128, f)}) for w in (1, 2)]

            def shipped_heavy(cfg):
                seg_launch(heavy, g.rowptr, g.rowptr[1:], col32, val, x, out, None, None, heavy.numel(), 0, False,
                           cfg)

            def shipped_light(cfg):     # the stop-35 row-group kernel's loop is ``base`` below
                var_light(dict(cfg, pf=0, u=1))

            def var_heavy(cfg):
                launch(_heavy, (heavy.numel(), triton.cdiv(f, cfg["BLOCK_F"])),
                       (heavy, g.rowptr, col32, val, x, out, f, x.stride(0)),
                       dict(BLOCK_E=cfg["BLOCK_E"], BLOCK_F=cfg["BLOCK_F"], PREFETCH=cfg["pf"], UNROLL=cfg["u"]),
                       cfg["num_warps"])

            def var_light(cfg):
                launch(_groups, (triton.cdiv(num_light, cfg["ROWS"]), triton.cdiv(f, cfg["BLOCK_F"])),
                       (light, g.rowptr, col32, val, x, out, num_light, f, x.stride(0)),
                       dict(ROWS=cfg["ROWS"], BLOCK_E=cfg["BLOCK_E"], BLOCK_F=cfg["BLOCK_F"], PREFETCH=cfg["pf"],
                            UNROLL=cfg["u"]), cfg["num_warps"])

            res = {}
            for half, rows, shipped, var, cfgs in (("heavy", heavy, shipped_heavy, var_heavy, seg_cfgs),
                                                   ("light", light, shipped_light, var_light, grp_cfgs)):
                if rows.numel() == 0:
                    continue
                want = ref[rows.long()]
                t = measure(shipped, cfgs, "cuda")
                i = min(range(len(cfgs)), key=lambda j: t[j][0])
                res[(half, "shipped")] = (t[i][0], cfgs[i])
                for vname, (pf, u) in VARIANTS.items():
                    vc = [dict(c, pf=pf, u=u) for c in cfgs]
                    worst = 0.0
                    for c in vc:            # every config checked against float64
                        out.zero_()
                        var(c)
                        got = out[rows.long()].double()
                        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
                    assert worst < 1e-2, (half, vname, worst)
                    t = measure(var, vc, "cuda")
                    i = min(range(len(vc)), key=lambda j: t[j][0])
                    res[(half, vname)] = (t[i][0], vc[i])
                line = "  ".join(f"{v} {res[(half, v)][0]:.4f}" for v in ["shipped"] + list(VARIANTS))
                print(f"  {name} F={f} {half}: {line}", flush=True)
                for v in ["shipped"] + list(VARIANTS):
                    print(f"      {v}: {res[(half, v)][1]}", flush=True)
            summary.append((name, f, res))
    print("\n| graph | F | half | shipped ms | " + " | ".join(VARIANTS) + " | best/shipped |")
    print("|---|---|---|---|" + "---|" * len(VARIANTS) + "---|")
    for name, f, res in summary:
        for half in ("heavy", "light"):
            if (half, "shipped") not in res:
                continue
            s = res[(half, "shipped")][0]
            vs = [res[(half, v)][0] for v in VARIANTS]
            print(f"| {name} | {f} | {half} | {s:.4f} | " + " | ".join(f"{v:.4f}" for v in vs)
                  + f" | {s / min(vs):.2f}x |")


if __name__ == "__main__":
    main()
