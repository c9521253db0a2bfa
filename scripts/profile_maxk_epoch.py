"""Where the GPU time of a MaxK-GNN training epoch goes (GPU machine): ``torch.profiler`` over
``--steps`` steps of ``MaxKGNN(conv="sage", k=--k)`` (or ``--relu``) on the Reddit stand-in,
kernels grouped by name, top ``--top`` by total CUDA time::

    PYTHONPATH=src python scripts/profile_maxk_epoch.py --k 32
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_layers as layers  # noqa: E402
import bench_maxk_train as bmt  # noqa: E402
import bench_train as bt  # noqa: E402
from sparsegnn.training import make_optimizer, make_train_step  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph", default="reddit")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--relu", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=22)
    args = parser.parse_args()
    device = torch.device("cuda")
    graph, kind = bt.load_bench_graph(args.graph, device, None)
    inputs = bt.bench_inputs(args.graph, kind, graph, None, 16, 0.66, device, 0)
    provider = "ours_relu" if args.relu else f"ours_maxk_k{args.k}"
    net = bmt.build_model(provider, inputs["x"].shape[1], inputs["classes"], None, 256, 3).to(device)
    opt = make_optimizer(net, "none", lr=0.01, weight_decay=5e-4)
    step = make_train_step(net, opt, inputs["x"], layers.bare(graph), inputs["train_idx"], inputs["y_train"])
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in events) / args.steps / 1e3
    print(f"{provider}: {total:.2f} ms of kernels per step")
    for e in events[:args.top]:
        print(f"{e.device_time_total / args.steps / 1e3:8.3f} ms  {e.count // args.steps:4d}x  {e.key[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
