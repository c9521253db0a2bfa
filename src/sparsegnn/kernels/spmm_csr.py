"""CSR SpMM (sum) in Triton: ``out[i, :] = sum_{e in row i} val[e] * x[col[e], :]``.

Schedule: one program per (row, block of BLOCK_F features); the row's edges are consumed
BLOCK_E at a time, each step gathering a [BLOCK_E, BLOCK_F] tile of neighbour rows into an
fp32 register accumulator.  Feature tails and edge tails are masked, so any F and any degree
work; node and feature offsets are computed in int64 (N * F may exceed 2^31).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .configs import spmm_csr_default


@triton.jit
def _spmm_csr_sum_kernel(
    rowptr_ptr, col_ptr, val_ptr, x_ptr, out_ptr,
    num_feats, stride_x, stride_out,
    HAS_VAL: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    start = tl.load(rowptr_ptr + row)
    end = tl.load(rowptr_ptr + row + 1)
    acc = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)
    for edge0 in range(start, end, BLOCK_E):
        edge = edge0 + tl.arange(0, BLOCK_E)
        edge_mask = edge < end
        src = tl.load(col_ptr + edge, mask=edge_mask, other=0).to(tl.int64)
        tile = tl.load(
            x_ptr + src[:, None] * stride_x + feat[None, :],
            mask=edge_mask[:, None] & feat_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        if HAS_VAL:
            weight = tl.load(val_ptr + edge, mask=edge_mask, other=0.0).to(tl.float32)
            tile = tile * weight[:, None]
        acc += tile
    result = tl.sum(acc, axis=0)
    tl.store(out_ptr + row * stride_out + feat, result.to(out_ptr.dtype.element_ty), mask=feat_mask)


def spmm_csr(
    rowptr: Tensor,
    col: Tensor,
    edge_val: Optional[Tensor],
    x: Tensor,
    config: Optional[Dict[str, int]] = None,
    out: Optional[Tensor] = None,
) -> Tensor:
    """Launch the CSR SpMM (sum) kernel.

    Args:
        rowptr: [N + 1] int64 row offsets.
        col: [E] int64 column (source) indices.
        edge_val: [E] values or None (all ones).
        x: [M, F] features (float32 / float16 / bfloat16), made contiguous here.
        config: ``BLOCK_E``, ``BLOCK_F``, ``num_warps``; default from ``configs.spmm_csr_default``.
        out: optional contiguous [N, F] output buffer of ``x``'s dtype (every element is written).

    Returns:
        [N, F] tensor of ``x``'s dtype (fp32 accumulation).
    """
    num_rows = rowptr.numel() - 1
    num_feats = x.shape[1]
    x = x.contiguous()
    if out is None:
        out = torch.empty((num_rows, num_feats), dtype=x.dtype, device=x.device)
    if num_rows == 0 or num_feats == 0:
        return out
    cfg = dict(config or spmm_csr_default(num_feats))
    num_warps = cfg.pop("num_warps", 4)
    grid = (num_rows, triton.cdiv(num_feats, cfg["BLOCK_F"]))
    _spmm_csr_sum_kernel[grid](
        rowptr, col, edge_val if edge_val is not None else col, x, out,
        num_feats, x.stride(0), out.stride(0),
        HAS_VAL=edge_val is not None, num_warps=num_warps, **cfg,
    )
    return out
