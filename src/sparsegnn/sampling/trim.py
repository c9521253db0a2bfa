"""Per-layer graphs of a sampled mini-batch: each layer computes only the rows later layers read.

In a batch of ``H`` hops (seeds first, then each hop's new nodes; edges grouped hop by hop by
target, see ``sampler``), an ``L``-layer model (``L <= H``) reads at its last layer the seeds
only, at the one before the seeds and hop-1 nodes, and so on.  Layer ``l`` (0-based) therefore
needs

- targets: the nodes of hops ``< L - l`` (``T_l`` = the first ``sum(num_sampled_nodes[:L - l])``),
- sources: the nodes of hops ``<= L - l`` (``S_l`` = ``T_{l-1}``; all ``N_s`` nodes for ``l = 0``
  when ``L = H``),
- edges: those of hops ``< L - l``, the first ``sum(num_sampled_edges[:L - l])`` of the CSR.

Because the sub-graph's CSR is target-major in that order, each layer's graph is a *prefix* of
it: views of ``rowptr`` and ``col``, no copy, no sort (PyG's ``trim_to_layer``, which slices
``edge_index`` per layer and still runs the first layer on every node).  The outputs of layer
``l`` are exactly rows ``0 .. T_l - 1`` of the untrimmed layer's, so the seeds' outputs are
unchanged (tested).  With ``x = (x_src, x_dst)`` layers, a model runs
``h = conv((h[:g.num_src], h[:g.num_nodes]), g)`` for ``g`` in ``layer_graphs(batch)``.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from .._checks import check
from ..graph import Graph


def _prefix_transpose(full, num_edges: int, sources: int):
    """``A_l^T`` of the graph of the first ``num_edges`` edges (targets ``< T_l``, sources
    ``< sources``) from the batch graph's transpose ``full``, without a sort or a host sync:
    its entries of edges ``< num_edges`` in the same order, rows cut at ``sources``.

    Shapes:
        full: (rowptr_t [N_s + 1], col_t [E], perm [E]) -> ([sources + 1], [num_edges], [num_edges]).
    """
    rowptr_t, col_t, perm = full
    keep = perm < num_edges
    before = torch.zeros(perm.numel() + 1, dtype=torch.int64, device=perm.device)
    torch.cumsum(keep, 0, out=before[1:])                       # kept entries before each position
    index = torch.nonzero_static(keep, size=num_edges).squeeze(1)
    return before[rowptr_t[:sources + 1]], col_t[index], perm[index]


def layer_graphs(batch, num_layers: Optional[int] = None) -> List[Graph]:
    """The bipartite graph of every layer of a ``num_layers``-layer model on ``batch`` (see the module doc).

    Args:
        batch: a sampled mini-batch (``graph``, ``num_sampled_nodes``, ``num_sampled_edges``), as
            ``sample_neighbors`` and ``NeighborLoader`` return.
        num_layers: layers of the model (default: the batch's hops); at most the hops.

    Returns:
        ``num_layers`` transient Graphs; graph ``l`` has ``T_l`` targets and ``S_l`` sources.
        Their transposes (for the backward) are cut from the batch graph's (which
        ``make_batch`` builds) without a sort or a host sync; the first shares it when it keeps
        every node.  Cached on the batch's graph.

    Shapes:
        graph l: [T_l targets, S_l sources], its first ``E_l`` edges.
    """
    fn = "layer_graphs"
    for attr in ("graph", "num_sampled_nodes", "num_sampled_edges"):
        check(hasattr(batch, attr), fn, f"batch has no {attr!r}: pass a batch of sparsegnn's sampler")
    hops = len(batch.num_sampled_edges)
    layers = hops if num_layers is None else int(num_layers)
    check(1 <= layers <= hops, fn, f"num_layers must be in [1, {hops}] (the batch's hops), got {num_layers}")
    sub: Graph = batch.graph
    cached = sub.cache.get("trimmed", layers)
    if cached is not None:
        return cached
    nodes, edges = list(batch.num_sampled_nodes), list(batch.num_sampled_edges)
    graphs = []
    for layer in range(layers):
        kept = layers - layer
        targets, sources, num_edges = sum(nodes[:kept]), sum(nodes[:kept + 1]), sum(edges[:kept])
        vals = None if sub.edge_val is None else sub.edge_val[:num_edges]
        perm = None if sub.edge_perm is None else sub.edge_perm[:num_edges]
        g = Graph(sub.rowptr[:targets + 1], sub.col[:num_edges], vals, targets, num_src=sources, transient=True,
                  edge_perm=perm)
        derived = sub.cache
        if "row" in derived:
            g.set_derived("row", derived.get("row")[:num_edges])
        for dtype in derived.keys("mean_scale"):      # 1 / deg of the kept rows: the batch graph's
            g.cache.put("mean_scale", derived.get("mean_scale", dtype)[:num_edges], dtype)
        if "transpose" in derived:
            full = derived.get("transpose")
            same = num_edges == sub.num_edges and sources == sub.num_src
            g.set_derived("transpose", full if same else _prefix_transpose(full, num_edges, sources))
        graphs.append(g)
    sub.cache.put("trimmed", graphs, layers)
    return graphs
