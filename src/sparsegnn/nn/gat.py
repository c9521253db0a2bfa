"""``GATConv`` and ``GATv2Conv``: PyG 2.8's attention layers, every option and input form.

Two paths compute the same attention:

* **fused** (plain ``GATConv``: no edge features, no ``return_attention_weights``): the
  self-looped graph is cached like every layer's graph (shared with AGNNConv) and scores,
  edge softmax, attention dropout and aggregation run as one op
  (:func:`sparsegnn.ops.attention.gat_attention`).  Its dropout mask is drawn by that op, so
  it differs from PyG's for the same seed.
* **unfused** (``GATConv`` with ``edge_attr`` or ``return_attention_weights``, and every
  ``GATv2Conv``: their scores need per-edge terms): ``sddmm`` for the per-edge scores,
  ``edge_softmax``, then one multi-head ``spmm``.  Its graph keeps PyG's edge order (edges that
  are no self loop in the caller's order, then the loops: ``pyg_self_looped_*``), so per-edge
  inputs and the returned attention are in PyG's order, and the attention dropout draws PyG's
  mask (same seed, same mask).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops import edge_softmax, sddmm, spmm
from ..ops.attention import gat_attention
from ._graph_input import (
    GraphInputMixin, graph_kind, identity, pyg_self_looped_graph, pyg_self_looped_input, self_looped,
)
from ._inputs import (
    Features, GraphArg, attention_output, loop_attributes, message_passing_options, node_counts, split_features,
    to_graph_order, unsupported,
)
from ._linear import Linear, glorot

__all__ = ["GATConv", "GATv2Conv"]

_FILL_NAMES = ("add", "sum", "mean", "min", "max", "mul")


def _check_fill_value(layer: str, fill_value) -> None:
    ok = (isinstance(fill_value, Tensor) or (isinstance(fill_value, (int, float)) and not isinstance(fill_value, bool))
          or fill_value in _FILL_NAMES)
    if not ok:
        raise unsupported(layer, "fill_value", fill_value, "use a number, a tensor or one of " +
                          ", ".join(repr(n) for n in _FILL_NAMES))


class _Attention(GraphInputMixin, nn.Module):
    """What GATConv and GATv2Conv share: options, graphs, softmax, dropout, outputs."""

    _name = "GATConv"

    def _options(self, in_channels, out_channels: int, heads: int, concat: bool, negative_slope: float,
                 dropout: float, add_self_loops: bool, edge_dim: Optional[int], fill_value, residual: bool, aggr,
                 aggr_kwargs, flow: str, decomposed_layers: int, backend: str) -> None:
        message_passing_options(self._name, aggr, aggr_kwargs, flow, decomposed_layers, aggrs=("add", "sum"))
        _check_fill_value(self._name, fill_value)
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.edge_dim, self.fill_value = add_self_loops, edge_dim, fill_value
        self.residual, self.aggr, self.flow, self.backend = residual, aggr, flow, backend
        self.node_dim = 0
        self.cached = False

    def _residual_and_bias(self, in_channels, bias: bool) -> None:
        total = self.out_channels * (self.heads if self.concat else 1)
        if self.residual:
            width = in_channels if isinstance(in_channels, int) else in_channels[1]
            self.res = Linear(width, total, bias=False, weight_initializer="glorot")
        else:
            self.register_parameter("res", None)
        if bias:
            self.bias = nn.Parameter(torch.empty(total))
        else:
            self.register_parameter("bias", None)

    def _unfused_graph(self, edge_index, edge_attr: Optional[Tensor], num_src: int, num_dst: int):
        """The graph of the unfused path and whether its ``edge_perm`` maps to the caller's order."""
        kind = graph_kind(edge_index)
        if self.add_self_loops and edge_attr is not None and kind in ("torch_sparse", "sparse_tensor"):
            raise unsupported(self._name, "add_self_loops", True, "edge features with self loops on a sparse adj_t "
                              "are not supported (PyG refuses them too); pass edge_index and edge_attr, or "
                              "add_self_loops=False")
        if self.add_self_loops:
            transform = pyg_self_looped_graph if kind == "graph" else pyg_self_looped_input
        else:
            transform = identity
        graph = self._graph(self._name, edge_index, None, num_dst, transform, num_src=num_src, sparse_values=False)
        return graph, kind != "graph" or self.add_self_loops

    def _edge_features(self, graph, edge_attr: Tensor, caller_order: bool) -> Tensor:
        """``edge_attr`` ``[E, D]`` in the graph's CSR order, with the loops' rows when loops were added."""
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        if self.add_self_loops:
            return loop_attributes(self._name, graph, edge_attr, self.fill_value)
        if edge_attr.shape[0] != graph.num_edges:
            raise ValueError(f"{self._name}(): edge_attr has {edge_attr.shape[0]} rows but the graph has "
                             f"{graph.num_edges} edges")
        return to_graph_order(graph, edge_attr, caller_order)

    def _softmax_dropout(self, graph, scores: Tensor, caller_order: bool) -> Tensor:
        alpha = edge_softmax(graph, scores, backend=self.backend)
        if self.training and self.dropout > 0:
            if caller_order and graph.edge_perm is not None:      # draw PyG's mask: on PyG's edge order
                alpha = graph.to_graph_order(F.dropout(graph.to_input_order(alpha), self.dropout, True))
            else:
                alpha = F.dropout(alpha, self.dropout, True)
        return alpha

    def _finish(self, out: Tensor, res: Optional[Tensor]) -> Tensor:
        out = out.reshape(-1, self.heads * self.out_channels) if self.concat else out.mean(dim=1)
        if res is not None:
            out = out + res
        return out + self.bias if self.bias is not None else out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"


