"""Per-call cost of small-graph structure work on the host (formats/_host.py) against the same
work on the GPU, both paths warm (steady state: a training loop that builds a new graph each
step, e.g. sampled mini-batches or molecule batches).  Prints a table; --out writes JSON rows.

    PYTHONPATH=src python scripts/time_host_routing.py --out benchmarks/h100/host_routing.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from sparsegnn.formats import _host
from sparsegnn.formats.csr import transpose_csr
from sparsegnn.formats.plan import build_row_plan
from sparsegnn.graph import Graph
from sparsegnn.nn import _graph_input as gi
from sparsegnn.tune.features import graph_stats


def _time(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return 1000.0 * (time.perf_counter() - t0) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    rows = []
    for nodes, edges in ((1_000, 2_000), (2_708, 13_264), (8_000, 32_000)):
        g = torch.Generator().manual_seed(0)
        ei = torch.randint(0, nodes, (2, edges), generator=g).cuda()
        graph = Graph.from_edge_index(ei, None, nodes)
        rowptr, col = graph.rowptr, graph.col
        row = graph.row
        work = {
            "layer graph (edge_index -> gcn-normalised Graph)":
                lambda: gi.graph_from_edge_index(ei.clone(), None, nodes, gi.gcn_normalized),
            "row plan": lambda: build_row_plan(rowptr, col, 32),
            "statistics": lambda: graph_stats(rowptr, col, row),
            "transpose": lambda: transpose_csr(rowptr, col, nodes),
        }
        for name, fn in work.items():
            times = {}
            for where, limit in (("host", 1 << 15), ("device", 0)):
                _host.HOST_MAX_EDGES = limit
                _host.HOST_CALLS = 1 << 30 if where == "host" else 0     # every call on the host
                gi.clear_graph_cache()
                times[where] = _time(fn, args.reps)
            _host.HOST_MAX_EDGES, _host.HOST_CALLS = 1 << 15, 8
            rows.append({"nodes": nodes, "edges": edges, "work": name, "host_ms": times["host"],
                         "device_ms": times["device"]})
    print("| nodes | edges | work | host ms | device ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['nodes']} | {r['edges']} | {r['work']} | {r['host_ms']:.3f} | {r['device_ms']:.3f} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
