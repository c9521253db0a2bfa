"""Aggregation of CBSR features in Triton (MaxK-GNN's SpGEMM forward and SSpMM backward).

Forward ``Y = A X`` with ``X`` in CBSR (``k`` entries per row): edge-parallel, a program takes
``BLOCK_E`` consecutive edges (CSR order), gathers each source's ``k`` values and columns
(``k (s + b)`` bytes instead of ``F s``) and adds ``w_e X[j, index[j, s]]`` into the zeroed fp32
output with atomics (Triton has no shared-memory scatter; the paper accumulates in shared
memory).  The additions into one output entry are in no fixed order: results agree with the
reference to rounding, not bit for bit.

Backward ``dvalues[j, s] = sum_{e: j -> i} w'_e dY[i, index[j, s]]``: one program per source row
of the transpose, ``BLOCK_E`` out-edges per step, gathering only the ``k`` sampled entries of
each ``dY`` row; fp32 accumulation in registers, deterministic.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch


@triton.jit
def _spgemm_kernel(row_ptr, col_ptr, w_ptr, val_ptr, idx_ptr, out_ptr, num_edges, k, stride_out,
                   HAS_W: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    edge = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    edge_ok = edge < num_edges
    dst = tl.load(row_ptr + edge, mask=edge_ok, other=0).to(tl.int64)
    src = tl.load(col_ptr + edge, mask=edge_ok, other=0).to(tl.int64)
    slot = tl.arange(0, BLOCK_K)
    mask = edge_ok[:, None] & (slot < k)[None, :]
    vals = tl.load(val_ptr + src[:, None] * k + slot[None, :], mask=mask, other=0.0).to(tl.float32)
    cols = tl.load(idx_ptr + src[:, None] * k + slot[None, :], mask=mask, other=0).to(tl.int64)
    if HAS_W:
        vals = vals * tl.load(w_ptr + edge, mask=edge_ok, other=0.0).to(tl.float32)[:, None]
    tl.atomic_add(out_ptr + dst[:, None] * stride_out + cols, vals, mask=mask, sem="relaxed")


@triton.jit
def _sspmm_kernel(rowptr_ptr, col_ptr, w_ptr, idx_ptr, grad_ptr, out_ptr, k, stride_g,
                  HAS_W: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    src = tl.program_id(0).to(tl.int64)
    start = tl.load(rowptr_ptr + src)
    end = tl.load(rowptr_ptr + src + 1)
    slot = tl.arange(0, BLOCK_K)
    slot_ok = slot < k
    cols = tl.load(idx_ptr + src * k + slot, mask=slot_ok, other=0).to(tl.int64)
    acc = tl.zeros([BLOCK_E, BLOCK_K], dtype=tl.float32)
    for e0 in range(start, end, BLOCK_E):
        edge = e0 + tl.arange(0, BLOCK_E)
        edge_ok = edge < end
        dst = tl.load(col_ptr + edge, mask=edge_ok, other=0).to(tl.int64)
        g = tl.load(grad_ptr + dst[:, None] * stride_g + cols[None, :], mask=edge_ok[:, None] & slot_ok[None, :],
                    other=0.0).to(tl.float32)
        if HAS_W:
            g = g * tl.load(w_ptr + edge, mask=edge_ok, other=0.0).to(tl.float32)[:, None]
        acc += g
    tl.store(out_ptr + src * k + slot, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=slot_ok)


def _block_k(k: int) -> int:
    return max(triton.next_power_of_2(k), 2)


def spgemm_cbsr(row32: Tensor, col32: Tensor, weight: Optional[Tensor], values: Tensor, index: Tensor,
                num_rows: int, num_cols: int) -> Tensor:
    """``Y[i] = sum_{e: j -> i} w_e scatter(values[j], index[j])`` (fp32 result).

    Shapes:
        row32, col32: [E] int32 target / source of every edge; weight: [E] or None;
        values, index: [M, k] -> [num_rows, num_cols] float32.
    """
    out = torch.zeros((num_rows, num_cols), dtype=torch.float32, device=values.device)
    num_edges, k = col32.numel(), values.shape[1]
    if num_edges == 0:
        return out
    block_k = _block_k(k)
    block_e = max(4096 // block_k, 8)
    launch(_spgemm_kernel, (triton.cdiv(num_edges, block_e),),
           (row32, col32, weight if weight is not None else values, values.contiguous(), index.contiguous(), out,
            num_edges, k, out.stride(0)),
           dict(HAS_W=weight is not None, BLOCK_E=block_e, BLOCK_K=block_k), 4)
    return out


def sspmm_cbsr(rowptr_t: Tensor, col_t: Tensor, weight_t: Optional[Tensor], index: Tensor, grad: Tensor,
               out_dtype: torch.dtype) -> Tensor:
    """``dvalues[j, s] = sum_{e in row j of A^T} w_e grad[col_t[e], index[j, s]]``.

    Shapes:
        rowptr_t: [M + 1], col_t: [E] (the transpose's CSR); weight_t: [E] or None;
        index: [M, k]; grad: [N, F] -> [M, k] of ``out_dtype``.
    """
    num_src, k = index.shape
    out = torch.empty((num_src, k), dtype=out_dtype, device=grad.device)
    if num_src == 0:
        return out
    grad = grad if grad.stride(1) == 1 else grad.contiguous()
    block_k = _block_k(k)
    block_e = max(min(2048 // block_k, 16), 2)
    launch(_sspmm_kernel, (num_src,),
           (rowptr_t, col_t, weight_t if weight_t is not None else grad, index.contiguous(), grad, out, k,
            grad.stride(0)),
           dict(HAS_W=weight_t is not None, BLOCK_E=block_e, BLOCK_K=block_k), 4 if block_k >= 64 else 2)
    return out
