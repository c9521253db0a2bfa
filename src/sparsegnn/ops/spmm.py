"""Sparse-dense matrix product (neighbour aggregation) with autograd.

``spmm(graph, x, reduce)[i] = reduce_{e: j -> i} w_e * x_j``

- ``sum``:  ``sum_e w_e x_j``
- ``mean``: ``(1 / deg_i) sum_e w_e x_j`` with ``deg_i`` the number of stored incoming edges
- ``max``:  feature-wise ``max_e w_e x_j``

Rows without incoming edges give zeros for every reduce.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._checks import check, check_edge_values, check_node_features, check_same_device
from ..graph import Graph, as_graph
from . import reference
from ._dispatch import aggregate, aggregate_transposed, choose_backend, edge_values, mean_scale

REDUCES = ("sum", "mean", "max")


class _SpMMLinear(torch.autograd.Function):
    """``Y = A X`` (sum) or ``Y = D^-1 A X`` (mean) with ``A_ij = w_e``.

    Backward: ``dX = A'^T dY`` on the cached transpose (``A'`` = the effective, scaled weights),
    ``dw_e = s_i <dY_i, X_j>`` with ``s_i = 1`` (sum) or ``1 / deg_i`` (mean).
    """

    @staticmethod
    def forward(ctx, graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, backend: str) -> Tensor:
        ctx.graph, ctx.reduce, ctx.backend = graph, reduce, backend
        ctx.save_for_backward(x, weight)
        return aggregate(backend, graph, x, weight, reduce)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        x, weight = ctx.saved_tensors
        graph = ctx.graph
        grad_x = grad_w = None
        grad_out = grad_out.contiguous()
        scale = mean_scale(graph, x.dtype) if ctx.reduce == "mean" else None
        if ctx.needs_input_grad[1]:
            effective = weight if scale is None else (scale if weight is None else weight * scale)
            grad_x = aggregate_transposed(ctx.backend, graph, grad_out, effective)
        if weight is not None and ctx.needs_input_grad[2]:
            if weight.dim() == 2:  # multi-head: per-head dot products of [E, F] products
                prod = edge_values(ctx.backend, graph, grad_out, x.to(grad_out.dtype), "mul")
                grad_w = prod.view(prod.shape[0], weight.shape[1], -1).sum(-1).to(weight.dtype)
            else:
                grad_w = edge_values(ctx.backend, graph, grad_out, x.to(grad_out.dtype), "dot").to(weight.dtype)
            if scale is not None:
                grad_w = grad_w * (scale.to(grad_w.dtype) if grad_w.dim() == 1 else scale.to(grad_w.dtype)[:, None])
        return None, grad_x, grad_w, None, None


class _SpMMMax(torch.autograd.Function):
    """Feature-wise max; the gradient flows to the first edge attaining each maximum."""

    @staticmethod
    def forward(ctx, graph: Graph, x: Tensor, weight: Optional[Tensor], backend: str) -> Tensor:
        out = aggregate(backend, graph, x, weight, reduce="max")
        ctx.graph = graph
        ctx.save_for_backward(x, weight, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        x, weight, out = ctx.saved_tensors
        graph = ctx.graph
        num_edges = graph.num_edges
        if num_edges == 0:
            return None, torch.zeros_like(x), (torch.zeros_like(weight) if weight is not None else None), None
        arg = reference.spmm_max_arg(graph.row, graph.col, x, weight, out)
        valid = arg < num_edges
        edge = arg.clamp(max=num_edges - 1)
        grad = grad_out.masked_fill(~valid, 0.0)
        grad_x = grad_w = None
        src = graph.col[edge]
        if ctx.needs_input_grad[1]:
            scaled = grad * weight[edge].to(grad.dtype) if weight is not None else grad
            grad_x = torch.zeros_like(x).scatter_add_(0, src, scaled.to(x.dtype))
        if weight is not None and ctx.needs_input_grad[2]:
            contrib = (grad * x.gather(0, src)).to(weight.dtype)
            grad_w = torch.zeros_like(weight).index_add_(0, edge[valid], contrib[valid])
        return None, grad_x, grad_w, None


def spmm(
    graph,
    x: Tensor,
    reduce: str = "sum",
    edge_weight: Optional[Tensor] = None,
    backend: str = "auto",
) -> Tensor:
    """Aggregate neighbour features: ``out[i] = reduce_{j -> i} w_ji * x[j]``.

    Args:
        graph: a :class:`Graph`, a PyG ``edge_index`` ([2, E], row 0 = source) or a square
            torch sparse tensor (``A[i, j]`` = weight of ``j -> i``).
        x: node features.
        reduce: ``"sum"``, ``"mean"`` or ``"max"``.
        edge_weight: per-edge weights overriding the graph's ``edge_val`` (Graph order for a
            Graph, the caller's order for an ``edge_index``). Differentiable.  ``[E, H]`` with
            ``x`` of shape ``[N, H, C]`` (or ``[N, H * C]``) weights each head separately, all
            heads in one kernel launch (GAT).
        backend: ``"auto"`` (Triton on CUDA, reference elsewhere), ``"reference"``, ``"triton"``.

    Returns:
        Aggregated features of ``x``'s dtype (fp32 accumulation for half types).

    Shapes:
        x: [N, F]; edge_weight: [E] -> [N, F].  Multi-head: x [N, H, C]; edge_weight [E, H] -> [N, H, C].

    Example:
        >>> ei = torch.tensor([[0, 1], [2, 2]])             # 0->2, 1->2
        >>> spmm(ei, torch.tensor([[1.0], [2.0], [5.0]])).tolist()
        [[0.0], [0.0], [3.0]]
    """
    fn = "spmm"
    if isinstance(x, Tensor) and x.dim() == 3:  # multi-head: x [N, H, C] with edge_weight [E, H]
        check(edge_weight is not None and edge_weight.dim() == 2 and edge_weight.shape[1] == x.shape[1], fn,
              f"x of shape [N, H, C] needs edge_weight of shape [E, H={x.shape[1]}], got "
              f"{None if edge_weight is None else tuple(edge_weight.shape)}")
        check(reduce == "sum", fn, "multi-head aggregation supports reduce='sum'")
        heads, channels = x.shape[1], x.shape[2]
        out = spmm(graph, x.reshape(x.shape[0], heads * channels), reduce, edge_weight, backend)
        return out.view(-1, heads, channels)
    if isinstance(graph, Graph):
        input_order = False
    else:
        check(isinstance(x, Tensor) and x.dim() == 2, fn,
              f"x must be a 2-D tensor [num_nodes, features], got {getattr(x, 'shape', type(x).__name__)}")
        graph, input_order = as_graph(graph, fn, num_nodes=x.shape[0])
    check_node_features(x, graph.num_nodes, fn)
    if reduce not in REDUCES:
        raise ValueError(f"{fn}(): reduce must be one of {REDUCES}, got {reduce!r}")
    if edge_weight is not None:
        check_edge_values(edge_weight, graph.num_edges, fn, "edge_weight", max_dim=2)
        if edge_weight.dim() == 2 and x.shape[1] % edge_weight.shape[1] != 0:
            raise ValueError(f"{fn}(): edge_weight [E, H] needs a feature width divisible by H, "
                             f"got F={x.shape[1]}, H={edge_weight.shape[1]}")
        if input_order:
            edge_weight = graph.to_graph_order(edge_weight)
    else:
        edge_weight = graph.edge_val
    check_same_device(fn, graph=graph.rowptr, x=x, edge_weight=edge_weight)
    chosen = choose_backend(fn, backend, x)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or (edge_weight is not None and edge_weight.requires_grad))
    if not needs_grad:  # no autograd node: less overhead per call (inference, small graphs)
        return aggregate(chosen, graph, x, edge_weight, reduce)
    if reduce == "max":
        return _SpMMMax.apply(graph, x, edge_weight, chosen)
    return _SpMMLinear.apply(graph, x, edge_weight, reduce, chosen)
