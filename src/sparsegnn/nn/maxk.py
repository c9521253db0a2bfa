r"""MaxK-GNN layers: the MaxK nonlinearity inside the convolution, aggregating CBSR features.

MaxK keeps the ``k`` largest entries of every row, ``c = maxk(y, k)`` (a :class:`~sparsegnn.CBSR`,
``[N, k]`` values and columns); in training, dropout acts on ``c.values`` only (the zeros stay
zeros).  The CBSR is aggregated with :func:`sparsegnn.spmm` (MaxK-GNN's SpGEMM forward and SSpMM
backward).  Where MaxK sits follows MaxK-GNN's models:

* :class:`MaxKSAGEConv` takes the *pre-activation* ``x`` (the output of the previous linear map)
  and applies MaxK first, the linear maps after the aggregation:
  :math:`c = \mathrm{drop}(\mathrm{maxk}(x, k))`, :math:`x'_i = W_l\, \mathrm{mean}_{j \to i} c_j + b + W_r c_i`.
* :class:`MaxKGCNConv` and :class:`MaxKGINConv` do the same by default (MaxK on the input, the
  linear map after the aggregation: :math:`X' = (\hat D^{-1/2} \hat A \hat D^{-1/2} C)\, \Theta + b`,
  :math:`x'_i = h_\Theta((1 + \epsilon) c_i + \sum_{j \to i} c_j)`).  With ``linear_first=True``
  they follow the paper's Eq. 3 / Fig. 5 and the authors' GCN / GIN ("the feature map post linear
  layer and the MaxK nonlinearity" is aggregated): the linear map first, MaxK on its output, an
  aggregation with no weight after it:
  :math:`C = \mathrm{drop}(\mathrm{maxk}(X \Theta, k))`, :math:`X' = \hat D^{-1/2} \hat A \hat D^{-1/2} C + b`;
  :math:`c = \mathrm{drop}(\mathrm{maxk}(h_\Theta(x), k))`, :math:`x'_i = (1 + \epsilon) c_i + \sum_{j \to i} c_j`.
  Neither placement is the more accurate one in our measurements (k = 32 of 256: with
  ``linear_first`` GCN is 1.3 points below ReLU on Cora and Citeseer over 30 seeds, level on the
  real graphs; ``docs/design/maxk.md``).

``c_i`` in a root / self term is taken from the kept entries only.  By default each layer equals
the plain layer (:class:`~sparsegnn.nn.SAGEConv`, :class:`~sparsegnn.nn.GCNConv`,
:class:`~sparsegnn.nn.GINConv`) applied to ``maxk(x, k, dense=True)`` (the same dropout mask); with
``linear_first`` the GCN and GIN layers equal the plain layers' aggregations (an identity map)
applied to ``maxk(lin(x), k, dense=True)``.  All have their plain layer's parameter names and
shapes, so state dicts move between the two.  Gradients reach the selected tensor at the kept
positions only.

With MaxK on the input, ``x`` may also be a :class:`~sparsegnn.CBSR` with the layer's ``k``, selected
already (:func:`sparsegnn.layer_norm_maxk` selects from a LayerNorm's output without writing it, as
:class:`~sparsegnn.nn.MaxKGNN` does between layers): the layer then applies only the dropout.

Eager calls on small graphs (CUDA, the default stream, Triton backend, not compiled; at most 6M
feature and 128M edge elements: :func:`sparsegnn.ops.maxk.aggregates_dense`) aggregate
``dropout(maxk(x, k, dense=True))`` with the plain layer's dense ops instead: such a step waits on
the host, and the dense form costs the plain layer's host time plus one selection launch, where
the CBSR nodes cost more (``docs/design/maxk.md``).  Its dropout draws over all ``F`` columns
(the zeros stay zeros).  Captures, replays, captured steps, ``torch.compile`` and calls on a side
stream keep the CBSR kernels: warm up a capture of your own on a side stream (PyTorch's recipe),
so that the kernels it records ran before it.

Graph argument: a :class:`~sparsegnn.Graph`, an ``edge_index`` (with ``edge_weight``), PyG's
``EdgeIndex``, a torch sparse ``adj_t`` or a ``SparseTensor``, through the plain layers' cached
graph machinery (``GraphInputMixin``; GCN's normalised graph included).  One node set only:
the CBSR of the sources is the root term of the targets.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor, nn

from .._checks import check
from ..formats.cbsr import CBSR
from ..ops.dropout import dropout as dropout_fn
from ..ops._dispatch import check_backend
from ..ops.maxk import aggregates_dense, dense_select, maxk
from ..ops.spmm import gin_aggregate, sage_cbsr, spmm
from ._graph_input import GraphInputMixin, edge_count, graph_kind, identity
from ._inputs import GraphArg, node_counts, split_features
from ._linear import Linear
from .gcn import add_gcn_parameters, gcn_layer_transform, gcn_propagate, reset_gcn_parameters
from .gin import reset_module

__all__ = ["MaxKSAGEConv", "MaxKGCNConv", "MaxKGINConv"]

def _check_k(fn: str, k, width: Optional[int], selected: str = "the input", twins: bool = False) -> int:
    """``k`` as an int in ``[1, width]`` (the width of ``selected``, the tensor MaxK selects from)."""
    limit = f"[1, {width}]" if width is not None and width > 0 else "[1, F]"
    ok = isinstance(k, int) and not isinstance(k, bool) and k >= 1 and (width is None or width <= 0 or k <= width)
    twin = " or None (the ReLU twin)" if twins else ""
    check(ok, fn, f"k must be an int in {limit}{twin} (entries kept per row of {selected}), got {k!r}")
    return k


class _MaxKConv(GraphInputMixin, nn.Module):
    """What the MaxK layers share: ``k``, dropout on the kept values, the backend, the graph.

    ``k=None`` makes the layer its ReLU twin (``relu`` then dropout, dense; the MaxK-GNN paper's
    baseline of the same structure, built by :class:`~sparsegnn.nn.MaxKGNN`)."""

    _name = "MaxKConv"
    #: Whether ``k=None`` (the ReLU twin) is accepted.
    _twins = True

    def __init__(self, k: Optional[int], dropout: float, backend: str, width: Optional[int],
                 selected: str = "the input") -> None:
        super().__init__()
        fn = self._name
        self.k = None if k is None and self._twins else _check_k(fn, k, width, selected, self._twins)
        check(isinstance(dropout, (int, float)) and 0.0 <= float(dropout) < 1.0, fn,
              f"dropout must be in [0, 1), got {dropout!r}")
        check_backend(fn, backend)
        self.dropout = float(dropout)
        self.backend = backend
        self.cached = False

    def sparsify(self, x: Union[Tensor, CBSR], dense: bool = False) -> Union[CBSR, Tensor]:
        """``maxk(x, k)`` with dropout on the kept values in training mode; a CBSR ``x`` (selected
        already, e.g. by :func:`sparsegnn.layer_norm_maxk`) gets the dropout only.  ``dense``:
        ``dropout(maxk(x, k, dense=True))``, the ``[N, F]`` matrix (dropout then draws over all
        ``F`` columns; the zeros stay zeros, so the kept values see the same distribution).

        Shapes:
            x: [N, F] (or a CBSR [N, k]) -> CBSR with values / index [N, k] (dense: [N, F]).
        """
        if isinstance(x, CBSR):
            c = x
        elif x.shape[1] < self.k:     # messages on failure only (a symbolic shape cannot be formatted)
            raise ValueError(f"{self._name}(): the selected features have width {x.shape[1]}, fewer than "
                             f"k = {self.k}")
        elif dense:     # on CUDA (``dense_path``) an x the Triton kernel takes: no checks again
            c = dense_select(x, self.k) if x.is_cuda else maxk(x, self.k, dense=True, backend=self.backend)
            return dropout_fn(c, self.dropout, self.training)
        else:
            c = maxk(x, self.k, backend=self.backend)
        if self.training and self.dropout > 0.0:
            c = c.with_values(dropout_fn(c.values, self.dropout, True))
        return c

    def activate(self, y: Tensor, dense: bool = False) -> Union[CBSR, Tensor]:
        """:meth:`sparsify`, or for the ReLU twin (``k`` None) ``dropout(relu(y))``, dense.

        Shapes:
            y: [N, F] -> CBSR [N, k] (dense [N, F] for the twin, or with ``dense``).
        """
        if self.k is None:
            return dropout_fn(torch.relu(y), self.dropout, self.training)
        return self.sparsify(y, dense)

    def dense_path(self, x: Union[Tensor, CBSR], graph: GraphArg) -> bool:
        """Whether this call aggregates ``maxk(x, k, dense=True)`` with the plain layer's dense ops
        rather than the CBSR kernels (:func:`sparsegnn.ops.maxk.aggregates_dense`: an eager call
        on a small graph, where host time bounds the step): MaxK on a tensor ``x`` only."""
        return self.k is not None and isinstance(x, Tensor) and aggregates_dense(x, edge_count(graph), self.backend)

    def _inputs_and_graph(self, x: Tensor, edge_index: GraphArg, edge_weight: Optional[Tensor], transform,
                          sparse_values: bool = True):
        """``(graph, x)``: the transformed Graph of ``edge_index`` and the checked features."""
        fn = self._name
        if isinstance(x, CBSR):     # selected already: MaxK on the input only, with this layer's k
            if self.k is None or getattr(self, "linear_first", False):
                what = ("selects from its linear map's output (linear_first)" if self.k is not None
                        else "is a ReLU twin (k=None)")
                raise ValueError(f"{fn}(): a CBSR x (features selected already) needs MaxK on the layer's input; "
                                 f"this layer {what}: pass a tensor")
            if x.k != self.k:
                raise ValueError(f"{fn}(): the CBSR x keeps k = {x.k} entries a row, the layer k = {self.k}")
            split_features(fn, x.values, pairs=False, dims=2)
            _, num_nodes = node_counts(fn, edge_index, x.values, x.values, None, -2, square=True)
        else:
            x, _, _ = split_features(fn, x, pairs=False, dims=2)
            _, num_nodes = node_counts(fn, edge_index, x, x, None, -2, square=True)
        graph = self._graph(fn, edge_index, edge_weight, num_nodes, transform, sparse_values=sparse_values)
        return graph, x

    def _check_width(self, x: Union[Tensor, CBSR], width: int) -> None:
        if isinstance(x, CBSR) and x.num_cols != width:
            raise ValueError(f"{self._name}(): the CBSR x has {x.num_cols} columns but in_channels = {width}")
        if isinstance(x, Tensor) and x.dim() == 2 and width > 0:
            if x.shape[1] != width:
                raise ValueError(f"{self._name}(): x has {x.shape[1]} features but in_channels = {width}")


class MaxKSAGEConv(_MaxKConv):
    r"""GraphSAGE with the MaxK nonlinearity (MaxK-GNN):
    :math:`c = \mathrm{drop}(\mathrm{maxk}(x, k))`,
    :math:`x'_i = W_l\, \mathrm{aggr}_{j \to i}\, w_{ji} c_j + b + W_r c_i`.

    Equals ``SAGEConv(in_channels, out_channels, aggr, root_weight=root_weight, bias=bias)``
    on ``maxk(x, k, dense=True)`` (parameters ``lin_l`` = :math:`W_l, b`, ``lin_r`` = :math:`W_r`).

    Args:
        in_channels: input width ``F`` (the pre-activation features).
        out_channels: output width.
        k: entries kept per row, ``1 <= k <= in_channels``.
        dropout: probability of dropping a kept value in training (the others are zeros already).
        aggr: ``"mean"`` (default, MaxK-GNN's), ``"sum"`` or ``"add"``.
        root_weight: add :math:`W_r c_i`.
        bias: learn ``b``.
        backend: ``"auto"``, ``"reference"``, ``"triton"`` or ``"cpu"`` (selection and aggregation).

    Shapes:
        x: [N, in_channels]; edge_index: Graph, [2, E], EdgeIndex, sparse adj_t [N, N] or
        SparseTensor; edge_weight: [E] -> [N, out_channels].
    """

    _name = "MaxKSAGEConv"
    _twins = False      # the ReLU baseline uses the plain SAGEConv

    def __init__(self, in_channels: int, out_channels: int, k: int, dropout: float = 0.0, aggr: str = "mean",
                 root_weight: bool = True, bias: bool = True, backend: str = "auto") -> None:
        check(isinstance(in_channels, int) and in_channels > 0, self._name,
              f"in_channels must be a positive int, got {in_channels!r}")
        super().__init__(k, dropout, backend, in_channels)
        check(aggr in ("mean", "sum", "add"), self._name, f"aggr must be 'mean', 'sum' or 'add' (CBSR features "
                                                          f"aggregate linearly), got {aggr!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.aggr, self.reduce, self.root_weight = aggr, "mean" if aggr == "mean" else "sum", root_weight
        self.lin_l = Linear(in_channels, out_channels, bias=bias)
        self.lin_r = Linear(in_channels, out_channels, bias=False) if root_weight else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_l.reset_parameters()
        if self.lin_r is not None:
            self.lin_r.reset_parameters()

    def forward(self, x: Tensor, edge_index: GraphArg, edge_weight: Optional[Tensor] = None) -> Tensor:
        """``edge_weight`` weighs an ``edge_index``'s messages (a Graph carries its own in ``edge_val``)."""
        self._check_width(x, self.in_channels)
        graph, x = self._inputs_and_graph(x, edge_index, edge_weight, identity,
                                          sparse_values=graph_kind(edge_index) != "sparse_tensor")
        if self.dense_path(x, graph):       # SAGEConv's ops on the dense selection
            c = self.sparsify(x, dense=True)
            out = self.lin_l(spmm(graph, c, reduce=self.reduce, backend=self.backend))
            return out if self.lin_r is None else out + self.lin_r(c)
        c = self.sparsify(x)
        if self.lin_r is None:
            return self.lin_l(spmm(graph, c, reduce=self.reduce, backend=self.backend))
        # the root term W_r c_i + b from the kept entries only (k multiply-adds per output), W_l agg_i
        # added onto it in the GEMM: one autograd node (``sage_cbsr``)
        return sage_cbsr(graph, c, self.lin_l.weight, self.lin_l.bias, self.lin_r.weight, self.reduce, self.backend)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, k={self.k}, aggr={self.aggr})"


