"""Eager training epochs, ours against PyG, with foreach and with fused Adam, timed interleaved.

Issue 9's "GCN / AGNN tf32 epoch >= 2x PyG": an eager epoch of these small models is host-bound,
and both sides run the same loss and optimiser after their forward / backward.  This times four
steps per (graph, model), built first and run in alternating blocks (``time_accel.interleaved``)
so that the device host's drift hits all alike:

* ``ours`` / ``pyg``: the optimiser ``training.make_optimizer`` builds (fused Adam on CUDA);
* ``ours_foreach`` / ``pyg_foreach``: ``torch.optim.Adam(foreach=True)`` (PyTorch's default).

PyG gets the faster of ``edge_index`` and ``adj_t`` per optimiser (GCN), as in ``bench_train``.

    PYTHONPATH=src python scripts/time_adam.py --models gcn,agnn --out /tmp/adam.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict

import torch

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent / "src", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import bench_train as bt  # noqa: E402
from time_accel import interleaved  # noqa: E402
from sparsegnn.training import make_optimizer, make_train_step  # noqa: E402


def build_steps(model: str, graph, inputs: Dict[str, object], pyg_nn, device, seed: int,
                precision: str) -> Dict[str, Callable]:
    f_in, classes = inputs["x"].shape[1], inputs["classes"]
    x, train_idx, y_train = inputs["x"], inputs["train_idx"], inputs["y_train"]
    drop = bt.DEFAULT_DROPOUT[model]
    steps: Dict[str, Callable] = {}
    variants = bt.pyg_variants(model, graph)
    for optim in ("fused", "foreach"):
        def optimizer(net):
            if optim == "fused":
                return make_optimizer(net, "none", lr=0.01, weight_decay=5e-4)
            return torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=5e-4, foreach=True)

        suffix = "" if optim == "fused" else "_foreach"
        torch.manual_seed(seed)
        ours = bt.ours_model(model, f_in, classes, drop, 8, 8, precision).to(device).train()
        steps["ours" + suffix] = make_train_step(ours, optimizer(ours), x, bt.layers.bare(graph), train_idx,
                                                 y_train, compile="none")
        for variant, make_input in variants:
            torch.manual_seed(seed)
            pyg = bt.pyg_model(pyg_nn, model, f_in, classes, drop, 8, 8).to(device).train()
            steps[f"pyg{suffix}:{variant}"] = make_train_step(pyg, optimizer(pyg), x, make_input(), train_idx,
                                                              y_train, compile="none")
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", default="real")
    parser.add_argument("--models", default="gcn,agnn")
    parser.add_argument("--precision", default="tf32")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="/tmp/adam.json")
    args = parser.parse_args(argv)
    import torch_geometric.nn as pyg_nn

    device = torch.device("cuda")
    names = (bt.layers.suite_names() if args.graphs == "real" else
             bt.all_graphs() if args.graphs == "all" else args.graphs.split(","))
    rows = []
    for name in names:
        graph, kind = bt.load_bench_graph(name, device, args.data_dir)
        inputs = bt.bench_inputs(name, kind, graph, None, 16, 0.1, device, args.seed)
        for model in args.models.split(","):
            times = interleaved(build_steps(model, graph, inputs, pyg_nn, device, args.seed, args.precision),
                                args.warmup, args.rounds, args.block, True)
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {"graph": name, "model": model}
            for suffix in ("", "_foreach"):
                pyg = min((v, k.split(":")[1]) for k, v in med.items() if k.startswith(f"pyg{suffix}:"))
                row[f"ours{suffix}_ms"], row[f"pyg{suffix}_ms"], row[f"pyg{suffix}_input"] = (
                    med["ours" + suffix], pyg[0], pyg[1])
                row[f"x{suffix}"] = pyg[0] / med["ours" + suffix]
            rows.append(row)
            print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name()
    lines = ["| model | graph | ours fused | PyG fused | x | ours foreach | PyG foreach | x |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['graph']} | {r['ours_ms']:.3f} | {r['pyg_ms']:.3f} ({r['pyg_input']}) | "
                     f"{r['x']:.2f} | {r['ours_foreach_ms']:.3f} | {r['pyg_foreach_ms']:.3f} | {r['x_foreach']:.2f} |")
    for model in args.models.split(","):
        sel = [r for r in rows if r["model"] == model]
        if sel:
            g = statistics.geometric_mean
            lines.append(f"| **{model}** | geomean (worst) | | | {g([r['x'] for r in sel]):.2f} "
                         f"({min(r['x'] for r in sel):.2f}) | | | {g([r['x_foreach'] for r in sel]):.2f} "
                         f"({min(r['x_foreach'] for r in sel):.2f}) |")
    table = "\n".join(lines)
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": {"gpu": gpu, "precision": args.precision, "rounds": args.rounds,
                                                   "block": args.block, "warmup": args.warmup}, "rows": rows},
                                         indent=1))
    Path(args.out).with_suffix(".md").write_text(
        f"# Eager epochs, fused vs foreach Adam, interleaved ({gpu}, ours {args.precision})\n\n"
        f"Median of {args.rounds} x {args.block} epochs per step, alternating blocks; x = PyG ms / ours ms "
        f"(PyG: the faster of edge_index and adj_t).\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
