"""Plots of MaxK evidence from the JSON that the benchmark scripts write (no torch needed).

* ``train``: the epoch ms of every provider in one or more ``bench_maxk_train.py`` runs (``maxk_train.json``),
  side by side (e.g. fp32 and TF32 GEMMs);
* ``accuracy``: MaxK minus ReLU test accuracy per dataset, with +-2 standard errors of the paired
  per-seed differences, for one or more ``maxk_accuracy.py`` runs (``maxk_accuracy.json``).

Each input is ``PATH=LABEL``::

    python scripts/plot_maxk_evidence.py train --out t.png runs/fp32/maxk_train.json=fp32 runs/tf32/maxk_train.json=TF32
    python scripts/plot_maxk_evidence.py accuracy --out a.png old/maxk_accuracy.json=before new/maxk_accuracy.json=after
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Dict, List, Sequence, Tuple


def _inputs(specs: Sequence[str]) -> List[Tuple[str, dict]]:
    runs = []
    for spec in specs:
        path, sep, label = spec.partition("=")
        if not sep or not label:
            raise SystemExit(f"plot_maxk_evidence: expected PATH=LABEL, got {spec!r}")
        with open(path) as fh:
            runs.append((label, json.load(fh)))
    return runs


def paired_gap(row: dict) -> Tuple[float, float, int]:
    """(mean, standard error, seeds) of MaxK minus ReLU in points over the row's paired seeds."""
    diffs = [100.0 * (m - r) for r, m in zip(row["relu_per_seed"], row["maxk_per_seed"])]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return statistics.mean(diffs), se, len(diffs)


def plot_train(runs: List[Tuple[str, dict]], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    providers: List[str] = []
    for _, report in runs:
        for row in report["rows"]:
            if row.get("ms") is not None and row["provider"] not in providers:
                providers.append(row["provider"])
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(providers) * len(runs)))
    height = 0.8 / len(runs)
    for i, (label, report) in enumerate(runs):
        ms: Dict[str, float] = {r["provider"]: r["ms"] for r in report["rows"] if r.get("ms") is not None}
        ys = [p + (i - (len(runs) - 1) / 2) * height for p in range(len(providers))]
        bars = ax.barh(ys, [ms.get(p, float("nan")) for p in providers], height=height, label=label)  # missing: no bar
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
    ax.set_yticks(range(len(providers)), providers)
    ax.invert_yaxis()
    ax.set_xlabel("epoch ms (lower is better)")
    ax.set_title(f"MaxK-GNN training epoch, {runs[0][1]['rows'][0].get('graph', '')}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def plot_accuracy(runs: List[Tuple[str, dict]], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets: List[str] = []
    for _, report in runs:
        for row in report["rows"]:
            if row["dataset"] not in datasets:
                datasets.append(row["dataset"])
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(runs)
    for i, (label, report) in enumerate(runs):
        gaps = {row["dataset"]: paired_gap(row) for row in report["rows"]}
        xs = [d + (i - (len(runs) - 1) / 2) * width for d in range(len(datasets)) if datasets[d] in gaps]
        vals = [gaps[name] for name in datasets if name in gaps]
        ax.bar(xs, [v[0] for v in vals], width=width, yerr=[2 * v[1] for v in vals], capsize=3,
               label=f"{label} ({vals[0][2]} seeds)" if vals else label)
    ax.axhline(-1.0, color="tab:red", linestyle="--", linewidth=1, label="bar: 1 point below ReLU")
    ax.axhline(0.0, color="black", linewidth=0.5)
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_ylabel("MaxK - ReLU test accuracy, points (+-2 se)")
    ax.set_title("MaxK (k = 32 of 256) against the ReLU model")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["train", "accuracy"])
    parser.add_argument("inputs", nargs="+", help="PATH=LABEL, one per run")
    parser.add_argument("--out", required=True, help="the .png to write")
    args = parser.parse_args(argv)
    runs = _inputs(args.inputs)
    (plot_train if args.kind == "train" else plot_accuracy)(runs, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
