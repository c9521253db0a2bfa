"""Structural features of a graph: the tuner's signature and what the cost model's inputs
are built from (``tune.model.build_inputs``).

``graph_stats`` reads a CSR once on its device (one host sync) and returns plain floats:
sizes, degree moments and tail, row-length spread and the locality of column indices.  They
are derived from the structure alone, so ``graph_stats_cached`` keeps them in the Graph's
structure cache.  ``signature`` quantises them (log2 buckets) into the key under which every
tuning decision is stored: graphs of the same shape class share decisions, a graph whose
signature was tuned before never re-tunes, and mini-batches of one loader (same sizes and
degree profile, different edges) reuse one decision.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Optional

import torch
from torch import Tensor

from ..formats._host import small_on_gpu
from ..formats.csr import rowptr_to_row

@dataclass(frozen=True)
class GraphStats:
    """Plain-number summary of a CSR's structure (rows = targets).

    Attributes:
        num_nodes, num_edges: sizes.
        deg_mean, deg_std, deg_max: in-degree moments (``deg_std / deg_mean`` is the spread).
        deg_p50, deg_p90, deg_p99: degree quantiles.
        empty_frac: share of rows without edges.
        hub_share: share of edges in rows of more than 256 edges.
        local_frac: share of edges with ``|row - col| < 64`` (neighbours close in the numbering).
        window_frac: share of edges with ``|row - col| < N / 64``.
            A bipartite graph's targets and sources are numbered apart, so there both measure
            how closely the sources follow the edge order instead: ``|col[k] - sorted(col)[k]|``
            under 64 and under ``M / 64`` (``M`` sources; every ``E / 2^22``-th edge on larger
            graphs, sorted among themselves): 1 where the rows the kernel walks read their
            sources in increasing order (they stream through L2), whatever the sources'
            degrees; a random order reads ~1/32 within ``M / 64``.
        num_src: columns, the rows of the gathered matrix ``x`` (a bipartite graph's sources;
            -1: ``num_nodes``, a square graph).  ``sources`` reads it.
    """

    num_nodes: int
    num_edges: int
    deg_mean: float
    deg_std: float
    deg_max: int
    deg_p50: float
    deg_p90: float
    deg_p99: float
    empty_frac: float
    hub_share: float
    local_frac: float
    window_frac: float
    num_src: int = -1

    @property
    def sources(self) -> int:
        """Rows of ``x`` the aggregation gathers from (``num_src``, else ``num_nodes``)."""
        return self.num_nodes if self.num_src < 0 else self.num_src

    def as_dict(self) -> Dict[str, float]:
        return asdict(self)


def graph_stats(rowptr: Tensor, col: Tensor, row: Optional[Tensor] = None, num_src: Optional[int] = None) -> GraphStats:
    """Compute :class:`GraphStats` with a handful of reductions and one device-to-host copy.
    ``row`` (the target of every edge; a square graph's locality reads it) is expanded from
    ``rowptr`` where not given, on the device the statistics are computed on (the host for a
    small graph: ``formats/_host.py``).
    ``num_src``: the columns of a bipartite graph (None: square).

    Shapes:
        rowptr: [N + 1]; col, row: [E] (target of every edge).
    """
    num_nodes = rowptr.numel() - 1
    num_edges = col.numel()
    src = -1 if num_src is None or num_src == num_nodes else int(num_src)
    if small_on_gpu(col, num_edges, "stats", num_nodes):            # on the host (formats/_host.py)
        return graph_stats(rowptr.cpu(), col.cpu(), None if row is None else row.cpu(), num_src)
    if num_nodes == 0 or num_edges == 0:
        return GraphStats(num_nodes, num_edges, 0.0, 0.0, 0, 0.0, 0.0, 0.0, 1.0 if num_nodes else 0.0, 0.0, 0.0, 0.0,
                          src)
    deg = (rowptr[1:] - rowptr[:-1]).to(torch.float32)
    sample = deg if num_nodes <= (1 << 20) else deg[torch.randperm(num_nodes, device=deg.device)[: 1 << 20]]
    quant = torch.quantile(sample, torch.tensor([0.5, 0.9, 0.99], device=deg.device))
    if src < 0:
        if row is None:
            row = rowptr_to_row(rowptr, num_edges)
        dist = (row - col).abs()
        window = max(num_nodes // 64, 1)
    else:
        dist = _source_drift(col)
        window = max(src // 64, 1)
    hub_edges = torch.where(deg > 256, deg, torch.zeros_like(deg)).sum()
    values = torch.stack([
        deg.mean(), deg.std(unbiased=False), deg.max(), quant[0], quant[1], quant[2],
        (deg == 0).float().mean(), hub_edges / num_edges,
        (dist < 64).float().mean(), (dist < window).float().mean(),
    ]).tolist()
    mean, std, dmax, p50, p90, p99, empty, hub, local, win = values
    return GraphStats(num_nodes, num_edges, mean, std, int(dmax), p50, p90, p99, empty, hub, local, win, src)


#: Edges sampled (evenly spaced, no random state) for a bipartite graph's locality.
DRIFT_SAMPLE = 1 << 22


def _source_drift(col: Tensor) -> Tensor:
    """``|col[k] - sorted(col)[k]|`` for the edges ``k`` of a bipartite CSR (every
    ``E / DRIFT_SAMPLE``-th one on larger graphs, sorted among themselves): how far each edge's
    source lies from where it would be if the rows read their sources in increasing order.
    Uneven source degrees and unused sources move ``sorted(col)`` with them, so an ordered
    graph reads 0 whatever they are."""
    sample = col[::-(-col.numel() // DRIFT_SAMPLE)].to(torch.int64)
    return (sample - torch.sort(sample).values).abs()


def graph_stats_cached(graph) -> GraphStats:
    """``graph_stats`` of a :class:`~sparsegnn.Graph`, kept in its structure cache."""
    stats = graph.cache.get("stats")
    if stats is None:      # ``row`` if the graph has it, else expanded where the statistics run
        stats = graph_stats(graph.rowptr, graph.col, graph.cache.get("row"), graph.num_src)
        graph.cache.put("stats", stats)
    return stats


def _log2b(value: float) -> int:
    return int(math.floor(math.log2(value))) if value >= 1 else -1


def signature(stats: GraphStats) -> str:
    """Coarse structural class of a graph: log2 buckets of nodes, edges, mean and max degree,
    the spread and the locality in halves/quarters.  Graphs in one class share decisions."""
    spread = stats.deg_std / stats.deg_mean if stats.deg_mean > 0 else 0.0
    return (f"n{_log2b(stats.num_nodes)}.e{_log2b(stats.num_edges)}.d{_log2b(2 * stats.deg_mean)}"
            f".m{_log2b(stats.deg_max)}.s{min(int(spread * 2), 8)}.l{int(stats.local_frac * 4)}")