class MaxKGCNConv(_MaxKConv):
    r"""Graph convolution with the MaxK nonlinearity (MaxK-GNN).

    Default (MaxK on the input, projected after the aggregation: exact, both being linear):
    :math:`C = \mathrm{drop}(\mathrm{maxk}(X, k))`, :math:`X' = (\hat D^{-1/2} \hat A \hat D^{-1/2} C)\, \Theta + b`;
    equals ``GCNConv(in_channels, out_channels, ...)`` on ``maxk(X, k, dense=True)``.

    ``linear_first=True`` (the paper's Eq. 3 / Fig. 5 and the authors' GCN): the linear map first,
    MaxK selecting ``k`` of ``out_channels`` entries from its output, an aggregation with no weight:
    :math:`C = \mathrm{drop}(\mathrm{maxk}(X \Theta, k))`, :math:`X' = \hat D^{-1/2} \hat A \hat D^{-1/2} C + b`;
    equals ``GCNConv(out_channels, out_channels, ...)`` with an identity weight on
    ``maxk(X Θ, k, dense=True)``.

    :math:`\hat A` as in :class:`~sparsegnn.nn.GCNConv` (the same cached normalised graph: self
    loops as PyG adds them for the graph form, symmetric normalisation by the weighted in-degree);
    its normalised values are the aggregation's edge weights.  Parameters as ``GCNConv(in_channels,
    out_channels)``'s (``lin`` without bias, ``bias``).

    Args:
        in_channels: input width.
        out_channels: output width.
        k: entries kept per row, ``1 <= k <= in_channels`` (``out_channels`` with ``linear_first``);
            ``None`` makes the ReLU twin (ReLU and dense dropout in place of MaxK: the paper's baseline).
        dropout: probability of dropping a kept value in training.
        add_self_loops: add self loops (needs ``normalize``).
        normalize: the symmetric normalisation (else the edge weights as given).
        bias: learn ``b``.
        backend: ``"auto"``, ``"reference"``, ``"triton"`` or ``"cpu"``.
        linear_first: MaxK on the output of the linear map (the paper's placement), not on the input.

    Shapes:
        x: [N, in_channels]; edge_index: Graph, [2, E], EdgeIndex, sparse adj_t [N, N] or
        SparseTensor; edge_weight: [E] -> [N, out_channels].
    """

    _name = "MaxKGCNConv"

    def __init__(self, in_channels: int, out_channels: int, k: Optional[int], dropout: float = 0.0,
                 add_self_loops: bool = True, normalize: bool = True, bias: bool = True,
                 backend: str = "auto", linear_first: bool = False) -> None:
        check(isinstance(in_channels, int) and in_channels > 0, self._name,
              f"in_channels must be a positive int, got {in_channels!r}")
        check(isinstance(out_channels, int) and out_channels > 0, self._name,
              f"out_channels must be a positive int, got {out_channels!r}")
        super().__init__(k, dropout, backend, out_channels if linear_first else in_channels,
                         "the linear map's output" if linear_first else "the input")
        check(normalize or not add_self_loops, self._name,
              "add_self_loops=True needs normalize=True (as in GCNConv); pass a graph with self loops instead")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.add_self_loops, self.normalize = add_self_loops, normalize
        self.linear_first = bool(linear_first)
        add_gcn_parameters(self, in_channels, out_channels, bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_gcn_parameters(self)

    def forward(self, x: Tensor, edge_index: GraphArg, edge_weight: Optional[Tensor] = None) -> Tensor:
        self._check_width(x, self.in_channels)
        transform = gcn_layer_transform(graph_kind(edge_index), self.normalize, self.add_self_loops)
        graph, x = self._inputs_and_graph(x, edge_index, edge_weight, transform)
        if self.linear_first:
            y = self.lin(x)
            out = spmm(graph, self.activate(y, self.dense_path(y, graph)), reduce="sum", backend=self.backend)
        elif self.dense_path(x, graph):     # GCNConv's ops on the dense selection
            return gcn_propagate(graph, self.activate(x, True), self.lin, self.bias, backend=self.backend)
        else:
            out = self.lin(spmm(graph, self.activate(x), reduce="sum", backend=self.backend))
        return out + self.bias if self.bias is not None else out

    def __repr__(self) -> str:
        k = f"k={self.k}" if self.k is not None else "relu"
        first = ", linear_first=True" if self.linear_first else ""
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, {k}{first})"


