"""``GCNConv``: PyG 2.8's graph convolution, every option and graph form, on the SpMM."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .._checks import check_precision
from ..graph import Graph
from ..ops.gcn_fused import FUSED_MAX_WIDTH, fused_batched_gcn, fused_gcn_applies
from ._graph_input import GraphInputMixin, GraphTransform, gcn_transform, graph_kind, identity
from ._inputs import (GraphArg, message_passing_options, node_counts, propagate, split_features,
                      unsupported)
from ._linear import Linear

__all__ = ["GCNConv", "gcn_layer_transform", "gcn_propagate", "add_gcn_parameters", "reset_gcn_parameters"]

#: How PyG adds GCN's self loops for each graph form (see ``_graph_input.gcn_transform``).
_LOOPS_BY_KIND = {"torch_sparse": "added", "sparse_tensor": "replaced"}


def gcn_layer_transform(kind: str, normalize: bool = True, add_self_loops: bool = True,
                        improved: bool = False) -> GraphTransform:
    """The graph transform of a GCN layer for a graph argument of form ``kind`` (``graph_kind``):
    the identity without ``normalize``, else the symmetric normalisation, with self loops added
    the way PyG adds them for that form (weight 2 with ``improved``) when ``add_self_loops``."""
    if not normalize:
        return identity
    if not add_self_loops:
        return gcn_transform(None)
    return gcn_transform(_LOOPS_BY_KIND.get(kind, "remaining"), 2.0 if improved else 1.0)


def add_gcn_parameters(module: nn.Module, in_channels: int, out_channels: int, bias: bool) -> None:
    """GCN's parameters on ``module``, PyG's names: ``lin`` (no bias, glorot) and ``bias`` (or None)."""
    module.lin = Linear(in_channels, out_channels, bias=False, weight_initializer="glorot")
    if bias:
        module.bias = nn.Parameter(torch.empty(out_channels))
    else:
        module.register_parameter("bias", None)


def reset_gcn_parameters(module: nn.Module) -> None:
    """Re-initialise what :func:`add_gcn_parameters` added (glorot weight, zero bias)."""
    module.lin.reset_parameters()
    if module.bias is not None:
        nn.init.zeros_(module.bias)


def gcn_propagate(graph: Graph, x: Tensor, lin: Linear, bias: Optional[Tensor], reduce: str = "sum",
                  node_dim: int = -2, backend: str = "auto", precision: str = "ieee") -> Tensor:
    r"""GCN's product on a transformed graph: :math:`\hat A X \Theta + b` (``Θ`` = ``lin``, no bias).

    On a batch of small graphs the fused kernel (aggregation, weight and bias in one launch: see
    :class:`GCNConv`); otherwise for a linear ``reduce`` the aggregation runs on the narrower side
    (:math:`\hat A (X \Theta) = (\hat A X) \Theta`), and "max" / "min" aggregate :math:`X \Theta`.

    Shapes:
        x: [N, F_in] or [..., N, F_in] (nodes on ``node_dim``); lin: F_in -> F_out; bias: [F_out] -> [..., N, F_out].
    """
    weight = lin.weight
    if (reduce == "sum" and precision == "ieee" and x.dim() == 2 and node_dim in (-2, 0)
            and weight.shape[0] <= FUSED_MAX_WIDTH and weight.shape[1] <= FUSED_MAX_WIDTH
            and weight.dtype == x.dtype and (bias is None or bias.dtype == x.dtype)
            and not torch.is_autocast_enabled(x.device.type) and fused_gcn_applies(graph, x, backend)):
        return fused_batched_gcn(x, graph, weight.t(), bias)
    if reduce in ("sum", "mean") and weight.shape[0] > x.size(-1):
        out = lin(propagate(graph, x, reduce, node_dim, backend=backend, precision=precision))
    else:
        out = propagate(graph, lin(x), reduce, node_dim, backend=backend, precision=precision)
    return out + bias if bias is not None else out


class GCNConv(GraphInputMixin, nn.Module):
    r"""Graph convolution (Kipf & Welling), PyG's ``GCNConv``:
    :math:`X' = \hat D^{-1/2} \hat A \hat D^{-1/2} X \Theta + b`,
    :math:`x'_i = \Theta^\top \sum_{j \in N(i) \cup \{i\}} \frac{e_{ji}}{\sqrt{\hat d_j \hat d_i}} x_j + b`,
    with :math:`\hat d_i = \sum_j \hat A_{ij}` the weighted in-degree of :math:`\hat A`.

    :math:`\hat A` is :math:`A` with self loops added as PyG adds them for each graph form:

    * ``edge_index`` / ``EdgeIndex`` / :class:`~sparsegnn.Graph`: every self loop is removed and
      each node gets one loop, of the weight of its last self loop in the input, else ``fill``
      (1, or 2 with ``improved``).  Without edge weights every edge and loop weighs 1 (PyG
      ignores ``improved`` then).
    * torch sparse ``adj_t``: :math:`\hat A = A + \mathrm{fill} \cdot I` (existing loops stay).
    * ``SparseTensor``: loops replaced by loops of weight ``fill``.

    With ``normalize=False``: :math:`X' = A X \Theta + b` (the edge weights as given).  The
    aggregation runs on the narrower side (:math:`\hat A (X \Theta) = (\hat A X) \Theta`) for the
    linear ``aggr`` ("add"/"sum", "mean"); "max" and "min" aggregate :math:`X \Theta`.

    On a batch of small graphs (a block-diagonal Graph with ``ptr``, every graph of at most 128
    nodes) with the Triton backend, ``aggr`` "add"/"sum", exact ``precision``, 2-D ``x``, widths
    of at most 128 and no autocast, the layer's forward is one fused kernel (:func:`sparsegnn.ops.gcn_fused.batched_gcn`:
    aggregation, :math:`\Theta` and bias in one launch; ``lin``'s forward hooks do not run then).

    Args:
        in_channels: input width, or ``-1`` to take it from the first input (lazy).
        out_channels: output width.
        improved: :math:`\hat A = A + 2I` (added loops weigh 2).
        cached: keep the normalised graph of the first call for every later call.
        add_self_loops: add self loops (default: ``normalize``); needs ``normalize=True``.
        normalize: add self loops and normalise symmetrically.
        bias: learn ``b``.
        aggr: ``"add"`` (default), ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.
        aggr_kwargs, flow, decomposed_layers: PyG's ``MessagePassing`` arguments; only their
            defaults are supported (anything else raises ``ValueError``).
        node_dim: the node dimension of ``x`` (PyG's, default -2: ``x`` of ``[..., N, F]``).
        backend: sparse backend of the aggregation (``"auto"``, ``"cpu"``, ``"triton"``, ``"reference"``).
        precision: ``"ieee"`` (default: exact), ``"tf32"`` or ``"bf16"``: the sum / mean
            aggregation on tensor cores where the tuner finds it faster (see
            :func:`sparsegnn.spmm`; max / min stay exact).

    Shapes:
        x: [N, in_channels] or [B, N, in_channels]; edge_index: Graph, [2, E], EdgeIndex, sparse
        adj_t [N, N] or SparseTensor; edge_weight: [E] -> [N, out_channels] (or [B, N, out_channels]).
    """

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False, cached: bool = False,
                 add_self_loops: Optional[bool] = None, normalize: bool = True, bias: bool = True, *,
                 aggr: str = "add", aggr_kwargs: Optional[dict] = None, flow: str = "source_to_target",
                 node_dim: int = -2, decomposed_layers: int = 1, backend: str = "auto",
                 precision: str = "ieee") -> None:
        super().__init__()
        self.reduce = message_passing_options("GCNConv", aggr, aggr_kwargs, flow, decomposed_layers, node_dim=node_dim)
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise unsupported("GCNConv", "add_self_loops", add_self_loops,
                              "self loops are added only with normalize=True (PyG refuses it too); pass a graph "
                              "with self loops instead")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.improved, self.cached = improved, cached
        self.add_self_loops, self.normalize = add_self_loops, normalize
        self.aggr, self.flow, self.node_dim, self.backend = aggr, flow, node_dim, backend
        self.precision = check_precision("GCNConv", precision)
        add_gcn_parameters(self, in_channels, out_channels, bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_gcn_parameters(self)
        self.reset_cache()

    def _transform(self, kind: str):
        return gcn_layer_transform(kind, self.normalize, self.add_self_loops, self.improved)

    def forward(self, x: Tensor, edge_index: GraphArg, edge_weight: Optional[Tensor] = None) -> Tensor:
        """Args: ``x``; the graph in any form (see the class doc); ``edge_weight`` of an
        ``edge_index`` (a sparse ``adj_t`` carries its own weights, and PyG ignores this one then)."""
        fn = "GCNConv"
        x, _, _ = split_features(fn, x, pairs=False)
        num_nodes, _ = node_counts(fn, edge_index, x, x, None, self.node_dim, square=True)
        graph = self._graph(fn, edge_index, edge_weight, num_nodes, self._transform(graph_kind(edge_index)))
        self.lin.initialize(x.size(-1))
        return gcn_propagate(graph, x, self.lin, self.bias, self.reduce, self.node_dim, self.backend, self.precision)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels})"
