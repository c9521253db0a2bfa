"""Aggregation of CBSR features (MaxK-GNN's forward SpGEMM and backward SSpMM).

``Y = A' X`` with ``X`` given as a :class:`~sparsegnn.formats.cbsr.CBSR` (``k`` entries per
row), ``A' = A`` (sum) or ``D^-1 A`` (mean), weights ``w``:

- forward (SpGEMM): ``Y[i, f] = sum_{e: j -> i} w_e X[j, f]``, where ``X[j, f]`` is nonzero
  only at ``f`` in ``index[j]``: dense ``[N, F]`` output;
- backward (SSpMM): ``dvalues[j, s] = (A'^T dY)[j, index[j, s]]``, the transposed product
  sampled at the kept positions only; ``dw_e = s_i <dY_i, X_j>`` (``s_i = 1`` or ``1/deg_i``).

Backends: ``"triton"`` runs the CBSR kernels: the forward in shared memory through CUDA
(``kernels/cbsr_cuda.py``, CuPy; fp32 values, F <= 256; deterministic) where it can, else
Triton's atomic form (``kernels/cbsr.py``: the order of additions into one entry is not
fixed); the backward gathers only the ``k`` sampled entries of each ``dY`` row (Triton,
deterministic).  Elsewhere both go through the dense product on
the chosen backend (exact; no bytes saved).  ``dw`` densifies ``X`` (only when the weights
need a gradient).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..formats.cbsr import CBSR
from ..graph import Graph
from ._dispatch import (aggregate, aggregate_transposed, mean_scale, plan_of, scaled, spmm_weight_grad,
                        transposed_weights)


class _CBSRSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: Graph, values: Tensor, index: Tensor, num_cols: int, weight: Optional[Tensor],
                reduce: str, backend: str) -> Tensor:
        ctx.graph, ctx.reduce, ctx.backend = graph, reduce, backend
        ctx.save_for_backward(values, index, weight)
        ctx.num_cols = num_cols
        if backend == "triton":
            from ..kernels import cbsr_cuda
            from ..kernels.cbsr import spgemm_cbsr

            plan = plan_of(graph)
            w = scaled(weight, mean_scale(graph, torch.float32)) if reduce == "mean" else weight
            if cbsr_cuda.available() and values.dtype == torch.float32 and index.dtype == torch.uint8:
                w = None if w is None else w.float()
                return cbsr_cuda.spgemm_cbsr_cuda(graph.rowptr, plan.rows_by_degree, plan.col32, w, values, index,
                                                  graph.num_nodes, num_cols)
            return spgemm_cbsr(plan.row32, plan.col32, w, values, index, graph.num_nodes, num_cols).to(values.dtype)
        return aggregate(backend, graph, CBSR(values, index, num_cols).to_dense(), weight, reduce)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        values, index, weight = ctx.saved_tensors
        graph, reduce, backend = ctx.graph, ctx.reduce, ctx.backend
        grad_out = grad_out.contiguous()
        grad_values = grad_weight = None
        if ctx.needs_input_grad[1] and backend == "triton":
            from ..kernels.cbsr import sspmm_cbsr

            transposed, weight_t = transposed_weights(graph, weight, reduce, torch.float32)
            grad_values = sspmm_cbsr(transposed.rowptr, transposed.col, weight_t, index, grad_out, values.dtype)
        elif ctx.needs_input_grad[1]:
            grad_values = aggregate_transposed(backend, graph, grad_out, weight, reduce).gather(1, index.long())
        if weight is not None and ctx.needs_input_grad[4]:
            x = CBSR(values, index, ctx.num_cols).to_dense()
            grad_weight = spmm_weight_grad(backend, graph, grad_out, x.to(grad_out.dtype), 0, reduce).to(weight.dtype)
        return None, grad_values, None, None, grad_weight, None, None


def spmm_cbsr(graph: Graph, x: CBSR, weight: Optional[Tensor], reduce: str, backend: str) -> Tensor:
    """``A' x`` for CBSR features (module doc); differentiable in ``x.values`` and ``weight``.

    Shapes:
        x: CBSR of [M, F] (k per row); weight: [E] or None -> [N, F].
    """
    return _CBSRSpMM.apply(graph, x.values, x.index, x.num_cols, weight, reduce, backend)
