"""Seeded random graphs: small awkward ones for tests, power-law stand-ins for benchmarks.

``random_graph`` draws uniform edges and then plants the awkward cases every kernel must get
right: isolated nodes (no edges at all), empty rows (nodes with no incoming edge), self loops
and duplicate edges.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .._paths import cache_root


def random_graph(
    num_nodes: int,
    num_edges: int,
    seed: int = 0,
    *,
    num_isolated: int = 0,
    num_empty_rows: int = 0,
    num_self_loops: int = 0,
    num_duplicates: int = 0,
    weighted: bool = False,
    device: Optional[torch.device] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """A seeded random directed multigraph as ``(edge_index, edge_weight)``.

    The last ``num_isolated`` nodes touch no edge; the ``num_empty_rows`` nodes before them
    have outgoing but no incoming edges.  ``num_self_loops`` loops and ``num_duplicates``
    copies of existing edges are appended (so ``E = num_edges + loops + duplicates``).

    Shapes:
        -> edge_index: [2, E] int64, edge_weight: [E] float32 (uniform in [0.5, 1.5)) or None.
    """
    if num_nodes < 0 or num_edges < 0:
        raise ValueError(f"random_graph(): sizes must be >= 0, got {num_nodes} nodes, {num_edges} edges")
    if num_isolated + num_empty_rows > num_nodes:
        raise ValueError("random_graph(): num_isolated + num_empty_rows exceeds num_nodes")
    gen = torch.Generator().manual_seed(seed)
    connected = num_nodes - num_isolated
    targets_hi = connected - num_empty_rows
    if num_edges > 0 and (connected == 0 or targets_hi == 0):
        raise ValueError("random_graph(): no nodes left to carry edges")
    src = torch.randint(0, max(connected, 1), (num_edges,), generator=gen)
    dst = torch.randint(0, max(targets_hi, 1), (num_edges,), generator=gen)
    parts = [torch.stack([src, dst])]
    if num_self_loops:
        loops = torch.randint(0, max(targets_hi, 1), (num_self_loops,), generator=gen)
        parts.append(torch.stack([loops, loops]))
    if num_duplicates and num_edges:
        pick = torch.randint(0, num_edges, (num_duplicates,), generator=gen)
        parts.append(parts[0][:, pick])
    edge_index = torch.cat(parts, dim=1)
    weight = None
    if weighted:
        weight = torch.rand(edge_index.shape[1], generator=gen) + 0.5
    if device is not None:
        edge_index = edge_index.to(device)
        weight = weight.to(device) if weight is not None else None
    return edge_index, weight


# ---------------------------------------------------------------- power-law stand-ins
def chung_lu(
    num_nodes: int,
    num_edges: int,
    seed: int = 0,
    *,
    exponent: float = 2.3,
    max_degree_ratio: float = 50.0,
    community_size: int = 0,
    community_fraction: float = 0.8,
    device=None,
) -> Tensor:
    """A seeded Chung-Lu power-law digraph as ``edge_index`` ``[2, E]`` (int64).

    Node ``i`` (in a random order) gets expected degree ``d_i ~ rank^(-1/(exponent-1))``,
    clipped at ``max_degree_ratio`` times the average, the same law for in- and out-degrees.
    Sources and targets are drawn by inverse-CDF sampling, so the generator runs in
    ``O(E log N)`` on the GPU.  With ``community_size > 0``, a ``community_fraction`` of the
    edges instead pick their source uniformly inside the target's block of
    ``community_size`` consecutive node ids (graphs with locality).

    Shapes:
        -> [2, num_edges] int64 on ``device``.
    """
    if num_nodes <= 0 or num_edges < 0:
        raise ValueError(f"chung_lu(): need num_nodes > 0 and num_edges >= 0, got {num_nodes}, {num_edges}")
    device = torch.device(device or "cpu")
    gen = torch.Generator(device=device).manual_seed(seed)
    ranks = torch.arange(1, num_nodes + 1, device=device, dtype=torch.float64)
    weight = ranks.pow(-1.0 / (exponent - 1.0))
    avg = num_edges / num_nodes
    for _ in range(4):  # scale to E edges, clip the head, rescale
        weight = weight * (num_edges / weight.sum())
        weight = weight.clamp(max=max(max_degree_ratio * avg, 1.0))
    cdf = torch.cumsum(weight, 0)
    cdf = cdf / cdf[-1]
    relabel = torch.randperm(num_nodes, generator=gen, device=device)

    def draw(count: int) -> Tensor:
        u = torch.rand(count, generator=gen, device=device, dtype=torch.float64)
        return relabel[torch.searchsorted(cdf, u).clamp(max=num_nodes - 1)]

    target = draw(num_edges)
    source = draw(num_edges)
    if community_size > 0:
        local = torch.rand(num_edges, generator=gen, device=device) < community_fraction
        block_start = (target // community_size) * community_size
        offset = torch.randint(0, community_size, (num_edges,), generator=gen, device=device)
        source = torch.where(local, (block_start + offset).clamp(max=num_nodes - 1), source)
    return torch.stack([source, target])


@dataclass(frozen=True)
class StandIn:
    """A synthetic stand-in for a paper dataset: sizes, feature width, classes, generator kind."""

    name: str
    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    source: str
    community_size: int = 0
    max_degree_ratio: float = 50.0
    exponent: float = 2.3
    kind: str = "chung_lu"


#: TC-GNN Table 4 and MaxK-GNN's datasets (node and edge counts as the papers report them).
STAND_INS: Dict[str, StandIn] = {s.name: s for s in [
    StandIn("citeseer", 3_327, 9_464, 3703, 6, "tc-gnn"),
    StandIn("cora", 2_708, 10_858, 1433, 7, "tc-gnn"),
    StandIn("pubmed", 19_717, 88_676, 500, 3, "tc-gnn"),
    StandIn("ppi", 56_944, 818_716, 50, 121, "tc-gnn"),
    StandIn("PROTEINS_full", 43_471, 162_088, 29, 2, "tc-gnn", community_size=64),
    StandIn("OVCAR-8H", 1_890_931, 3_946_402, 66, 2, "tc-gnn", community_size=64),
    StandIn("Yeast", 1_714_644, 3_636_546, 74, 2, "tc-gnn", community_size=64),
    StandIn("DD", 334_925, 1_686_092, 89, 2, "tc-gnn", community_size=512),
    StandIn("YeastH", 3_139_988, 6_487_230, 75, 2, "tc-gnn", community_size=64),
    StandIn("amazon0505", 410_236, 4_878_875, 96, 22, "tc-gnn"),
    StandIn("artist", 50_515, 1_638_396, 100, 12, "tc-gnn"),
    StandIn("com-amazon", 334_863, 1_851_744, 96, 22, "tc-gnn"),
    StandIn("soc-BlogCatalog", 88_784, 2_093_195, 128, 39, "tc-gnn"),
    StandIn("amazon0601", 403_394, 3_387_388, 96, 22, "tc-gnn"),
    StandIn("flickr", 89_250, 989_006, 500, 7, "maxk-gnn"),
    StandIn("yelp", 716_847, 13_954_819, 300, 100, "maxk-gnn"),
    StandIn("reddit", 232_965, 114_615_891, 602, 41, "maxk-gnn"),
    StandIn("ogbn-proteins", 132_534, 79_122_504, 8, 112, "maxk-gnn"),
    StandIn("ogbn-products", 2_449_029, 123_718_280, 100, 47, "maxk-gnn"),
    StandIn("reddit-community", 232_965, 67_000_000, 602, 41, "performance.md", community_size=2048),
    # Beyond one GPU: ogbn-papers100M's widths (128 features, 172 classes, mean
    # in-degree 14.5) at 16M nodes, with citation-like locality.  Full-graph GraphSAGE 3 x 256
    # keeps ~9.3 KB per node for backward (measured), ~150 GB: more than one H200 holds.
    StandIn("papers-16m", 16_000_000, 232_000_000, 128, 172, "beyond-one-gpu", community_size=4096),
    # Structure classes the real graphs showed and the paper stand-ins lack:
    # hubs of thousands of edges in graphs of tens of thousands of nodes (GitHub / Twitch-like
    # social graphs: max degree ~600x the mean), small dense graphs, near-regular meshes.
    StandIn("hub-social", 37_700, 578_006, 128, 2, "structure", max_degree_ratio=620.0, exponent=2.1),
    StandIn("hub-wiki", 11_631, 341_691, 128, 2, "structure", max_degree_ratio=120.0, exponent=2.0),
    StandIn("dense-small", 7_000, 840_000, 128, 2, "structure", max_degree_ratio=6.0, exponent=3.5),
    StandIn("mesh", 1_000_000, 3_960_000, 32, 2, "structure", kind="grid"),
    StandIn("mesh-shuffled", 1_000_000, 3_960_000, 32, 2, "structure", kind="grid-shuffled"),
]}

SUITES: Dict[str, Tuple[str, ...]] = {
    "small": ("cora", "citeseer", "pubmed", "ppi", "artist"),
    "paper": tuple(n for n, s in STAND_INS.items() if s.source in ("tc-gnn", "maxk-gnn")),
    "large": ("reddit", "ogbn-proteins", "ogbn-products", "yelp", "reddit-community"),
    "structure": ("hub-social", "hub-wiki", "dense-small", "mesh", "mesh-shuffled"),
}


def grid_graph(num_nodes: int, seed: int = 0, shuffle: bool = False, device=None) -> Tensor:
    """A 2-D lattice (4-neighbour, both directions) of about ``num_nodes`` nodes in row-major
    order, 1% of its edges dropped: a near-regular, low-degree mesh (road-network class).
    ``shuffle`` relabels nodes at random (no locality in the numbering).

    Shapes:
        -> [2, E] int64 with E ~= 4 N.
    """
    device = torch.device(device or "cpu")
    side = int(num_nodes ** 0.5)
    gen = torch.Generator(device=device).manual_seed(seed)
    ids = torch.arange(side * side, device=device).view(side, side)
    right = torch.stack([ids[:, :-1].flatten(), ids[:, 1:].flatten()])
    down = torch.stack([ids[:-1, :].flatten(), ids[1:, :].flatten()])
    und = torch.cat([right, down], 1)
    und = und[:, torch.rand(und.shape[1], generator=gen, device=device) > 0.01]
    edge_index = torch.cat([und, und.flip(0)], 1)
    if shuffle:
        edge_index = torch.randperm(side * side, generator=gen, device=device)[edge_index]
    return edge_index


def cache_dir() -> Path:
    """Where generated graphs are cached: the cache root (``sparsegnn._paths.cache_root``:
    ``$SPARSEGNN_CACHE``, else the platform's user cache directory), as the tuner's."""
    return cache_root()


def stand_in_graph(name: str, seed: int = 0, device=None, use_cache: bool = True) -> Tensor:
    """``edge_index`` of the stand-in ``name``, generated on ``device`` and cached on disk.

    Shapes:
        -> [2, E] int64 with E = the paper's edge count.
    """
    if name not in STAND_INS:
        raise ValueError(f"stand_in_graph(): unknown stand-in {name!r}; known: {', '.join(STAND_INS)}")
    spec = STAND_INS[name]
    path = cache_dir() / "graphs" / f"{name}-seed{seed}.pt"
    if use_cache and path.exists():
        return torch.load(path, map_location=device, weights_only=True).to(torch.int64)
    if spec.kind.startswith("grid"):
        edge_index = grid_graph(spec.num_nodes, seed, shuffle=spec.kind == "grid-shuffled", device=device)
    else:
        edge_index = chung_lu(spec.num_nodes, spec.num_edges, seed, community_size=spec.community_size,
                              max_degree_ratio=spec.max_degree_ratio, exponent=spec.exponent, device=device)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(edge_index.to(torch.int32).cpu(), path)
    return edge_index


def small_graph_batch(num_graphs: int, min_nodes: int, max_nodes: int, kind: str = "molecule", seed: int = 0,
                      device=None):
    """A batch of small undirected graphs as one block-diagonal edge list (a stand-in for a
    mini-batch of molecules or TU graphs), each edge both ways, no self loops.

    ``kind``: ``"molecule"``: a random tree (node ``i`` bonds to a random earlier node) plus
    ``n // 6`` ring closures, mean degree ~2.3 as in Tox21; ``"dense"``: every pair with
    probability 0.25 (mean degree ~0.25 n: the dense small graphs class).

    Shapes:
        -> edge_index [2, E] int64, ptr [B + 1] int64 (graph ``b`` = nodes ``ptr[b]:ptr[b+1]``).
    """
    if kind not in ("molecule", "dense"):
        raise ValueError(f"small_graph_batch(): kind must be 'molecule' or 'dense', got {kind!r}")
    if num_graphs < 1 or not 1 <= min_nodes <= max_nodes:
        raise ValueError(f"small_graph_batch(): need num_graphs >= 1 and 1 <= min_nodes <= max_nodes, got "
                         f"{num_graphs}, {min_nodes}, {max_nodes}")
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(min_nodes, max_nodes + 1, (num_graphs,), generator=gen)
    ptr = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
    src, dst = [], []
    for b in range(num_graphs):
        n, off = int(sizes[b]), int(ptr[b])
        if kind == "molecule":
            child = torch.arange(1, n)
            parent = (torch.rand(n - 1, generator=gen) * child).long()
            ring = torch.randint(0, n, (2, n // 6), generator=gen)
            keep = ring[0] != ring[1]
            a, c = torch.cat([child, ring[0][keep]]), torch.cat([parent, ring[1][keep]])
        else:
            upper = torch.triu(torch.rand(n, n, generator=gen) < 0.25, diagonal=1).nonzero().t()
            a, c = upper[0], upper[1]
        src += [a + off, c + off]
        dst += [c + off, a + off]
    edge_index = torch.stack([torch.cat(src), torch.cat(dst)])
    return edge_index.to(device), ptr.to(device)
