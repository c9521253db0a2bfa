"""``GINConv`` and ``GINEConv``: PyG 2.8's graph isomorphism layers, on the SpMM."""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from .._checks import check_precision
from ._graph_input import GraphInputMixin, graph_kind, identity
from ._inputs import (
    Features, GraphArg, edge_graph, message_passing_options, node_counts, propagate, split_features,
    to_graph_order,
)
from ._linear import Linear

__all__ = ["GINConv", "GINEConv"]


def reset_module(module) -> None:
    """``module.reset_parameters()``, or that of each child that has one (PyG's ``reset``)."""
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
    elif hasattr(module, "children"):
        for child in module.children():
            reset_module(child)


class _GINBase(GraphInputMixin, torch.nn.Module):
    """The parts GINConv and GINEConv share: ``nn``, ``eps`` and PyG's options."""

    _name = "GINConv"

    def __init__(self, nn: Callable[[Tensor], Tensor], eps: float, train_eps: bool, aggr, aggr_kwargs, flow: str,
                 node_dim: int, decomposed_layers: int, backend: str) -> None:
        super().__init__()
        self.reduce = message_passing_options(self._name, aggr, aggr_kwargs, flow, decomposed_layers, node_dim=node_dim)
        self.nn = nn
        self.initial_eps = eps
        self.aggr, self.flow, self.node_dim, self.backend = aggr, flow, node_dim, backend
        self.cached = False
        self.precision = "ieee"
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))

    def reset_parameters(self) -> None:
        reset_module(self.nn)
        self.eps.data.fill_(self.initial_eps)

    def _inputs(self, x: Features, edge_index: GraphArg, size: Optional[Tuple[int, int]]):
        x_src, x_dst, _ = split_features(self._name, x)
        num_src, num_dst = node_counts(self._name, edge_index, x_src, x_dst, size, self.node_dim)
        return x_src, x_dst, num_src, num_dst

    def _update(self, aggregated: Tensor, x_dst: Optional[Tensor]) -> Tensor:
        if x_dst is not None:
            aggregated = aggregated + (1 + self.eps) * x_dst
        return self.nn(aggregated)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(nn={self.nn})"


