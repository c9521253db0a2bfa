"""Where a mini-batch GraphSAGE step spends its time: ours vs PyG's layers on the same sampled batches.

Samples ``--batches`` batches once (``sparsegnn.sampling.NeighborLoader``), then for each
provider times forward + loss and backward per batch (CUDA events around each phase, median)
and prints ``torch.profiler``'s top operators by self CPU time and by CUDA time over the
batches: which ops, syncs and kernels make the difference::

    python scripts/profile_minibatch.py --graph reddit-threads-10k --batches 20
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent / "src", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import bench_minibatch as mb  # noqa: E402
import bench_train as train  # noqa: E402
from sparsegnn import nn as sgnn  # noqa: E402
from sparsegnn.sampling import NeighborLoader  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", default="reddit-threads-10k")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, default=14, help="profiler table rows")
    parser.add_argument("--variants", default="ours,pyg", help="of ours, pyg, ours_trim, pyg_trim")
    args = parser.parse_args()
    device = torch.device(args.device)
    graph, kind = train.load_bench_graph(args.graph, device, None)
    inputs = train.bench_inputs(args.graph, kind, graph, None, 16, 0.1, device, 0)
    mask = torch.zeros(graph.num_nodes, dtype=torch.bool, device=device)
    mask[inputs["train_idx"]] = True
    loader = NeighborLoader(graph, [15, 10], batch_size=1024, input_nodes=mask, x=inputs["x"], y=inputs["y"],
                            generator=torch.Generator(device=device).manual_seed(0))
    batches = [b for _, b in zip(range(args.batches), loader)]
    import torch_geometric.nn as pyg_nn

    f_in, classes = inputs["x"].shape[1], inputs["classes"]
    variants = {"ours": (sgnn.SAGEConv, lambda b: b.graph), "pyg": (pyg_nn.SAGEConv, lambda b: b.edge_index),
                "ours_trim": (sgnn.SAGEConv, mb.ours_trimmed), "pyg_trim": (pyg_nn.SAGEConv, mb.pyg_trimmed)}
    for name in args.variants.split(","):
        conv_cls, graph_of = variants[name]
        torch.manual_seed(0)
        model = mb.Sage(conv_cls, f_in, args.hidden, classes, 0.5).to(device)

        def step(b, times=None):
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3)) if times is not None else (None,) * 3
            b.graph.cache.pop(("layer_graphs", 2), None)      # per-layer graphs built per batch, as in training
            if start is not None:
                start.record()
            loss = F.cross_entropy(model(b.x, graph_of(b))[:b.batch_size], b.y[:b.batch_size])
            if mid is not None:
                mid.record()
            loss.backward()
            if end is not None:
                end.record()
                times.append((start, mid, end))

        for b in batches[:3]:
            step(b)
        torch.cuda.synchronize()
        times = []
        for b in batches:
            step(b, times)
        torch.cuda.synchronize()
        fwd = statistics.median(s.elapsed_time(m) for s, m, _ in times)
        bwd = statistics.median(m.elapsed_time(e) for _, m, e in times)
        print(f"== {name}: forward + loss {fwd:.3f} ms, backward {bwd:.3f} ms per batch (median of {len(times)})")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for b in batches:
                step(b)
            torch.cuda.synchronize()
        table = prof.key_averages()
        print(table.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=48))
        print(table.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=48))
    return 0


if __name__ == "__main__":
    sys.exit(main())
