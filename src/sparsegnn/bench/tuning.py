"""Tuning report: what each policy picks, what the pick runs at, and what the tuning costs.

For every case (graph x F x dtype) and policy (``model``: zero-shot, ``shortlist``: the
model's top 3 timed, ``exhaustive``: every candidate timed), a fresh in-memory decision store
is used, the first call's wall time is measured (Triton's compile cache warmed beforehand, so
it is the tuning itself) and the picked config is timed with the benchmark protocol.  The
model's predicted rank of the exhaustive winner is reported too (predicted vs measured).
"""
from __future__ import annotations

import os
import time
from typing import Dict, List

import torch

from ..graph import Graph
from ..ops import spmm
from ..ops._dispatch import plan_of, spmm_detail
from ..tune import autotune
from ..tune.features import graph_stats_cached
from ..tune.model import load_model
from ..tune.store import reset_stores
from .harness import bench_graph

POLICIES = ("model", "shortlist", "exhaustive")


def tuning_report(graphs: List[str], dims: List[int], dtypes: List[torch.dtype], real: bool = True,
                  data_dir=None) -> List[Dict]:
    """One row per case and policy: pick, its kernel ms, first-call (tuning) seconds."""
    from ..kernels import configs
    from ..kernels.spmm_csr import spmm_planned

    rows = []
    saved = {k: os.environ.get(k) for k in ("SPARSEGNN_TUNE", "SPARSEGNN_TUNE_CACHE")}
    os.environ["SPARSEGNN_TUNE_CACHE"] = "off"
    try:
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
                    model = load_model()
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
                        record = autotune.lookup("spmm", g, spmm_detail(g.edge_val, "sum"), num_feats, dtype, "cuda")
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
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reset_stores()
    return rows


def markdown(rows: List[Dict]) -> str:
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
