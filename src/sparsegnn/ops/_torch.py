"""The ``"reference"`` backend: graph-level computations in plain PyTorch (``reference.py``'s
scatter formulations), for any device and dtype; also the fallback of the other backends for
the cases their kernels do not cover (per-feature weights, arg-max gradients)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..graph import Graph
from . import reference
from ._common import mean_scale, scaled, sum_heads, via_transpose


def aggregate(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str = "sum", owned: bool = False) -> Tensor:
    """``out[i] = reduce_{e in row i} w_e x[col[e]]`` by scatter (see ``_dispatch.aggregate``).

    Shapes:
        x: [M, F]; weight: [E], [E, H] or None -> [N, F].
    """
    if weight is not None and weight.dim() == 2 and weight.shape[1] != x.shape[1]:
        weight = weight.repeat_interleave(x.shape[1] // weight.shape[1], dim=1)
    if reduce == "max":
        return reference.spmm_max(graph.row, graph.col, graph.num_nodes, x, weight)
    if reduce == "mean":
        weight = scaled(weight, mean_scale(graph, x.dtype))
    return reference.spmm_sum(graph.row, graph.col, graph.num_nodes, x, weight)


def aggregate_transposed(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str = "sum") -> Tensor:
    """``A'^T x`` (see ``_dispatch.aggregate_transposed``) on the cached transpose."""
    return via_transpose(aggregate, graph, x, weight, reduce)


def edge_values(graph: Graph, a: Tensor, b: Tensor, op: str) -> Tensor:
    """Per-edge ``op(a[row[e]], b[col[e]])`` (``dot`` -> [E], else [E, F])."""
    return reference.sddmm(graph.row, graph.col, a, b, op)


def head_dots(graph: Graph, grad_out: Tensor, x: Tensor, heads: int) -> Tensor:
    """Per-edge, per-head ``<dY_i, X_j>`` over each head's ``F / H`` features: [E, H]."""
    return sum_heads(edge_values(graph, grad_out, x, "mul"), heads)


def edge_sum(graph: Graph, values: Tensor, by_source: bool = False) -> Tensor:
    """``out[i] = sum_{e: row[e] = i} v_e`` (by target), or over ``col[e] = i`` (``by_source``)."""
    if by_source:
        return reference.segment_sum(graph.col, values, graph.num_src)
    return reference.segment_sum(graph.row, values, graph.num_nodes)


def softmax(graph: Graph, scores: Tensor) -> Tensor:
    """Edge softmax of ``scores`` ([E] or [E, H]) over each target's edges."""
    return reference.edge_softmax(graph.row, graph.num_nodes, scores)


def softmax_grad(graph: Graph, out: Tensor, grad_out: Tensor) -> Tensor:
    """``ds_e = y_e (g_e - sum_{e' -> i} g_e' y_e')`` for the softmax output ``y = out``."""
    weighted = grad_out * out
    row_sum = reference.segment_sum(graph.row, weighted, graph.num_nodes)
    return weighted - out * row_sum.index_select(0, graph.row)


def max_backward(graph: Graph, grad_out: Tensor, x: Tensor, weight: Optional[Tensor], out: Tensor,
                 arg: Optional[Tensor], need_weight: bool):
    """Gradients of the max aggregation through its arg-max edges (found here unless given), with
    masks instead of boolean indexing: no data-dependent shapes, no host sync.

    Shapes:
        grad_out, x, out: [N, F]; weight: [E] or None -> (grad_x [N, F], grad_w [E] or None).
    """
    num_edges = graph.num_edges
    if arg is None:
        arg = reference.spmm_max_arg(graph.row, graph.col, x, weight, out)
    valid = arg < num_edges
    edge = arg.clamp(max=num_edges - 1)
    zero = grad_out.new_zeros(())
    grad = torch.where(valid, grad_out, zero)
    src = graph.col[edge]
    if weight is not None:
        grad_x_src = torch.where(valid, grad * weight[edge].to(grad.dtype), zero)
    else:
        grad_x_src = grad
    grad_x = x.new_zeros(x.shape).scatter_add_(0, src, grad_x_src.to(x.dtype))
    grad_w = None
    if weight is not None and need_weight:
        contrib = torch.where(valid, grad * x.gather(0, src).to(grad.dtype), zero).to(weight.dtype)
        grad_w = weight.new_zeros(weight.shape).index_add_(0, edge.flatten(), contrib.flatten())
    return grad_x, grad_w
