"""Markdown tables (speedups vs a baseline, geometric means) and a PNG plot from benchmark rows."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, List

BASELINE = {"spmm": "cusparse", "spmm-mean": "pyg-scatter", "spmm-max": "pyg-scatter", "sddmm": "sampled_addmm"}


def _geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def speedups(rows: List[dict], op: str, baseline: str, provider: str = "sparsegnn") -> Dict[tuple, float]:
    """``(graph, F, dtype) -> baseline ms / provider ms`` where both ran."""
    times = {(r["graph"], r["F"], r["dtype"], r["provider"]): r["ms"] for r in rows if r["op"] == op and r["ms"]}
    out = {}
    for (g, f, d, p), ms in times.items():
        if p == provider and (g, f, d, baseline) in times:
            out[(g, f, d)] = times[(g, f, d, baseline)] / ms
    return out


def markdown(rows: List[dict], meta: dict) -> str:
    lines = [f"# Benchmarks: {meta.get('device', '?')}", "",
             f"torch {meta.get('torch')}, triton {meta.get('triton')}, {meta.get('date')}; "
             "median ms of `triton.testing.do_bench`; rel_err vs the float64 reference in the same run.", ""]
    by_op = defaultdict(list)
    for r in rows:
        by_op[r["op"]].append(r)
    for op, op_rows in by_op.items():
        providers = sorted({r["provider"] for r in op_rows}, key=lambda p: (p != "sparsegnn", p))
        base = BASELINE.get(op)
        lines += [f"## {op}", "", "| graph | nodes | nnz | F | dtype | " + " | ".join(f"{p} ms" for p in providers)
                  + f" | speedup vs {base} | max rel_err |",
                  "|" + "---|" * (7 + len(providers))]
        cases = sorted({(r["graph"], r["nodes"], r["nnz"], r["F"], r["dtype"]) for r in op_rows},
                       key=lambda c: (c[2], c[0], c[3], c[4]))
        sp = speedups(rows, op, base) if base else {}
        for g, n, e, f, d in cases:
            cells, errs = [], []
            for p in providers:
                r = next((r for r in op_rows if (r["graph"], r["F"], r["dtype"], r["provider"]) == (g, f, d, p)), None)
                if r is None:
                    cells.append("")
                elif r["ms"] is None:
                    cells.append(r["note"] or "-")
                else:
                    cells.append(f"{r['ms']:.3f}")
                    errs.append(r["rel_err"])
            s = sp.get((g, f, d))
            speed = f"{s:.2f}x" if s else "-"
            err = f"{max(errs):.1e}" if errs else "-"
            lines.append(f"| {g} | {n:,} | {e:,} | {f} | {d} | " + " | ".join(cells) + f" | {speed} | {err} |")
        if sp:
            worst = min(sp.items(), key=lambda kv: kv[1])
            lines += ["", f"**Geomean speedup of sparsegnn over {base}: {_geomean(list(sp.values())):.2f}x** "
                      f"over {len(sp)} cases; worst {worst[1]:.2f}x ({worst[0][0]}, F={worst[0][1]}, {worst[0][2]}); "
                      f"best {max(sp.values()):.2f}x.", ""]
            for d in sorted({k[2] for k in sp}):
                for f in sorted({k[1] for k in sp}):
                    vals = [v for k, v in sp.items() if k[1] == f and k[2] == d]
                    if vals:
                        lines.append(f"- {d}, F={f}: geomean {_geomean(vals):.2f}x, min {min(vals):.2f}x")
            lines.append("")
        vendor = [r for r in op_rows if r["provider"] == "sparsegnn" and (r.get("extra") or {}).get("kernel") == "cusparse"]
        if vendor:
            lines += ["Cases where sparsegnn ran cuSPARSE (timed faster than our best schedule by the tuner's "
                      "`spmm_vendor` decision; the tuner's own reading of that schedule, cold L2, follows):", ""]
            lines += [f"- {r['graph']}, F={r['F']}, {r['dtype']}: our schedule "
                      f"{r['extra'].get('tuned_ms') or float('nan'):.3f} ms" for r in vendor]
            lines.append("")
    return "\n".join(lines)


def plot(rows: List[dict], path) -> None:
    """Speedup of sparsegnn over each op's baseline, one panel per op (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in BASELINE if speedups(rows, op, BASELINE[op])]
    if not ops:
        return
    fig, axes = plt.subplots(len(ops), 1, figsize=(12, 3.2 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        sp = speedups(rows, op, BASELINE[op])
        graphs = sorted({k[0] for k in sp}, key=lambda g: next(r["nnz"] for r in rows if r["graph"] == g))
        dims = sorted({k[1] for k in sp})
        width = 0.8 / max(len(dims), 1)
        for i, f in enumerate(dims):
            vals = [sp.get((g, f, "float32"), sp.get((g, f, "bfloat16"), 0)) for g in graphs]
            ax.bar([j + i * width for j in range(len(graphs))], vals, width, label=f"F={f}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(graphs))])
        ax.set_xticklabels(graphs, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"speedup vs {BASELINE[op]}")
        ax.set_title(op)
        ax.legend(fontsize=7, ncol=len(dims))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
