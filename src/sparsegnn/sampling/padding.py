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

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check
from ..datasets.padding import MIN_PAD_NODES, PaddedGraph, _pow2, _round_up

__all__ = ["MiniBatchPadding", "StaticMiniBatch", "minibatch_loss"]


class StaticView:
    """What a captured step reads of a static mini-batch: ``x``, ``y``, ``graph``,
    ``batch_size`` (seeds first), ``node_weight`` (1 = real node)."""

    def __init__(self, x: Tensor, y: Tensor, graph, batch_size: int, node_weight: Tensor) -> None:
        self.x, self.y, self.graph, self.batch_size, self.node_weight = x, y, graph, batch_size, node_weight

    def items(self):
        return [("x", self.x), ("y", self.y), ("node_weight", self.node_weight)]


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
        n = batch.graph.num_nodes
        self.padded.fill(batch.graph)
        for dst, src in ((self.x, batch.x), (self.y, batch.y)):
            dst[:n].copy_(src)
            dst[n:].zero_()
        self.node_weight[:n].fill_(1.0)
        self.node_weight[n:].zero_()
        self.fills += 1
        return self.batch

    def __repr__(self) -> str:
        return f"StaticMiniBatch(nodes={self.shape[0]}, edges={self.shape[1]}, seeds={self.shape[2]}, fills={self.fills})"


def minibatch_loss(logits: Tensor, batch) -> Tensor:
    """Cross-entropy over the seeds (the first ``batch.batch_size`` rows), as PyG's recipe.

    Shapes:
        logits: [N, C]; batch.y: [N] -> [].
    """
    size = batch.batch_size
    return F.cross_entropy(logits[:size], batch.y[:size])
