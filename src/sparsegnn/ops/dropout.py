"""Dropout with a fast path on the CPU.

``dropout(x, p)[k] = x[k] * m_k / (1 - p)`` with ``m_k ~ Bernoulli(1 - p)``.

PyTorch's CPU ``bernoulli_`` draws one Mersenne-Twister number per element on one thread:
on Cora's 2,708 x 1,433 features it takes 27-67 ms, most of a GCN epoch.  On CPU tensors
of float32 / float64 (with Numba installed) the mask here comes from a counter-based hash
of ``(seed, index)`` in a parallel loop (about 3 ms there); the seed is drawn from PyTorch's
default generator, so ``torch.manual_seed`` makes runs repeatable.  The backward multiplies
by the saved mask.  Under ``torch.compile`` the same kernel runs as the custom op
``sparsegnn::dropout`` (the seed a tensor drawn in the traced program), so compiled and eager
steps draw the same masks.  Elsewhere (CUDA, other dtypes, no Numba) this is
``torch.nn.functional.dropout``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from typing import Tuple

from ..kernels import cpu as cpu_kernels


class _CPUDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float, seed: int) -> Tensor:
        out, mask = cpu_kernels.dropout(x, p, seed)
        ctx.p = p
        ctx.save_for_backward(mask)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        return cpu_kernels.dropout_backward(grad, mask, ctx.p), None, None


@torch.library.custom_op("sparsegnn::dropout", mutates_args=(), device_types="cpu")
def _dropout_op(x: Tensor, seed: Tensor, p: float) -> Tuple[Tensor, Tensor]:
    out, mask = cpu_kernels.dropout(x, p, int(seed.item()))
    return out, mask


@_dropout_op.register_fake
def _(x, seed, p):
    return x.new_empty(x.shape), torch.empty(x.shape, dtype=torch.bool, device=x.device)


def _dropout_setup(ctx, inputs, output) -> None:
    ctx.p = inputs[2]
    ctx.save_for_backward(output[1])


def _dropout_op_backward(ctx, grad, _grad_mask):
    (mask,) = ctx.saved_tensors
    return grad * mask.to(grad.dtype) * (1.0 / (1.0 - ctx.p)), None, None


_dropout_op.register_autograd(_dropout_op_backward, setup_context=_dropout_setup)


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Inverted dropout, as ``torch.nn.functional.dropout`` (see the module doc for the CPU path).

    Shapes:
        x: any -> same.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout(): p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if (p == 1.0 or x.device.type != "cpu" or x.dtype not in cpu_kernels.NATIVE_DTYPES
            or not cpu_kernels.numba_available()):
        return F.dropout(x, p, training)
    seed = torch.randint(0, 2**62, (1,))
    if torch.compiler.is_compiling():
        return _dropout_op(x, seed, float(p))[0]
    if torch.is_grad_enabled() and x.requires_grad:
        return _CPUDropout.apply(x, float(p), int(seed.item()))
    return cpu_kernels.dropout(x, float(p), int(seed.item()))[0]
