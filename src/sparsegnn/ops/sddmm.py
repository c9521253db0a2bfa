"""Sampled dense-dense products: one value per edge from its two endpoint features.

For edge ``e: j -> i`` (``i`` = target, ``j`` = source):

- ``dot``: ``out[e] = <a_i, b_j>``            (attention scores, AGNN's cosine)
- ``add``: ``out[e] = a_i + b_j``             (GAT's ``alpha_dst[i] + alpha_src[j]``)
- ``mul``: ``out[e] = a_i * b_j`` (elementwise)

Gradients: for ``dot``, ``da = A_g b`` and ``db = A_g^T a`` where ``A_g`` has the upstream
gradient as edge values, computed by the SpMM on the graph and its cached transpose.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._checks import check, check_node_features, check_precision, check_same_device, check_tensor
from ..graph import Graph, as_graph
from ._dispatch import BACKENDS, aggregate, aggregate_transposed, choose_backend, edge_sum, edge_values
from ._library import compiling, not_traceable_graph

OPS = ("dot", "add", "mul")


class _SDDMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: Graph, a: Tensor, b: Tensor, op: str, backend: str) -> Tensor:
        ctx.graph, ctx.op, ctx.backend = graph, op, backend
        ctx.save_for_backward(a, b)
        return edge_values(backend, graph, a, b, op)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        a, b = ctx.saved_tensors
        graph, op, backend = ctx.graph, ctx.op, ctx.backend
        grad_a = grad_b = None
        if op == "add":
            if ctx.needs_input_grad[1]:
                grad_a = edge_sum(graph, grad_out, by_source=False, backend=backend)
            if ctx.needs_input_grad[2]:
                grad_b = edge_sum(graph, grad_out, by_source=True, backend=backend)
        else:
            # dot: edge weight g_e; mul: per-feature edge weight g_ef.  Same algebra either way.
            if ctx.needs_input_grad[1]:
                grad_a = aggregate(backend, graph, b, grad_out)
            if ctx.needs_input_grad[2]:
                grad_b = aggregate_transposed(backend, graph, a, grad_out)
        return None, grad_a, grad_b, None, None


def sddmm(graph, a: Tensor, b: Tensor, op: str = "dot", backend: str = "auto", precision: str = "ieee") -> Tensor:
    """Per-edge values from target features ``a`` and source features ``b``.

    Args:
        graph: a :class:`Graph`, an ``edge_index`` [2, E] or a square torch sparse tensor.
        a: target-side node features (``a[i]`` for edge ``j -> i``).
        b: source-side node features (``b[j]``).
        op: ``"dot"``, ``"add"`` or ``"mul"``.
        backend: ``"auto"`` (Triton on CUDA), ``"reference"`` or ``"triton"``.
        precision: ``"ieee"`` (default, exact), ``"tf32"`` or ``"bf16"`` (run as tf32): a
            ``"dot"`` on the Triton backend may then run on tensor cores over the graph's tiles
            where the tuner finds that faster (``ops.tiles.sddmm_precise``; gradients by
            ``spmm`` at the same precision).  Elsewhere, and under ``torch.compile``, exact.

    Returns:
        ``[E]`` for ``dot``, ``[E, F]`` otherwise, in the Graph's edge order (the caller's
        order for an ``edge_index``).

    Shapes:
        a: [N, F]; b: [M, F] -> [E] or [E, F] (a bipartite graph's ``M`` sources, else ``M = N``).

    Example:
        >>> ei = torch.tensor([[0], [1]])                  # one edge 0 -> 1
        >>> x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> sddmm(ei, x, x).tolist()                       # <x_1, x_0>
        [11.0]
    """
    fn = "sddmm"
    check_tensor(a, fn, "a")
    check_tensor(b, fn, "b")
    if isinstance(graph, Graph):
        input_order = False
    else:
        if compiling():
            raise not_traceable_graph(fn, graph)
        check(a.dim() == 2, fn, f"a must be 2-D [num_nodes, features], got shape {tuple(a.shape)}")
        graph, input_order = as_graph(graph, fn, num_nodes=a.shape[0], per_edge=True)
    check_node_features(a, graph.num_nodes, fn, "a")
    check_node_features(b, graph.num_src, fn, "b", sources=graph.is_bipartite)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"{fn}(): a and b must have the same feature width, got {a.shape[1]} and {b.shape[1]}")
    if a.dtype != b.dtype:
        raise ValueError(f"{fn}(): a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if op not in OPS:
        raise ValueError(f"{fn}(): op must be one of {OPS}, got {op!r}")
    check_precision(fn, precision)
    if compiling():  # the custom op: graph tensors stay out of the traced program (devices checked there)
        if backend not in BACKENDS:
            raise ValueError(f"{fn}(): backend must be one of {BACKENDS}, got {backend!r}")
        return torch.ops.sparsegnn.sddmm(a, b, graph.key, op, backend)
    check_same_device(fn, graph=graph.rowptr, a=a, b=b)
    chosen = choose_backend(fn, backend, a)
    if precision != "ieee" and op == "dot" and chosen == "triton":
        from .tiles import sddmm_precise

        out = sddmm_precise(graph, a, b, precision)
    elif torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        out = _SDDMM.apply(graph, a, b, op, chosen)
    else:  # no autograd node (and its host cost) when nothing needs a gradient
        out = edge_values(chosen, graph, a, b, op)
    return graph.to_input_order(out) if input_order else out
