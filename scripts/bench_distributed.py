"""Full-graph training on 1..P processes (issue 13): epoch time, halo traffic, partition quality.

Same code for every process count (``sparsegnn.distributed.train_distributed``): NCCL and one
GPU per process with ``--device cuda``, gloo on the CPU.  Graphs: a node dataset
(``cora``, ``lastfm``, ...) or a synthetic stand-in (``reddit``: 233k nodes, 115M edges) with
random features and labels of its widths (602 features, 41 classes) and a 60/20/20 split.
Writes ``<out>/distributed_<graph>.json`` and ``.md``::

    PYTHONPATH=src python scripts/bench_distributed.py --graph reddit --stand-in --nprocs 1,2 --device cuda --out benchmarks/h200x2
    PYTHONPATH=src python scripts/bench_distributed.py --graph cora --nprocs 1,2,4 --device cpu --out /tmp/dist
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sparsegnn import Graph  # noqa: E402
from sparsegnn.datasets import NodeDataset, load  # noqa: E402
from sparsegnn.datasets.synthetic import STAND_INS, stand_in_graph  # noqa: E402
from sparsegnn.distributed.train import train_distributed  # noqa: E402


def stand_in_dataset(name: str, seed: int = 0) -> NodeDataset:
    """A stand-in graph with random features / labels of its widths and a random 60/20/20 split."""
    spec = STAND_INS[name]
    edge_index = stand_in_graph(name, seed=seed)
    num_nodes = int(edge_index.max()) + 1
    graph = Graph.from_edge_index(edge_index, num_nodes=num_nodes)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, spec.num_features, generator=gen)
    y = torch.randint(0, spec.num_classes, (num_nodes,), generator=gen)
    draw = torch.rand(num_nodes, generator=gen)
    return NodeDataset(name, graph, x, y, draw < 0.6, (draw >= 0.6) & (draw < 0.8), draw >= 0.8, spec.num_classes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graph", default="cora", help="a node dataset (sparsegnn.datasets.load) or a stand-in")
    parser.add_argument("--stand-in", action="store_true", help="--graph names a synthetic stand-in (reddit, ...)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--model", default="sage", choices=["sage", "gcn"])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--nprocs", default="1,2")
    parser.add_argument("--partition", default="auto", choices=["auto", "metis", "contiguous"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="/tmp/sparsegnn-out")
    args = parser.parse_args(argv)
    data = stand_in_dataset(args.graph) if args.stand_in else load(args.graph, data_dir=args.data_dir)
    rows = []
    for n in (int(v) for v in args.nprocs.split(",")):
        r = train_distributed(data, args.model, n, epochs=args.epochs, hidden=args.hidden, num_layers=args.layers,
                              dropout=0.5, device=args.device, method=args.partition)
        row = {"graph": args.graph, "model": args.model, "nproc": n, "device": args.device, "backend": r.backend,
               "epoch_ms": r.mean_epoch_ms, "halo_mb_per_epoch": r.halo_bytes_per_epoch / 1e6,
               "halo_mb_per_layer": r.halo_bytes_per_epoch / 1e6 / (2 * args.layers),
               "cut_edges": r.cut_edges, "num_edges": r.num_edges, "part_nodes": r.part_nodes,
               "test_acc": r.test_acc, "final_loss": r.losses[-1]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["epoch_ms"]
    lines = [f"# Distributed full-graph {args.model} ({args.layers} x {args.hidden}) on {args.graph}, {args.device}", "",
             "| processes | backend | epoch ms | speedup vs first row | halo MB / epoch | halo MB / layer (fwd or bwd) | "
             "cut edges | test acc |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['nproc']} | {r['backend']} | {r['epoch_ms']:.1f} | {base / r['epoch_ms']:.2f}x | "
                     f"{r['halo_mb_per_epoch']:.1f} | {r['halo_mb_per_layer']:.2f} | {r['cut_edges']:,} of "
                     f"{r['num_edges']:,} | {100 * r['test_acc']:.2f}% |")
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"distributed_{args.graph}.json").write_text(json.dumps(rows, indent=1))
    (out / f"distributed_{args.graph}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
