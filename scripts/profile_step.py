"""Where the host time of one eager training step goes (GPU machine).

For each model, our step and PyG's (same architecture, bench_train's builders) on one graph:
host time per step with the GPU held busy by a sleep kernel (so the host clock sees only host
work), GPU-synchronised time per step, then a cProfile of our steps (top functions by own time).

    PYTHONPATH=src python scripts/profile_step.py --graph cora --models gcn,gat
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train as bt  # noqa: E402
import bench_layers as layers  # noqa: E402
from profile_host import per_call_us  # noqa: E402


def host_ms(step, n=5) -> float:
    """Host ms per step with the GPU held busy (few steps: a long step overflows the launch queue)."""
    return per_call_us(step, n) / 1e3


def synced_ms(step, n=20) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--graph", default="cora")
    p.add_argument("--models", default="gcn,gat")
    p.add_argument("--top", type=int, default=22)
    p.add_argument("--torch-profiler", action="store_true", help="torch.profiler CPU table instead of cProfile")
    p.add_argument("--cuda", action="store_true", help="with --torch-profiler: also CUDA kernels, sorted by GPU time")
    p.add_argument("--accel", action="store_true", help="also PyG's model converted by sparsegnn.accelerate "
                   "(called with edge_index), in the synced times and the torch.profiler tables")
    args = p.parse_args()
    device = torch.device("cuda")
    graph, kind = bt.load_bench_graph(args.graph, device, None)
    inputs = bt.bench_inputs(args.graph, kind, graph, None, 16, 0.1, device, 0)
    x, idx, y = inputs["x"], inputs["train_idx"], inputs["y_train"]
    try:
        import torch_geometric.nn as pyg_nn
    except ImportError:
        pyg_nn = None
    for model in args.models.split(","):
        torch.manual_seed(0)
        net = bt.ours_model(model, x.shape[1], inputs["classes"], None, 8, 8).to(device)
        opt = bt.make_optimizer(net, "none", lr=0.01, weight_decay=5e-4)
        ours_graph = layers.bare(graph)   # one Graph object: a new one is a new replay signature (re-recorded)
        ours = bt.make_train_step(net, opt, x, ours_graph, idx, y, compile="none")
        for _ in range(10):
            ours()
        row = [f"ours host {host_ms(ours):.3f} ms, synced {synced_ms(ours):.3f} ms"]
        if pyg_nn is not None:
            pnet = bt.pyg_model(pyg_nn, model, x.shape[1], inputs["classes"], None, 8, 8).to(device)
            popt = bt.make_optimizer(pnet, "none", lr=0.01, weight_decay=5e-4)
            pyg = bt.make_train_step(pnet, popt, x, graph.edge_index().contiguous(), idx, y, compile="none")
            for _ in range(10):
                pyg()
            row.append(f"PyG host {host_ms(pyg):.3f} ms, synced {synced_ms(pyg):.3f} ms")
            if args.accel:
                from sparsegnn import accelerate

                torch.manual_seed(0)
                anet = bt.pyg_model(pyg_nn, model, x.shape[1], inputs["classes"], None, 8, 8).to(device)
                anet = accelerate(anet, inplace=True)
                aopt = bt.make_optimizer(anet, "none", lr=0.01, weight_decay=5e-4)
                accel = bt.make_train_step(anet, aopt, x, graph.edge_index().contiguous(), idx, y, compile="none")
                for _ in range(10):
                    accel()
                row.append(f"accel host {host_ms(accel):.3f} ms, synced {synced_ms(accel):.3f} ms")
        print(f"== {model} on {args.graph}: " + "; ".join(row))
        # host time of the parts: forward, forward + backward, optimiser step (GPU held busy)
        import torch.nn.functional as F
        parts = {"ours": (net, opt, ours_graph)}
        if pyg_nn is not None:
            parts["pyg"] = (pnet, popt, graph.edge_index().contiguous())
        for name, (m, o, g_in) in parts.items():
            fwd = lambda: F.cross_entropy(m(x, g_in).index_select(0, idx), y)  # noqa: E731
            fwd_bwd = lambda: fwd().backward()  # noqa: E731
            print(f"   {name}: forward {host_ms(fwd):.3f} ms, forward+backward {host_ms(fwd_bwd):.3f} ms, "
                  f"optimizer.step {host_ms(o.step):.3f} ms, zero_grad {host_ms(o.zero_grad):.3f} ms")
        if args.torch_profiler:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.cuda else [])
            key = "cuda_time_total" if args.cuda else "cpu_time_total"
            steps = {"ours": ours} if pyg_nn is None or not args.cuda else {"ours": ours, "pyg": pyg}
            if args.accel and pyg_nn is not None:
                steps["accel"] = accel
            for name, step in steps.items():
                with profile(activities=acts) as tp:
                    for _ in range(20):
                        step()
                    torch.cuda.synchronize()
                print(f"-- {name} (20 steps)")
                print(tp.key_averages().table(sort_by=key, row_limit=args.top, max_name_column_width=60))
            continue
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(30):
            ours()
        torch.cuda.synchronize()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
        print("\n".join(line[:150] for line in out.getvalue().splitlines()[6:6 + args.top + 3]))


if __name__ == "__main__":
    main()
