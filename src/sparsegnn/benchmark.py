"""Timing on a user's own graph: ``sparsegnn bench`` and ``sparsegnn tune``.

* :func:`time_graph`: ``spmm`` (sum) on one graph against ``torch.sparse.mm`` (cuSPARSE on CUDA),
  each output checked against the float64 reference; :func:`load_graph` reads the graph from a
  file or by name.
* :func:`tuning_report`: for every case (graph x F x dtype) and policy (``model``: zero-shot,
  ``shortlist``: the model's top 3 timed, ``exhaustive``: every candidate timed), a fresh
  in-memory decision store is used, the first call's wall time is measured (Triton's compile
  cache warmed beforehand, so it is the tuning itself) and the picked config is timed with the
  benchmark protocol.  The model's predicted rank of the exhaustive winner is reported too.

* :func:`precision_report`: what a precision mode buys (``sparsegnn tune --precision``): for
  every case (graph x F x precision) the tuner's pick among the exact call and the reduced
  kernels (every candidate timed, as an eager call), its time, the best candidate's and the
  exact call's, and the per-call time of ``spmm(..., precision=p)`` against the exact
  ``spmm`` as a script calls them (eager, back to back).

The benchmark suites (every op, graph suite and baseline) live in the repository's
``benchmarks/`` package, not here.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .datasets.synthetic import STAND_INS, stand_in_graph
from .graph import Graph
from .ops import spmm
from .ops._common import spmm_detail
from .ops._triton import SPMM_FAMILY, plan_of
from .tune import autotune
from .tune.features import graph_stats_cached
from .tune.model import load_model
from .tune.store import reset_stores


def bench_graph(name: str, seed: int = 0, device=None, data_dir=None, real: bool = False) -> Graph:
    """The graph of a benchmark case without values: a synthetic stand-in (``STAND_INS``) or,
    with ``real`` (or a name no stand-in has), a real-suite graph (``datasets.suite``, natural
    node order).  Some names (cora, citeseer, PROTEINS_full) exist as both."""
    if name in STAND_INS and not real:
        spec = STAND_INS[name]
        edge_index = stand_in_graph(name, seed=seed, device=device)
        num_nodes = max(spec.num_nodes, int(edge_index.max()) + 1 if edge_index.numel() else 0)
        graph = Graph.from_edge_index(edge_index, num_nodes=num_nodes)
        return Graph(graph.rowptr, graph.col, None, graph.num_nodes)  # drop edge_perm memory
    from .datasets.suite import load_suite_graph

    return load_suite_graph(name, data_dir=data_dir).to(device)  # already without values


def load_graph(source: str, device=None, data_dir=None) -> Graph:
    """A graph from a file or a name: ``.pt`` / ``.pth`` (a ``[2, E]`` edge_index tensor, or a
    dict with ``edge_index`` and optionally ``num_nodes``), ``.npz`` (``edge_index``, or ``row``
    and ``col``), else a stand-in or real-suite graph name (:func:`bench_graph`)."""
    path = Path(source).expanduser()
    if path.suffix in (".pt", ".pth", ".npz"):
        if not path.is_file():
            raise ValueError(f"bench(): no such file {source}")
        if path.suffix == ".npz":
            import numpy as np

            with np.load(path) as arrays:
                data = {k: torch.from_numpy(arrays[k]) for k in arrays.files}
            if "edge_index" not in data and {"row", "col"} <= set(data):
                data["edge_index"] = torch.stack([data["row"], data["col"]])
        else:
            data = torch.load(path, map_location="cpu", weights_only=True)
            data = data if isinstance(data, dict) else {"edge_index": data}
        edge_index = data.get("edge_index")
        if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"bench(): {source} holds no [2, E] edge_index")
        num_nodes = data.get("num_nodes")
        num_nodes = int(num_nodes) if num_nodes is not None else None
        return Graph.from_edge_index(edge_index.long().to(device), num_nodes=num_nodes)
    if source not in STAND_INS:
        from .datasets.suite import REAL_SUITE

        if source not in REAL_SUITE:
            raise ValueError(f"bench(): {source!r} is neither a .pt / .npz file nor a known graph "
                             f"({', '.join(list(STAND_INS) + list(REAL_SUITE))})")
    return bench_graph(source, device=device, data_dir=data_dir)


def _median_ms(fn, device: torch.device, reps: int = 20) -> float:
    """Median wall ms of ``fn`` over ``reps`` calls after two warm-up calls, synchronised."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def time_graph(graph: Graph, dims: Sequence[int] = (32, 128), dtype: torch.dtype = torch.float32,
               seed: int = 0) -> List[Dict]:
    """One row per feature width: ``spmm`` (sum, random edge values) and ``torch.sparse.mm`` on
    ``graph``'s device, median ms of 20 calls, and each one's error against float64."""
    device = graph.rowptr.device
    gen = torch.Generator(device=device).manual_seed(seed)
    weighted = graph.with_values(torch.rand(graph.num_edges, device=device, generator=gen) + 0.5)
    reference = weighted.with_values(weighted.edge_val.double())
    csr = weighted.to_torch_sparse_csr(dtype)
    rows = []
    for num_feats in dims:
        x = torch.randn(graph.num_nodes, num_feats, device=device, generator=gen).to(dtype)
        ref = spmm(reference, x.double(), backend="reference")
        row = {"nodes": graph.num_nodes, "edges": graph.num_edges, "F": num_feats, "dtype": str(dtype).replace("torch.", "")}
        for name, fn in (("sparsegnn", lambda: spmm(weighted, x)), ("torch.sparse", lambda: torch.sparse.mm(csr, x))):
            try:
                out = fn()
                row[f"{name}_ms"] = _median_ms(fn, device)
                row[f"{name}_err"] = float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))
            except RuntimeError as exc:  # a dtype the baseline has no kernel for
                row[f"{name}_ms"], row[f"{name}_err"] = None, str(exc).splitlines()[0][:80]
        base, ours = row["torch.sparse_ms"], row["sparsegnn_ms"]
        row["speedup"] = base / ours if base and ours else None
        rows.append(row)
    return rows


