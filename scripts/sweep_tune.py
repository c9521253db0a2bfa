"""Collect the cost model's training data on the GPU: every SpMM candidate config timed on
every case (graph x F x dtype), next to cuSPARSE, each output checked against float64.

    python -m scripts.sweep_tune --groups real,structure,paper --out sweep.jsonl
    python -m scripts.sweep_tune --groups extra --dry-run    # CPU: graphs, time estimate

One JSON row per (case, config): graph, group, structural stats (tune.features.GraphStats),
F, dtype, config, ms (the tuner's measure: GPU time, cold L2, median of CUDA-graph replays),
rel_err, and cusparse_ms for the case.  Every config is timed in ``--passes`` passes of fresh
random order; ``ms`` is the minimum (``ms_reps``: every reading; ``replayed``: false where a
call could not be captured and was timed eagerly).  ``host_ms_reps``: what
issuing one call took in each pass (``tune.autotune.measure(host=True)``: the least of three
calls), recorded for analysis; the tuner decides on GPU time.  Rows are appended and flushed
as they come, so a run cut short keeps what it measured; ``--max-seconds`` stops cleanly
before a device-time limit and ``--skip-done`` resumes after the graphs already written.

The ``families`` group draws every structure family of ``datasets.families`` (power laws of
three exponents, communities, dense graphs, meshes, road networks, bipartite graphs, molecule
batches) at 10k-10M edges in locality and random order; its rows carry ``family``, so that
validation can hold out whole families (``datasets.families.leave_out_folds``).  A family
graph named by ``--graphs`` (``dense/1000000/random``) is swept as one of the group.  ``bipartite-sizes`` adds
bipartite graphs at 3M and 30M edges (``BIPARTITE_SIZES``), family rows like the others.

The ``extra`` group (``EXTRA``) holds graphs that only widen what the model trains on
(``fit_cost_model.py --extra``): synthetic graphs over sizes, degrees, hubs, power laws,
locality, small-graph batches and meshes, and re-ordered copies of real-suite graphs; a copy's
rows carry ``source`` (the group and name of the graph it copies) so that leave-graph-out holds
it out with that graph.  ``--dry-run`` builds the selected graphs on the CPU and prints their
sizes, build times, structure digests and candidate counts, and the sweep's estimated device
time, without a GPU.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from typing import List, Optional, Tuple

import torch

from sparsegnn.benchmark import bench_graph
from sparsegnn.datasets.suite import REAL_SUITE, load_suite_graph
from sparsegnn.datasets.families import FAMILIES, ORDERS as FAMILY_ORDERS, family_graph
from sparsegnn.datasets.synthetic import SUITES, chung_lu, grid_graph, small_graph_batch
from sparsegnn.formats.reorder import order as node_order
from sparsegnn.formats.reorder import permute_csr
from sparsegnn.graph import Graph
from sparsegnn.kernels import configs
from sparsegnn.kernels.spmm_csr import spmm_planned
from sparsegnn.ops import reference
from sparsegnn.ops._triton import plan_of
from sparsegnn.tune.autotune import measure
from sparsegnn.tune.features import graph_stats_cached


def _cl(nodes: int, edges: int, exponent: float, ratio: float, community: int = 0, fraction: float = 0.8):
    """An ``EXTRA`` generator entry: ``datasets.synthetic.chung_lu`` with these arguments."""
    return "chung_lu", dict(num_nodes=nodes, num_edges=edges, exponent=exponent, max_degree_ratio=ratio,
                            community_size=community, community_fraction=fraction)


#: The ``extra`` group: name -> (base, node order); training data only, never evaluated.
#: base: a seeded generator of ``datasets.synthetic`` (``chung_lu`` power laws: nodes, edges,
#: exponent, max degree / mean, and with ``community`` that share of the edges inside blocks of
#: consecutive ids; ``grid`` meshes; ``batch`` block-diagonal batches of small graphs), or
#: ``("real", name)`` / ``("extra", name)``: a copy of that graph.  Node order: None (as built or
#: loaded), ``shuffle`` (random relabelling: no locality), ``degree`` (hubs first) or ``rcm``.
#: Each graph <= 5M edges (the paper group's largest is 4.9M).
EXTRA = {
    # power laws in random order: sizes, mean degree 2-150, max degree 3-1000x the mean, exponent 1.9-3.5
    "cl-n2k-d6": (_cl(2_000, 12_000, 2.5, 30), None),
    "cl-n5k-d40-hubs": (_cl(5_000, 200_000, 2.0, 60), None),
    "cl-n3k-d150-flat": (_cl(3_000, 450_000, 3.5, 3), None),
    "cl-n15k-d80": (_cl(15_000, 1_200_000, 3.0, 10), None),
    "cl-n20k-d60-hubs": (_cl(20_000, 1_200_000, 1.9, 150), None),
    "cl-n40k-d25-hubs": (_cl(40_000, 1_000_000, 2.1, 300), None),
    "cl-n100k-d20-hubs": (_cl(100_000, 2_000_000, 1.9, 1000), None),
    "cl-n100k-d8": (_cl(100_000, 800_000, 2.8, 20), None),
    "cl-n400k-d10-hubs": (_cl(400_000, 4_000_000, 2.1, 1000), None),
    "cl-n400k-d3": (_cl(400_000, 1_200_000, 2.5, 100), None),
    "cl-n200k-d2-flat": (_cl(200_000, 400_000, 3.5, 5), None),
    "cl-n40k-d100-flat": (_cl(40_000, 4_000_000, 3.2, 5), None),
    # locality: a share of each node's in-edges from its block of consecutive ids
    "cl-n60k-d8-c128": (_cl(60_000, 480_000, 2.3, 50, community=128, fraction=0.6), None),
    "cl-n150k-d12-c256": (_cl(150_000, 1_800_000, 2.3, 60, community=256, fraction=0.9), None),
    "cl-n30k-d30-c32": (_cl(30_000, 900_000, 2.6, 20, community=32, fraction=0.5), None),
    "cl-n50k-d32-c64-band": (_cl(50_000, 1_600_000, 3.5, 3, community=64, fraction=1.0), None),
    "cl-n10k-d16-c512-hubs": (_cl(10_000, 160_000, 2.2, 100, community=512, fraction=0.7), None),
    # same degrees, other locality
    "cl-n40k-d25-hubs.degree": (("extra", "cl-n40k-d25-hubs"), "degree"),
    # batches of small graphs: molecule-like (trees + rings, degree ~2.3), TU-like (dense, p = 0.25)
    "mol-n60k": (("batch", dict(num_graphs=2_500, min_nodes=8, max_nodes=40, kind="molecule")), None),
    "mol-n250k": (("batch", dict(num_graphs=10_000, min_nodes=5, max_nodes=45, kind="molecule")), None),
    "tu-n20k": (("batch", dict(num_graphs=600, min_nodes=10, max_nodes=60, kind="dense")), None),
    "tu-n20k.shuffle": (("extra", "tu-n20k"), "shuffle"),
    "tu-n60k-d50": (("batch", dict(num_graphs=300, min_nodes=100, max_nodes=300, kind="dense")), None),
    # meshes (row-major; side 60 keeps vertical neighbours within 64 ids)
    "mesh-n3.6k": (("grid", dict(num_nodes=3_600)), None),
    "mesh-n40k": (("grid", dict(num_nodes=40_000)), None),
    "mesh-n250k.shuffle": (("grid", dict(num_nodes=250_000)), "shuffle"),
    # real-suite graphs in another order (held out with their source in leave-graph-out)
    "real.reddit-threads-10k.shuffle": (("real", "reddit-threads-10k"), "shuffle"),
    "real.tox21.shuffle": (("real", "tox21"), "shuffle"),
    "real.PROTEINS_full.shuffle": (("real", "PROTEINS_full"), "shuffle"),
    "real.deezer.rcm": (("real", "deezer"), "rcm"),
    "real.wikipedia.degree": (("real", "wikipedia"), "degree"),
}

#: The ``families`` group: every structure family (``datasets.families``) at these edge counts,
#: in both node orders; a row carries its ``family`` (for folds that hold a family out).
FAMILY_EDGES = (10_000, 100_000, 1_000_000, 10_000_000)
FAMILY_GRAPHS = tuple(f"{family}/{edges}/{order}" for family in FAMILIES for edges in FAMILY_EDGES
                      for order in FAMILY_ORDERS)

#: Bipartite graphs between the ``families`` sizes: their winners change with size and node
#: order (a locality-ordered one at 10M edges is the only graph of the sweep won by 128-wide
#: feature blocks with 2 warps and 8-row groups), so a model that holds one graph out needs
#: neighbours of it.
BIPARTITE_SIZES = tuple(f"bipartite/{edges}/{order}" for edges in (3_000_000, 30_000_000) for order in FAMILY_ORDERS)

GROUPS = {
    "real": REAL_SUITE,
    "structure": SUITES["structure"],
    "paper": ("cora", "citeseer", "pubmed", "ppi", "PROTEINS_full", "DD", "amazon0505", "artist", "com-amazon",
              "soc-BlogCatalog", "amazon0601", "flickr", "OVCAR-8H", "Yeast"),
    "large": ("yelp", "reddit", "ogbn-proteins"),
    "extra": tuple(EXTRA),
    "families": FAMILY_GRAPHS,
    "bipartite-sizes": BIPARTITE_SIZES,
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Device seconds per timing of one config in the 3-pass sweep of notes/tuning.md:
#: real 74 s + structure 23 s + paper 78 s for 3 x 4401 timings (4161 configs and 240 cuSPARSE
#: calls), about 13 ms each (L2 flushes and up to 25 repetitions); compiling added about 60 s.
TIMING_S = (74 + 23 + 78) / (3 * 4401)
COMPILE_S = 60


def extra_graph(name: str) -> Tuple[Graph, Optional[Tuple[str, str]]]:
    """``(graph, source)`` of ``EXTRA[name]``, built on the CPU without edge values: seeded, so
    the same graph on every machine.  ``source``: ``(group, name)`` of the graph it copies, else None."""
    (kind, arg), how = EXTRA[name]
    source = None
    if kind == "real":
        graph, source = load_suite_graph(arg), ("real", arg)
    elif kind == "extra":
        graph, source = extra_graph(arg)[0], ("extra", arg)
    elif kind == "chung_lu":
        graph = Graph.from_edge_index(chung_lu(seed=0, **arg), num_nodes=arg["num_nodes"])
    elif kind == "grid":
        graph = Graph.from_edge_index(grid_graph(seed=0, **arg), num_nodes=int(arg["num_nodes"] ** 0.5) ** 2)
    else:
        edge_index, ptr = small_graph_batch(seed=0, **arg)
        graph = Graph.from_edge_index(edge_index, num_nodes=int(ptr[-1]))
    rowptr, col = graph.rowptr, graph.col
    if how is not None:
        perm = (torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(0)) if how == "shuffle"
                else node_order(rowptr, col, how))
        rowptr, col, _ = permute_csr(rowptr, col, perm)
    return Graph(rowptr, col, None, graph.num_nodes), source


def family_of(name: str) -> Optional[str]:
    """The structure family of a ``families`` graph name (``family/edges/order``), else None."""
    parts = name.split("/")
    return parts[0] if len(parts) == 3 and parts[0] in FAMILIES else None


def load_graph(name: str, group: str, device) -> Tuple[Graph, Optional[Tuple[str, str]]]:
    """``(graph without values on device, source)`` of one sweep graph (``source``: see ``extra_graph``)."""
    if group == "extra":
        graph, source = extra_graph(name)
        return graph.to(device), source
    if family_of(name):     # a family graph (family/edges/order), whatever group names it
        family, edges, order = name.split("/")
        fg = family_graph(family, int(edges), seed=0, order=order, device=device)
        return Graph.from_edge_index(fg.edge_index, num_nodes=fg.num_nodes, num_src=fg.num_src), None
    return bench_graph(name, device=device, real=group == "real"), None


def group_dims(group: str, dims):
    """The feature widths swept for ``group`` (the large graphs: 32 and 128 only)."""
    return [d for d in dims if d in (32, 128)] if group == "large" else list(dims)


def dry_run(work, dims, dtypes, passes: int) -> int:
    """Build every graph of ``work`` on the CPU and print its sizes, build time, structure
    digest (sha256 of its CSR) and candidate configs, then the sweep's estimated device time
    (``TIMING_S`` per timing, ``COMPILE_S`` once); no GPU needed."""
    total_build, total_cfgs, total_cases = 0.0, 0, 0
    print(f"{'group':9s} {'graph':34s} {'nodes':>9s} {'edges':>9s} {'mean':>6s} {'max':>6s} {'local':>5s} "
          f"{'window':>6s} {'build s':>7s} {'cfgs':>5s} {'est s':>6s}  digest")
    for name, group in work:
        start = time.perf_counter()
        graph, source = load_graph(name, group, "cpu")
        build_s = time.perf_counter() - start
        stats = graph_stats_cached(graph)
        digest = hashlib.sha256(graph.rowptr.numpy().tobytes() + graph.col.numpy().tobytes()).hexdigest()[:12]
        cases = [(f, d) for f in group_dims(group, dims) for d in dtypes]
        cfgs = sum(len(configs.spmm_candidates(stats.num_nodes, stats.num_edges, f, DTYPES[d].itemsize, stats.deg_max))
                   for f, d in cases)
        total_build, total_cfgs, total_cases = total_build + build_s, total_cfgs + cfgs, total_cases + len(cases)
        print(f"{group:9s} {name:34s} {stats.num_nodes:9d} {stats.num_edges:9d} {stats.deg_mean:6.1f} "
              f"{stats.deg_max:6d} {stats.local_frac:5.2f} {stats.window_frac:6.2f} {build_s:7.2f} {cfgs:5d} "
              f"{passes * (cfgs + len(cases)) * TIMING_S:6.1f}  {digest}" + (f"  (copy of {'/'.join(source)})"
                                                                             if source else ""), flush=True)
    est = passes * (total_cfgs + total_cases) * TIMING_S + COMPILE_S
    print(f"dry run: {len(work)} graphs built in {total_build:.1f} s (CPU); {total_cases} cases, {total_cfgs} configs; "
          f"estimated device time with --passes {passes}: {est:.0f} s ({est / 60:.1f} min, "
          f"{COMPILE_S} s of it compiling)")
    return 0


def sweep_case(graph, x, dtype_name, ref, passes: int = 1, seed: int = 0):
    """``([(config, ms, rel_err, reps, replayed)], cusparse_ms)`` for every candidate of one case
    (``reps``: (GPU ms, host ms) per pass; ``replayed``: every GPU reading a replay).

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
    replayed = {i: True for i in range(len(cands) + 1)}           # every reading a replay (else eager)
    for rep in range(passes):
        for i in random.Random(seed * 1000 + rep).sample(range(len(cands) + 1), len(cands) + 1):
            protocol: dict = {}
            call = (lambda c: torch.sparse.mm(csr, x)) if i == len(cands) else run
            timings[i] += measure(call, [{} if i == len(cands) else cands[i]], protocol=protocol, host=True)
            replayed[i] = replayed[i] and protocol["replayed"]
    out = [(cfg, min(g for g, _ in timings[i]), errs[i], timings[i], replayed[i]) for i, cfg in enumerate(cands)]
    return out, min(g for g, _ in timings[len(cands)])


