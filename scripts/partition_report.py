"""Partition quality of a graph for P = 2, 4, 8 (issue 13's scaling model): cut edges, halo rows
and the halo bytes per layer they imply at a feature width, per method.

    PYTHONPATH=src python scripts/partition_report.py --graph reddit --stand-in --methods contiguous,metis
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench_distributed import stand_in_dataset  # noqa: E402

from sparsegnn.datasets import load  # noqa: E402
from sparsegnn.distributed.partition import partition_graph, partition_stats  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--graph", default="cora")
parser.add_argument("--stand-in", action="store_true")
parser.add_argument("--parts", default="2,4,8")
parser.add_argument("--methods", default="contiguous,metis")
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--out", default=None)
args = parser.parse_args()
data = stand_in_dataset(args.graph) if args.stand_in else load(args.graph)
rows = []
for method in args.methods.split(","):
    for p in (int(v) for v in args.parts.split(",")):
        start = time.perf_counter()
        stats = partition_stats(partition_graph(data.graph, p, method=method))
        row = {"graph": args.graph, "method": method, "parts": p, "seconds": time.perf_counter() - start,
               "cut_fraction": stats["cut_fraction"], "halo_nodes": stats["halo_nodes"],
               "edge_imbalance": stats["edge_imbalance"],
               "halo_mb_per_layer": stats["halo_nodes"] * args.width * 4 / 1e6}
        rows.append(row)
        print(json.dumps(row), flush=True)
if args.out:
    Path(args.out).write_text(json.dumps(rows, indent=1))
