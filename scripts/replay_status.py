"""Whether each model's forward / backward replays (``sparsegnn.nn.replay``) in bench_train's
training steps, and why not where it does not (GPU machine).

For every (graph, model): our model and the PyG model converted by ``accelerate``, ``--steps``
eager training steps, then the replay state: recorded (with the replay count), refused (over the
memory budget, with the forward's bytes) or failed (the recording's error), and any warning.

    PYTHONPATH=src python scripts/replay_status.py --graphs cora,twitch --models gcn,gin
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent / "src", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import bench_train as bt  # noqa: E402
import bench_layers as layers  # noqa: E402
from sparsegnn.nn.accelerate import accelerate  # noqa: E402
from sparsegnn.nn.replay import replay_state  # noqa: E402
from sparsegnn.training import make_optimizer, make_train_step  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--graphs", default="cora")
    p.add_argument("--models", default="gcn,sage,gin,gat,agnn")
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    device = torch.device("cuda")
    import torch_geometric.nn as pyg_nn

    for name in args.graphs.split(","):
        graph, kind = bt.load_bench_graph(name, device, None)
        inputs = bt.bench_inputs(name, kind, graph, None, 16, 0.1, device, 0)
        x, idx, y = inputs["x"], inputs["train_idx"], inputs["y_train"]
        for model in args.models.split(","):
            for side in ("ours", "accel"):
                if side == "accel" and model == "agnn":
                    continue
                torch.manual_seed(0)
                if side == "ours":
                    net = bt.ours_model(model, x.shape[1], inputs["classes"], None, 8, 8).to(device)
                    g_in = layers.bare(graph)
                else:
                    net = accelerate(bt.pyg_model(pyg_nn, model, x.shape[1], inputs["classes"], None, 8, 8).to(device),
                                     inplace=True)
                    g_in = graph.edge_index().contiguous()
                opt = make_optimizer(net, "none", lr=0.01, weight_decay=5e-4)
                step = make_train_step(net, opt, x, g_in, idx, y, compile="none")
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    for _ in range(args.steps):
                        step()
                torch.cuda.synchronize()
                notes = "; ".join(str(w.message)[:160] for w in caught if "replay" in str(w.message))
                print(f"{name:>18} {model:>5} {side:>5}: {replay_state(net)}" + (f"  [{notes}]" if notes else ""),
                      flush=True)
        del graph, inputs


if __name__ == "__main__":
    main()
