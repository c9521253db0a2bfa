"""Structure families: the graph classes a cost model is fitted and validated on.

A model fitted on a handful of graphs learns those graphs.  To learn what makes a kernel
config fast, its data spans *families* of structure, each at any size and in two node orders:

- ``powerlaw-2.1`` / ``powerlaw-2.5`` / ``powerlaw-3.0``: Chung-Lu digraphs of degree exponent
  2.1 (hubs of ~1000x the mean), 2.5 and 3.0 (near-uniform), half their edges inside blocks of
  1,024 consecutive nodes (the locality a crawl's numbering has);
- ``community``: Chung-Lu with 85 % of the edges inside blocks of 256 consecutive nodes
  (blocks of at most ``N / 32`` nodes on small graphs);
- ``dense``: Chung-Lu of mean degree 96 (exponent 2.8, hubs of at most ~8x the mean), 60 % of
  the edges inside blocks of 512 consecutive nodes: the dense graphs of co-authorship, co-acting
  and protein interactions, where a row holds hundreds of edges;
- ``mesh``: a 2-D lattice (4 neighbours, both ways);
- ``road``: a sparser lattice (a fifth of its edges dropped) with a few long shortcuts: low,
  uneven degree, long paths;
- ``bipartite``: users -> items, power-law on the item side (``num_src != num_nodes``);
- ``molecules``: a batch of small molecule-like graphs (trees plus ring closures, 10-60
  nodes), block-diagonal.

``order``: ``"locality"`` keeps the generator's numbering, which has locality (lattices in
row-major order, blocks of nodes, molecules one after another, users grouped by item);
``"random"`` relabels the nodes at random.

``leave_out_folds`` splits cases into folds that hold out whole graphs, or whole families,
for the validation the cost model reports per family.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Sequence, Tuple

import torch
from torch import Tensor

from .synthetic import chung_lu, grid_graph, small_graph_batch

__all__ = ["FAMILIES", "ORDERS", "FamilyGraph", "family_graph", "leave_out_folds"]

ORDERS = ("locality", "random")


@dataclass(frozen=True)
class _Family:
    """How a family is drawn: its generator and mean degree (edges per node)."""

    kind: str
    mean_degree: float
    exponent: float = 2.3
    max_degree_ratio: float = 50.0
    community_size: int = 0
    community_fraction: float = 0.0


#: The families (module doc).
FAMILIES: Dict[str, _Family] = {
    "powerlaw-2.1": _Family("chung_lu", 16.0, exponent=2.1, max_degree_ratio=1000.0, community_size=1024,
                            community_fraction=0.5),
    "powerlaw-2.5": _Family("chung_lu", 16.0, exponent=2.5, max_degree_ratio=200.0, community_size=1024,
                            community_fraction=0.5),
    "powerlaw-3.0": _Family("chung_lu", 16.0, exponent=3.0, max_degree_ratio=50.0, community_size=1024,
                            community_fraction=0.5),
    "community": _Family("chung_lu", 24.0, exponent=2.5, max_degree_ratio=100.0, community_size=256,
                         community_fraction=0.85),
    "dense": _Family("chung_lu", 96.0, exponent=2.8, max_degree_ratio=8.0, community_size=512,
                     community_fraction=0.6),
    "mesh": _Family("grid", 4.0),
    "road": _Family("road", 2.6),
    "bipartite": _Family("bipartite", 12.0, exponent=2.2, max_degree_ratio=500.0),
    "molecules": _Family("molecules", 2.3),
}


class FamilyGraph(NamedTuple):
    """One drawn graph: ``edge_index`` (row 0 sources, row 1 targets), its node counts, and
    what it is (``ptr``: the graph boundaries of a molecule batch, else None)."""

    edge_index: Tensor
    num_nodes: int
    num_src: int
    family: str
    order: str
    seed: int
    ptr: object = None


def family_graph(family: str, num_edges: int, seed: int = 0, order: str = "locality", device=None) -> FamilyGraph:
    """A graph of ``family`` with about ``num_edges`` edges, numbered in ``order``.

    Shapes:
        -> edge_index [2, ~num_edges] int64 on ``device``.
    """
    if family not in FAMILIES:
        raise ValueError(f"family_graph(): family must be one of {sorted(FAMILIES)}, got {family!r}")
    if order not in ORDERS:
        raise ValueError(f"family_graph(): order must be one of {ORDERS}, got {order!r}")
    if num_edges < 1:
        raise ValueError(f"family_graph(): num_edges must be at least 1, got {num_edges}")
    spec = FAMILIES[family]
    device = torch.device(device or "cpu")
    num_nodes = max(int(num_edges / spec.mean_degree), 2)
    num_src, ptr = num_nodes, None
    if spec.kind == "chung_lu":
        edge_index = chung_lu(num_nodes, num_edges, seed, exponent=spec.exponent,
                              max_degree_ratio=spec.max_degree_ratio,
                              community_size=max(16, min(spec.community_size, num_nodes // 32)),
                              community_fraction=spec.community_fraction, device=device)
    elif spec.kind in ("grid", "road"):
        edge_index = grid_graph(num_nodes, seed, device=device)
        num_nodes = num_src = int(num_nodes ** 0.5) ** 2
        if spec.kind == "road":
            edge_index = _road(edge_index, num_nodes, seed)
    elif spec.kind == "bipartite":
        num_src = max(num_nodes * 3, 2)           # more users than items
        items = chung_lu(num_nodes, num_edges, seed, exponent=spec.exponent,
                         max_degree_ratio=spec.max_degree_ratio, device=device)[1]
        gen = torch.Generator(device=device).manual_seed(seed + 1)
        users = torch.randint(0, num_src, (num_edges,), generator=gen, device=device)
        if order == "locality":                   # users grouped by the item they rate most
            users = torch.sort(users).values[torch.argsort(torch.argsort(items, stable=True))]
        edge_index = torch.stack([users, items])
    else:                                         # molecules
        count = max(num_edges // 80, 1)           # ~80 directed edges a molecule of 10-60 nodes
        edge_index, ptr = small_graph_batch(count, 10, 60, "molecule", seed=seed)
        edge_index, ptr = edge_index.to(device), ptr.to(device)
        num_nodes = num_src = int(ptr[-1])
    if order == "random":
        gen = torch.Generator(device=device).manual_seed(seed + 2)
        target_perm = torch.randperm(num_nodes, generator=gen, device=device)
        source_perm = target_perm if num_src == num_nodes else torch.randperm(num_src, generator=gen, device=device)
        edge_index = torch.stack([source_perm[edge_index[0]], target_perm[edge_index[1]]])
        ptr = None                                # no longer contiguous graphs
    return FamilyGraph(edge_index, num_nodes, num_src, family, order, seed, ptr)


def _road(edge_index: Tensor, num_nodes: int, seed: int) -> Tensor:
    """A lattice thinned to a road network: a fifth of its undirected edges dropped (both
    directions), plus shortcuts between random nodes for 0.5 % of the nodes (both ways)."""
    gen = torch.Generator(device=edge_index.device).manual_seed(seed + 3)
    half = edge_index.shape[1] // 2                  # grid_graph: the undirected edges, then flipped
    und = edge_index[:, :half]
    und = und[:, torch.rand(half, generator=gen, device=edge_index.device) > 0.2]
    shortcuts = torch.randint(0, num_nodes, (2, max(num_nodes // 200, 1)), generator=gen, device=edge_index.device)
    und = torch.cat([und, shortcuts[:, shortcuts[0] != shortcuts[1]]], 1)
    return torch.cat([und, und.flip(0)], 1)


def leave_out_folds(cases: Sequence[Tuple[str, str]], by: str = "graph") -> List[Tuple[List[int], List[int]]]:
    """``(train, held_out)`` index lists over ``cases`` (``(family, graph name)`` pairs, one per
    timed case): ``by="graph"`` holds out every case of one graph per fold, ``"family"`` every
    case of one family.  Folds come in sorted order of what they hold out.
    """
    if by not in ("graph", "family"):
        raise ValueError(f"leave_out_folds(): by must be 'graph' or 'family', got {by!r}")
    key = (lambda c: c[1]) if by == "graph" else (lambda c: c[0])
    groups: Dict[str, List[int]] = {}
    for i, case in enumerate(cases):
        groups.setdefault(key(case), []).append(i)
    folds = []
    for name in sorted(groups):
        held = set(groups[name])
        folds.append(([i for i in range(len(cases)) if i not in held], sorted(held)))
    return folds

