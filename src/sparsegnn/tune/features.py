"""Structural features of a graph and of a kernel config: the tuner's signature and the
cost model's inputs.

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
from typing import Dict, List

import torch
from torch import Tensor

from ..formats._host import small_on_gpu

#: Config keys the cost model sees (absent keys count as 0).
CONFIG_KEYS = ("BLOCK_F", "BLOCK_E", "ROWS", "GROUP_ROWS", "GROUP_E", "num_warps", "SEG_WARPS", "LIGHT_STEPS",
               "FLAT", "HEAVY_E", "SPLIT", "PIECE_STEPS", "INLINE")


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

    def as_dict(self) -> Dict[str, float]:
        return asdict(self)


def graph_stats(rowptr: Tensor, col: Tensor, row: Tensor) -> GraphStats:
    """Compute :class:`GraphStats` with a handful of reductions and one device-to-host copy.

    Shapes:
        rowptr: [N + 1]; col, row: [E] (target of every edge).
    """
    num_nodes = rowptr.numel() - 1
    num_edges = col.numel()
    if small_on_gpu(col, num_edges, "stats", num_nodes):            # on the host (formats/_host.py)
        return graph_stats(rowptr.cpu(), col.cpu(), row.cpu())
    if num_nodes == 0 or num_edges == 0:
        return GraphStats(num_nodes, num_edges, 0.0, 0.0, 0, 0.0, 0.0, 0.0, 1.0 if num_nodes else 0.0, 0.0, 0.0, 0.0)
    deg = (rowptr[1:] - rowptr[:-1]).to(torch.float32)
    sample = deg if num_nodes <= (1 << 20) else deg[torch.randperm(num_nodes, device=deg.device)[: 1 << 20]]
    quant = torch.quantile(sample, torch.tensor([0.5, 0.9, 0.99], device=deg.device))
    dist = (row - col).abs()
    hub_edges = torch.where(deg > 256, deg, torch.zeros_like(deg)).sum()
    window = max(num_nodes // 64, 1)
    values = torch.stack([
        deg.mean(), deg.std(unbiased=False), deg.max(), quant[0], quant[1], quant[2],
        (deg == 0).float().mean(), hub_edges / num_edges,
        (dist < 64).float().mean(), (dist < window).float().mean(),
    ]).tolist()
    mean, std, dmax, p50, p90, p99, empty, hub, local, win = values
    return GraphStats(num_nodes, num_edges, mean, std, int(dmax), p50, p90, p99, empty, hub, local, win)


def graph_stats_cached(graph) -> GraphStats:
    """``graph_stats`` of a :class:`~sparsegnn.Graph`, kept in its structure cache."""
    stats = graph.cache.get("stats")
    if stats is None:
        stats = graph.cache["stats"] = graph_stats(graph.rowptr, graph.col, graph.row)
    return stats


def _log2b(value: float) -> int:
    return int(math.floor(math.log2(value))) if value >= 1 else -1


def signature(stats: GraphStats) -> str:
    """Coarse structural class of a graph: log2 buckets of nodes, edges, mean and max degree,
    the spread and the locality in halves/quarters.  Graphs in one class share decisions."""
    spread = stats.deg_std / stats.deg_mean if stats.deg_mean > 0 else 0.0
    return (f"n{_log2b(stats.num_nodes)}.e{_log2b(stats.num_edges)}.d{_log2b(2 * stats.deg_mean)}"
            f".m{_log2b(stats.deg_max)}.s{min(int(spread * 2), 8)}.l{int(stats.local_frac * 4)}")


def graph_vector(stats: GraphStats, num_feats: int, elem_size: int) -> List[float]:
    """The graph half of the cost model's input (logs of sizes, shares as they are)."""
    lg = lambda v: math.log2(max(v, 0) + 1.0)  # noqa: E731
    spread = stats.deg_std / stats.deg_mean if stats.deg_mean > 0 else 0.0
    return [lg(stats.num_nodes), lg(stats.num_edges), lg(stats.deg_mean), lg(stats.deg_max), lg(stats.deg_p50),
            lg(stats.deg_p90), lg(stats.deg_p99), spread, stats.empty_frac, stats.hub_share, stats.local_frac,
            stats.window_frac, lg(num_feats), float(elem_size),
            lg(stats.num_nodes * num_feats * elem_size), lg(stats.num_edges * num_feats * elem_size)]


def config_vector(config: Dict[str, int], stats: GraphStats, num_feats: int) -> List[float]:
    """The config half: log2 of every config value, the family, and what the config implies
    for this graph (programs launched, serial steps of the largest row, feature blocks)."""
    lg = lambda v: math.log2(max(v, 0) + 1.0)  # noqa: E731
    raw = [lg(config.get(k, 0)) for k in CONFIG_KEYS]
    block_f = config.get("BLOCK_F", 32)
    fblocks = -(-num_feats // block_f)
    flat, split = bool(config.get("FLAT")), bool(config.get("SPLIT"))
    grouped = not flat and not split and config.get("LIGHT_STEPS", 0) == 64
    planned = not (flat or split or grouped)
    heavy_e = config.get("HEAVY_E", 0)
    light_e = config.get("BLOCK_E", 8) if (flat or split) else config.get("GROUP_E", 1)
    if split:
        max_steps = config.get("PIECE_STEPS", 8)
        programs = stats.num_nodes + stats.hub_share * stats.num_edges / max(heavy_e * config.get("PIECE_STEPS", 8), 1)
    elif flat:
        per_step = heavy_e or config.get("BLOCK_E", 8)
        max_steps = stats.deg_max / per_step
        programs = stats.num_nodes
    else:
        max_steps = min(stats.deg_max, 4096) / max(config.get("BLOCK_E", 8), 1)
        programs = stats.num_nodes / max(config.get("GROUP_ROWS", 1), 1)
    tile = config.get("GROUP_ROWS", 1) * light_e * block_f if grouped or planned else light_e * block_f
    return raw + [float(flat), float(split), float(grouped), float(planned), lg(fblocks), lg(max_steps),
                  lg(programs * fblocks), lg(tile), lg(stats.deg_mean / max(light_e, 1)),
                  lg(tile / max(config.get("num_warps", 1), 1))]