class MaxKGINConv(_MaxKConv):
    r"""Graph isomorphism layer with the MaxK nonlinearity (MaxK-GNN).

    Default: :math:`c = \mathrm{drop}(\mathrm{maxk}(x, k))`,
    :math:`x'_i = h_\Theta\big((1 + \epsilon) c_i + \sum_{j \to i} w_{ji} c_j\big)`; equals
    ``GINConv(nn, eps, train_eps)`` on ``maxk(x, k, dense=True)``.

    ``linear_first=True`` (the paper's Eq. 3 and the authors' GIN): :math:`h_\Theta` first, MaxK
    on its output, then :math:`x'_i = (1 + \epsilon) c_i + \sum_{j \to i} w_{ji} c_j` with
    :math:`c = \mathrm{drop}(\mathrm{maxk}(h_\Theta(x), k))`; equals ``GINConv(Identity(), eps,
    train_eps)`` on ``maxk(h_Θ(x), k, dense=True)``.

    Parameters as ``GINConv(nn, eps, train_eps)``'s (``nn`` and ``eps``, a parameter with
    ``train_eps``, else a buffer).

    Args:
        nn: the network :math:`h_\Theta` (reset when the layer is made, as in GINConv).
        k: entries kept per row, ``1 <= k <= F`` (checked against the selected tensor: ``x``, or
            ``nn``'s output with ``linear_first``); ``None`` makes the ReLU twin.
        dropout: probability of dropping a kept value in training.
        eps: initial :math:`\epsilon`; ``train_eps`` makes it a parameter.
        backend: ``"auto"``, ``"reference"``, ``"triton"`` or ``"cpu"``.
        linear_first: MaxK on the output of ``nn`` (the paper's placement), not on the input.

    Shapes:
        x: [N, F]; edge_index: Graph, [2, E], EdgeIndex, sparse adj_t [N, N] or SparseTensor;
        edge_weight: [E] -> [N, F_out of nn].
    """

    _name = "MaxKGINConv"

    def __init__(self, nn: Callable[[Tensor], Tensor], k: Optional[int], dropout: float = 0.0, eps: float = 0.0,
                 train_eps: bool = False, backend: str = "auto", linear_first: bool = False) -> None:
        super().__init__(k, dropout, backend, None, "nn's output" if linear_first else "the input")
        self.nn = nn
        self.initial_eps = eps
        self.linear_first = bool(linear_first)
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_module(self.nn)
        self.eps.data.fill_(self.initial_eps)

    def forward(self, x: Tensor, edge_index: GraphArg, edge_weight: Optional[Tensor] = None) -> Tensor:
        graph, x = self._inputs_and_graph(x, edge_index, edge_weight, identity,
                                          sparse_values=graph_kind(edge_index) != "sparse_tensor")
        y = self.nn(x) if self.linear_first else x
        c = self.activate(y, self.dense_path(y, graph))
        out = gin_aggregate(graph, c, self.eps, backend=self.backend)  # CBSR: the self term inside the aggregation
        return out if self.linear_first else self.nn(out)

    def __repr__(self) -> str:
        k = f"k={self.k}" if self.k is not None else "relu"
        first = ", linear_first=True" if self.linear_first else ""
        return f"{self.__class__.__name__}(nn={self.nn}, {k}{first})"
