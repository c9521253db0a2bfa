"""Edge softmax in Triton, forward and backward, one program per target row (``ROWS`` rows each).

Forward (online softmax, two passes over the row's scores):
    ``m_i = max_e s_e``, ``z_i = sum_e exp(s_e - m_i)`` in one pass, ``y_e = exp(s_e - m_i) / z_i``.
Backward: ``t_i = sum_e g_e y_e``, ``ds_e = y_e (g_e - t_i)``.
Scores are ``[E, H]`` (``H`` heads, ``H = 1`` for ``[E]``); statistics are fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch
from .configs import next_pow2


@triton.jit
def _tile(edge0, end, head, head_mask, num_heads, BLOCK_E: tl.constexpr):
    """Offsets and mask of the [BLOCK_E, BLOCK_H] score tile of edges ``edge0..`` (< ``end``)."""
    edge = edge0 + tl.arange(0, BLOCK_E)
    mask = (edge < end)[:, None] & head_mask[None, :]
    return edge.to(tl.int64)[:, None] * num_heads + head[None, :], mask


@triton.jit(do_not_specialize=["num_rows"])
def _edge_softmax_fwd_kernel(
    rowptr_ptr, s_ptr, y_ptr, num_rows, num_heads,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
):
    head = tl.arange(0, BLOCK_H)
    head_mask = head < num_heads
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        if row < num_rows:
            start = tl.load(rowptr_ptr + row)
            end = tl.load(rowptr_ptr + row + 1)
            run_max = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
            run_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
            for edge0 in range(start, end, BLOCK_E):
                offs, mask = _tile(edge0, end, head, head_mask, num_heads, BLOCK_E)
                s = tl.load(s_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
                new_max = tl.maximum(run_max, tl.max(s, axis=0))
                safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
                run_sum = run_sum * tl.exp(run_max - safe_max) + tl.sum(tl.exp(s - safe_max[None, :]), axis=0)
                run_max = new_max
            safe_max = tl.where(run_max == float("-inf"), 0.0, run_max)
            for edge0 in range(start, end, BLOCK_E):
                offs, mask = _tile(edge0, end, head, head_mask, num_heads, BLOCK_E)
                s = tl.load(s_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
                y = tl.exp(s - safe_max[None, :]) / run_sum[None, :]
                tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_rows"])
def _edge_softmax_bwd_kernel(
    rowptr_ptr, y_ptr, g_ptr, ds_ptr, num_rows, num_heads,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
):
    head = tl.arange(0, BLOCK_H)
    head_mask = head < num_heads
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        if row < num_rows:
            start = tl.load(rowptr_ptr + row)
            end = tl.load(rowptr_ptr + row + 1)
            total = tl.zeros([BLOCK_H], dtype=tl.float32)
            for edge0 in range(start, end, BLOCK_E):
                offs, mask = _tile(edge0, end, head, head_mask, num_heads, BLOCK_E)
                y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                total += tl.sum(g * y, axis=0)
            for edge0 in range(start, end, BLOCK_E):
                offs, mask = _tile(edge0, end, head, head_mask, num_heads, BLOCK_E)
                y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                tl.store(ds_ptr + offs, (y * (g - total[None, :])).to(ds_ptr.dtype.element_ty), mask=mask)


def _config(num_rows: int, num_edges: int, num_heads: int):
    block_h = next_pow2(num_heads)
    avg = num_edges / max(num_rows, 1)
    block_e = max(16, min(256, next_pow2(int(avg)))) // max(1, block_h // 4)
    rows = 4 if avg <= 8 else 1
    return max(block_e, 4), block_h, rows


def edge_softmax_fwd(rowptr: Tensor, scores: Tensor) -> Tensor:
    """Softmax of ``scores`` ([E] or [E, H], CSR order) over each row's edges."""
    scores = scores.contiguous()
    num_rows, num_edges = rowptr.numel() - 1, scores.shape[0]
    num_heads = scores.shape[1] if scores.dim() == 2 else 1
    out = torch.empty_like(scores)
    if num_edges == 0 or num_rows == 0:
        return out
    block_e, block_h, rows = _config(num_rows, num_edges, num_heads)
    launch(_edge_softmax_fwd_kernel, (triton.cdiv(num_rows, rows),), (rowptr, scores, out, num_rows, num_heads),
           dict(ROWS=rows, BLOCK_E=block_e, BLOCK_H=block_h), 4)
    return out


def edge_softmax_bwd(rowptr: Tensor, out: Tensor, grad: Tensor) -> Tensor:
    """Gradient of the edge softmax w.r.t. its scores, given its output ``out`` and upstream ``grad``."""
    out, grad = out.contiguous(), grad.contiguous()
    num_rows, num_edges = rowptr.numel() - 1, out.shape[0]
    num_heads = out.shape[1] if out.dim() == 2 else 1
    ds = torch.empty_like(out)
    if num_edges == 0 or num_rows == 0:
        return ds
    block_e, block_h, rows = _config(num_rows, num_edges, num_heads)
    launch(_edge_softmax_bwd_kernel, (triton.cdiv(num_rows, rows),), (rowptr, out, grad, ds, num_rows, num_heads),
           dict(ROWS=rows, BLOCK_E=block_e, BLOCK_H=block_h), 4)
    return ds