def time_markdown(rows: List[Dict]) -> str:
    lines = ["| nodes | edges | F | dtype | sparsegnn ms | torch.sparse ms | x | error ours / torch |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, spec: "-" if v is None else (v if isinstance(v, str) else format(v, spec))  # noqa: E731
    for r in rows:
        lines.append(f"| {r['nodes']:,} | {r['edges']:,} | {r['F']} | {r['dtype']} | {fmt(r['sparsegnn_ms'], '.4f')} | "
                     f"{fmt(r['torch.sparse_ms'], '.4f')} | {fmt(r['speedup'], '.2f')} | "
                     f"{fmt(r['sparsegnn_err'], '.1e')} / {fmt(r['torch.sparse_err'], '.1e')} |")
    return "\n".join(lines)


POLICIES = ("model", "shortlist", "exhaustive")


@contextlib.contextmanager
def _environ(**values: Optional[str]):
    """The environment variables ``values`` set (None: unset) for the block, restored after it
    and the decision stores reset (they read the tuning settings)."""
    def put(settings: Dict[str, Optional[str]]) -> None:
        for k, v in settings.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    saved = {k: os.environ.get(k) for k in values}
    try:
        put(values)
        yield
    finally:
        put(saved)
        reset_stores()


def tuning_report(graphs: List[str], dims: List[int], dtypes: List[torch.dtype], real: bool = True,
                  data_dir=None) -> List[Dict]:
    """One row per case and policy: pick, its kernel ms, first-call (tuning) seconds (the graph
    is planned first, so its first call is an invested one: ``tune.reuse``)."""
    from .kernels import configs
    from .kernels.spmm_csr import spmm_planned

    rows = []
    with _environ(SPARSEGNN_TUNE_CACHE="off", SPARSEGNN_TUNE=os.environ.get("SPARSEGNN_TUNE")):
        for name in graphs:
            base = bench_graph(name, device="cuda", data_dir=data_dir, real=real)
            # the CSR tuner's report: without ptr (a small batch would take the batched kernels, untuned)
            g = Graph(base.rowptr, base.col, torch.rand(base.num_edges, device="cuda") + 0.5, base.num_nodes)
            plan = plan_of(g)
            stats = graph_stats_cached(g)
            for num_feats in dims:
                for dtype in dtypes:
                    x = torch.randn(g.num_nodes, num_feats, device="cuda").to(dtype)
                    run = lambda c: spmm_planned(g.rowptr, plan, g.edge_val, x, "sum", config=c)  # noqa: E731
                    cands = configs.spmm_candidates(g.num_nodes, g.num_edges, num_feats, x.element_size(),
                                                    plan.max_degree)
                    for cfg in cands:  # warm Triton's compile cache: time the tuning, not the compiler
                        run(cfg)
                    model = load_model(torch.cuda.get_device_name())
                    order = model.rank(stats, num_feats, x.element_size(), cands) if model else list(range(len(cands)))
                    picks = {}
                    for policy in POLICIES:
                        os.environ["SPARSEGNN_TUNE"] = policy
                        reset_stores()
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        spmm(g, x)
                        torch.cuda.synchronize()
                        first_s = time.perf_counter() - t0
                        record = autotune.lookup(SPMM_FAMILY, g, spmm_detail(g.edge_val, "sum"), num_feats, dtype, "cuda")
                        if record is None:
                            raise RuntimeError(f"tuning_report(): spmm on {name} (F = {num_feats}, {dtype}) "
                                               f"stored no decision under SPARSEGNN_TUNE={policy}")
                        picks[policy] = (record["config"], first_s)
                    timed = {p: autotune.time_config(run, cfg) for p, (cfg, _) in picks.items()}
                    best_cfg = picks["exhaustive"][0]
                    for policy, (cfg, first_s) in picks.items():
                        rows.append({"graph": name, "F": num_feats, "dtype": str(dtype).replace("torch.", ""),
                                     "policy": policy, "config": cfg, "ms": timed[policy],
                                     "vs_exhaustive": timed[policy] / timed["exhaustive"], "tune_s": first_s,
                                     "candidates": len(cands),
                                     "model_rank_of_best": order.index(cands.index(best_cfg)) + 1})
            g = base = None  # noqa: F841 - free the graph before the next one
    return rows


def tuning_markdown(rows: List[Dict]) -> str:
    lines = ["| graph | F | dtype | model ms (x best) | shortlist ms (x best) | exhaustive ms | tuning s: model / shortlist / exhaustive | model's rank of the best |",
             "|---|---|---|---|---|---|---|---|"]
    by_case: Dict = {}
    for r in rows:
        by_case.setdefault((r["graph"], r["F"], r["dtype"]), {})[r["policy"]] = r
    for (graph, f, dtype), p in by_case.items():
        m, s, e = p["model"], p["shortlist"], p["exhaustive"]
        lines.append(f"| {graph} | {f} | {dtype} | {m['ms']:.4f} ({m['vs_exhaustive']:.2f}) | {s['ms']:.4f} "
                     f"({s['vs_exhaustive']:.2f}) | {e['ms']:.4f} | {m['tune_s']:.3f} / {s['tune_s']:.3f} / "
                     f"{e['tune_s']:.3f} | {e['model_rank_of_best']} of {e['candidates']} |")
    return "\n".join(lines)


def eager_ms(fn, target_ms: float = 2.0, reps: int = 7, max_calls: int = 200) -> float:
    """Median per-call wall ms of ``fn`` issued back to back (as a script calls it: host and
    GPU overlapping), ``reps`` groups of enough calls to take about ``target_ms``, each group
    synchronised at its end, after two warm-up calls."""
    calls = _group_calls(fn, target_ms, max_calls, torch.cuda.synchronize)
    return statistics.median(_group_ms(fn, calls, torch.cuda.synchronize) for _ in range(reps))


def _group_calls(fn, target_ms: float, max_calls: int, sync) -> int:
    """Calls of ``fn`` in a group of about ``target_ms`` (at most ``max_calls``), from the second
    of two warm-up calls, each synchronised."""
    fn()
    sync()
    return max(1, min(max_calls, int(target_ms / max(_group_ms(fn, 1, sync), 1e-3)) + 1))


def _group_ms(fn, calls: int, sync) -> float:
    """Per-call wall ms of ``calls`` calls of ``fn`` issued back to back, synchronised at the end."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return 1e3 * (time.perf_counter() - t0) / calls


#: Interleaved rounds of ``precision_report``'s two eager timings (the least of each kept by the
#: exact section of ``benchmarks/choices.py``): the H200's host switches between a fast and a slow
#: mode for milliseconds at a time (one call timed 24 or 41 us a group).
PRECISION_ROUNDS = 7
#: Rounds of :func:`paired_eager_ms` in ``precision_report``: one group of calls of each side a
#: round, the sides' order alternating, so that both see the same host modes.
PAIRED_ROUNDS = 41
#: Wall ms both sides run, alternating, before ``precision_report`` times them: right after the
#: tuner's timing a call that gathers from L2 (fp16-packed features, H200, soc-BlogCatalog
#: F = 128) ran at 0.185 ms a call for ~0.15 s and then settled at 0.145 ms, while the exact
#: call (bound by HBM) held 0.152 ms throughout.
PAIRED_WARMUP_MS = 300.0


def paired_eager_ms(fns: Dict[str, Callable[[], object]], rounds: int = PAIRED_ROUNDS, target_ms: float = 1.0,
                    max_calls: int = 100, sync: Optional[Callable[[], None]] = None,
                    warmup_ms: float = 0.0) -> Dict[str, List[float]]:
    """Per-call wall ms of each of ``fns`` (issued back to back, as a script calls them), in
    ``rounds`` rounds of one group of calls per function, the order reversed every other round,
    so that adjacent groups share the host's mode; a group is enough calls to take about
    ``target_ms`` (at most ``max_calls``), synchronised (``sync``, default
    ``torch.cuda.synchronize``) at its end, after two warm-up calls of each and then, for
    ``warmup_ms`` of wall time, untimed groups of each in turn.  Returns each name's
    list of ``rounds`` group times: the pairs of one round compare like with like, so the median
    of their ratios is the speedup (a host's slow phase inflates both sides of a round)."""
    sync = sync or torch.cuda.synchronize
    names = list(fns)
    calls = {name: _group_calls(fns[name], target_ms, max_calls, sync) for name in names}
    t0 = time.perf_counter()
    while 1e3 * (time.perf_counter() - t0) < warmup_ms:
        for name in names:
            _group_ms(fns[name], calls[name], sync)
    times: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(_group_ms(fns[name], calls[name], sync))
    return times


def precision_report(graphs: List[str], dims: List[int], precisions: Sequence[str] = ("tf32", "bf16"),
                     real: bool = True, data_dir=None, dtype: torch.dtype = torch.float32) -> List[Dict]:
    """One row per case (graph x F x precision): the ``"spmm_tc"`` pick (every candidate timed,
    a fresh in-memory store), its ms, the best candidate's and the exact call's as the tuner
    timed them, and ``spmm(g, x, precision=p)`` against ``spmm(g, x)`` called eagerly
    (:func:`paired_eager_ms`: medians of each side's groups); ``speedup`` = the median over
    rounds of exact / precision call."""
    from .ops.tiles import TC_FAMILY

    rows = []
    with _environ(SPARSEGNN_TUNE_CACHE="off", SPARSEGNN_TUNE="exhaustive", SPARSEGNN_INVEST="always"):
        reset_stores()
        for name in graphs:
            g = bench_graph(name, device="cuda", data_dir=data_dir, real=real)
            for num_feats in dims:
                x = torch.randn(g.num_src, num_feats, device="cuda").to(dtype)
                exact = lambda: spmm(g, x)  # noqa: E731
                exact()
                for precision in precisions:
                    call = lambda: spmm(g, x, precision=precision)  # noqa: E731
                    call()          # decides (every candidate timed)
                    record = autotune.lookup(TC_FAMILY, g, precision, num_feats, dtype, "cuda") or {}
                    times = paired_eager_ms({"exact": exact, "call": call}, warmup_ms=PAIRED_WARMUP_MS)
                    exact_ms, call_ms = statistics.median(times["exact"]), statistics.median(times["call"])
                    speedup = statistics.median(e / c for e, c in zip(times["exact"], times["call"]))
                    rows.append({"graph": name, "edges": g.num_edges, "F": num_feats, "precision": precision,
                                 "dtype": str(dtype).replace("torch.", ""), "pick": record.get("config"),
                                 "pick_ms": record.get("ms"), "best_ms": record.get("best_ms"),
                                 "exact_timed_ms": record.get("first_ms"), "exact_call_ms": exact_ms,
                                 "precision_call_ms": call_ms, "speedup": speedup})
            g = x = None  # noqa: F841 - free the graph before the next one
    return rows


_PATHS = {0: "exact", 1: "tiles", 2: "cuSPARSE", 3: "packed fp16", 4: "bf16 rows", 5: "bf16 rows, fp32 out"}


def precision_markdown(rows: List[Dict]) -> str:
    lines = ["| graph | edges | F | precision | pick | pick ms | best ms | exact ms (timed warm) | call ms (medians): exact / precision | x exact (median of paired ratios) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    for r in rows:
        pick = r["pick"] or {}
        path = _PATHS.get(pick.get("path"), "-")
        if pick.get("path") == 1:
            path += f" bf{pick['bf']} w{pick['warps']} c{pick['chunk']}{' swap' if pick['swap'] else ''}"
        lines.append(f"| {r['graph']} | {r['edges']:,} | {r['F']} | {r['precision']} | {path} | {fmt(r['pick_ms'])} | "
                     f"{fmt(r['best_ms'])} | {fmt(r['exact_timed_ms'])} | {r['exact_call_ms']:.4f} / "
                     f"{r['precision_call_ms']:.4f} | {r['speedup']:.2f} |")
    return "\n".join(lines)
