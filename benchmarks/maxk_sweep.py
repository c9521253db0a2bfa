"""MaxK-GNN's k sweep: accuracy and epoch time of the MaxK model for several ``k`` against its ReLU baseline.

For one dataset and conv (``sage``, ``gcn``, ``gin``) it trains :class:`~sparsegnn.nn.MaxKGNN`
with ``nonlinearity="relu"`` (the baseline) and with MaxK for every ``k``, ``runs`` seeds each
(:func:`~sparsegnn.training.train_node_classifier`: full graph, Adam, the mean epoch time over
the second half of the epochs), and reports per configuration the mean final test accuracy, the
mean (and spread of the) test accuracy at the best validation epoch, the mean epoch time, the
speedup over ReLU and the per-seed values.  ``python -m benchmarks.maxk_sweep`` writes
``maxk_sweep.json`` (``{"meta", "rows"}``), ``maxk_sweep.md`` and ``maxk_sweep.png``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from sparsegnn.datasets import NodeDataset
from benchmarks import run_command
from sparsegnn.cli import (MATMUL_PRECISIONS, _LINEAR_FIRST_SAGE, _MATMUL_HELP, _add_data_args, _default_device, _dims,
                           _float_in, _matmul_precision, _non_negative_int, _Parser, _path_problem, _positive_int)
from sparsegnn.training import train_node_classifier

#: The ``k`` values of ``maxk-sweep`` by default (hidden 256).
DEFAULT_KS = (8, 16, 32, 64, 128)


def device_name(device) -> str:
    """A readable name of ``device``: the GPU's name on CUDA, the CPU's otherwise."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _std(values: Sequence[float]) -> float:
    """Sample standard deviation (0 for one value)."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _row(label: str, k: Optional[int], results) -> dict:
    per_seed = lambda key: [getattr(r, key) for r in results]  # noqa: E731
    best = per_seed("test_acc_at_best_val")
    return {
        "config": label, "nonlinearity": "relu" if k is None else "maxk", "k": k,
        "test_acc": statistics.fmean(per_seed("test_acc")),
        "test_acc_at_best_val": statistics.fmean(best), "test_acc_at_best_val_std": _std(best),
        "best_val_acc": statistics.fmean(per_seed("best_val_acc")),
        "mean_epoch_ms": statistics.fmean(per_seed("mean_epoch_ms")),
        "seeds": per_seed("seed"), "test_acc_per_seed": per_seed("test_acc"),
        "test_acc_at_best_val_per_seed": best, "epoch_ms_per_seed": per_seed("mean_epoch_ms"),
    }


def maxk_sweep(data: NodeDataset, model: str = "sage", ks: Sequence[int] = DEFAULT_KS, epochs: int = 200,
               runs: int = 1, seed: int = 0, device: str = "cpu", lr: float = 0.01, weight_decay: float = 5e-4,
               hidden: Optional[int] = None, dropout: Optional[float] = None, backend: str = "auto",
               progress: bool = True, linear_first: bool = False) -> Dict[str, object]:
    """Train the ReLU baseline and MaxK with every ``k`` of ``ks``, ``runs`` seeds each (module doc).

    Args:
        data: the node-classification dataset.
        model: ``"sage"``, ``"gcn"`` or ``"gin"``.
        ks: the MaxK ``k`` values, each in ``[1, hidden]``.
        epochs, lr, weight_decay, hidden, dropout, backend: as in ``train_node_classifier``
            (``hidden`` / ``dropout`` default to MaxK-GNN's 256 / 0.5).
        runs: seeds per configuration: ``seed, seed + 1, ...``.
        device: where to train.
        progress: a progress bar over the runs (tqdm).
        linear_first: GCN / GIN as the authors' models (MaxK on each layer's linear output), for
            MaxK and its ReLU baseline alike.

    Returns:
        ``{"meta": {...}, "rows": [relu row, k rows...]}``; each row holds ``config``, ``k``,
        ``test_acc``, ``test_acc_at_best_val`` (+ ``_std``), ``best_val_acc``, ``mean_epoch_ms``,
        ``speedup`` (ReLU epoch ms / this one's) and the per-seed lists.
    """
    fn = "maxk_sweep"
    if runs < 1:
        raise ValueError(f"{fn}(): runs must be >= 1, got {runs}")
    ks = list(ks)
    if not ks:
        raise ValueError(f"{fn}(): ks must hold at least one k")
    width = 256 if hidden is None else hidden
    bad = [k for k in ks if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= width]
    if bad:
        raise ValueError(f"{fn}(): every k must be an int in [1, hidden = {width}], got {bad}")
    if linear_first and model == "sage":
        raise ValueError(f"{fn}(): linear_first is for gcn / gin (MaxK after their linear map); sage's placement "
                         "is already the authors'")
    configs = [("relu", None)] + [(f"k={k}", k) for k in ks]
    from tqdm.auto import tqdm

    bar = tqdm(total=len(configs) * runs, desc=f"maxk-sweep {model}/{data.name}", disable=not progress)
    rows: List[dict] = []
    try:
        for label, k in configs:
            results = []
            for run in range(runs):
                bar.set_postfix(config=label, seed=seed + run)
                results.append(train_node_classifier(
                    data, model, epochs=epochs, lr=lr, weight_decay=weight_decay, hidden=hidden, dropout=dropout,
                    seed=seed + run, device=device, backend=backend, progress=False,
                    maxk="relu" if k is None else k, maxk_linear_first=linear_first))
                bar.update(1)
            rows.append(_row(label, k, results))
    finally:
        bar.close()
    relu_ms = rows[0]["mean_epoch_ms"]
    for row in rows:
        row["speedup"] = relu_ms / row["mean_epoch_ms"] if row["mean_epoch_ms"] > 0 else float("nan")
    meta = {
        "dataset": data.name, "model": model, "device": device_name(device), "device_arg": str(device),
        "nodes": data.graph.num_nodes, "edges": data.graph.num_edges, "features": int(data.x.shape[1]),
        "classes": data.num_classes, "epochs": epochs, "runs": runs, "seed": seed, "lr": lr,
        "weight_decay": weight_decay, "hidden": width, "dropout": 0.5 if dropout is None else dropout,
        "num_layers": 3, "ks": ks, "backend": backend, "linear_first": bool(linear_first),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }
    return {"meta": meta, "rows": rows}


def _pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.2f}"


def markdown(result: Dict[str, object]) -> str:
    """The sweep as a markdown table: k, test accuracy (at best val, +- std), epoch ms, speedup over ReLU."""
    meta, rows = result["meta"], result["rows"]
    placement = ", linear first: MaxK on each layer's linear output" if meta.get("linear_first") else ""
    lines = [f"# MaxK sweep: {meta['model']} on {meta['dataset']} ({meta['device']})", "",
             f"MaxKGNN ({meta['num_layers']} layers, hidden {meta['hidden']}, dropout {meta['dropout']}"
             f"{placement}), "
             f"{meta['epochs']} epochs, lr {meta['lr']}, weight decay {meta['weight_decay']}, "
             f"matmul precision {meta.get('matmul_precision', 'highest')}, {meta['runs']} seed(s) "
             f"from {meta['seed']}; {meta['date']}, torch {meta['torch']}.  Test accuracy at the best validation "
             "epoch (mean +- sample std over seeds) and at the last epoch; epoch ms: forward + backward + Adam step, "
             "mean over the second half of the epochs.", "",
             "| k | test acc at best val (%) | final test acc (%) | epoch ms | speedup over relu |",
             "|---|---|---|---|---|"]
    for row in rows:
        k = "relu" if row["k"] is None else str(row["k"])
        lines.append(f"| {k} | {_pct(row['test_acc_at_best_val'])} +- {100 * row['test_acc_at_best_val_std']:.2f} | "
                     f"{_pct(row['test_acc'])} | {row['mean_epoch_ms']:.2f} | {row['speedup']:.2f}x |")
    return "\n".join(lines) + "\n"


def plot(result: Dict[str, object], path) -> None:
    """Test accuracy (at best val) against epoch time, one labelled point per k, ReLU marked
    (needs matplotlib: ``ImportError`` otherwise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, rows = result["meta"], result["rows"]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    maxk_rows = [r for r in rows if r["k"] is not None]
    ax.plot([r["mean_epoch_ms"] for r in maxk_rows], [100 * r["test_acc_at_best_val"] for r in maxk_rows],
            "o-", color="tab:blue", label="MaxK")
    for r in maxk_rows:
        ax.annotate(f"k={r['k']}", (r["mean_epoch_ms"], 100 * r["test_acc_at_best_val"]),
                    textcoords="offset points", xytext=(4, 4), fontsize=8)
    for r in rows:
        if r["k"] is None:
            ax.plot([r["mean_epoch_ms"]], [100 * r["test_acc_at_best_val"]], "*", color="tab:red", markersize=14,
                    label="ReLU")
    ax.set_xlabel("epoch time (ms)")
    ax.set_ylabel("test accuracy at best val (%)")
    ax.set_title(f"MaxK sweep: {meta['model']} on {meta['dataset']} ({meta['device']})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out_dir, stem: str, report: Dict[str, object], text: str) -> Dict[str, Path]:
    """``<out_dir>/<stem>.json`` (``report``) and ``<stem>.md`` (``text``), the folder made if
    needed; returns the two paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md"}
    paths["json"].write_text(json.dumps(report, indent=1))
    paths["md"].write_text(text)
    return paths


def write_sweep(result: Dict[str, object], out_dir, stem: str = "maxk_sweep") -> Dict[str, Path]:
    """``<out_dir>/<stem>.json``, ``.md`` and ``.png`` (the plot skipped, with a note on stderr,
    when matplotlib is missing); returns the paths written."""
    import sys

    out = Path(out_dir)
    paths = write_report(out, stem, result, markdown(result))
    try:
        plot(result, out / f"{stem}.png")
        paths["png"] = out / f"{stem}.png"
    except ImportError:
        print("maxk-sweep: matplotlib not installed, no plot", file=sys.stderr)
    return paths


# the command line: python -m benchmarks.maxk_sweep --dataset cora --ks 8,16,32,64,128 --out DIR
def _run(args: argparse.Namespace) -> int:
    with _matmul_precision(args.matmul_precision):
        return _maxk_sweep(args)


def _maxk_sweep(args: argparse.Namespace) -> int:
    from sparsegnn.datasets import load

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("maxk-sweep: --device cuda requested but no CUDA device is available", file=sys.stderr)
        return 2
    problem = _path_problem(args, outputs=[("--out", "out")])
    if problem is not None:
        print(f"maxk-sweep: {problem}", file=sys.stderr)
        return 2
    hidden = 256 if args.hidden is None else args.hidden
    bad = [k for k in args.ks if k > hidden]
    if bad:
        print(f"maxk-sweep: every k must be in [1, hidden = {hidden}], got {bad}", file=sys.stderr)
        return 2
    if args.linear_first and args.model == "sage":
        print("maxk-sweep: " + _LINEAR_FIRST_SAGE.replace("--maxk-linear-first", "--linear-first"), file=sys.stderr)
        return 2
    data = load(args.dataset, root=args.root, data_dir=args.data_dir)
    progress = sys.stderr.isatty() or args.progress
    result = maxk_sweep(data, args.model, args.ks, epochs=args.epochs, runs=args.runs, seed=args.seed,
                        device=args.device, lr=args.lr, weight_decay=args.weight_decay, hidden=args.hidden,
                        dropout=args.dropout, backend=args.backend, progress=progress, linear_first=args.linear_first)
    paths = write_sweep(result, args.out)
    print(markdown(result))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    sweep = _Parser(prog="python -m benchmarks.maxk_sweep",
                    description="MaxK-GNN's k sweep: accuracy and epoch time of MaxK models for several k against the "
                                "ReLU baseline (JSON, markdown, plot)")
    _add_data_args(sweep)
    sweep.add_argument("--model", default="sage", choices=["sage", "gcn", "gin"])
    sweep.add_argument("--linear-first", action="store_true",
                       help="--model gcn / gin as the authors' models: MaxK (or ReLU) on each layer's linear output")
    sweep.add_argument("--ks", type=_dims, default=[8, 16, 32, 64, 128], help="comma-separated k values "
                                                                           "(default 8,16,32,64,128)")
    sweep.add_argument("--epochs", type=_positive_int, default=200)
    sweep.add_argument("--matmul-precision", default="highest", choices=MATMUL_PRECISIONS, help=_MATMUL_HELP)
    sweep.add_argument("--runs", type=_positive_int, default=1, help="seeds per configuration: seed, seed+1, ...")
    sweep.add_argument("--seed", type=_non_negative_int, default=0)
    sweep.add_argument("--lr", type=_float_in(0.0, open_low=True), default=0.01)
    sweep.add_argument("--weight-decay", type=_float_in(0.0), default=5e-4)
    sweep.add_argument("--hidden", type=_positive_int, default=None, help="hidden width (default 256)")
    sweep.add_argument("--dropout", type=_float_in(0.0, 1.0, open_high=True), default=None, help="dropout (default 0.5)")
    sweep.add_argument("--device", default=_default_device())
    sweep.add_argument("--backend", default="auto", choices=["auto", "reference", "triton"])
    sweep.add_argument("--out", default="benchmarks/local", help="folder for maxk_sweep.json / .md / .png")
    sweep.add_argument("--progress", action="store_true", help="show the progress bar even when not on a terminal")
    return sweep


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(build_parser(), _run, argv)


if __name__ == "__main__":
    sys.exit(main())
