"""The layers' inputs in PyG's forms, normalised in one place (the graph argument: ``_graph_input``).

* **Options** PyG's ``MessagePassing`` takes as ``**kwargs`` (``aggr``, ``aggr_kwargs``, ``flow``,
  ``node_dim``, ``decomposed_layers``): :func:`message_passing_options` accepts what the layers
  honour and raises ``ValueError("<Layer>(): <arg>=... is not supported; <alternative>")`` for
  the rest (:func:`unsupported`), never silently computing something else.
* **Node features**: a tensor, or a bipartite pair ``(x_src, x_dst)`` with ``x_dst`` possibly
  ``None`` (:func:`split_features`); node counts from the features, PyG's ``size=(N_src, N_dst)``
  and the graph argument, checked against each other (:func:`node_counts`).  Features may carry
  leading dimensions (``[B, N, F]``, one static graph and ``B`` feature sets; nodes on
  ``node_dim``, -2 by default): :func:`propagate` aggregates them in *one* SpMM over
  ``[N, B * F]``.
* **Per-edge tensors** (``edge_attr``) come in the caller's edge order and are moved into the
  graph's CSR order (:func:`to_graph_order`); loops added the PyG way get their attributes from
  ``fill_value`` (:func:`loop_attributes`); attention weights go back in PyG's form
  (:func:`attention_output`).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..graph import Graph
from ..ops import spmm
from ._graph_input import LOOP_INFO, LoopInfo, graph_kind, graph_sizes

__all__ = [
    "Features", "GraphArg", "unsupported", "message_passing_options", "split_features", "node_counts", "propagate",
    "edge_graph",
    "to_graph_order", "loop_attributes", "attention_output", "AGGR_TO_REDUCE",
]

#: Node features: a tensor, or a bipartite pair ``(x_src, x_dst)`` (``x_dst`` may be ``None``).
Features = Union[Tensor, Tuple[Tensor, Optional[Tensor]]]
#: A layer's graph argument: a Graph, an ``edge_index`` / ``EdgeIndex``, a torch sparse ``adj_t``
#: or a ``torch_sparse.SparseTensor``.
GraphArg = Union[Graph, Tensor, Any]

#: PyG aggregation names the SpMM-based layers honour, and the reduce each one runs.
AGGR_TO_REDUCE = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min"}


def unsupported(layer: str, arg: str, value: Any, alternative: str) -> ValueError:
    """The error for a PyG argument (or input) a layer cannot honour."""
    return ValueError(f"{layer}(): {arg}={value!r} is not supported; {alternative}")


def message_passing_options(layer: str, aggr: Any, aggr_kwargs: Optional[dict], flow: str, decomposed_layers: int,
                            aggrs: Sequence[str] = tuple(AGGR_TO_REDUCE), node_dim: int = -2) -> str:
    """Check PyG's ``MessagePassing`` keyword arguments; return the SpMM reduce of ``aggr``.

    Raises:
        ValueError: an ``Aggregation`` object, a list of aggregations or a name outside
            ``aggrs``; ``aggr_kwargs``; ``flow="target_to_source"``; ``decomposed_layers != 1``;
            ``node_dim=-1`` (the feature dimension) or a non-integer.
    """
    if isinstance(node_dim, bool) or not isinstance(node_dim, int) or node_dim == -1:
        raise unsupported(layer, "node_dim", node_dim, "nodes lie on a dimension other than the last (the features): "
                          "use -2 for [..., N, F] or 0 for [N, ..., F]")
    names = ", ".join(repr(a) for a in aggrs)
    if not isinstance(aggr, str) or aggr not in aggrs:
        raise unsupported(layer, "aggr", aggr, f"use one of {names} (sparsegnn aggregates with its SpMM; "
                          "Aggregation modules and lists of aggregations have no kernel here)")
    if aggr_kwargs:
        raise unsupported(layer, "aggr_kwargs", aggr_kwargs, "the supported aggregations take no arguments")
    if flow != "source_to_target":
        raise unsupported(layer, "flow", flow, "keep flow='source_to_target' and pass edge_index.flip(0) (or the "
                          "transposed adj_t) to send messages the other way")
    if decomposed_layers != 1:
        raise unsupported(layer, "decomposed_layers", decomposed_layers,
                          "drop it: it only chunks PyG's per-edge messages to save memory, and the SpMM never "
                          "materialises them")
    return AGGR_TO_REDUCE[aggr]


def _check_features(layer: str, name: str, x: Any, dims: Optional[int]) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{layer}(): {name} must be a torch.Tensor, got {type(x).__name__}")
    if dims is None and x.dim() < 2:
        raise ValueError(f"{layer}(): {name} must have at least 2 dimensions ([..., num_nodes, features]), "
                         f"got shape {tuple(x.shape)}")
    if dims is not None and x.dim() != dims:
        raise ValueError(f"{layer}(): {name} must be 2-D [num_nodes, features], got shape {tuple(x.shape)} (features "
                         "with leading batch dimensions are not supported by this layer, as in PyG)")
    if not x.is_floating_point():
        raise ValueError(f"{layer}(): {name} must be floating point, got {x.dtype}")


def split_features(layer: str, x: Features, pairs: bool = True, dims: Optional[int] = None
                   ) -> Tuple[Tensor, Optional[Tensor], bool]:
    """``(x_src, x_dst, is_pair)`` of a tensor ``x`` (``x_dst is x_src``) or a pair ``(x_src, x_dst)``.

    Args:
        pairs: whether the layer takes bipartite pairs (GCNConv and AGNNConv do not, as in PyG).
        dims: the exact number of dimensions the features must have (``None``: at least 2).

    Raises:
        ValueError: a pair for a layer without bipartite message passing, or bad features.
    """
    if isinstance(x, (tuple, list)):
        if not pairs:
            raise ValueError(f"{layer}(): x is a tuple of (source, target) node features, but this layer does not "
                             "support bipartite message passing (neither does PyG's); use SAGEConv, GINConv or "
                             "GATConv for bipartite graphs")
        if len(x) != 2:
            raise ValueError(f"{layer}(): a bipartite x must be a pair (x_src, x_dst), got {len(x)} entries")
        x_src, x_dst = x
        _check_features(layer, "x[0] (source features)", x_src, dims)
        if x_dst is not None:
            _check_features(layer, "x[1] (target features)", x_dst, dims)
        return x_src, x_dst, True
    _check_features(layer, "x", x, dims)
    return x, x, False


def node_counts(layer: str, graph: GraphArg, x_src: Tensor, x_dst: Optional[Tensor],
                size: Optional[Tuple[Optional[int], Optional[int]]], node_dim: int,
                square: bool = False) -> Tuple[int, int]:
    """``(num_src, num_dst)`` from the features, PyG's ``size=(N_src, N_dst)`` and the graph argument.

    Without target features the targets are ``size[1]``, else the graph's, else the sources (PyG's
    rule).  ``square``: the layer needs ``num_src == num_dst``.

    Raises:
        ValueError: the counts disagree.
    """
    if not -x_src.dim() <= node_dim < x_src.dim():
        raise ValueError(f"{layer}(): node_dim={node_dim} is out of range for features of shape {tuple(x_src.shape)}")
    num_src = int(x_src.size(node_dim))
    num_dst = None if x_dst is None else int(x_dst.size(node_dim))
    if size is not None:
        if not isinstance(size, (tuple, list)) or len(size) != 2:
            raise ValueError(f"{layer}(): size must be a pair (num_src, num_dst), got {size!r}")
        if size[0] is not None and int(size[0]) != num_src:
            raise ValueError(f"{layer}(): size[0]={size[0]} but the source features have {num_src} nodes")
        if size[1] is not None:
            if num_dst is not None and int(size[1]) != num_dst:
                raise ValueError(f"{layer}(): size[1]={size[1]} but the target features have {num_dst} nodes")
            num_dst = int(size[1])
    graph_src, graph_dst = graph_sizes(graph)
    if graph_src is not None and int(graph_src) != num_src:
        raise ValueError(f"{layer}(): the graph has {graph_src} source nodes but the source features have {num_src}")
    if graph_dst is not None:
        if num_dst is not None and int(graph_dst) != num_dst:
            raise ValueError(f"{layer}(): the graph has {graph_dst} target nodes but the target features have "
                             f"{num_dst}")
        num_dst = int(graph_dst)
    if num_dst is None:
        num_dst = num_src
    if square and num_dst != num_src:
        raise ValueError(f"{layer}(): needs a square graph (one node set), got {num_dst} targets and {num_src} "
                         "sources; PyG's layer refuses bipartite graphs too")
    return num_src, num_dst


def _flat(x: Tensor, node_dim: int) -> Tuple[Tensor, Tuple[int, ...], int]:
    """``x`` as ``[N, rest]`` with nodes first, the shape of the rest and the node dimension."""
    dim = node_dim % x.dim()
    if dim == x.dim() - 1:
        raise ValueError(f"propagate(): node_dim={node_dim} points at the feature dimension of x of shape "
                         f"{tuple(x.shape)}; nodes must lie on another dimension")
    if x.dim() == 2 and dim == 0:
        return x, tuple(x.shape[1:]), 0
    moved = x.movedim(dim, 0)
    return moved.reshape(moved.shape[0], -1), tuple(moved.shape[1:]), dim


def propagate(graph: Graph, x: Tensor, reduce: str = "sum", node_dim: int = -2,
              edge_weight: Optional[Tensor] = None, backend: str = "auto", precision: str = "ieee") -> Tensor:
    r"""``out[i] = reduce_{j -> i} w_ji x_j`` over the nodes of ``x``'s ``node_dim``, in one SpMM.

    ``x`` of shape ``[B, N, F]`` (or any shape with nodes on ``node_dim``) is aggregated as one
    ``[N, B * F]`` matrix: a permute and reshape around a single SpMM.  ``reduce="min"`` runs
    :math:`-\max(-w x)`.  ``precision`` as in :func:`sparsegnn.spmm` (sums and means on tensor
    cores with ``"tf32"`` / ``"bf16"``; max and min stay exact).

    Shapes:
        x: [..., M, ..., F] (``M`` = sources on ``node_dim``) -> the same with ``N`` targets.
    """
    flat, rest, dim = _flat(x, node_dim)
    if reduce == "min":
        out = -spmm(graph, -flat, reduce="max", edge_weight=edge_weight, backend=backend)
    else:
        out = spmm(graph, flat, reduce=reduce, edge_weight=edge_weight, backend=backend, precision=precision)
    if x.dim() == 2 and dim == 0:
        return out
    return out.view((graph.num_nodes,) + rest).movedim(0, dim)


def edge_graph(graph: Graph) -> Graph:
    """The graph from ``graph``'s edges to its targets: ``E`` sources, CSR edge ``k`` from source ``k``.

    ``spmm(edge_graph(g), messages)`` sums (means, maxes) per-edge messages ``[E, F]`` (CSR
    order) into their targets: how GINEConv aggregates ``ReLU(x_j + e_ji)`` with the SpMM.
    Cached in ``graph.cache`` (it depends on the structure only).
    """
    return graph.cache.get("edge_source_graph", None, lambda: Graph(
        graph.rowptr, torch.arange(graph.num_edges, device=graph.device), None, graph.num_nodes,
        num_src=graph.num_edges, transient=graph.transient))


def to_graph_order(graph: Graph, values: Tensor, caller_order: bool) -> Tensor:
    """A per-edge tensor in ``graph``'s CSR order: permuted by ``edge_perm`` when it is in the caller's order."""
    return graph.to_graph_order(values) if caller_order and graph.edge_perm is not None else values


#: ``fill_value`` names and the scatter reduction computing them (PyG's ``scatter``).
_FILL_REDUCE = {"add": "sum", "sum": "sum", "mean": "mean", "min": "amin", "max": "amax", "mul": "prod"}


def loop_attributes(layer: str, graph: Graph, edge_attr: Tensor, fill_value: Union[float, Tensor, str]) -> Tensor:
    """``edge_attr`` (caller's order, ``[E, D]``) with PyG's self-loop handling applied: the
    attributes of the edges that are no loop, then one row per added loop (``fill_value``: a
    number, a tensor, or ``"add"``/``"sum"``, ``"mean"``, ``"min"``, ``"max"``, ``"mul"`` of the
    loop node's incoming edges), in PyG's order, then moved into ``graph``'s CSR order.

    ``graph`` is the result of ``pyg_self_looped_*`` (its ``cache`` holds the ``LoopInfo``).
    """
    info: LoopInfo = graph.cache.get(LOOP_INFO)
    if edge_attr.shape[0] != info.keep.shape[0]:
        raise ValueError(f"{layer}(): edge_attr has {edge_attr.shape[0]} rows but the graph has "
                         f"{info.keep.shape[0]} edges")
    kept = edge_attr.index_select(0, info.kept)              # index tensors found once: no host sync
    size = (info.num_loops,) + tuple(kept.shape[1:])
    if isinstance(fill_value, bool) or fill_value is None:
        raise unsupported(layer, "fill_value", fill_value, "use a number, a tensor or 'add', 'sum', 'mean', "
                          "'min', 'max', 'mul'")
    if isinstance(fill_value, (int, float)):
        loops = kept.new_full(size, float(fill_value))
    elif isinstance(fill_value, Tensor):
        fill = fill_value.to(kept.device, kept.dtype)
        if fill.dim() != kept.dim():
            fill = fill.unsqueeze(0)
        loops = fill.expand(size).contiguous()
    elif isinstance(fill_value, str):
        reduce = _FILL_REDUCE.get(fill_value)
        if reduce is None:
            raise unsupported(layer, "fill_value", fill_value, "use 'add', 'sum', 'mean', 'min', 'max', 'mul', a "
                              "number or a tensor")
        target, source = info.into_target, kept.index_select(0, info.into_loops)   # edges into looped nodes
        index = target.view((-1,) + (1,) * (kept.dim() - 1)).expand_as(source)
        if reduce == "mean":
            total = kept.new_zeros(size).scatter_add_(0, index, source)
            count = kept.new_zeros(info.num_loops).scatter_add_(0, target, kept.new_ones(target.shape[0]))
            loops = total / count.clamp(min=1).view((-1,) + (1,) * (kept.dim() - 1))
        elif reduce == "prod":
            loops = kept.new_ones(size).scatter_reduce(0, index, source, "prod", include_self=True)
        else:
            loops = kept.new_zeros(size).scatter_reduce(0, index, source, reduce, include_self=reduce == "sum")
    else:
        raise unsupported(layer, "fill_value", fill_value, "use a number, a tensor or 'add', 'sum', 'mean', 'min', "
                          "'max', 'mul'")
    return graph.to_graph_order(torch.cat([kept, loops], dim=0))


def attention_output(graph_arg: GraphArg, graph: Graph, alpha: Tensor, caller_order: bool, looped: bool) -> Any:
    """PyG's ``(edge_index, alpha)`` (or its sparse form) for ``return_attention_weights=True``.

    Args:
        graph_arg: the layer's graph argument.
        graph: the graph the attention ran on (``pyg_self_looped_*`` when ``looped``).
        alpha: ``[E', H]`` attention in ``graph``'s CSR order.
        caller_order: ``graph.edge_perm`` maps to the caller's (PyG's) edge order.
        looped: self loops were removed and added.

    Returns:
        an ``edge_index`` input: ``(edge_index', alpha)`` in PyG's order (the edges that are no
        loop, then the loops; an ``EdgeIndex`` for an ``EdgeIndex``); a torch sparse ``adj_t``:
        ``(adj_t' with alpha as values, alpha)`` (coalesced order); a ``SparseTensor``: the
        ``SparseTensor`` with alpha as values; a Graph: ``(graph, alpha)`` in its CSR order.
    """
    kind = graph_kind(graph_arg)
    if kind == "graph":
        return graph, alpha
    if kind in ("edge_index", "edge_index_class"):
        alpha_caller = graph.to_input_order(alpha) if caller_order else alpha
        edge_index = graph_arg.as_tensor() if kind == "edge_index_class" else graph_arg
        if looped:
            info: LoopInfo = graph.cache.get(LOOP_INFO)
            loops = torch.arange(info.num_loops, device=edge_index.device, dtype=edge_index.dtype)
            edge_index = torch.cat([edge_index.index_select(1, info.kept), loops.view(1, -1).expand(2, -1)], dim=1)
        if kind == "edge_index_class":
            edge_index = type(graph_arg)(edge_index, sparse_size=graph_arg.sparse_size())
        elif not looped:
            edge_index = graph_arg
        return edge_index, alpha_caller
    # sparse inputs: alpha in row-major (target, source) order = this graph's CSR order (no duplicates)
    row, col = graph.row, graph.col
    shape = (graph.num_nodes, graph.num_src) + tuple(alpha.shape[1:])
    if kind == "sparse_tensor":
        return type(graph_arg)(row=row, col=col, value=alpha, sparse_sizes=(graph.num_nodes, graph.num_src))
    if graph_arg.layout == torch.sparse_csr:
        adj = torch.sparse_csr_tensor(graph.rowptr, col, alpha, shape, device=alpha.device)
    else:
        adj = torch.sparse_coo_tensor(torch.stack([row, col]), alpha, shape, device=alpha.device).coalesce()
    return adj, alpha

