"""``AGNNConv``: PyG 2.8's attention-based propagation, on the fused AGNN op."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .._checks import check_precision
from ..ops.attention import agnn_attention
from ._graph_input import GraphInputMixin, identity, self_looped
from ._inputs import GraphArg, message_passing_options, node_counts, split_features, unsupported

__all__ = ["AGNNConv"]


class AGNNConv(GraphInputMixin, nn.Module):
    r"""Attention-based propagation (Thekumparampil et al.), PyG's ``AGNNConv``:
    :math:`x'_i = \sum_{j \in N(i) \cup \{i\}} P_{ij} x_j`,
    :math:`P_{ij} = \mathrm{softmax}_j(\beta \cos(x_i, x_j))`.

    With ``add_self_loops`` every self loop is removed and each node gets one; duplicate edges
    are separate softmax entries (as in PyG).  Scores, softmax and sum run as one op
    (:func:`sparsegnn.ops.attention.agnn_attention`).  Square graphs and 2-D features only (PyG's
    layer has neither bipartite pairs nor batched features).

    Args:
        requires_grad: learn :math:`\beta` (a parameter; else a buffer of 1).
        add_self_loops: replace self loops by one per node.
        aggr: ``"add"``/``"sum"`` only; ``aggr_kwargs``, ``flow``, ``decomposed_layers``: defaults only.
        node_dim: -2 or 0 (the node dimension of 2-D features).
        cached: keep the self-looped graph of the first call (sparsegnn's; PyG has no such option).
        backend: sparse backend.
        precision: ``"ieee"`` (default: exact, fused scores + softmax + sum), ``"tf32"`` or
            ``"bf16"``: the weighted sum through ``spmm(..., precision=)`` after exact scores and
            softmax (:func:`sparsegnn.ops.attention.agnn_attention`).

    Shapes:
        x: [N, F]; edge_index: Graph, [2, E], EdgeIndex, sparse adj_t [N, N] or SparseTensor -> [N, F].
    """

    def __init__(self, requires_grad: bool = True, add_self_loops: bool = True, *, aggr="add",
                 aggr_kwargs: Optional[dict] = None, flow: str = "source_to_target", node_dim: int = -2,
                 decomposed_layers: int = 1, cached: bool = False, backend: str = "auto",
                 precision: str = "ieee") -> None:
        super().__init__()
        message_passing_options("AGNNConv", aggr, aggr_kwargs, flow, decomposed_layers, aggrs=("add", "sum"))
        if node_dim not in (-2, 0):
            raise unsupported("AGNNConv", "node_dim", node_dim, "AGNNConv takes 2-D features [N, F] (node_dim=-2)")
        self.requires_grad, self.add_self_loops = requires_grad, add_self_loops
        self.aggr, self.flow, self.node_dim = aggr, flow, node_dim
        self.cached, self.backend = cached, backend
        self.precision = check_precision("AGNNConv", precision)
        if requires_grad:
            self.beta = nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("beta", torch.ones(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.requires_grad:
            self.beta.data.fill_(1.0)
        self.reset_cache()

    def forward(self, x: Tensor, edge_index: GraphArg) -> Tensor:
        fn = "AGNNConv"
        x, _, _ = split_features(fn, x, pairs=False, dims=2)
        num_nodes, _ = node_counts(fn, edge_index, x, x, None, 0, square=True)
        graph = self._graph(fn, edge_index, None, num_nodes, self_looped if self.add_self_loops else identity,
                            sparse_values=False)
        return agnn_attention(graph, x, self.beta, backend=self.backend, precision=self.precision)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}()"