def not_done(work: List[Tuple[str, str]], out: str) -> List[Tuple[str, str]]:
    """The ``(graph, group)`` items of ``work`` with no row in the sweep file ``out`` yet: keyed
    by group and name, since a stand-in may share a real graph's name (``cora`` in ``paper``
    is the stand-in, in ``real`` the real graph)."""
    try:
        with open(out) as f:
            done = {(r["graph"], r["group"]) for r in map(json.loads, filter(str.strip, f))}
    except FileNotFoundError:
        done = set()
    return [item for item in work if item not in done]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="real,structure,paper")
    parser.add_argument("--graphs", default=None, help="comma-separated names (overrides --groups; stand-ins)")
    parser.add_argument("--dims", default="32,64,128,256")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", help="output JSONL (rows appended); required unless --dry-run")
    parser.add_argument("--max-seconds", type=float, default=1e9)
    parser.add_argument("--passes", type=int, default=3, help="timings per config, each pass in a new random order")
    parser.add_argument("--skip-done", action="store_true", help="skip graphs already in --out (resume)")
    parser.add_argument("--dry-run", action="store_true", help="CPU only: build the graphs, estimate the device time")
    args = parser.parse_args()
    work = [(g, grp) for grp in args.groups.split(",") for g in GROUPS[grp]]
    if args.graphs:
        # a graph named by --graphs keeps the group it has (an extra graph, a family's graph), else "custom"
        work = [(g, "extra" if g in EXTRA else ("families" if family_of(g) else "custom")) for g in args.graphs.split(",")]
    dims = [int(d) for d in args.dims.split(",")]
    if args.dry_run:
        return dry_run(work, dims, args.dtypes.split(","), args.passes)
    if not args.out:
        parser.error("--out is required (unless --dry-run)")
    device = torch.device("cuda")
    start = time.perf_counter()
    if args.skip_done:
        work = not_done(work, args.out)
    with open(args.out, "a") as f:
        for name, group in work:
            if time.perf_counter() - start > args.max_seconds:
                print(f"sweep: stopping at {name} (time limit)", file=sys.stderr)
                break
            structure, source = load_graph(name, group, device)
            ident = {"graph": name, "group": group, **({"source": list(source)} if source else {}),
                     **({"family": family_of(name)} if family_of(name) else {})}
            gen = torch.Generator(device=device).manual_seed(0)
            graph = structure.with_values(torch.rand(structure.num_edges, device=device, generator=gen) + 0.5)
            stats = graph_stats_cached(graph).as_dict()
            for num_feats in group_dims(group, dims):
                x32 = torch.randn(graph.num_src, num_feats, device=device, generator=gen)
                ref = reference.spmm_sum(graph.row, graph.col, graph.num_nodes, x32.double(), graph.edge_val.double())
                for dtype_name in args.dtypes.split(","):
                    x = x32.to(DTYPES[dtype_name])
                    rows, cusparse = sweep_case(graph, x, dtype_name, ref, args.passes, seed=num_feats)
                    best = min(ms for _, ms, _, _, _ in rows)
                    for cfg, ms, err, reps, replay in rows:
                        f.write(json.dumps({**ident, "stats": stats, "F": num_feats,
                                            "dtype": dtype_name, "config": cfg, "ms": ms, "rel_err": err,
                                            "cusparse_ms": cusparse, "ms_reps": [g for g, _ in reps],
                                            "host_ms_reps": [h for _, h in reps], "replayed": replay}) + "\n")
                    f.flush()
                    worst_err = max(err for _, _, err, _, _ in rows)
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
