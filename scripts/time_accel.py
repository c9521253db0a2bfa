"""PyG models converted by ``sparsegnn.accelerate`` against our own models, timed interleaved
(issue 15: "converted models train at least as fast as our own").

Both training steps of a (graph, model) are built first; then ``--rounds`` rounds time
``--block`` epochs of one and ``--block`` of the other (the order alternating per round), with
CUDA events around each epoch.  Host slowdowns that come and go (the device host's Python runs
30-60 us an op, and drifts) then hit both sides alike; the ratio of the medians is what a
sequential run (``bench_train.py``, one provider after the other) could not pin within 10-30 %.

Ours gets our ``Graph``; the converted PyG model gets ``edge_index`` (what its forward is called
with), as a PyG user runs it.

    PYTHONPATH=src python scripts/time_accel.py --out benchmarks/h100/accel_interleaved.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent / "src", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import bench_train as bt  # noqa: E402
from sparsegnn.nn.accelerate import accelerate  # noqa: E402
from sparsegnn.training import make_optimizer, make_train_step  # noqa: E402


def build_steps(model: str, graph, inputs: Dict[str, object], pyg_nn, device, seed: int) -> Dict[str, Callable]:
    """The two training steps of one case: ``ours`` (our model, Graph input) and ``accel``
    (PyG's model converted by ``accelerate``, edge_index input), same seed."""
    f_in, classes = inputs["x"].shape[1], inputs["classes"]
    x, train_idx, y_train = inputs["x"], inputs["train_idx"], inputs["y_train"]
    drop = bt.DEFAULT_DROPOUT[model]
    torch.manual_seed(seed)
    ours = bt.ours_model(model, f_in, classes, drop, 8, 8).to(device).train()
    torch.manual_seed(seed)
    pyg = bt.pyg_model(pyg_nn, model, f_in, classes, drop, 8, 8).to(device)
    accel, report = accelerate(pyg, inplace=True, return_report=True)
    if report.skipped:
        raise RuntimeError(f"accelerate() left {report.skipped}")
    accel.train()
    edge_index = graph.edge_index().contiguous()
    return {
        "ours": make_train_step(ours, make_optimizer(ours, "none", lr=0.01, weight_decay=5e-4), x,
                                bt.layers.bare(graph), train_idx, y_train, compile="none"),
        "accel": make_train_step(accel, make_optimizer(accel, "none", lr=0.01, weight_decay=5e-4), x,
                                 edge_index, train_idx, y_train, compile="none"),
    }


def interleaved(steps: Dict[str, Callable], warmup: int, rounds: int, block: int,
                cuda: bool = True) -> Dict[str, List[float]]:
    """ms per epoch of each step, ``rounds`` x ``block`` epochs each, interleaved by blocks
    (CUDA events on the GPU, wall-clock otherwise)."""
    names = list(steps)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for name in names:
        for _ in range(warmup):
            steps[name]()
    sync()
    times: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            if cuda:
                events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                          for _ in range(block)]
                for start, end in events:
                    start.record()
                    steps[name]()
                    end.record()
                sync()
                times[name] += [s.elapsed_time(e) for s, e in events]
            else:
                for _ in range(block):
                    t = time.perf_counter()
                    steps[name]()
                    times[name].append(1e3 * (time.perf_counter() - t))
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", default="all")
    parser.add_argument("--models", default="gcn,sage,gin,gat")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="/tmp/accel_interleaved.json")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    import torch_geometric.nn as pyg_nn

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    graphs = bt.all_graphs() if args.graphs == "all" else args.graphs.split(",")
    rows = []
    for name in graphs:
        graph, kind = bt.load_bench_graph(name, device, args.data_dir)
        inputs = bt.bench_inputs(name, kind, graph, None, 16, 0.1, device, args.seed)   # bench_train defaults
        for model in args.models.split(","):
            try:
                times = interleaved(build_steps(model, graph, inputs, pyg_nn, device, args.seed), args.warmup,
                                    args.rounds, args.block, cuda)
            except Exception as exc:  # noqa: BLE001 - a failing case is a row
                rows.append({"graph": name, "model": model, "error": f"{type(exc).__name__}: {exc}"[:300]})
                print(json.dumps(rows[-1]), flush=True)
                continue
            ours, accel = statistics.median(times["ours"]), statistics.median(times["accel"])
            rows.append({"graph": name, "model": model, "ours_ms": ours, "accel_ms": accel,
                         "ours_over_accel": ours / accel, "ours_min": min(times["ours"]),
                         "accel_min": min(times["accel"]), "epochs_each": len(times["ours"])})
            print(json.dumps(rows[-1]), flush=True)
            if cuda:
                torch.cuda.empty_cache()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": {"gpu": gpu, "warmup": args.warmup,
                                                   "rounds": args.rounds, "block": args.block},
                                          "rows": rows}, indent=1))
    ok = [r for r in rows if "ours_over_accel" in r]
    lines = ["| model | graph | ours ms | accelerate(PyG) ms | accel speed / ours |", "|---|---|---|---|---|"]
    for r in ok:
        lines.append(f"| {r['model']} | {r['graph']} | {r['ours_ms']:.3f} | {r['accel_ms']:.3f} | "
                     f"{r['ours_over_accel']:.2f} |")
    for model in args.models.split(","):
        ratios = [r["ours_over_accel"] for r in ok if r["model"] == model]
        if ratios:
            geo = statistics.geometric_mean(ratios)
            lines.append(f"| **{model}** | geomean / worst | | | {geo:.2f} / {min(ratios):.2f} |")
    print("\n".join(lines))
    Path(args.out).with_suffix(".md").write_text(
        f"# accelerate(PyG) vs our models, interleaved ({gpu})\n\n"
        f"Median of {args.rounds} x {args.block} epochs each, alternating blocks, after {args.warmup} warm-up "
        f"epochs; accel speed / ours = ours ms / accel ms (>= 1: the converted model is at least as fast).\n\n"
        + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
