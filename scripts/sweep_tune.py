"""Collect the cost model's training data on the GPU: every SpMM candidate config timed on
every case (graph x F x dtype), next to cuSPARSE, each output checked against float64.

    PYTHONPATH=src python scripts/sweep_tune.py --groups real,structure,paper --out sweep.jsonl

One JSON row per (case, config): graph, group, structural stats (tune.features.GraphStats),
F, dtype, config, ms (benchmark protocol: cold L2, median), rel_err, and cusparse_ms for the
case; ``ms`` is the minimum of ``--passes`` readings taken in passes of fresh random order
(``ms_reps``: all of them).  Rows are appended and flushed as they come, so a run cut short
keeps what it measured; ``--max-seconds`` stops cleanly before a device-time limit and
``--skip-done`` resumes after the graphs already written.
"""
from __future__ import annotations

import argparse
import json
import math
import random
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


def sweep_case(graph, x, dtype_name, ref, passes: int = 1, seed: int = 0):
    """``([(config, ms, rel_err, reps)], cusparse_ms)`` for every candidate of one case.

    With ``passes > 1`` every candidate (and cuSPARSE) is timed once per pass, each pass in a
    fresh random order, and ``ms`` is the minimum: a transient (clocks settling, a neighbour's
    load) then hits one reading of a config, not the config's only reading, and no config is
    always timed first.  ``reps`` keeps every reading.
    """
    plan = plan_of(graph)
    num_feats = x.shape[1]
    cands = configs.spmm_candidates(graph.num_nodes, graph.num_edges, num_feats, x.element_size(), plan.max_degree)
    run = lambda c: spmm_planned(graph.rowptr, plan, graph.edge_val, x, "sum", config=c)  # noqa: E731
    errs = []
    for cfg in cands:
        err = float((run(cfg).double() - ref).norm() / ref.norm().clamp(min=1e-30))
        errs.append(err if math.isfinite(err) else float("inf"))
    csr = graph.to_torch_sparse_csr(x.dtype)
    timings = {i: [] for i in range(len(cands) + 1)}             # the last: cuSPARSE
    for rep in range(passes):
        for i in random.Random(seed * 1000 + rep).sample(range(len(cands) + 1), len(cands) + 1):
            if i == len(cands):
                timings[i].append(time_config(lambda c: torch.sparse.mm(csr, x), {}))
            else:
                timings[i].append(time_config(run, cands[i]))
    out = [(cfg, min(timings[i]), errs[i], timings[i]) for i, cfg in enumerate(cands)]
    return out, min(timings[len(cands)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="real,structure,paper")
    parser.add_argument("--graphs", default=None, help="comma-separated names (overrides --groups; stand-ins)")
    parser.add_argument("--dims", default="32,64,128,256")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-seconds", type=float, default=1e9)
    parser.add_argument("--passes", type=int, default=3, help="timings per config, each pass in a new random order")
    parser.add_argument("--skip-done", action="store_true", help="skip graphs already in --out (resume)")
    args = parser.parse_args()
    device = torch.device("cuda")
    start = time.perf_counter()
    work = [(g, grp) for grp in args.groups.split(",") for g in GROUPS[grp]]
    if args.graphs:
        work = [(g, "custom") for g in args.graphs.split(",")]
    if args.skip_done:
        try:
            with open(args.out) as f:
                done = {json.loads(line)["graph"] for line in f if line.strip()}
        except FileNotFoundError:
            done = set()
        work = [(g, grp) for g, grp in work if g not in done]
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
                    rows, cusparse = sweep_case(graph, x, dtype_name, ref, args.passes, seed=num_feats)
                    best = min(ms for _, ms, _, _ in rows)
                    for cfg, ms, err, reps in rows:
                        f.write(json.dumps({"graph": name, "group": group, "stats": stats, "F": num_feats,
                                            "dtype": dtype_name, "config": cfg, "ms": ms, "rel_err": err,
                                            "cusparse_ms": cusparse, "ms_reps": reps}) + "\n")
                    f.flush()
                    worst_err = max(err for _, _, err, _ in rows)
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
