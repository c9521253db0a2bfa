"""Full-graph training on 1..P processes (issue 13): epoch time, halo traffic, partition quality.

Same code for every process count (``sparsegnn.distributed.train_distributed``): NCCL and one
GPU per process with ``--device cuda``, gloo on the CPU.  Graphs: a node dataset
(``cora``, ``lastfm``, ...) or a synthetic stand-in (``reddit``: 233k nodes, 115M edges) with
random features and labels of its widths (602 features, 41 classes) and a 60/20/20 split.
Writes ``<out>/distributed_<graph>.json`` and ``.md``.  A row whose run runs out of GPU memory
is recorded as such (``--nprocs 2,1`` on ``papers-16m``: the graph that one GPU cannot train)::

    PYTHONPATH=src python scripts/bench_distributed.py --graph reddit --stand-in --nprocs 1,2 --device cuda --out benchmarks/h200x2
    PYTHONPATH=src python scripts/bench_distributed.py --graph papers-16m --stand-in --nprocs 2,1 --epochs 4 --device cuda --gen-device cuda --out benchmarks/h200x2
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


def stand_in_dataset(name: str, seed: int = 0, device=None) -> NodeDataset:
    """A stand-in graph with random features / labels of its widths and a random 60/20/20 split,
    generated on ``device`` (a GPU builds a 10^8-edge graph in seconds) and returned on the CPU."""
    spec = STAND_INS[name]
    edge_index = stand_in_graph(name, seed=seed, device=device, use_cache=device is None)
    num_nodes = spec.num_nodes
    graph = Graph.from_edge_index(edge_index, num_nodes=num_nodes)
    del edge_index
    gen = torch.Generator(device=device or "cpu").manual_seed(seed)
    x = torch.randn(num_nodes, spec.num_features, generator=gen, device=device).cpu()
    y = torch.randint(0, spec.num_classes, (num_nodes,), generator=gen, device=device).cpu()
    draw = torch.rand(num_nodes, generator=gen, device=device).cpu()
    graph = graph.to("cpu")
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return NodeDataset(name, graph, x, y, draw < 0.6, (draw >= 0.6) & (draw < 0.8), draw >= 0.8, spec.num_classes)


def sent_widths(in_channels: int, hidden: int, out_channels: int, layers: int) -> list:
    """Columns each layer exchanges: the narrower side of its dense transform (the models project
    before the exchange when that narrows the rows)."""
    widths = [in_channels] + [hidden] * (layers - 1) + [out_channels]
    return [widths[i + 1] if widths[i + 1] < widths[i] else widths[i] for i in range(layers)]


def _out_of_memory(exc: BaseException) -> bool:
    return "OutOfMemoryError" in str(exc) or "out of memory" in str(exc)


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
    parser.add_argument("--gen-device", default=None, help="generate the stand-in there (e.g. cuda)")
    parser.add_argument("--partition-device", default=None, help="partition there (default: the CPU)")
    parser.add_argument("--out", default="/tmp/sparsegnn-out")
    args = parser.parse_args(argv)
    data = (stand_in_dataset(args.graph, device=args.gen_device) if args.stand_in
            else load(args.graph, data_dir=args.data_dir))
    classes = int(data.y.max()) + 1
    widths = sent_widths(data.x.shape[1], args.hidden, classes, args.layers)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    rows = []
    for n in (int(v) for v in args.nprocs.split(",")):
        row = {"graph": args.graph, "nodes": data.graph.num_nodes, "edges": data.graph.num_edges,
               "features": data.x.shape[1], "model": args.model, "layers": args.layers, "hidden": args.hidden,
               "nproc": n, "device": args.device, "gpu": gpu, "partition": args.partition}
        try:
            r = train_distributed(data, args.model, n, epochs=args.epochs, hidden=args.hidden, num_layers=args.layers,
                                  dropout=0.5, device=args.device, method=args.partition,
                                  partition_device=args.partition_device)
        except Exception as exc:            # noqa: BLE001 - a worker's error arrives as its traceback text
            if not _out_of_memory(exc):
                raise
            tail = [ln for ln in str(exc).splitlines() if "out of memory" in ln.lower()]
            row.update(out_of_memory=True, error=(tail[-1] if tail else str(exc).splitlines()[-1])[:400])
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        halo_rows = sum(r.halo_sizes)
        row.update(backend=r.backend, epoch_ms=r.mean_epoch_ms, halo_mb_per_epoch=r.halo_bytes_per_epoch / 1e6,
                   halo_rows=halo_rows, halo_sizes=r.halo_sizes,
                   halo_mb_per_layer=[halo_rows * w * 4 / 1e6 for w in widths], sent_widths=widths,
                   cut_edges=r.cut_edges, num_edges=r.num_edges, part_nodes=r.part_nodes,
                   peak_gib=[b / 2 ** 30 for b in r.peak_memory], test_acc=r.test_acc,
                   losses=r.losses, final_loss=r.losses[-1])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "losses"}), flush=True)
    timed = [r for r in rows if "epoch_ms" in r]
    base = next((r["epoch_ms"] for r in timed if r["nproc"] == 1), timed[0]["epoch_ms"] if timed else 1.0)
    lines = [f"# Distributed full-graph {args.model} ({args.layers} x {args.hidden}) on {args.graph}, "
             f"{data.graph.num_nodes:,} nodes, {data.graph.num_edges:,} edges, {data.x.shape[1]} features; {gpu}", "",
             f"Partition: {args.partition}. Same code for every row (`train_distributed`); epoch = forward + "
             f"backward + all_reduce + Adam, mean of epochs 2..{args.epochs}. Halo MB per layer = received rows "
             f"x columns sent ({', '.join(map(str, widths))}) x 4 bytes: rows forward, gradients backward (none for "
             "a first layer that aggregates the raw features, which need no gradient).",
             "", "| processes | epoch ms | speedup vs 1 | halo rows | halo MB / layer | halo MB / epoch | "
             "cut edges | peak GPU memory per rank (GiB) | test acc |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("out_of_memory"):
            lines.append(f"| {r['nproc']} | out of GPU memory | | | | | | | |")
            continue
        peak = ", ".join(f"{v:.1f}" for v in r["peak_gib"]) or "-"
        per_layer = " / ".join(f"{v:.1f}" for v in r["halo_mb_per_layer"])
        lines.append(f"| {r['nproc']} | {r['epoch_ms']:.1f} | {base / r['epoch_ms']:.2f}x | {r['halo_rows']:,} | "
                     f"{per_layer} | {r['halo_mb_per_epoch']:.1f} | {r['cut_edges']:,} of {r['num_edges']:,} | "
                     f"{peak} | {100 * r['test_acc']:.2f}% |")
    for r in rows:
        if r.get("out_of_memory"):
            lines += ["", f"{r['nproc']} process(es): `{r['error']}`"]
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"distributed_{args.graph}.json").write_text(json.dumps(rows, indent=1))
    (out / f"distributed_{args.graph}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
