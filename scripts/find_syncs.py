"""Report host syncs inside a warmed-up eager training step (GPU machine).

Runs each model's step (bench_train builders) a few times, then one more under
``torch.cuda.set_sync_debug_mode("error")`` and prints where the first sync happens.

    PYTHONPATH=src python scripts/find_syncs.py --graph cora --models gcn,gat,sage
"""
from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_layers as layers  # noqa: E402
import bench_train as bt  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--graph", default="cora")
    p.add_argument("--models", default="gcn,sage,gin,gat,agnn")
    args = p.parse_args()
    device = torch.device("cuda")
    graph, kind = bt.load_bench_graph(args.graph, device, None)
    inputs = bt.bench_inputs(args.graph, kind, graph, None, 16, 0.1, device, 0)
    x, idx, y = inputs["x"], inputs["train_idx"], inputs["y_train"]
    for model in args.models.split(","):
        net = bt.ours_model(model, x.shape[1], inputs["classes"], None, 8, 8).to(device)
        opt = bt.make_optimizer(net, "none", lr=0.01, weight_decay=5e-4)
        step = bt.make_train_step(net, opt, x, layers.bare(graph), idx, y, compile="none")
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        found = []

        def show(message, *rest, **kw):  # runs in the thread that synced (autograd's too)
            frames = [f for f in traceback.extract_stack() if "sparsegnn" in f.filename or "scripts" in f.filename]
            found.append(" <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.line}" for f in frames[::-1][:4]))

        old = warnings.showwarning
        warnings.showwarning = show
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
            torch.cuda.set_sync_debug_mode("default")
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = old
        torch.cuda.synchronize()
        print(f"{model}: {len(found)} syncs" + "".join(f"\n   {line}" for line in found[:6]))


if __name__ == "__main__":
    main()
