"""Edge softmax: normalise per-edge scores over each target node's incoming edges.

``y_e = exp(s_e) / sum_{e' -> i} exp(s_e')`` for ``e: j -> i`` (computed with the row
maximum subtracted).  Backward: ``ds_e = y_e (g_e - sum_{e' -> i} g_e' y_e')``.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._checks import check_edge_values, check_same_device
from ..graph import Graph, as_graph
from ._dispatch import BACKENDS, choose_backend, softmax_grad, softmax_values
from ._library import compiling, not_traceable_graph


class _EdgeSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: Graph, scores: Tensor, backend: str) -> Tensor:
        out = softmax_values(backend, graph, scores)
        ctx.graph, ctx.backend = graph, backend
        ctx.save_for_backward(out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        (out,) = ctx.saved_tensors
        return None, softmax_grad(ctx.backend, ctx.graph, out, grad_out), None


def edge_softmax(graph, scores: Tensor, num_nodes: int | None = None, backend: str = "auto") -> Tensor:
    """Softmax of per-edge ``scores`` over the incoming edges of each target node.

    Args:
        graph: a :class:`Graph`, an ``edge_index`` [2, E] or a square torch sparse tensor.
        scores: per-edge scores (one per head with ``[E, H]``), in the Graph's edge order
            (the caller's order for an ``edge_index``).
        num_nodes: node count when ``graph`` is an ``edge_index`` (default: max index + 1).
        backend: ``"auto"`` (Triton on CUDA), ``"reference"`` or ``"triton"``.

    Returns:
        Tensor shaped like ``scores``; entries of each target's incoming edges sum to 1.

    Shapes:
        scores: [E] or [E, H] -> same.

    Example:
        >>> ei = torch.tensor([[0, 1], [2, 2]])
        >>> edge_softmax(ei, torch.tensor([0.0, 0.0])).tolist()
        [0.5, 0.5]
    """
    fn = "edge_softmax"
    if not isinstance(graph, Graph) and compiling():
        raise not_traceable_graph(fn, graph)
    graph, input_order = as_graph(graph, fn, num_nodes=num_nodes, per_edge=True)
    check_edge_values(scores, graph.num_edges, fn, "scores", max_dim=2)
    if compiling():  # the custom op: graph tensors stay out of the traced program (devices checked there)
        if backend not in BACKENDS:
            raise ValueError(f"{fn}(): backend must be one of {BACKENDS}, got {backend!r}")
        return torch.ops.sparsegnn.edge_softmax(scores, graph.key, backend)
    check_same_device(fn, graph=graph.rowptr, scores=scores)
    if input_order:
        scores = graph.to_graph_order(scores)
    chosen = choose_backend(fn, backend, scores)
    out = _EdgeSoftmax.apply(graph, scores, chosen)
    return graph.to_input_order(out) if input_order else out
