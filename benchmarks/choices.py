"""Choices on graphs nobody tuned on: what a precision mode buys over the exact call, and our
exact / bf16 kernels against cuSPARSE, on the real suite and the stand-ins (GPU).

    python -m benchmarks.choices --data .data --out benchmarks/local/choices
    python -m benchmarks.choices --sections precision --graphs cora,reddit --dims 32,256
    python -m benchmarks.choices --from-json a/choices.json b/choices.json --out DIR   # outputs of runs

Sections (each row measured in one process, every provider side by side):

- ``precision``: ``spmm(g, x, precision=p)`` against the exact ``spmm(g, x)``, both called
  eagerly in paired rounds (one group of calls of each a round, the order alternating; the
  ratio is the median of the rounds' ratios: ``sparsegnn.benchmark.precision_report``), for tf32 and bf16 on
  fp32 features; the graph is reused (invested in: ``SPARSEGNN_INVEST=always``), every
  candidate timed (``SPARSEGNN_TUNE=exhaustive``), so the pick shown is the tuner's.
- ``exact``: exact fp32 SpMM with cuSPARSE removed from our candidates against cuSPARSE
  (``torch.sparse.mm`` on a CSR tensor, its fastest input), and bf16 features on our kernels
  against cuSPARSE bf16; eager calls in ``PRECISION_ROUNDS`` interleaved rounds (the least of
  each side: the host's slow mode can last a whole round), error against float64 on graphs up to
  ``REFERENCE_MAX_EDGES`` edges (above, against our exact fp32 result).

Writes ``choices.json`` and ``choices.md`` (and ``choices.png`` with matplotlib) under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

REAL = ("cora", "citeseer", "deezer", "lastfm", "twitch", "wikipedia", "roadnet-pa-excerpt", "reddit-threads-10k",
        "PROTEINS_full", "ENZYMES", "tox21")
STAND_INS = ("pubmed", "ppi", "artist", "com-amazon", "soc-BlogCatalog", "DD", "amazon0505", "yelp", "reddit")
#: Graphs whose error is checked against the float64 reference (larger: against our exact fp32).
REFERENCE_MAX_EDGES = 20_000_000


def _graph(name: str, data: Optional[Path]):
    from sparsegnn.benchmark import bench_graph

    return bench_graph(name, device="cuda", data_dir=data, real=name in REAL)


def _cases(args) -> List[str]:
    return args.graphs.split(",") if args.graphs else list(REAL) + list(STAND_INS)


def _geomean(values) -> float:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def section_precision(args, budget) -> List[dict]:
    from sparsegnn.benchmark import precision_report

    rows = []
    for name in _cases(args):
        if budget.spent():
            print(f"  precision: budget spent, {name} and later graphs not run", flush=True)
            break
        try:
            got = precision_report([name], args.dims, ("tf32", "bf16"), real=name in REAL, data_dir=args.data)
        except (ImportError, FileNotFoundError, ValueError) as exc:   # a dataset this machine lacks
            print(f"  precision: {name} skipped ({exc})", flush=True)
            continue
        for r in got:
            print(f"  {name:20s} F={r['F']:>3d} {r['precision']}: pick {r['pick']} call {r['precision_call_ms']:.4f} "
                  f"exact {r['exact_call_ms']:.4f} ms ({r['speedup']:.2f}x)", flush=True)
        rows += got
        torch.cuda.empty_cache()
    return rows


def _relative_error(out: torch.Tensor, want: torch.Tensor) -> float:
    return float((out.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def section_exact(args, budget) -> List[dict]:
    import sparsegnn as sg
    from sparsegnn.benchmark import PRECISION_ROUNDS, eager_ms
    from sparsegnn.ops import _triton

    rows = []
    os.environ["SPARSEGNN_INVEST"] = "always"
    for name in _cases(args):
        if budget.spent():
            print(f"  exact: budget spent, {name} and later graphs not run", flush=True)
            break
        try:
            g = _graph(name, args.data)
        except (ImportError, FileNotFoundError, ValueError) as exc:
            print(f"  exact: {name} skipped ({exc})", flush=True)
            continue
        gen = torch.Generator(device="cuda").manual_seed(0)
        g = g.with_values(torch.rand(g.num_edges, device="cuda", generator=gen) + 0.5)
        csr32 = g.to_torch_sparse_csr(torch.float32)
        csr16 = g.to_torch_sparse_csr(torch.bfloat16)
        for num_feats in args.dims:
            x = torch.randn(g.num_src, num_feats, device="cuda", generator=gen)
            if g.num_edges <= REFERENCE_MAX_EDGES:
                want = sg.spmm(g.with_values(g.edge_val.double()), x.double(), backend="reference")
            else:
                want = sg.spmm(g, x)
            row = {"graph": name, "edges": g.num_edges, "F": num_feats}
            if num_feats >= 128:
                saved = _triton.VENDOR_MIN_WORK
                _triton.VENDOR_MIN_WORK = 1 << 62          # cuSPARSE out of our candidates
                try:
                    ours = lambda: sg.spmm(g, x)  # noqa: E731
                    row["fp32_err"] = _relative_error(ours(), want)
                    vendor = lambda: torch.sparse.mm(csr32, x)  # noqa: E731
                    t_ours, t_vendor = [], []
                    for _ in range(PRECISION_ROUNDS):
                        t_ours.append(eager_ms(ours))
                        t_vendor.append(eager_ms(vendor))
                    row["fp32_ours_ms"], row["fp32_cusparse_ms"] = min(t_ours), min(t_vendor)
                    row["fp32_speedup"] = row["fp32_cusparse_ms"] / row["fp32_ours_ms"]
                finally:
                    _triton.VENDOR_MIN_WORK = saved
            xb = x.to(torch.bfloat16)
            ours = lambda: sg.spmm(g, xb)  # noqa: E731
            row["bf16_err"] = _relative_error(ours(), want)
            t_ours, t_vendor = [], []
            try:
                vendor = lambda: torch.sparse.mm(csr16, xb)  # noqa: E731
                vendor()
            except RuntimeError as exc:                   # cuSPARSE rejects some bf16 structures
                vendor, row["bf16_cusparse_error"] = None, str(exc).splitlines()[0][:100]
            for _ in range(PRECISION_ROUNDS):
                t_ours.append(eager_ms(ours))
                if vendor is not None:
                    t_vendor.append(eager_ms(vendor))
            row["bf16_ours_ms"] = min(t_ours)
            row["bf16_cusparse_ms"] = min(t_vendor) if t_vendor else None
            row["bf16_speedup"] = row["bf16_cusparse_ms"] / row["bf16_ours_ms"] if t_vendor else None
            rows.append(row)
            fp32 = f"fp32 {row['fp32_ours_ms']:.4f} / cusp {row['fp32_cusparse_ms']:.4f} ({row['fp32_speedup']:.2f}x) " \
                if "fp32_ours_ms" in row else ""
            bf16 = f"bf16 {row['bf16_ours_ms']:.4f} / cusp {row['bf16_cusparse_ms'] or float('nan'):.4f}"
            print(f"  {name:20s} F={num_feats:>3d} {fp32}{bf16}", flush=True)
        g = csr32 = csr16 = x = xb = want = None  # noqa: F841
        torch.cuda.empty_cache()
    return rows


def summary(results: Dict[str, list], meta: Dict[str, dict]) -> str:
    runs = "; ".join(f"{name}: {m['device']}, torch {m['torch']}, {m['date']}" for name, m in meta.items())
    lines = ["# Choices on graphs nobody tuned on", "", f"Runs ({runs}); each section's providers side by side in its run.", ""]
    notes = [f"- {name}: {m['note']}" for name, m in meta.items() if m.get("note")]
    lines += notes + [""] if notes else []
    rows = results.get("precision", [])
    if rows:
        from sparsegnn.benchmark import precision_markdown

        lines += ["## Precision modes against the exact call (eager calls, graph reused)", ""]
        for precision in ("tf32", "bf16"):
            sel = [r for r in rows if r["precision"] == precision]
            if not sel:
                continue
            big = [r["speedup"] for r in sel if r["edges"] >= 1_000_000]
            # a case whose pick is the exact call runs the exact call's code: its ratio is the
            # spread of two timings of one call, reported apart from the reduced picks'
            reduced = [r for r in sel if (r.get("pick") or {}).get("path", 0) != 0]
            same = [r["speedup"] for r in sel if (r.get("pick") or {}).get("path", 0) == 0]
            line = (f"- `{precision}`: {len(sel)} cases, geomean {_geomean([r['speedup'] for r in sel]):.2f}x "
                    f"the exact call; graphs of >= 1M edges: geomean {_geomean(big):.2f}x over {len(big)} cases; "
                    f"{len(reduced)} reduced picks")
            if reduced:
                worst = min(reduced, key=lambda r: r["speedup"])
                line += f" (geomean {_geomean([r['speedup'] for r in reduced]):.2f}x, worst {worst['speedup']:.2f}x, " \
                        f"{worst['graph']} F={worst['F']})"
            if same:
                line += f"; {len(same)} exact picks (the same call timed twice: {min(same):.2f}x-{max(same):.2f}x)"
            lines.append(line)
        lines += ["", precision_markdown(rows), ""]
    rows = results.get("exact", [])
    if rows:
        wide = [r for r in rows if "fp32_speedup" in r]
        bf16 = [r for r in rows if r.get("bf16_speedup")]
        lines += ["## Our exact fp32 (cuSPARSE not a candidate) and bf16 kernels against cuSPARSE (eager calls)", ""]
        if wide:
            worst = min(wide, key=lambda r: r["fp32_speedup"])
            lines.append(f"- fp32, F >= 128: geomean {_geomean([r['fp32_speedup'] for r in wide]):.2f}x cuSPARSE, "
                         f"worst {worst['fp32_speedup']:.2f}x ({worst['graph']} F={worst['F']}), {len(wide)} cases")
        if bf16:
            worst = min(bf16, key=lambda r: r["bf16_speedup"])
            lines.append(f"- bf16: geomean {_geomean([r['bf16_speedup'] for r in bf16]):.2f}x cuSPARSE bf16, worst "
                         f"{worst['bf16_speedup']:.2f}x ({worst['graph']} F={worst['F']}), {len(bf16)} cases")
        lines += ["", "| graph | edges | F | fp32 ours ms | fp32 cuSPARSE ms | x | bf16 ours ms | bf16 cuSPARSE ms | x | "
                      "error fp32 / bf16 |", "|---|---|---|---|---|---|---|---|---|---|"]
        fmt = lambda v, spec=".4f": "-" if v is None else format(v, spec)  # noqa: E731
        for r in rows:
            lines.append(f"| {r['graph']} | {r['edges']:,} | {r['F']} | {fmt(r.get('fp32_ours_ms'))} | "
                         f"{fmt(r.get('fp32_cusparse_ms'))} | {fmt(r.get('fp32_speedup'), '.2f')} | "
                         f"{fmt(r['bf16_ours_ms'])} | {fmt(r.get('bf16_cusparse_ms'))} | "
                         f"{fmt(r.get('bf16_speedup'), '.2f')} | {fmt(r.get('fp32_err'), '.1e')} / "
                         f"{fmt(r['bf16_err'], '.1e')} |")
    return "\n".join(lines) + "\n"


def plot(results: Dict[str, list], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("precision", "tf32", "speedup", "tf32 vs exact"), ("precision", "bf16", "speedup", "bf16 vs exact"),
              ("exact", None, "fp32_speedup", "exact fp32 vs cuSPARSE"), ("exact", None, "bf16_speedup", "bf16 vs cuSPARSE bf16")]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), sharey=False)
    for ax, (section, precision, key, title) in zip(axes, panels):
        rows = [r for r in results.get(section, []) if (precision is None or r.get("precision") == precision)
                and r.get(key)]
        for num_feats in sorted({r["F"] for r in rows}):
            sel = [r for r in rows if r["F"] == num_feats]
            ax.scatter([r["edges"] for r in sel], [r[key] for r in sel], label=f"F={num_feats}", s=14)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("edges")
        ax.set_title(title)
        if rows:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("speedup (x)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


class _Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.perf_counter() + seconds

    def spent(self) -> bool:
        return time.perf_counter() > self.end


SECTIONS = {"precision": section_precision, "exact": section_exact}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.choices", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="the datasets folder (real suite)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/local/choices"))
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--graphs", default=None, help="comma-separated graph names (default: real suite + stand-ins)")
    parser.add_argument("--dims", default="32,64,128,256")
    parser.add_argument("--budget-s", type=float, default=1e9, help="stop starting new graphs after this many seconds per section")
    parser.add_argument("--from-json", type=Path, nargs="+", default=None,
                        help="no run: write the outputs from these choices.json files (a later file's section replaces an earlier one's)")
    args = parser.parse_args(argv)
    args.dims = [int(d) for d in args.dims.split(",")]
    if args.from_json:
        results, meta = {}, {}
        for path in args.from_json:
            data = json.loads(path.read_text())
            for name in SECTIONS:
                if data.get(name):
                    results[name] = data[name]
                    meta[name] = data["meta"].get(name, data["meta"])
        _write(args.out, results, meta)
        return 0
    if not torch.cuda.is_available():
        print("benchmarks.choices: needs a CUDA device", file=sys.stderr)
        return 2
    sections = args.sections.split(",")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        print(f"benchmarks.choices: unknown sections {unknown}; known: {list(SECTIONS)}", file=sys.stderr)
        return 2
    results = {}
    for name in sections:
        print(f"== {name}", flush=True)
        results[name] = SECTIONS[name](args, _Budget(args.budget_s))
    run = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    _write(args.out, results, {name: run for name in results})
    return 0


def _write(out: Path, results: Dict[str, list], meta: Dict[str, dict]) -> None:
    """``choices.json`` (rows and each section's run), ``choices.md`` and ``choices.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "choices.json").write_text(json.dumps({"meta": meta, **results}, indent=1))
    text = summary(results, meta)
    (out / "choices.md").write_text(text)
    try:
        plot(results, out / "choices.png")
    except ImportError:
        pass
    print(text)


if __name__ == "__main__":
    raise SystemExit(main())
