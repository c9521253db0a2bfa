"""Collect the cost model's training data on the GPU: every SpMM candidate config timed on
every case (graph x F x dtype), next to cuSPARSE, each output checked against float64.

    PYTHONPATH=src python scripts/sweep_tune.py --groups real,structure,paper --out sweep.jsonl

One JSON row per (case, config): graph, group, structural stats (tune.features.GraphStats),
F, dtype, config, ms (benchmark protocol: cold L2, median), rel_err, and cusparse_ms for the
case.  Rows are appended and flushed as they come, so a run cut short keeps what it measured;
``--max-seconds`` stops cleanly before a device-time limit.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from sparsegnn.bench.harness import bench_graph
from sparsegnn.datasets.suite import REAL_SUITE
from sparsegnn.datasets.synthetic import SUITES
from sparsegnn.kernels import configs
from sparsegnn.kernels.spmm_csr import spmm_planned
from sparsegnn.ops import reference
from sparsegnn.ops._dispatch import plan_of
from sparsegnn.tune.autotune import time_config
from sparsegnn.tune.features import graph_stats_cached

GROUPS = {
    "real": REAL_SUITE,
    "structure": SUITES["structure"],
    "paper": ("cora", "citeseer", "pubmed", "ppi", "PROTEINS_full", "DD", "amazon0505", "artist", "com-amazon",
              "soc-BlogCatalog", "amazon0601", "flickr", "OVCAR-8H", "Yeast"),
    "large": ("yelp", "reddit", "ogbn-proteins"),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def sweep_case(graph, x, dtype_name, ref):
    """(config, ms, rel_err) of every candidate, and cuSPARSE's ms, on one case."""
    plan = plan_of(graph)
    num_feats = x.shape[1]
    cands = configs.spmm_candidates(graph.num_nodes, graph.num_edges, num_feats, x.element_size(), plan.max_degree)
    out = []
    for cfg in cands:
        run = lambda c: spmm_planned(graph.rowptr, plan, graph.edge_val, x, "sum", config=c)  # noqa: E731
        res = run(cfg).double()
        err = float((res - ref).norm() / ref.norm().clamp(min=1e-30))
        out.append((cfg, time_config(run, cfg), err if math.isfinite(err) else float("inf")))
    csr = graph.to_torch_sparse_csr(x.dtype)
    cusparse = time_config(lambda c: torch.sparse.mm(csr, x), {})
    return out, cusparse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="real,structure,paper")
    parser.add_argument("--graphs", default=None, help="comma-separated names (overrides --groups; stand-ins)")
    parser.add_argument("--dims", default="32,64,128,256")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-seconds", type=float, default=1e9)
    args = parser.parse_args()
    device = torch.device("cuda")
    start = time.perf_counter()
    work = [(g, grp) for grp in args.groups.split(",") for g in GROUPS[grp]]
    if args.graphs:
        work = [(g, "custom") for g in args.graphs.split(",")]
    with open(args.out, "a") as f:
        for name, group in work:
            if time.perf_counter() - start > args.max_seconds:
                print(f"sweep: stopping at {name} (time limit)", file=sys.stderr)
                break
            structure = bench_graph(name, device=device, real=group == "real")
            gen = torch.Generator(device=device).manual_seed(0)
            graph = structure.with_values(torch.rand(structure.num_edges, device=device, generator=gen) + 0.5)
            stats = graph_stats_cached(graph).as_dict()
            dims = [int(d) for d in args.dims.split(",")]
            if group == "large":
                dims = [d for d in dims if d in (32, 128)]
            for num_feats in dims:
                x32 = torch.randn(graph.num_nodes, num_feats, device=device, generator=gen)
                ref = reference.spmm_sum(graph.row, graph.col, graph.num_nodes, x32.double(), graph.edge_val.double())
                for dtype_name in args.dtypes.split(","):
                    x = x32.to(DTYPES[dtype_name])
                    rows, cusparse = sweep_case(graph, x, dtype_name, ref)
                    best = min(ms for _, ms, _ in rows)
                    for cfg, ms, err in rows:
                        f.write(json.dumps({"graph": name, "group": group, "stats": stats, "F": num_feats,
                                            "dtype": dtype_name, "config": cfg, "ms": ms, "rel_err": err,
                                            "cusparse_ms": cusparse}) + "\n")
                    f.flush()
                    worst_err = max(err for _, _, err in rows)
                    print(f"{group:9s} {name:20s} F={num_feats:3d} {dtype_name:8s} best {best:.4f} ms  cusparse "
                          f"{cusparse:.4f} ms  x{cusparse / best:.2f}  worst_err {worst_err:.1e}  ({len(rows)} cfgs)",
                          flush=True)
                del x32, ref
            del graph, structure
            torch.cuda.empty_cache()
    print(f"sweep: {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
