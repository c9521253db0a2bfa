"""``global_pool``: one vector per graph of a batch (sum, mean or max over its nodes).

A batch of graphs is a block-diagonal :class:`~sparsegnn.Graph` whose ``ptr`` gives each graph's
node range; pooling reduces the rows ``ptr[b]:ptr[b+1]`` of the node features to row ``b``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check, check_float, check_same_device, check_tensor

__all__ = ["global_pool", "POOL_REDUCES"]

#: ``reduce=`` of :func:`global_pool`.
POOL_REDUCES = ("sum", "mean", "max")
_BACKENDS = ("auto", "reference")


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


def global_pool(x: Tensor, ptr: Tensor, reduce: str = "sum", *, backend: str = "auto") -> Tensor:
    r"""Pool the node features of each graph of a batch:
    :math:`\mathrm{out}_b = \bigoplus_{i = \mathrm{ptr}_b}^{\mathrm{ptr}_{b+1} - 1} x_i` with
    :math:`\oplus` = sum, mean (sum / :math:`n_b`) or max (per feature).  A graph without nodes
    gives a row of zeros for every ``reduce``.  Differentiable in ``x`` (max: the gradient goes to
    the maximal entries).

    Args:
        x: node features, graph ``b``'s nodes in rows ``ptr[b]:ptr[b+1]`` (a batch ``Graph``'s ``ptr``).
        ptr: node offsets of the graphs (``ptr[0] = 0``, ``ptr[B] = N``, non-decreasing; checked
            when ``ptr`` is on the CPU).
        reduce: ``"sum"``, ``"mean"`` or ``"max"``.
        backend: ``"auto"`` (today the reference; a GPU kernel will slot in here) or ``"reference"``
            (``torch.segment_reduce``).

    Shapes:
        x: [N, F]; ptr: [B + 1] integer -> [B, F].

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
    return _reference(x, ptr, reduce)
