"""Tensor-core tiles on the GPU: translation cost and block statistics, tile SpMM in every
launch config against cuSPARSE and our CUDA-core SpMM (fp32 / tf32 and bf16), tile SDDMM against
the row-wise kernel and ``torch.sparse.sampled_addmm`` (fast layout), and the same after
locality reordering::

    python -m scripts.time_tiles --graphs real,paper --dims 32,64,128,256 --out DIR [--reorder rcm,lpa]

``real`` / ``paper`` expand to the real suite (natural order) and the TC-GNN/MaxK stand-ins.
Rows go to ``DIR/tiles_rows.jsonl`` as they are measured (a time-out keeps what was done); a
summary table is printed last.  Every timed result is checked against the float64 product.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from sparsegnn import Graph, sddmm, spmm
from sparsegnn.benchmark import bench_graph
from sparsegnn.datasets.suite import REAL_SUITE
from sparsegnn.datasets.synthetic import SUITES
from sparsegnn.kernels.spmm_tiles import sddmm_tiles, spmm_tiles
from sparsegnn.ops.tiles import TC_FAMILY, _run_sum, tile_encoding, translate_graph
from sparsegnn.tune import lookup

#: (swap, block_f, num_warps, chunk) launch configs of the tile SpMM
CONFIGS = [(False, 32, 4, 8), (False, 64, 4, 4), (False, 64, 4, 16), (False, 128, 8, 16), (True, 64, 4, 16),
           (True, 128, 4, 32)]


#: ``--capture``: time one call replayed from a CUDA graph (no host cost, for every provider alike)
CAPTURE = False


def _bench(fn) -> float:
    """Median ms of ``fn`` under ``do_bench`` (L2 flushed); with ``CAPTURE`` the call is captured
    into a CUDA graph first and its replay timed, so host work (Python, launch) leaves the
    figure for cuSPARSE, sampled_addmm and our ops alike.  A call that cannot be captured is
    timed eagerly (and counted as such: ``_LAST_TIMING``)."""
    from triton.testing import do_bench

    global _LAST_TIMING
    _LAST_TIMING = "eager"
    if CAPTURE:
        try:
            replay = _captured(fn)
            _LAST_TIMING = "captured"
            return float(do_bench(replay, warmup=10, rep=30, return_mode="median"))
        except Exception as exc:  # noqa: BLE001 - an op that syncs: timed eagerly below
            print(f"    capture failed ({type(exc).__name__}: {str(exc)[:80]}); timed eagerly", flush=True)
            torch.cuda.synchronize()
    return float(do_bench(fn, warmup=10, rep=30, return_mode="median"))


_LAST_TIMING = "eager"


def _captured(fn):
    """``graph.replay`` of one call of ``fn`` captured after warm-up calls on a side stream."""
    fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm().clamp(min=1e-30))


def _graphs(spec: str, max_edges: int) -> List[tuple]:
    from sparsegnn.datasets.synthetic import STAND_INS

    out = []
    for part in spec.split(","):
        if part == "real":
            out += [("real", n) for n in REAL_SUITE]
        elif part == "paper":
            out += [("paper", n) for n in SUITES["paper"] if STAND_INS[n].num_edges <= max_edges]
        elif part:
            out.append(("real" if part in REAL_SUITE else "paper", part))
    return out


def _translate_timed(g: Graph, calls: int = 11, warmup_ms: float = 0.0) -> Tuple[object, Tuple[float, float]]:
    """The graph's tiles as the library builds them before its first tile SpMM
    (``translate_graph``: the graph's cached rows of the edges, ``kernels.translate.condense``;
    the dense tiles of the edge values, ``tiles_of``, where ``ops.tiles.tile_encoding`` picks
    them; with runs the values are read per edge); ``stats.ms`` the median of ``calls`` translations after a warm one
    (allocator, kernels, the cached rows), returned with the 25th and 75th percentiles: one
    call's time swings by +-50 % with the host's jitter, and a slow spell of the H100 host
    covered 3 of 5 calls once (PROTEINS_full 0.98 ms, 0.24-0.36 ms in the runs before
    and beside it).  ``warmup_ms``: translations run back to back for that long before the
    timed ones (the GPU at its steady clocks, as the epochs it is compared with are; one warm
    call where 0)."""
    def run():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tiles = translate_graph(g)
        if tile_encoding(tiles) == "dense" and g.edge_val is not None:
            tiles.block_vals = tiles.tiles_of(g.edge_val)
        torch.cuda.synchronize()
        tiles.stats.ms = 1e3 * (time.perf_counter() - t0)
        return tiles
    start = time.perf_counter()
    run()
    while 1e3 * (time.perf_counter() - start) < warmup_ms:
        run()
    times = [run().stats.ms for _ in range(calls - 1)]   # each TileGraph freed before the next
    tiles = run()
    times = sorted(times + [tiles.stats.ms])
    tiles.stats.ms = times[calls // 2]
    return tiles, (times[calls // 4], times[(3 * calls) // 4])


def _spmm_rows(g: Graph, tiles, dims, base: Dict, emit, configs) -> None:
    csr = g.to_torch_sparse_csr()
    csr16 = torch.sparse_csr_tensor(csr.crow_indices(), csr.col_indices(), csr.values().bfloat16(), csr.shape)
    vals16 = tiles.tiles_of(g.edge_val, torch.bfloat16)
    vals32 = tiles.tiles_of(g.edge_val)
    ordered = tiles.ordered
    ev16 = None if g.edge_val is None else g.edge_val.bfloat16()
    for f in dims:
        if g.num_src * f * 8 * 3 > 0.6 * torch.cuda.mem_get_info()[0]:
            emit(dict(base, F=f, provider="skipped", note="float64 reference does not fit"))
            continue
        x = torch.randn(g.num_src, f, device="cuda")
        x16 = x.bfloat16()
        ref = torch.sparse.mm(csr.double(), x.double())
        ref16 = torch.sparse.mm(csr.double(), x16.double())
        cases = {
            ("cusparse", "fp32", ""): (lambda: torch.sparse.mm(csr, x), ref),
            ("ours", "fp32", "auto"): (lambda: spmm(g, x, edge_weight=g.edge_val), ref),
            ("ours", "tf32", "auto"): (lambda: spmm(g, x, edge_weight=g.edge_val, precision="tf32"), ref),
            # the row kernel on fp16-packed features (path 3 of the spmm_tc decisions)
            ("packed", "tf32", "rows-fp16"): (lambda: _run_sum(g, x, g.edge_val, "tf32", {"path": 3}), ref),
            ("cusparse", "bf16", ""): (lambda: torch.sparse.mm(csr16, x16), ref16),
            ("ours", "bf16", "auto"): (lambda: spmm(g, x16, edge_weight=g.edge_val), ref16),
            ("ours", "bf16", "auto-bf16"): (lambda: spmm(g, x16, edge_weight=g.edge_val, precision="bf16"), ref16),
        }
        for swap, bf, warps, chunk in configs:
            if bf > max(32, f):
                continue
            cfg = f"{'swap' if swap else 'rows'}-bf{bf}-w{warps}-c{chunk}"
            cases[("tiles", "tf32", cfg)] = (lambda s=swap, b=bf, w=warps, c=chunk: spmm_tiles(
                tiles, x, vals32, precision="tf32", block_f=b, swap=s, num_warps=w, chunk=c), ref)
            cases[("tiles", "bf16", cfg)] = (lambda s=swap, b=bf, w=warps, c=chunk: spmm_tiles(
                tiles, x16, vals16, block_f=b, swap=s, num_warps=w, chunk=c), ref16)
            if ordered:     # the runs encoding: the edge values in CSR order, no tile values
                cases[("tiles-runs", "tf32", cfg)] = (lambda s=swap, b=bf, w=warps, c=chunk: spmm_tiles(
                    tiles, x, g.edge_val, precision="tf32", block_f=b, swap=s, num_warps=w, chunk=c,
                    encoding="runs"), ref)
                cases[("tiles-runs", "bf16", cfg)] = (lambda s=swap, b=bf, w=warps, c=chunk: spmm_tiles(
                    tiles, x16, ev16, block_f=b, swap=s, num_warps=w, chunk=c, encoding="runs"), ref16)
        timed = []
        for (provider, prec, cfg), (fn, want) in cases.items():
            row = dict(base, op="spmm", F=f, provider=provider, precision=prec, config=cfg)
            try:
                row["rel_err"] = _err(fn(), want)       # the first call also tunes (ours)
                row["ms"] = _bench(fn)
                row["timing"] = _LAST_TIMING
                if cfg in ("auto", "auto-bf16") and prec != "fp32" and (prec == "tf32" or cfg == "auto-bf16"):
                    record = lookup(TC_FAMILY, g, prec, f, torch.float32 if prec == "tf32" else torch.bfloat16,
                                    x.device) or {}
                    row["pick"], row["pick_ms"] = record.get("config"), record.get("ms")
                timed.append((row, fn))
            except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                row["note"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                emit(row)
        for row, fn in timed:                            # second pass, the lower median kept
            row["ms"] = min(row["ms"], _bench(fn))
            emit(row)
        x = x16 = ref = ref16 = None   # free before the next width (not del: the lambdas above name them)


def _sddmm_rows(g: Graph, tiles, dims, base: Dict, emit) -> None:
    template = torch.sparse_csr_tensor(g.rowptr, g.col, torch.zeros(g.num_edges, device="cuda"),
                                       (g.num_nodes, g.num_src))
    rows = g.row
    for f in dims:
        a = torch.randn(g.num_nodes, f, device="cuda")
        b = torch.randn(g.num_src, f, device="cuda")
        if g.num_edges * f * 8 * 2 < 0.5 * torch.cuda.mem_get_info()[0]:
            want = (a.double()[rows] * b.double()[g.col]).sum(-1)
        else:
            want = None
        b_t = b.t()
        cases = {
            ("sampled_addmm", ""): lambda: torch.sparse.sampled_addmm(template, a, b_t, beta=0.0).values(),
            ("ours", "rowwise"): lambda: sddmm(g, a, b),
            ("ours", "auto-tf32"): lambda: sddmm(g, a, b, precision="tf32"),     # tuned rows / tiles
            ("tiles", "tf32-bf32"): lambda: sddmm_tiles(tiles, a, b, precision="tf32", block_f=32),
            ("tiles", "tf32-bf64"): lambda: sddmm_tiles(tiles, a, b, precision="tf32", block_f=64),
        }
        for (provider, cfg), fn in cases.items():
            row = dict(base, op="sddmm", F=f, provider=provider, precision="fp32", config=cfg)
            try:
                out = fn()
                row["rel_err"] = _err(out, want) if want is not None else None
                row["ms"] = _bench(fn)
                row["timing"] = _LAST_TIMING
                if (provider, cfg) == ("ours", "rowwise"):     # which exact kernel the tuner kept
                    record = lookup("sddmm", g, "dot", f, a.dtype, a.device) or {}
                    row["pick"], row["pick_ms"] = record.get("config"), record.get("ms")
            except Exception as exc:  # noqa: BLE001
                row["note"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            emit(row)


def _geo(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary(rows: List[Dict]) -> List[str]:
    """Per (suite, order, graph, F): cuSPARSE, ours, best tile config; geomeans per suite."""
    spmm_rows = [r for r in rows if r.get("op") == "spmm" and r.get("ms")]
    keys = sorted({(r["suite"], r["order"], r["nnz"], r["graph"], r["F"]) for r in spmm_rows})
    out = ["| suite | order | graph | F | cuSP fp32 | ours fp32 | tiles tf32 (cfg) | packed tf32 | auto tf32 | cuSP bf16 "
           "| ours bf16 | tiles bf16 (cfg) | auto bf16 | best tf32/cuSP32 | best bf16/cuSP32 | err tf32 | err bf16 |",
           "|" + "---|" * 17]
    ratios: Dict[tuple, List[float]] = {}
    for suite, order, _, graph, f in keys:
        sel = [r for r in spmm_rows if (r["suite"], r["order"], r["graph"], r["F"]) == (suite, order, graph, f)]

        def pick(provider, prec):
            cand = [r for r in sel if r["provider"] == provider and r["precision"] == prec and r["config"] != "auto-bf16"]
            return min(cand, key=lambda r: r["ms"]) if cand else None
        c32, o32, t32 = pick("cusparse", "fp32"), pick("ours", "fp32"), pick("tiles", "tf32")
        p32 = pick("packed", "tf32")
        c16, o16, t16 = pick("cusparse", "bf16"), pick("ours", "bf16"), pick("tiles", "bf16")
        if not (c32 and o32 and t32):
            continue
        a32 = next((r for r in sel if r["provider"] == "ours" and r["config"] == "auto" and r["precision"] == "tf32"), None)
        a16 = next((r for r in sel if r["provider"] == "ours" and r["config"] == "auto-bf16"), None)
        for tag, auto, fastest in (("auto_tf32_vs_fastest", a32, min(r["ms"] for r in (c32, o32, t32, p32) if r)),
                                   ("auto_bf16_vs_fastest", a16, min(r["ms"] for r in (c16, o16, t16) if r))):
            if auto:
                ratios.setdefault((suite, order, tag), []).append(fastest / auto["ms"])
        if a32:
            ratios.setdefault((suite, order, "auto_tf32_vs_cusp32"), []).append(c32["ms"] / a32["ms"])
        if a16:
            ratios.setdefault((suite, order, "auto_bf16_vs_cusp32"), []).append(c32["ms"] / a16["ms"])
            if c16:
                ratios.setdefault((suite, order, "auto_bf16_vs_cusp16"), []).append(c16["ms"] / a16["ms"])
        best32 = min(r["ms"] for r in (o32, t32, p32) if r)
        best16 = min(r["ms"] for r in (o16, t16) if r) if (o16 or t16) else float("nan")
        for tag, val in (("ours32", c32["ms"] / o32["ms"]), ("tiles32", c32["ms"] / t32["ms"]),
                         ("packed32", (c32["ms"] / p32["ms"]) if p32 else float("nan")),
                         ("best32", c32["ms"] / best32), ("best16", c32["ms"] / best16),
                         ("best16_vs_cusp16", (c16["ms"] / best16) if c16 else float("nan"))):
            if math.isfinite(val):
                ratios.setdefault((suite, order, tag), []).append(val)
        fmt = lambda r: f"{r['ms']:.3f}" if r else "-"  # noqa: E731
        out.append(f"| {suite} | {order} | {graph} | {f} | {fmt(c32)} | {fmt(o32)} | {fmt(t32)} ({t32['config']}) | {fmt(p32)} | {fmt(a32)} "
                   f"| {fmt(c16)} | {fmt(o16)} | {fmt(t16)} ({t16['config'] if t16 else '-'}) | {fmt(a16)} | {c32['ms'] / best32:.2f}x "
                   f"| {c32['ms'] / best16:.2f}x | {t32['rel_err']:.1e} | {t16['rel_err'] if t16 else float('nan'):.1e} |")
    out.append("")
    for (suite, order, tag), vals in sorted(ratios.items()):
        out.append(f"- {suite}/{order} {tag}: geomean {_geo(vals):.2f}x, min {min(vals):.2f}x over {len(vals)}")
    sd = [r for r in rows if r.get("op") == "sddmm" and r.get("ms")]
    sd_keys = sorted({(r["suite"], r["order"], r["graph"], r["F"]) for r in sd})
    sd_ratio: Dict[tuple, List[float]] = {}
    for key in sd_keys:
        sel = [r for r in sd if (r["suite"], r["order"], r["graph"], r["F"]) == key]
        base = [r["ms"] for r in sel if r["provider"] == "sampled_addmm"]
        rowwise = [r["ms"] for r in sel if r["provider"] == "ours" and r["config"] == "rowwise"]
        auto = [r["ms"] for r in sel if r["provider"] == "ours" and r["config"] == "auto-tf32"]
        tile = [r["ms"] for r in sel if r["provider"] == "tiles"]
        if base and rowwise and tile:
            sd_ratio.setdefault((key[0], key[1], "rowwise"), []).append(base[0] / rowwise[0])
            sd_ratio.setdefault((key[0], key[1], "best"), []).append(base[0] / min(rowwise[0], min(tile)))
            if auto:
                sd_ratio.setdefault((key[0], key[1], "auto tf32"), []).append(base[0] / auto[0])
                sd_ratio.setdefault((key[0], key[1], "auto tf32 vs best"), []).append(min(rowwise[0], min(tile)) / auto[0])
    for (suite, order, tag), vals in sorted(sd_ratio.items()):
        out.append(f"- SDDMM {suite}/{order} {tag} vs sampled_addmm: geomean {_geo(vals):.2f}x, min {min(vals):.2f}x "
                   f"over {len(vals)}")
    return out


def report(rows: List[Dict], lines: List[str], folder: Path) -> None:
    """``tiles.json`` (rows), ``tiles.md`` (the summary) and ``tiles.png`` (speedups over cuSPARSE fp32)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiles.json").write_text(json.dumps({"meta": {"script": "scripts/time_tiles.py"}, "rows": rows}, indent=0))
    captured = any(r.get("timing") == "captured" for r in rows)
    reordered = sorted({r["order"] for r in rows if r.get("order") not in (None, "natural")})
    how = ("each call captured in a CUDA graph and its replay timed (no host work for any provider), "
           if captured else "")
    head = ["# Tensor-core tiles: SpMM / SDDMM on the H100", "",
            f"`scripts/time_tiles.py --graphs real,paper --max-edges 20000000"
            f"{' --reorder ' + ','.join(reordered) if reordered else ''}{' --capture' if captured else ''}`; {how}median ms of "
            "`triton.testing.do_bench` (L2 flushed), two passes, the lower kept; rel err vs float64 in the same run. "
            "`best` = the faster of our CUDA-core kernel and the best tile config; `auto` = `spmm(..., precision=)` "
            f"as a user calls it (tuned rows / tiles / cuSPARSE{'' if captured else ', host cost included'}).", ""]
    (folder / "tiles.md").write_text("\n".join(head + lines) + "\n")
    spmm_rows = [r for r in rows if r.get("op") == "spmm" and r.get("ms") and r["order"] == "natural"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, suite in zip(axes, ("real", "paper")):
        sel = [r for r in spmm_rows if r["suite"] == suite]
        for label, prov, prec, marker in (("CUDA-core fp32", "ours", "fp32", "o"), ("tiles tf32", "tiles", "tf32", "s"),
                                          ("tiles bf16", "tiles", "bf16", "^")):
            xs, ys = [], []
            for key in sorted({(r["graph"], r["F"], r["nnz"]) for r in sel}):
                base = [r["ms"] for r in sel if (r["graph"], r["F"]) == key[:2] and r["provider"] == "cusparse"
                        and r["precision"] == "fp32"]
                mine = [r["ms"] for r in sel if (r["graph"], r["F"]) == key[:2] and r["provider"] == prov
                        and r["precision"] == prec and r["config"] != "auto-bf16"]
                if base and mine:
                    xs.append(key[2] * (1 + 0.02 * math.log2(key[1])))
                    ys.append(base[0] / min(mine))
            ax.scatter(xs, ys, marker=marker, label=label, alpha=0.7)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{suite} suite, natural order, F = 32..256")
        ax.set_xlabel("edges")
    axes[0].set_ylabel("speedup over cuSPARSE fp32")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(folder / "tiles.png", dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default="real")
    parser.add_argument("--dims", default="32,64,128,256")
    parser.add_argument("--sddmm-dims", default="32,128")
    parser.add_argument("--no-spmm", action="store_true", help="time the SDDMM only")
    parser.add_argument("--capture", action="store_true", help="time CUDA-graph replays (no host cost)")
    parser.add_argument("--translate-warmup-ms", type=float, default=0.0,
                        help="translations run back to back this long before the timed ones")
    parser.add_argument("--reorder", default="", help="comma list of Graph.reorder methods (real suite only)")
    parser.add_argument("--out", default="/tmp/sparsegnn-out")
    parser.add_argument("--max-edges", type=int, default=10**9, help="paper stand-ins up to this many edges")
    parser.add_argument("--budget-s", type=float, default=480.0, help="start no new graph after this")
    parser.add_argument("--summarise", default="", help="only print the summary of this jsonl")
    parser.add_argument("--report", default="", help="with --summarise: write tiles.json / .md / .png under this folder")
    args = parser.parse_args()
    if args.summarise:
        rows = [json.loads(line) for line in open(args.summarise)]
        lines = summary(rows)
        print("\n".join(lines))
        if args.report:
            report(rows, lines, Path(args.report))
        return 0
    global CAPTURE
    CAPTURE = args.capture
    dims = [int(v) for v in args.dims.split(",")]
    sd_dims = [int(v) for v in args.sddmm_dims.split(",") if v]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tiles_rows.jsonl"
    rows: List[Dict] = []
    sink = open(path, "a")

    def emit(row: Dict) -> None:
        rows.append(row)
        sink.write(json.dumps(row) + "\n")
        sink.flush()

    start = time.perf_counter()
    for suite, name in _graphs(args.graphs, args.max_edges):
        if time.perf_counter() - start > args.budget_s:
            print(f"budget reached: {name} and later skipped", flush=True)
            break
        t0 = time.perf_counter()
        g0 = bench_graph(name, device="cuda", real=suite == "real")
        g0 = g0.with_values(torch.rand(g0.num_edges, device="cuda", generator=None) + 0.5)
        orders = [("natural", g0, 0.0)]
        if suite == "real" and g0.ptr is None:      # a batch of graphs keeps its graphs' node ranges
            for method in [m for m in args.reorder.split(",") if m]:
                torch.cuda.synchronize()
                r0 = time.perf_counter()
                g, _ = g0.reorder(method)
                torch.cuda.synchronize()
                orders.append((method, g, 1e3 * (time.perf_counter() - r0)))
        for order, g, reorder_ms in orders:
            tiles, quartiles = _translate_timed(g, warmup_ms=args.translate_warmup_ms)
            s = tiles.stats
            base = dict(suite=suite, graph=name, order=order, nodes=g.num_nodes, nnz=g.num_edges,
                        reorder_ms=reorder_ms, windows=s.windows, blocks_plain=s.blocks_plain, blocks=s.blocks,
                        fill=s.fill, translate_ms=s.ms, translate_ms_quartiles=quartiles, ordered=tiles.ordered,
                        encoding=tile_encoding(tiles))
            emit(dict(base, op="translate", ms=s.ms))
            print(f"{suite}/{order} {name}: N={g.num_nodes} E={g.num_edges} blocks {s.blocks_plain}->{s.blocks} "
                  f"fill {s.fill:.3f} translate {s.ms:.1f} ms reorder {reorder_ms:.0f} ms", flush=True)
            configs = CONFIGS if order == "natural" else [c for c in CONFIGS if c in ((False, 64, 4, 16), (True, 128, 4, 8))]
            if not args.no_spmm:
                _spmm_rows(g, tiles, dims, base, emit, configs)
            if order == "natural" and sd_dims:
                _sddmm_rows(g, tiles, sd_dims, base, emit)
            del tiles
        del g0, orders
        torch.cuda.empty_cache()
        print(f"  {time.perf_counter() - t0:.1f} s", flush=True)
    sink.close()
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
