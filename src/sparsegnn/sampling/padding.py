"""Sampled mini-batches padded to a few fixed shapes, for training steps captured as CUDA graphs.

A neighbour-sampled sub-graph has its own node and edge counts each batch.
:class:`MiniBatchPadding` rounds them up (nodes to a multiple of ``node_multiple`` with at least
16 padding nodes, edges to a multiple of ``edge_multiple``; both default to about 1/8 of the
first batch's counts), and :class:`StaticMiniBatch` holds one shape's tensors, refilled in place
(:class:`~sparsegnn.datasets.padding.PaddedGraph`: padding nodes last, zero features, self loops
only, so no real node's aggregation changes).  The seeds stay the first ``batch_size`` rows, so
``out[:batch_size]`` is the same loss as on the unpadded batch.
:class:`~sparsegnn.capture.CapturedGraphSteps` takes a ``MiniBatchPadding``.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check
from ..datasets.padding import MIN_PAD_NODES, PaddedGraph, _pow2, _round_up
from .trim import layer_graphs

__all__ = ["MiniBatchPadding", "StaticMiniBatch", "TrimmedMiniBatchPadding", "StaticTrimmedMiniBatch",
           "minibatch_loss"]


class StaticView:
    """What a captured step reads of a static mini-batch: ``x``, ``y``, ``graph``,
    ``batch_size`` (seeds first), ``node_weight`` (1 = real node)."""

    def __init__(self, x: Tensor, y: Tensor, graph, batch_size: int, node_weight: Tensor) -> None:
        self.x, self.y, self.graph, self.batch_size, self.node_weight = x, y, graph, batch_size, node_weight

    def items(self):
        return [("x", self.x), ("y", self.y), ("node_weight", self.node_weight)]


def _fill_nodes(static, batch) -> StaticView:
    """Copy ``batch``'s node tensors into a static batch's (zero padding rows, ``node_weight``
    1 on the real nodes) and count the fill; returns the static view."""
    n = batch.graph.num_nodes
    for dst, src in ((static.x, batch.x), (static.y, batch.y)):
        dst[:n].copy_(src)
        dst[n:].zero_()
    static.node_weight[:n].fill_(1.0)
    static.node_weight[n:].zero_()
    static.fills += 1
    return static.batch


class MiniBatchPadding:
    """The fixed shapes ``(N_pad, E_pad, seeds)`` sampled mini-batches are padded to.

    Args:
        node_multiple, edge_multiple: rounding of the node and edge counts (>= 16); None: about
            1/8 of the first batch's counts (powers of two, >= 32), fixed from then on.
    """

    def __init__(self, node_multiple: Optional[int] = None, edge_multiple: Optional[int] = None) -> None:
        for name, value in (("node_multiple", node_multiple), ("edge_multiple", edge_multiple)):
            check(value is None or (isinstance(value, int) and value >= 16), "MiniBatchPadding",
                  f"{name} must be None or an int >= 16, got {value!r}")
        self.node_multiple, self.edge_multiple = node_multiple, edge_multiple

    def shape_of(self, batch) -> Tuple[int, int, int]:
        """``(N_pad, E_pad, batch_size)`` of a sampled batch (host integers only)."""
        g = batch.graph
        check(not g.is_bipartite, "MiniBatchPadding.shape_of", "needs the sampled sub-graph over all its nodes")
        if self.node_multiple is None:
            self.node_multiple = max(32, _pow2(g.num_nodes / 8))
        if self.edge_multiple is None:
            self.edge_multiple = max(32, _pow2(g.num_edges / 8))
        return (_round_up(g.num_nodes + MIN_PAD_NODES, self.node_multiple),
                _round_up(max(g.num_edges, 1), self.edge_multiple), int(batch.batch_size))

    def static(self, shape: Tuple[int, int, int], like) -> "StaticMiniBatch":
        return StaticMiniBatch(shape, like)

    def __repr__(self) -> str:
        return f"MiniBatchPadding(node_multiple={self.node_multiple}, edge_multiple={self.edge_multiple})"


class StaticMiniBatch:
    """One shape's tensors, refilled by :meth:`fill`; :attr:`batch` is the static view.

    Shapes:
        x: [N_pad, F]; y: [N_pad]; graph: N_pad nodes, E_pad edges; node_weight: [N_pad].
    """

    def __init__(self, shape: Tuple[int, int, int], like) -> None:
        num_nodes, num_edges, seeds = shape
        device = like.x.device
        self.shape = tuple(shape)
        self.x = torch.zeros(num_nodes, like.x.shape[1], dtype=like.x.dtype, device=device)
        self.y = torch.zeros(num_nodes, *like.y.shape[1:], dtype=like.y.dtype, device=device)
        self.node_weight = torch.zeros(num_nodes, device=device)
        self.padded = PaddedGraph(num_nodes, num_edges, like.graph, device)
        self.batch = StaticView(self.x, self.y, self.padded.graph, seeds, self.node_weight)
        self.fills = 0

    def fill(self, batch) -> StaticView:
        """Copy a sampled batch of this shape in (padded); returns :attr:`batch`."""
        check(int(batch.batch_size) == self.shape[2], "StaticMiniBatch.fill",
              f"the batch has {batch.batch_size} seeds, the shape {self.shape[2]}")
        self.padded.fill(batch.graph)
        return _fill_nodes(self, batch)

    def __repr__(self) -> str:
        return f"StaticMiniBatch(nodes={self.shape[0]}, edges={self.shape[1]}, seeds={self.shape[2]}, fills={self.fills})"


class TrimmedMiniBatchPadding:
    """Shapes of *trimmed* sampled mini-batches (:func:`~sparsegnn.sampling.layer_graphs`: layer
    ``l`` computes its ``T_l`` rows only), for captured steps of models that take one graph per
    layer: ``model(x, graphs)`` with ``h = conv((h[:g.num_src], h[:g.num_nodes]), g)``.

    A shape is ``(T_pad per layer, E_pad per layer, N_pad, batch_size)``: each count rounded up
    to its own multiple (a power of two near 1/8 of its value in the first batch, >= 32; nodes
    with at least ``MIN_PAD_NODES`` padding), so the seeds' layer is ~``batch_size`` rows, not
    ~``N``.  Layer ``l``'s padded graph has ``T_pad_l`` targets and ``S_pad_l = T_pad_{l-1}``
    sources (``N_pad`` for the first layer): padding rows only ever feed padding rows, so the
    seeds' outputs and every gradient equal the unpadded trimmed step's.  Models with batch
    statistics over nodes (``PaddedBatchNorm1d``) are not supported: their rows differ per layer.

    Args:
        num_layers: layers of the model (default: the batches' hops).
    """

    def __init__(self, num_layers: Optional[int] = None) -> None:
        check(num_layers is None or (isinstance(num_layers, int) and num_layers >= 1), "TrimmedMiniBatchPadding",
              f"num_layers must be None or an int >= 1, got {num_layers!r}")
        self.num_layers = num_layers
        self.multiples: Optional[Tuple[List[int], List[int], int]] = None

    def shape_of(self, batch) -> tuple:
        """``(T_pad per layer, E_pad per layer, N_pad, batch_size)`` (host integers only)."""
        graphs = layer_graphs(batch, self.num_layers)
        n = batch.graph.num_nodes
        if self.multiples is None:
            self.multiples = ([max(32, _pow2(g.num_nodes / 8)) for g in graphs],
                              [max(32, _pow2(g.num_edges / 8)) for g in graphs], max(32, _pow2(n / 8)))
        node_mult, edge_mult, all_mult = self.multiples
        return (tuple(_round_up(g.num_nodes + MIN_PAD_NODES, m) for g, m in zip(graphs, node_mult)),
                tuple(_round_up(max(g.num_edges, 1), m) for g, m in zip(graphs, edge_mult)),
                _round_up(n + MIN_PAD_NODES, all_mult), int(batch.batch_size))

    def static(self, shape: tuple, like) -> "StaticTrimmedMiniBatch":
        return StaticTrimmedMiniBatch(shape, like, self.num_layers)

    def __repr__(self) -> str:
        return f"TrimmedMiniBatchPadding(num_layers={self.num_layers}, multiples={self.multiples})"


class StaticTrimmedMiniBatch:
    """One trimmed shape's tensors, refilled by :meth:`fill`; :attr:`batch` is the static view,
    its ``graph`` the list of the layers' padded (bipartite, volatile) graphs.

    Shapes:
        x: [N_pad, F]; y: [N_pad]; graph l: T_pad_l targets, S_pad_l sources, E_pad_l edges.
    """

    def __init__(self, shape: tuple, like, num_layers: Optional[int] = None) -> None:
        targets, edges, num_nodes, seeds = shape
        device = like.x.device
        self.shape, self.num_layers = shape, num_layers
        self.x = torch.zeros(num_nodes, like.x.shape[1], dtype=like.x.dtype, device=device)
        self.y = torch.zeros(num_nodes, *like.y.shape[1:], dtype=like.y.dtype, device=device)
        self.node_weight = torch.zeros(num_nodes, device=device)
        sources = (num_nodes,) + tuple(targets[:-1])
        self.padded = [PaddedGraph(t, e, like.graph, device, num_src=src) for t, e, src in zip(targets, edges, sources)]
        self.batch = StaticView(self.x, self.y, [p.graph for p in self.padded], seeds, self.node_weight)
        self.fills = 0

    def fill(self, batch) -> StaticView:
        """Copy a sampled batch of this shape in (each layer's graph padded); returns :attr:`batch`."""
        check(int(batch.batch_size) == self.shape[3], "StaticTrimmedMiniBatch.fill",
              f"the batch has {batch.batch_size} seeds, the shape {self.shape[3]}")
        for padded, g in zip(self.padded, layer_graphs(batch, self.num_layers)):
            padded.fill(g)
        return _fill_nodes(self, batch)

    def __repr__(self) -> str:
        return f"StaticTrimmedMiniBatch(shape={self.shape}, fills={self.fills})"


def minibatch_loss(logits: Tensor, batch) -> Tensor:
    """Cross-entropy over the seeds (the first ``batch.batch_size`` rows), as PyG's recipe.

    Shapes:
        logits: [N, C]; batch.y: [N] -> [].
    """
    size = batch.batch_size
    return F.cross_entropy(logits[:size], batch.y[:size])
