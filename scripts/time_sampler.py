"""Host + GPU time of one sampled mini-batch, piece by piece: the torch sampler against the Triton
hop kernels, then ``make_batch`` and a whole loader batch.

Each piece is timed from the host with a device sync after it (what a training loop without
prefetch waits for), median over ``--batches`` batches of ``--batch-size`` seeds::

    python scripts/time_sampler.py --graphs reddit-threads-10k,wikipedia --out sampler.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent / "src", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import bench_train as train  # noqa: E402
from sparsegnn.sampling import NeighborLoader, NeighborSampler, _fused  # noqa: E402
from sparsegnn.sampling.batch import make_batch  # noqa: E402


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device):
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return out, 1e3 * (time.perf_counter() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default="reddit-threads-10k,wikipedia,deezer")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanouts", default="15,10")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    fanouts = [int(k) for k in args.fanouts.split(",")]
    rows = []
    for name in args.graphs.split(","):
        graph, kind = train.load_bench_graph(name, device, None)
        inputs = train.bench_inputs(name, kind, graph, None, 16, 0.1, device, 0)
        x = inputs["x"]
        seeds_all = inputs["train_idx"].to(device)
        res = {"graph": name, "nodes": graph.num_nodes, "edges": graph.num_edges, "fanouts": fanouts,
               "batch_size": args.batch_size}
        for impl in ("torch", "triton"):
            _fused.FUSED = "never" if impl == "torch" else "auto"
            sampler = NeighborSampler(graph, fanouts)
            gen = torch.Generator(device=device).manual_seed(0)
            t_sample, t_batch, sizes = [], [], []
            for b in range(args.batches + 2):
                perm = torch.randperm(seeds_all.numel(), generator=torch.Generator().manual_seed(b))
                seeds = seeds_all[perm[:args.batch_size].to(device)]
                out, ms_s = _timed(lambda: sampler.sample(seeds, gen, validate=False), device)
                _, ms_b = _timed(lambda: make_batch(out, graph, node_tensors={"x": x}), device)
                if b >= 2:
                    t_sample.append(ms_s)
                    t_batch.append(ms_b)
                    sizes.append((out.n_id.numel(), out.src.numel()))
            loader = NeighborLoader(graph, fanouts, batch_size=args.batch_size, input_nodes=seeds_all, x=x,
                                    generator=torch.Generator(device=device).manual_seed(0), prefetch=0)
            t_loader, it = [], iter(loader)
            for b in range(min(args.batches + 2, len(loader))):
                _, ms = _timed(lambda: next(it), device)
                if b >= 2:
                    t_loader.append(ms)
            res[impl] = {"sample_ms": statistics.median(t_sample), "make_batch_ms": statistics.median(t_batch),
                         "loader_batch_ms": statistics.median(t_loader) if t_loader else None,
                         "nodes": statistics.mean(s[0] for s in sizes), "edges": statistics.mean(s[1] for s in sizes)}
        _fused.FUSED = "auto"
        rows.append(res)
        print(json.dumps(res), flush=True)
    print("\n| graph | impl | sample ms | make_batch ms | loader batch ms | nodes | edges |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        for impl in ("torch", "triton"):
            v = r[impl]
            loader_ms = "-" if v["loader_batch_ms"] is None else f"{v['loader_batch_ms']:.2f}"
            print(f"| {r['graph']} | {impl} | {v['sample_ms']:.2f} | {v['make_batch_ms']:.2f} | {loader_ms} | "
                  f"{v['nodes']:.0f} | {v['edges']:.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                                              "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
