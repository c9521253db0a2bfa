"""``global_pool``: one vector per graph of a batch (sum, mean or max over its nodes).

A batch of graphs is a block-diagonal :class:`~sparsegnn.Graph` whose ``ptr`` gives each graph's
node range; pooling reduces the rows ``ptr[b]:ptr[b+1]`` of the node features to row ``b``.

Backends: ``"triton"`` (``kernels/pool.py``: one program per graph and feature block, fp32
accumulation, deterministic, no host sync in forward or backward: CUDA-graph capturable) and
``"reference"`` (``torch.segment_reduce``).  ``"auto"`` takes Triton for CUDA float32 / float16 /
bfloat16 inputs (``_dispatch.choose_backend``), the reference otherwise; under ``torch.compile``
``"auto"`` takes the reference (traceable), an explicit ``"triton"`` runs its kernels outside the
compiled graph (a graph break).

Max ties: the Triton backward gives ``dy[b, f]`` to the *first* row of the graph attaining the
maximum (the first NaN row if the column has a NaN); the reference (``segment_reduce``'s
backward) splits it evenly among the tied rows.  Both sum to ``dy[b, f]`` over the graph.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._checks import check, check_float, check_same_device, check_tensor
from ._dispatch import choose_backend
from ._library import compiling

__all__ = ["global_pool", "POOL_REDUCES"]

#: ``reduce=`` of :func:`global_pool`.
POOL_REDUCES = ("sum", "mean", "max")
_BACKENDS = ("auto", "reference", "triton")


def _check_ptr(fn: str, x: Tensor, ptr: Tensor) -> None:
    check_tensor(ptr, fn, "ptr")
    check(ptr.dim() == 1 and ptr.numel() >= 1, fn, f"ptr must be 1-D with B + 1 entries, got shape {tuple(ptr.shape)}")
    check(not ptr.is_floating_point() and not ptr.is_complex() and ptr.dtype != torch.bool, fn,
          f"ptr must have an integer dtype, got {ptr.dtype}")
    check_same_device(fn, x=x, ptr=ptr)
    if ptr.device.type == "cpu":           # on a GPU these checks would wait for the device: skipped there
        check(int(ptr[0]) == 0 and int(ptr[-1]) == x.shape[0], fn,
              f"ptr must run from 0 to the {x.shape[0]} rows of x, got {int(ptr[0])}..{int(ptr[-1])}")
        check(bool((ptr[1:] >= ptr[:-1]).all()), fn, "ptr must be non-decreasing")


def _reference(x: Tensor, ptr: Tensor, reduce: str) -> Tensor:
    """``torch.segment_reduce`` over the node ranges; empty graphs give zeros."""
    out = torch.segment_reduce(x, reduce, offsets=ptr.to(torch.int64), axis=0, initial=0 if reduce == "sum" else None)
    if reduce == "sum":
        return out
    empty = (ptr[1:] == ptr[:-1]).unsqueeze(1)      # mean: 0/0, max: -inf
    return out.masked_fill(empty, 0.0)


class _PoolTriton(torch.autograd.Function):
    """The Triton kernels (``kernels/pool.py``); max saves the forward's arg (the first maximal
    row of each graph and feature) for the backward."""

    @staticmethod
    def forward(ctx, x: Tensor, ptr: Tensor, reduce: str) -> Tensor:
        from ..kernels.pool import pool_forward

        out, arg = pool_forward(x, ptr, reduce, need_arg=ctx.needs_input_grad[0])
        ctx.reduce, ctx.num_rows, ctx.dtype = reduce, x.shape[0], x.dtype
        ctx.save_for_backward(ptr, arg)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        from ..kernels.pool import pool_backward

        ptr, arg = ctx.saved_tensors
        return pool_backward(grad_out, ptr, ctx.num_rows, ctx.reduce, arg, dtype=ctx.dtype), None, None


def _pool_triton(x: Tensor, ptr: Tensor, reduce: str) -> Tensor:
    return _PoolTriton.apply(x, ptr, reduce)


#: An explicit ``backend="triton"`` under torch.compile: run eagerly, outside the traced graph.
_pool_triton_not_traced = torch.compiler.disable(_pool_triton)


#: Rows of ``x`` from which max takes the reference: the kernel's arg holds int32 row offsets.
_MAX_ROWS_INT32 = 2 ** 31


#: ``"auto"`` takes the Triton kernels up to this many features.  H100
#: (``docs/design/pool.md``): at F = 64 they beat ``segment_reduce`` everywhere
#: (200 molecules, mean: 2.2 vs 9.5 us forward, 11.0 vs 24.9 us with the backward); at F = 512 the
#: forward loses on large batches (1000 molecules, sum: 43.4 vs 20.8 us).
AUTO_TRITON_MAX_FEATURES = 128


def resolve_backend(backend: str, x: Tensor, reduce: str = "sum") -> str:
    """``backend`` resolved for ``x``: ``"triton"`` or ``"reference"`` (checked; the rules of
    ``_dispatch.choose_backend``, whose CPU backend pools with the reference)."""
    fn = "global_pool"
    check(backend in _BACKENDS, fn, f"backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "reference":
        return backend
    unsupported = None
    if reduce == "max" and x.shape[0] >= _MAX_ROWS_INT32:
        unsupported = "with reduce='max' needs fewer than 2^31 rows of x (int32 row offsets)"
    chosen = choose_backend(fn, backend, x, unsupported)
    if backend == "auto" and chosen == "triton" and x.dim() == 2 and x.shape[1] > AUTO_TRITON_MAX_FEATURES:
        return "reference"
    return "triton" if chosen == "triton" else "reference"


def global_pool(x: Tensor, ptr: Tensor, reduce: str = "sum", *, backend: str = "auto") -> Tensor:
    r"""Pool the node features of each graph of a batch:
    :math:`\mathrm{out}_b = \bigoplus_{i = \mathrm{ptr}_b}^{\mathrm{ptr}_{b+1} - 1} x_i` with
    :math:`\oplus` = sum, mean (sum / :math:`n_b`, :math:`n_b = \mathrm{ptr}_{b+1} - \mathrm{ptr}_b`)
    or max (per feature).  A graph without nodes gives a row of zeros for every ``reduce``.
    Differentiable in ``x``: :math:`\partial \mathrm{out}_b / \partial x_i = 1` (sum),
    :math:`1 / n_b` (mean) for the rows of graph ``b``; max: the gradient of ``out[b, f]`` goes to
    the maximal entry of column ``f`` in graph ``b`` (ties: the Triton backend picks the first such
    row, the reference splits it evenly among them; see the module doc).

    Args:
        x: node features, graph ``b``'s nodes in rows ``ptr[b]:ptr[b+1]`` (a batch ``Graph``'s ``ptr``).
        ptr: node offsets of the graphs (``ptr[0] = 0``, ``ptr[B] = N``, non-decreasing; checked
            when ``ptr`` is on the CPU, assumed on a GPU, where checking would sync).
        reduce: ``"sum"``, ``"mean"`` or ``"max"``.
        backend: ``"auto"`` (Triton for CUDA float32 / float16 / bfloat16 of at most
            ``AUTO_TRITON_MAX_FEATURES`` = 128 features, else the reference),
            ``"triton"`` (``kernels/pool.py``: CUDA tensors, or CPU ones under ``TRITON_INTERPRET=1``;
            fp32 accumulation, deterministic, CUDA-graph capturable) or ``"reference"``
            (``torch.segment_reduce``).

    Shapes:
        x: [N, F]; ptr: [B + 1] integer -> [B, F] of ``x``'s dtype.

    Example:
        >>> global_pool(torch.tensor([[1.0], [2.0], [4.0]]), torch.tensor([0, 2, 2, 3]), "mean")
        tensor([[1.5000],
                [0.0000],
                [4.0000]])
    """
    fn = "global_pool"
    check(reduce in POOL_REDUCES, fn, f"reduce must be one of {POOL_REDUCES}, got {reduce!r}")
    check(backend in _BACKENDS, fn, f"backend must be one of {_BACKENDS}, got {backend!r}")
    check_tensor(x, fn, "x")
    check(x.dim() == 2, fn, f"x must be 2-D [num_nodes, features], got shape {tuple(x.shape)}")
    check_float(x, fn, "x")
    _check_ptr(fn, x, ptr)
    chosen = resolve_backend(backend, x, reduce)
    if chosen == "triton":
        if not compiling():
            return _pool_triton(x, ptr, reduce)
        if backend == "triton":
            return _pool_triton_not_traced(x, ptr, reduce)
    return _reference(x, ptr, reduce)