class GATConv(_Attention):
    r"""Graph attention (Velickovic et al.), PyG's ``GATConv``:
    :math:`x'_i = \Vert_h \sum_{j \in N(i) \cup \{i\}} \alpha^h_{ij} \Theta^h_s x_j` (heads
    concatenated, or averaged with ``concat=False``), plus :math:`\Theta_r x_i` (``residual``) and ``b``,

    .. math::
        \alpha^h_{ij} = \mathrm{softmax}_j\, \mathrm{LeakyReLU}\big(a^{h\top}_s \Theta^h_s x_j
        + a^{h\top}_t \Theta^h_t x_i + a^{h\top}_e \Theta^h_e e_{ji}\big),

    :math:`\Theta_s = \Theta_t` (``lin``) unless ``in_channels`` is a pair (``lin_src``,
    ``lin_dst``); the edge term exists with ``edge_dim`` and an ``edge_attr``.  With
    ``add_self_loops`` every self loop is removed and nodes ``i < min(N_src, N_dst)`` get one,
    whose edge features come from ``fill_value``.  Bipartite ``x = (x_src, x_dst)``;
    ``x_dst=None`` drops the target term of the score (and the residual).

    See the module doc for the fused and the unfused path.

    Args:
        in_channels: input width, ``-1`` (lazy), or ``(source width, target width)``.
        out_channels: width per head.
        heads: attention heads.
        concat: concatenate the heads (else average them).
        negative_slope: LeakyReLU slope.
        dropout: attention dropout (training only).
        add_self_loops: replace self loops by one per node.
        edge_dim: edge feature width (``lin_edge``, ``att_edge``).
        fill_value: edge features of added loops: a number, a tensor, or ``"add"``/``"sum"``,
            ``"mean"`` (default), ``"min"``, ``"max"``, ``"mul"`` of the node's incoming edges.
        bias: learn ``b``.
        residual: add :math:`\Theta_r x_i` (``res``).
        aggr: ``"add"``/``"sum"`` only; ``aggr_kwargs``, ``flow``, ``decomposed_layers``: defaults only.
        backend: sparse backend.

    Shapes:
        x: [N, F] or ([M, F_s], [N, F_t] or None); edge_attr: [E, edge_dim] or [E] in the edge
        order of the graph argument; size: (M, N) -> [N, heads * out_channels] (concat) or
        [N, out_channels].  With ``return_attention_weights=True``:
        ``(out, (edge_index, alpha [E', heads]))`` in PyG's form (see ``forward``).
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 edge_dim: Optional[int] = None, fill_value: Union[float, Tensor, str] = "mean", bias: bool = True,
                 residual: bool = False, *, aggr="add", aggr_kwargs: Optional[dict] = None,
                 flow: str = "source_to_target", decomposed_layers: int = 1, backend: str = "auto") -> None:
        super().__init__()
        self._options(in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops, edge_dim,
                      fill_value, residual, aggr, aggr_kwargs, flow, decomposed_layers, backend)
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = Linear(in_channels, heads * out_channels, bias=False, weight_initializer="glorot")
        else:
            self.lin_src = Linear(in_channels[0], heads * out_channels, False, weight_initializer="glorot")
            self.lin_dst = Linear(in_channels[1], heads * out_channels, False, weight_initializer="glorot")
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, heads * out_channels, bias=False, weight_initializer="glorot")
            self.att_edge = nn.Parameter(torch.empty(1, heads, out_channels))
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        self._residual_and_bias(in_channels, bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):
            if lin is not None:
                lin.reset_parameters()
        glorot(self.att_src)
        glorot(self.att_dst)
        glorot(self.att_edge)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Features, edge_index: GraphArg, edge_attr: Optional[Tensor] = None,
                size: Optional[Tuple[int, int]] = None, return_attention_weights: Optional[bool] = None) -> Any:
        """Returns ``out``, or with ``return_attention_weights=True`` ``(out, attention)``:
        ``(edge_index', alpha)`` for an ``edge_index`` (an ``EdgeIndex`` for an ``EdgeIndex``),
        with the self loops this layer added (PyG's order: the edges that are no loop, then the
        loops); ``(adj_t', alpha)`` for a torch sparse ``adj_t`` (``alpha`` as its values); the
        ``SparseTensor`` with ``alpha`` as values; ``(graph', alpha)`` for a Graph (CSR order)."""
        fn, heads, channels = self._name, self.heads, self.out_channels
        x_src, x_dst, pair = split_features(fn, x, dims=2)
        num_src, num_dst = node_counts(fn, edge_index, x_src, x_dst, size, 0)
        lin_src = self.lin if self.lin is not None else self.lin_src
        lin_dst = self.lin if self.lin is not None else self.lin_dst
        res = self.res(x_dst) if self.res is not None and x_dst is not None else None
        h_src = lin_src(x_src).view(-1, heads, channels)
        if pair:
            h_dst = None if x_dst is None else lin_dst(x_dst).view(-1, heads, channels)
        else:
            h_dst = h_src if self.lin is not None else lin_dst(x_dst).view(-1, heads, channels)
        a_src = (h_src * self.att_src).sum(dim=-1)                                   # [M, H]
        a_dst = None if h_dst is None else (h_dst * self.att_dst).sum(dim=-1)        # [N, H]
        edges = edge_attr is not None and self.lin_edge is not None                  # PyG ignores it without edge_dim
        if not edges and not return_attention_weights:                               # the fused path
            transform = self_looped if self.add_self_loops else identity
            graph = self._graph(fn, edge_index, None, num_dst, transform, num_src=num_src, sparse_values=False)
            if a_dst is None:
                a_dst = a_src.new_zeros(num_dst, heads)
            out = gat_attention(graph, h_src, a_src, a_dst, self.negative_slope,
                                self.dropout if self.training else 0.0, backend=self.backend)
            return self._finish(out, res)
        graph, caller_order = self._unfused_graph(edge_index, edge_attr if edges else None, num_src, num_dst)
        if a_dst is None:
            scores = a_src.index_select(0, graph.col)
        else:
            scores = sddmm(graph, a_dst, a_src, "add", backend=self.backend)         # [E', H]
        if edges:
            features = self.lin_edge(self._edge_features(graph, edge_attr, caller_order))
            scores = scores + (features.view(-1, heads, channels) * self.att_edge).sum(dim=-1)
        alpha = self._softmax_dropout(graph, F.leaky_relu(scores, self.negative_slope), caller_order)
        out = self._finish(spmm(graph, h_src, edge_weight=alpha, backend=self.backend), res)
        if return_attention_weights:
            return out, attention_output(edge_index, graph, alpha, caller_order, self.add_self_loops)
        return out


class GATv2Conv(_Attention):
    r"""GATv2 (Brody et al.), PyG's ``GATv2Conv``:
    :math:`x'_i = \Vert_h \sum_{j \in N(i) \cup \{i\}} \alpha^h_{ij} \Theta^h_s x_j` (+ residual, bias),

    .. math::
        \alpha^h_{ij} = \mathrm{softmax}_j\, a^{h\top} \mathrm{LeakyReLU}\big(\Theta^h_s x_j
        + \Theta^h_t x_i + \Theta^h_e e_{ji}\big),

    :math:`\Theta_s` = ``lin_l``, :math:`\Theta_t` = ``lin_r`` (the same module with
    ``share_weights``), both with bias when ``bias``.  The score needs ``[E, heads, C]``
    per-edge terms, so GATv2 always takes the unfused path (module doc).  Bipartite
    ``x = (x_src, x_dst)`` needs ``x_dst`` (as in PyG).  Loops as in :class:`GATConv`.

    Args:
        in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops,
        edge_dim, fill_value, bias, residual, aggr, aggr_kwargs, flow, decomposed_layers,
        backend: as in :class:`GATConv`.
        share_weights: one projection for sources and targets.

    Shapes:
        x: [N, F] or ([M, F_s], [N, F_t]); edge_attr: [E, edge_dim] or [E] -> [N, heads *
        out_channels] (concat) or [N, out_channels]; attention weights as in :class:`GATConv`.
    """

    _name = "GATv2Conv"

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 edge_dim: Optional[int] = None, fill_value: Union[float, Tensor, str] = "mean", bias: bool = True,
                 share_weights: bool = False, residual: bool = False, *, aggr="sum",
                 aggr_kwargs: Optional[dict] = None, flow: str = "source_to_target", decomposed_layers: int = 1,
                 backend: str = "auto") -> None:
        super().__init__()
        self._options(in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops, edge_dim,
                      fill_value, residual, aggr, aggr_kwargs, flow, decomposed_layers, backend)
        self.share_weights = share_weights
        widths = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        self.lin_l = Linear(widths[0], heads * out_channels, bias=bias, weight_initializer="glorot")
        if share_weights:
            self.lin_r = self.lin_l
        else:
            self.lin_r = Linear(widths[1], heads * out_channels, bias=bias, weight_initializer="glorot")
        self.att = nn.Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, heads * out_channels, bias=False, weight_initializer="glorot")
        else:
            self.lin_edge = None
        self._residual_and_bias(in_channels, bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin_l, self.lin_r, self.lin_edge, self.res):
            if lin is not None:
                lin.reset_parameters()
        glorot(self.att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Features, edge_index: GraphArg, edge_attr: Optional[Tensor] = None,
                return_attention_weights: Optional[bool] = None) -> Any:
        """Returns ``out``, or ``(out, attention)`` as :meth:`GATConv.forward` does."""
        fn, heads, channels = self._name, self.heads, self.out_channels
        x_src, x_dst, pair = split_features(fn, x, dims=2)
        if x_dst is None:
            raise ValueError(f"{fn}(): the target features x[1] are needed (the score compares both ends of an edge; "
                             "PyG's GATv2Conv needs them too)")
        if edge_attr is not None and self.lin_edge is None:
            raise ValueError(f"{fn}(): edge_attr is given but the layer has no edge_dim (PyG refuses it too); "
                             "construct it with edge_dim=edge_attr.size(-1)")
        num_src, num_dst = node_counts(fn, edge_index, x_src, x_dst, None, 0)
        res = self.res(x_dst) if self.res is not None else None
        h_src = self.lin_l(x_src).view(-1, heads, channels)                         # x_j side
        h_dst = h_src if (self.share_weights and not pair) else self.lin_r(x_dst).view(-1, heads, channels)
        graph, caller_order = self._unfused_graph(edge_index, edge_attr, num_src, num_dst)
        hidden = sddmm(graph, h_dst.reshape(num_dst, heads * channels), h_src.reshape(num_src, heads * channels),
                       "add", backend=self.backend).view(-1, heads, channels)       # [E', H, C]
        if edge_attr is not None:
            features = self.lin_edge(self._edge_features(graph, edge_attr, caller_order))
            hidden = hidden + features.view(-1, heads, channels)
        scores = (F.leaky_relu(hidden, self.negative_slope) * self.att).sum(dim=-1)
        alpha = self._softmax_dropout(graph, scores, caller_order)
        out = self._finish(spmm(graph, h_src, edge_weight=alpha, backend=self.backend), res)
        if return_attention_weights:
            return out, attention_output(edge_index, graph, alpha, caller_order, self.add_self_loops)
        return out
