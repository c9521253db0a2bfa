"""MaxK against ReLU with each model's hyperparameters chosen on validation.

``maxk_accuracy.py`` trains both models with one fixed setting (dropout 0.5, weight decay 5e-4).
A setting fixed for both can suit one model better than the other. Here each model gets its own
setting, chosen by **validation** accuracy only, and is then tested on seeds that played no part
in the choice:

1. **Selection.** Every (dropout, weight decay) of the grid trains ReLU and MaxK (k = 32)
   ``MaxKGNN`` (GraphSAGE, 3 layers, hidden 256, LayerNorm) on seeds ``0 .. --select-seeds - 1``.
   Each model keeps the setting of its highest mean best-validation accuracy.
2. **Evaluation.** Both chosen settings, and the shipped one for comparison, train on the fresh
   seeds ``100 .. 100 + --eval-seeds - 1``. The report gives the test accuracy at the best
   validation epoch (mean +- sample std) and the per-seed paired gap MaxK - ReLU with its
   standard error.

Writes ``<out>/maxk_select.json`` (every run) and ``<out>/maxk_select.md``::

    python -m benchmarks.maxk_select --out benchmarks/results/h100 --device cuda
    python -m benchmarks.maxk_select --out /tmp/ms --device cpu --epochs 2 --select-seeds 1 --eval-seeds 2 \\
        --dropouts 0.5 --weight-decays 5e-4      # smoke test
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch

from sparsegnn.datasets import load
from benchmarks.maxk_sweep import device_name, write_report
from sparsegnn.training import train_node_classifier

SHIPPED = (0.5, 5e-4)          # maxk_accuracy.py's dropout and weight decay
EVAL_SEED = 100


def _floats(text: str) -> List[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _runs(data, maxk, dropout: float, weight_decay: float, seeds: List[int], args) -> List[dict]:
    out = []
    for seed in seeds:
        r = train_node_classifier(data, "sage", epochs=args.epochs, lr=args.lr, weight_decay=weight_decay,
                                  dropout=dropout, seed=seed, device=args.device, progress=False, maxk=maxk)
        out.append({"seed": seed, "best_val_acc": r.best_val_acc, "test_acc_at_best_val": r.test_acc_at_best_val,
                    "mean_epoch_ms": r.mean_epoch_ms})
    return out


def _mean(runs: List[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in runs)


def _std(runs: List[dict], key: str) -> float:
    return statistics.stdev([r[key] for r in runs]) if len(runs) > 1 else 0.0


def paired_gap(maxk: List[dict], relu: List[dict]) -> Tuple[float, float, List[float]]:
    """Per-seed ``maxk - relu`` test accuracy in points: mean, standard error, the differences."""
    if [r["seed"] for r in maxk] != [r["seed"] for r in relu]:
        raise ValueError("paired_gap(): the two lists must hold the same seeds in the same order")
    diffs = [100 * (m["test_acc_at_best_val"] - r["test_acc_at_best_val"]) for m, r in zip(maxk, relu)]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return statistics.fmean(diffs), se, diffs


def choose(grid: Dict[str, List[dict]]) -> Tuple[float, float]:
    """The (dropout, weight decay) of the grid whose runs have the highest mean best-validation
    accuracy (ties: the first in grid order). ``grid`` maps ``"dropout,weight_decay"`` to runs."""
    best = max(grid, key=lambda key: _mean(grid[key], "best_val_acc"))
    dropout, wd = best.split(",")
    return float(dropout), float(wd)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--datasets", default="citeseer")
    parser.add_argument("--dropouts", default="0.2,0.5,0.7")
    parser.add_argument("--weight-decays", default="5e-4,5e-3")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--select-seeds", type=int, default=5)
    parser.add_argument("--eval-seeds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.select_seeds < 1 or args.eval_seeds < 1:
        parser.error("--select-seeds and --eval-seeds must be >= 1")
    start = time.perf_counter()
    grid_points = [(d, w) for d in _floats(args.dropouts) for w in _floats(args.weight_decays)]
    select_seeds = list(range(args.select_seeds))
    eval_seeds = list(range(EVAL_SEED, EVAL_SEED + args.eval_seeds))
    models = {"relu": "relu", "maxk": args.k}
    report = {"settings": {**vars(args), "device_name": device_name(args.device), "torch": torch.__version__,
                           "date": datetime.date.today().isoformat(), "select_seed_list": select_seeds,
                           "eval_seed_list": eval_seeds}, "datasets": {}}
    for name in args.datasets.split(","):
        data = load(name)
        grid = {m: {} for m in models}
        for dropout, wd in grid_points:
            key = f"{dropout},{wd}"
            for m, maxk in models.items():
                grid[m][key] = _runs(data, maxk, dropout, wd, select_seeds, args)
            print(f"{name} dropout {dropout} wd {wd}: val relu {100 * _mean(grid['relu'][key], 'best_val_acc'):.2f} "
                  f"maxk {100 * _mean(grid['maxk'][key], 'best_val_acc'):.2f}", file=sys.stderr)
        chosen = {m: choose(grid[m]) for m in models}
        evaluation = {}
        for label, settings in (("chosen", chosen), ("shipped", {m: SHIPPED for m in models})):
            evaluation[label] = {m: _runs(data, maxk, *settings[m], eval_seeds, args) for m, maxk in models.items()}
        report["datasets"][name] = {"grid": grid, "chosen": {m: list(v) for m, v in chosen.items()},
                                    "evaluation": evaluation}
    report["settings"]["wall_s"] = time.perf_counter() - start
    text = markdown(report)
    write_report(args.out, "maxk_select", report, text)
    print(text)
    return 0


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"# MaxK k={s['k']} vs ReLU, each with its setting chosen on validation ({s['device_name']})", "",
             f"MaxKGNN (sage, 3 layers, hidden 256, LayerNorm), Adam lr {s['lr']}, {s['epochs']} epochs. Selection: "
             f"dropout x weight decay over {s['dropouts']} x {s['weight_decays']}, seeds {s['select_seed_list']}, "
             f"by mean best-validation accuracy. Evaluation on the fresh seeds {s['eval_seed_list']}: test accuracy "
             f"at the best validation epoch. {s['date']}, torch {s['torch']}, {s['wall_s']:.0f} s.", ""]
    for name, d in report["datasets"].items():
        lines += [f"## {name}", "", "| dropout, weight decay | ReLU val | ReLU test | MaxK val | MaxK test |",
                  "|---|---|---|---|---|"]
        for key in d["grid"]["relu"]:
            r, m = d["grid"]["relu"][key], d["grid"]["maxk"][key]
            lines.append(f"| {key} | {100 * _mean(r, 'best_val_acc'):.2f} | {100 * _mean(r, 'test_acc_at_best_val'):.2f} "
                         f"| {100 * _mean(m, 'best_val_acc'):.2f} | {100 * _mean(m, 'test_acc_at_best_val'):.2f} |")
        lines += ["", f"Chosen: ReLU {tuple(d['chosen']['relu'])}, MaxK {tuple(d['chosen']['maxk'])}.", "",
                  "| evaluation | ReLU test (%) | MaxK test (%) | MaxK - ReLU, paired (points) | MaxK at most 1 point worse |",
                  "|---|---|---|---|---|"]
        for label, ev in d["evaluation"].items():
            gap, se, _ = paired_gap(ev["maxk"], ev["relu"])
            lines.append(f"| {label} | {100 * _mean(ev['relu'], 'test_acc_at_best_val'):.2f} +- "
                         f"{100 * _std(ev['relu'], 'test_acc_at_best_val'):.2f} | "
                         f"{100 * _mean(ev['maxk'], 'test_acc_at_best_val'):.2f} +- "
                         f"{100 * _std(ev['maxk'], 'test_acc_at_best_val'):.2f} | {gap:+.2f} (se {se:.2f}) | "
                         f"{'yes' if gap >= -1.0 else 'no'} |")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
