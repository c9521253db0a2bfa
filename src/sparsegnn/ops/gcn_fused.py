"""``batched_gcn``: a whole GCN layer ``act(A X W + b)`` on a batch of small graphs in one launch.

On a block-diagonal batch (``Graph.ptr``, every edge inside its graph, at most
``BATCHED_MAX_NODES`` nodes per graph) with the Triton backend, the forward is one kernel
(``kernels/gcn_batched.py``: aggregate each graph's rows, multiply by ``W`` in registers, add
the bias, relu) instead of a matmul, an SpMM and a bias add (and a relu).  The backward:

- ``dY`` masked by ``out > 0`` for relu (one ``where``);
- ``db = sum_i dY_i``; ``dW = H^T dY`` with ``H = A X`` stored by the forward (only when ``W``
  needs a gradient);
- ``dX = A^T (dY W^T) = (A^T dY) W^T``, the product on the narrower side first, the transposed
  aggregation by the batched SpMM (``_dispatch.aggregate_transposed``).  (Running the fused
  kernel itself on the transposed batch, one launch, measured slower on the H100: 77.6 vs
  61.7 us for forward + backward of 200 molecules at 48 -> 64, because the kernel gathers the
  edges once per 16-wide input block; ``docs/design/gcn_fused.md``.);
- edge values, when they need a gradient: ``dw_e = <dY_i, (X W)_j>`` for ``e: j -> i`` (or
  ``<(dY W^T)_i, X_j>`` when ``F_in`` is the narrower side).

The kernel reads the graph on every call (``rowptr``, ``col``, ``edge_val``, ``ptr``,
``batch_stats()``); the backward's transposed aggregation uses the graph's cached transpose
like every SpMM backward (a batch refilled in place between calls, the ``volatile`` Graph of a
captured step, keeps no derived form of an old batch); no call syncs the host once
``batch_stats()`` is known.  Elsewhere (CPU backends,
graphs that are no such batch) the layer is composed of ``spmm``, a matmul and the bias.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._checks import check, check_node_features, check_same_device, check_tensor
from ..graph import Graph
from ..kernels import interpreting, triton_available
from ._dispatch import TRITON_DTYPES, aggregate_transposed, choose_backend
from ._triton import BATCHED_MAX_NODES, BATCHED_MAX_TOTAL_NODES
from .spmm import spmm

__all__ = ["batched_gcn", "fused_batched_gcn", "fused_gcn_applies", "ACTIVATIONS", "FUSED_MAX_WIDTH"]

#: ``activation=`` of :func:`batched_gcn`.
ACTIVATIONS = (None, "relu")
#: ``GCNConv`` takes the fused kernel while both widths are at most this.  H100
#: (``docs/design/gcn_fused.md``, 200 molecules): 48 -> 64 forward 8.7 vs 14.0 us unfused,
#: 512 -> 512 363.5 vs 136.0 us (the kernel's fp32 FMA dot against cuBLAS).
FUSED_MAX_WIDTH = 128


def _triton_resolved(backend: str, x: Tensor) -> bool:
    """Whether ``backend`` resolves to Triton for ``x`` (as ``choose_backend`` would, without raising)."""
    if not triton_available() or x.dtype not in TRITON_DTYPES:
        return False
    if backend == "auto":
        return x.is_cuda
    return backend == "triton" and (x.is_cuda or interpreting())


def _batch_fits(graph: Graph) -> bool:
    """A block-diagonal batch of at most ``BATCHED_MAX_TOTAL_NODES`` nodes of graphs of at most
    ``BATCHED_MAX_NODES`` nodes (``batch_stats``: one host sync the first time, unless the loader
    filled it)."""
    if graph.ptr is None or graph.is_bipartite or (graph.edge_val is not None and graph.edge_val.dim() != 1):
        return False
    if graph.num_nodes > BATCHED_MAX_TOTAL_NODES:    # large batches: the CSR kernels (see _triton)
        return False
    stats = graph.batch_stats()
    return bool(stats[2]) and stats[0] <= BATCHED_MAX_NODES


def fused_gcn_applies(graph: Graph, x: Tensor, backend: str = "auto") -> bool:
    """Whether :func:`batched_gcn` runs the fused kernel for ``x`` on ``graph`` with ``backend``:
    a 2-D ``x`` on the Triton backend (CUDA, or ``TRITON_INTERPRET=1`` with ``backend="triton"``),
    ``graph`` a batch of small graphs, not under ``torch.compile`` (the kernel is no custom op)."""
    return (isinstance(graph, Graph) and isinstance(x, Tensor) and x.dim() == 2 and _triton_resolved(backend, x)
            and graph.rowptr.device == x.device and graph.ptr is not None and graph.ptr.device == x.device
            and not torch.compiler.is_compiling() and _batch_fits(graph))


def _kernels():
    from ..kernels import gcn_batched

    return gcn_batched


class _BatchedGCN(torch.autograd.Function):
    """``act(A X W + b)`` by the fused kernel; see the module doc for the backward."""

    @staticmethod
    def forward(ctx, x: Tensor, edge_val: Optional[Tensor], weight: Tensor, bias: Optional[Tensor], graph: Graph,
                activation: Optional[str], config: Dict[str, int], max_nodes: int) -> Tensor:
        need_x, need_val, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        out, h = _kernels().gcn_batched(graph.ptr, graph.rowptr, graph.col, edge_val, x, weight, bias, config,
                                        activation, store_h=need_w and weight.shape[1] > 0)
        ctx.graph, ctx.activation, ctx.max_nodes, ctx.pack = graph, activation, max_nodes, config.get("PACK", 0)
        ctx.f_in = weight.shape[0]
        ctx.save_for_backward(x if need_val else None, edge_val if (need_x or need_val) else None,
                              weight if (need_x or need_val) else None, h,
                              out if activation == "relu" else None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        x, edge_val, weight, h, out = ctx.saved_tensors
        need_x, need_val, need_w, need_b = ctx.needs_input_grad[:4]
        graph = ctx.graph
        grad = grad_out.contiguous()
        if ctx.activation == "relu":
            grad = torch.where(out > 0, grad, grad.new_zeros(()))
        grad_x = grad_val = grad_w = grad_b = None
        if need_b:
            grad_b = grad.sum(0)
        if need_w:
            grad_w = h.t() @ grad if h is not None else grad.new_zeros((ctx.f_in, 0))    # F_out = 0: no H
        if need_x:
            w = weight.detach()
            values = None if edge_val is None else edge_val.detach()
            if w.shape[0] < w.shape[1]:      # A^T (dY W^T): aggregate the narrower F_in columns
                grad_x = aggregate_transposed("triton", graph, grad @ w.t(), values)
            else:                            # (A^T dY) W^T
                grad_x = aggregate_transposed("triton", graph, grad, values) @ w.t()
        if need_val:
            w = weight.detach()
            row, col = graph.row, graph.col
            if w.shape[1] <= w.shape[0]:     # <dY_i, (X W)_j>
                left, right = grad, x.detach() @ w
            else:                            # <(dY W^T)_i, X_j>
                left, right = grad @ w.t(), x.detach()
            grad_val = (left.index_select(0, row).float() * right.index_select(0, col).float()).sum(1)
            grad_val = grad_val.to(edge_val.dtype)
        return grad_x, grad_val, grad_w, grad_b, None, None, None, None


def _composed(x: Tensor, graph: Graph, weight: Tensor, bias: Optional[Tensor], activation: Optional[str],
              backend: str) -> Tensor:
    """The layer from ``spmm``, a matmul and the bias: aggregation on the narrower side."""
    if weight.shape[1] < weight.shape[0]:
        out = spmm(graph, x @ weight, backend=backend)
    else:
        out = spmm(graph, x, backend=backend) @ weight
    if bias is not None:
        out = out + bias
    return torch.relu(out) if activation == "relu" else out


def batched_gcn(x: Tensor, graph: Graph, weight: Tensor, bias: Optional[Tensor] = None,
                activation: Optional[str] = None, *, backend: str = "auto",
                config: Optional[Dict[str, int]] = None) -> Tensor:
    r"""One GCN layer on a batch of graphs: :math:`\mathrm{act}(A X W + b)`, ``A`` the batch's
    adjacency (``A[i, j]`` = the summed values of the edges ``j -> i``; ones without ``edge_val``).

    On a block-diagonal batch (``graph.ptr``, every edge inside its graph, at most
    ``BATCHED_MAX_NODES`` = 128 nodes per graph) with the Triton backend this is one kernel
    launch forward and one (plus a ``where`` for relu, a sum for the bias and a matmul for
    ``W``) backward; see the module doc.  Otherwise it is ``spmm`` and a matmul with
    ``backend``.  Differentiable in ``x``, ``weight``, ``bias`` and the graph's ``edge_val``.

    Args:
        x: node features.
        graph: a :class:`~sparsegnn.Graph` (square).
        weight: ``W`` of shape ``[F_in, F_out]`` (a ``Linear``'s ``weight.t()``: no copy needed).
        bias: ``b`` of shape ``[F_out]`` or None.
        activation: None or ``"relu"``.
        backend: ``"auto"``, ``"triton"``, ``"cpu"`` or ``"reference"`` (as :func:`sparsegnn.spmm`).
        config: kernel blocks (``kernels.gcn_batched.gcn_config``), for benchmarks; default chosen
            from the batch's largest graph and the widths.

    Returns:
        ``[N, F_out]`` of ``x``'s dtype (fp32 accumulation; fp32 inputs in exact fp32 arithmetic).

    Shapes:
        x: [N, F_in]; weight: [F_in, F_out]; bias: [F_out] -> [N, F_out].
    """
    fn = "batched_gcn"
    check(isinstance(graph, Graph), fn, f"graph must be a sparsegnn.Graph, got {type(graph).__name__}")
    check(not graph.is_bipartite, fn, "needs a square graph (a batch of graphs)")
    check_node_features(x, graph.num_nodes, fn)
    check_tensor(weight, fn, "weight")
    check(weight.dim() == 2 and weight.shape[0] == x.shape[1], fn,
          f"weight must have shape [F_in={x.shape[1]}, F_out], got {tuple(weight.shape)}")
    check(weight.dtype == x.dtype, fn, f"weight must have x's dtype {x.dtype}, got {weight.dtype}")
    if bias is not None:
        check_tensor(bias, fn, "bias")
        check(bias.shape == (weight.shape[1],), fn,
              f"bias must have shape [F_out={weight.shape[1]}], got {tuple(bias.shape)}")
        check(bias.dtype == x.dtype, fn, f"bias must have x's dtype {x.dtype}, got {bias.dtype}")
    check(activation in ACTIVATIONS, fn, f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_same_device(fn, graph=graph.rowptr, x=x, weight=weight, bias=bias, edge_val=graph.edge_val)
    chosen = choose_backend(fn, backend, x)
    if chosen != "triton" or not fused_gcn_applies(graph, x, "triton"):
        return _composed(x, graph, weight, bias, activation, chosen)
    return fused_batched_gcn(x, graph, weight, bias, activation, config)


def fused_batched_gcn(x: Tensor, graph: Graph, weight: Tensor, bias: Optional[Tensor] = None,
                      activation: Optional[str] = None, config: Optional[Dict[str, int]] = None) -> Tensor:
    """:func:`batched_gcn`'s fused kernel without its checks: for callers that checked the
    arguments and :func:`fused_gcn_applies` (``nn.GCNConv``: less host time per layer)."""
    max_nodes = graph.batch_stats()[0]
    cfg = config if config is not None else _kernels().gcn_config(max_nodes, weight.shape[0], weight.shape[1])
    edge_val = graph.edge_val
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
                                    or (edge_val is not None and edge_val.requires_grad)):
        return _BatchedGCN.apply(x, edge_val, weight, bias, graph, activation, cfg, max_nodes)
    return _kernels().gcn_batched(graph.ptr, graph.rowptr, graph.col, edge_val, x, weight, bias, cfg, activation)[0]