class GINConv(_GINBase):
    r"""Graph isomorphism layer, PyG's ``GINConv``:
    :math:`x'_i = h_\Theta\big((1 + \epsilon) x_i + \mathrm{aggr}_{j \to i} x_j\big)`.

    Bipartite ``x = (x_src, x_dst)`` aggregates ``x_src`` into the targets (``x_dst=None``
    drops the root term).  A torch sparse ``adj_t`` (and a Graph's ``edge_val``) weighs the
    messages; a ``SparseTensor``'s values are dropped (as in PyG).

    Args:
        nn: the network :math:`h_\Theta` (reset, like PyG does, when the layer is made).
        eps: initial :math:`\epsilon`; ``train_eps`` makes it a parameter (else a buffer).
        aggr: ``"add"`` (default), ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.
        aggr_kwargs, flow, decomposed_layers: PyG's ``MessagePassing`` arguments; defaults only.
        node_dim: node dimension of the features (default -2: ``[..., N, F]``).
        backend: sparse backend of the aggregation.
        precision: ``"ieee"`` (default: exact), ``"tf32"`` or ``"bf16"``: the sum / mean
            aggregation on tensor cores where the tuner finds it faster (see
            :func:`sparsegnn.spmm`; max / min stay exact).

    Shapes:
        x: [N, F] or ([M, F], [N, F] or None), optionally with leading batch dimensions;
        size: (M, N) -> [N, F_out of nn].
    """

    def __init__(self, nn: Callable[[Tensor], Tensor], eps: float = 0.0, train_eps: bool = False, *, aggr="add",
                 aggr_kwargs: Optional[dict] = None, flow: str = "source_to_target", node_dim: int = -2,
                 decomposed_layers: int = 1, backend: str = "auto", precision: str = "ieee") -> None:
        super().__init__(nn, eps, train_eps, aggr, aggr_kwargs, flow, node_dim, decomposed_layers, backend)
        self.precision = check_precision(self._name, precision)
        self.reset_parameters()

    def forward(self, x: Features, edge_index: GraphArg, size: Optional[Tuple[int, int]] = None, *,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        """``edge_weight`` (keyword only; not in PyG's signature) weighs an ``edge_index``'s messages,
        as a torch sparse ``adj_t``'s values do."""
        x_src, x_dst, num_src, num_dst = self._inputs(x, edge_index, size)
        graph = self._graph(self._name, edge_index, edge_weight, num_dst, identity, num_src=num_src,
                            sparse_values=graph_kind(edge_index) != "sparse_tensor")
        aggregated = propagate(graph, x_src, self.reduce, self.node_dim, backend=self.backend, precision=self.precision)
        return self._update(aggregated, x_dst)


class GINEConv(_GINBase):
    r"""GIN with edge features (Hu et al.), PyG's ``GINEConv``:
    :math:`x'_i = h_\Theta\big((1 + \epsilon) x_i + \mathrm{aggr}_{j \to i} \mathrm{ReLU}(x_j + \Theta_e e_{ji})\big)`.

    :math:`\Theta_e` (``lin``, with bias) exists when ``edge_dim`` is given; otherwise edge and
    node features must have one width.  The messages are per edge, so they are formed in the
    graph's CSR order (``x_j`` gathered, ``e_ji`` permuted) and aggregated by one SpMM over the
    edge-to-target graph (:func:`~sparsegnn.nn._inputs.edge_graph`): no fused kernel.

    Args:
        nn: the network :math:`h_\Theta` (reset when the layer is made, as in PyG).
        eps, train_eps: as in :class:`GINConv`.
        edge_dim: edge feature width, to project edge features to the input width of ``nn``
            (read from its first layer's ``in_features`` / ``in_channels``).
        aggr, aggr_kwargs, flow, decomposed_layers, node_dim, backend: as in :class:`GINConv`.

    Shapes:
        x: [N, F] or ([M, F], [N, F] or None); edge_attr: [E, D] in the edge order of the graph
        argument (CSR order for a Graph) -> [N, F_out of nn].
    """

    _name = "GINEConv"

    def __init__(self, nn: torch.nn.Module, eps: float = 0.0, train_eps: bool = False, edge_dim: Optional[int] = None,
                 *, aggr="add", aggr_kwargs: Optional[dict] = None, flow: str = "source_to_target",
                 node_dim: int = -2, decomposed_layers: int = 1, backend: str = "auto") -> None:
        super().__init__(nn, eps, train_eps, aggr, aggr_kwargs, flow, node_dim, decomposed_layers, backend)
        self.edge_dim = edge_dim
        if edge_dim is not None:
            first = nn[0] if isinstance(nn, torch.nn.Sequential) else nn
            width = getattr(first, "in_features", getattr(first, "in_channels", None))
            if width is None:
                raise ValueError("GINEConv(): edge_dim is given but the input width of nn cannot be read (its first "
                                 "layer has no in_features or in_channels); give nn a Linear first layer")
            self.lin = Linear(edge_dim, width)
        else:
            self.lin = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.lin is not None:
            self.lin.reset_parameters()

    def forward(self, x: Features, edge_index: GraphArg, edge_attr: Optional[Tensor] = None,
                size: Optional[Tuple[int, int]] = None) -> Tensor:
        fn = self._name
        x_src, x_dst, num_src, num_dst = self._inputs(x, edge_index, size)
        if not isinstance(edge_attr, Tensor) or edge_attr.dim() != 2:
            raise ValueError(f"{fn}(): edge_attr must be a 2-D tensor [E, edge features], got "
                             f"{getattr(edge_attr, 'shape', edge_attr)} (PyG's GINEConv needs it too)")
        kind = graph_kind(edge_index)
        graph = self._graph(fn, edge_index, None, num_dst, identity, num_src=num_src, sparse_values=False)
        if edge_attr.shape[0] != graph.num_edges:
            raise ValueError(f"{fn}(): edge_attr has {edge_attr.shape[0]} rows but the graph has {graph.num_edges} "
                             "edges")
        edges = self.lin(edge_attr) if self.lin is not None else edge_attr
        if edges.size(-1) != x_src.size(-1):
            raise ValueError(f"{fn}(): node and edge features have different widths ({x_src.size(-1)} and "
                             f"{edges.size(-1)}); set edge_dim to project the edge features")
        edges = to_graph_order(graph, edges, caller_order=kind != "graph")
        messages = torch.relu(x_src.index_select(self.node_dim % x_src.dim(), graph.col) + edges)   # [..., E, F]
        aggregated = propagate(edge_graph(graph), messages, self.reduce, self.node_dim, backend=self.backend)
        return self._update(aggregated, x_dst)
