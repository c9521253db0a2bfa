"""Features packed to fp16 with one scale per row: tf32's precision at half the gathered bytes.

``precision="tf32"`` promises products of inputs rounded to 11 significant bits (tf32 keeps
10 explicit mantissa bits) with fp32 accumulation.  fp16 keeps the same 10 bits but only 5
exponent bits (normals from 2^-14 to 65504), so each row ``j`` is scaled before rounding::

    s_j = 2^15 / max(max_f |x_jf|, 2^-100)        h_jf = fp16(x_jf * s_j)        x_jf ~= h_jf * inv_j,
    inv_j = max(max_f |x_jf|, 2^-100) / 2^15

The error of each entry is at most ``2^-11 |x_jf| + 2^-40 max_f |x_jf|``: entries down to
2^-29 of their row's largest magnitude (the smallest fp16 normal) keep 11 significant bits (as
tf32), smaller ones keep fewer, and those below 2^-40 of it round to zero.  Unlike tf32,
this bound is relative to the row: a row whose entries span more than ~2^29 in magnitude
loses its smallest ones (``precision="ieee"`` keeps them).  The floor 2^-100 keeps ``s_j``
finite for all-zero and subnormal rows.  The maximum is over finite entries: ``inf`` and
``NaN`` stay as they are and do not disturb the scale of the rest of their row.

The CUDA-core row kernel then gathers ``h`` (2 bytes per feature instead of 4) and, with each
edge, ``inv_{col[e]}`` (its ``src_scale``), and accumulates ``w_e inv_{col[e]} h_{col[e]}`` in
fp32 (``ops/tiles.py``, path 3 of the tf32 decisions, ``TC_FAMILY``).  The packing reads ``x`` once
and writes ``h`` once (6 bytes per element; rows wider than ``MAX_BLOCK_F`` are read twice).
"""
from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch

#: Widest row held in registers at once; wider rows take two passes over ``x``.
MAX_BLOCK_F = 256


@triton.jit
def _finite_abs(v):
    """``|v|`` where finite, else 0 (NaN compares false)."""
    a = tl.abs(v)
    return tl.where(a < float("inf"), a, 0.0)


@triton.jit
def _pack_kernel(x_ptr, h_ptr, inv_ptr, num_rows, num_feats, stride_x, stride_h,
                 ROWS: tl.constexpr, BLOCK_F: tl.constexpr, ONE_PASS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < num_rows
    rows = rows.to(tl.int64)
    feat = tl.arange(0, BLOCK_F)
    if ONE_PASS:
        mask = row_mask[:, None] & (feat[None, :] < num_feats)
        v = tl.load(x_ptr + rows[:, None] * stride_x + feat[None, :], mask=mask, other=0.0).to(tl.float32)
        amax = tl.max(_finite_abs(v), axis=1)
    else:
        amax = tl.zeros([ROWS], dtype=tl.float32)
        for f0 in range(0, num_feats, BLOCK_F):
            mask = row_mask[:, None] & (f0 + feat[None, :] < num_feats)
            v = tl.load(x_ptr + rows[:, None] * stride_x + f0 + feat[None, :], mask=mask, other=0.0)
            amax = tl.maximum(amax, tl.max(_finite_abs(v.to(tl.float32)), axis=1))
    amax = tl.maximum(amax, 7.888609052210118e-31)          # 2^-100: a finite scale for zero rows
    scale = 32768.0 / amax                                  # the largest packs to 2^15 (fp16 max 65504)
    inv = amax * (1.0 / 32768.0)
    tl.store(inv_ptr + rows, inv, mask=row_mask)
    if ONE_PASS:
        tl.store(h_ptr + rows[:, None] * stride_h + feat[None, :], (v * scale[:, None]).to(tl.float16), mask=mask)
    else:
        for f0 in range(0, num_feats, BLOCK_F):
            mask = row_mask[:, None] & (f0 + feat[None, :] < num_feats)
            v = tl.load(x_ptr + rows[:, None] * stride_x + f0 + feat[None, :], mask=mask, other=0.0)
            tl.store(h_ptr + rows[:, None] * stride_h + f0 + feat[None, :],
                     (v.to(tl.float32) * scale[:, None]).to(tl.float16), mask=mask)


def pack_fp16(x: Tensor) -> Tuple[Tensor, Tensor]:
    """``(h, inv)`` with ``x ~= h * inv[:, None]`` (see the module doc).

    Args:
        x: [M, F] float32 features (CUDA, or CPU under ``TRITON_INTERPRET=1``); any row stride.

    Returns:
        ``h``: [M, F] float16 (each row's largest magnitude packed to 2^15); ``inv``: [M]
        float32 per-row factors.

    Shapes:
        x: [M, F] -> ([M, F], [M]).
    """
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"pack_fp16(): x must be a 2-D float32 tensor, got {x.dtype} of shape {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    num_rows, num_feats = x.shape
    h = torch.empty((num_rows, num_feats), dtype=torch.float16, device=x.device)
    inv = torch.empty(num_rows, dtype=torch.float32, device=x.device)
    if num_rows == 0:
        return h, inv
    if num_feats == 0:
        return h, inv.fill_(1.0)
    block_f = min(triton.next_power_of_2(num_feats), MAX_BLOCK_F)
    rows = max(1, min(16, 2048 // block_f))
    launch(_pack_kernel, (triton.cdiv(num_rows, rows),),
           (x, h, inv, num_rows, num_feats, x.stride(0), h.stride(0)),
           dict(ROWS=rows, BLOCK_F=block_f, ONE_PASS=num_feats <= block_f), 4)
    return h, inv
