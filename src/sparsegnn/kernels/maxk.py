"""MaxK selection in Triton: the ``k`` largest entries of every row, in CBSR (values, columns).

A program holds ``ROWS`` whole rows in registers (``F <= MAX_FEATS``) as fp32 values (NaN and
+inf rank as the largest float, -inf as the smallest; ``-0 == +0``).  A per-row search over
values finds a threshold ``t`` with ``count(v >= t) >= k > count(v > t)``: ``lo`` always has
``count(v >= lo) >= k``, ``hi`` has ``count(v > hi) < k``.  Each step interpolates the count
linearly between ``lo`` and ``hi`` (clamped to the middle 7/8; the paper bisects at
``(min + max) / 2``: ~8 steps against ~5 here on normal rows, k = 32 of 256); a row stops when ``count(v >= lo) == k`` or when no
float lies strictly inside ``(lo, hi)``; every 4th step snaps ``lo`` / ``hi`` to the nearest
data values, so ties at the k-th value close the bracket in a step or two.  The first pivot is the
k-th largest entry of a normal row with the row's mean and deviation (pre-activations are
near-normal; a wrong guess costs one step).  The kept entries are those
with ``v > t`` plus the first of the ``v == t`` ties in column order, so the result is
deterministic; they are written in column order with a prefix sum (no sort).  Global
traffic: one read of the rows and ``k`` values + columns per row, as an element-wise op.
"""
from __future__ import annotations

import functools
import statistics
from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch

#: Widest rows the kernel holds in registers.
MAX_FEATS = 4096


@triton.jit
def _maxk_kernel(x_ptr, val_ptr, idx_ptr, num_rows, num_feats, stride_x, k, z,
                 ROWS: tl.constexpr, BLOCK_F: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < num_rows
    feat = tl.arange(0, BLOCK_F)
    valid = row_ok[:, None] & (feat < num_feats)[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_x + feat[None, :], mask=valid, other=0.0)
    # ranks on finite fp32 values: NaN and +inf count as the largest float, -inf as the smallest
    xf = x.to(tl.float32)
    v = tl.minimum(tl.maximum(xf, -3.4028234663852886e38), 3.4028234663852886e38)
    v = tl.where(xf != xf, 3.4028234663852886e38, v)               # tested first: max/min may drop NaN
    v = tl.where(valid, v, -float("inf"))                          # padding: never counted
    lo = tl.min(tl.where(valid, v, float("inf")), axis=1)
    hi = tl.max(v, axis=1)
    c_lo = tl.sum(valid.to(tl.int32), axis=1)                      # count(v >= lo) >= k
    c_hi = tl.sum(((v >= hi[:, None]) & valid).to(tl.int32), axis=1)  # count(v >= hi); count(v > hi) < k
    done = (c_lo == k) | (c_hi >= k) | (row_ok == 0)
    # first pivot: the k-th largest of a normal row with this mean and deviation (z = the
    # normal quantile of 1 - (k + 1/2) / F); then the count interpolated linearly between lo and hi
    width = tl.maximum(tl.sum(valid.to(tl.float32), axis=1), 1.0)
    mean = tl.sum(tl.where(valid, v, 0.0), axis=1) / width
    dev = tl.where(valid, v - mean[:, None], 0.0)
    guess = mean + tl.sqrt(tl.sum(dev * dev, axis=1) / width) * z
    step = 0
    while tl.max((done == 0).to(tl.int32), axis=0) > 0:
        frac = (c_lo - k).to(tl.float32) / tl.maximum(c_lo - c_hi, 1).to(tl.float32)
        frac = tl.minimum(tl.maximum(frac, 0.0625), 0.9375)
        half = lo * 0.5 + hi * 0.5                                 # no overflow, in [lo, hi]
        mid = tl.where(step == 0, guess, lo + (hi - lo) * frac)
        mid = tl.where((mid > lo) & (mid < hi), mid, half)         # also NaN / overflow
        collapsed = (half <= lo) | (half >= hi)                    # no float strictly inside (lo, hi)
        count = tl.sum(((v >= mid[:, None]) & valid).to(tl.int32), axis=1)
        move = (done == 0) & (collapsed == 0)
        enough = count >= k
        new_lo, new_hi = mid, mid
        if step % 4 == 3:
            # snap the bracket to data values: ties at the k-th value then close it in a
            # step or two instead of halving down to one ulp (up to ~150 steps around 0)
            new_lo = tl.min(tl.where(valid & (v >= mid[:, None]), v, float("inf")), axis=1)
            new_hi = tl.max(tl.where(valid & (v < mid[:, None]), v, -float("inf")), axis=1)
        lo = tl.where(move & enough, new_lo, lo)
        c_lo = tl.where(move & enough, count, c_lo)
        hi = tl.where(move & (enough == 0), new_hi, hi)
        c_hi = tl.where(move & (enough == 0), count, c_hi)
        done = done | collapsed | (c_lo == k) | (lo >= hi)
        step += 1
    # count(v >= t) >= k > count(v > t): hi when it holds k or more (a snapped hi can be the
    # k-th value itself, with ties), else lo (then no float lies between lo and hi, or lo holds k)
    at_hi = tl.sum(((v >= hi[:, None]) & valid).to(tl.int32), axis=1)
    t = tl.where(at_hi >= k, hi, lo)[:, None]
    above = (v > t) & valid
    ties = (v == t) & valid
    room = k - tl.sum(above.to(tl.int32), axis=1)
    keep = above | (ties & (tl.cumsum(ties.to(tl.int32), axis=1) <= room[:, None]))
    slot = rows.to(tl.int64)[:, None] * k + (tl.cumsum(keep.to(tl.int32), axis=1) - 1)
    tl.store(val_ptr + slot, x, mask=keep)
    tl.store(idx_ptr + slot, (feat[None, :] + tl.zeros_like(c_lo)[:, None]).to(idx_ptr.dtype.element_ty), mask=keep)


def maxk_select(x: Tensor, k: int, index_dtype: torch.dtype, config: Optional[Dict[str, int]] = None
                ) -> Tuple[Tensor, Tensor]:
    """The ``k`` largest entries of each row of ``x`` and their columns (increasing).
    ``config``: ``ROWS`` rows per program and ``num_warps`` (default: ``maxk_config``).

    Shapes:
        x: [N, F] with ``F <= MAX_FEATS`` -> values [N, k] (``x``'s dtype), index [N, k].
    """
    num_rows, num_feats = x.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    values = torch.empty((num_rows, k), dtype=x.dtype, device=x.device)
    index = torch.empty((num_rows, k), dtype=index_dtype, device=x.device)
    if num_rows == 0:
        return values, index
    block_f = max(triton.next_power_of_2(num_feats), 16)
    cfg = config or maxk_config(block_f)
    launch(_maxk_kernel, (triton.cdiv(num_rows, cfg["ROWS"]),),
           (x, values, index, num_rows, num_feats, x.stride(0), k, _normal_quantile(1.0 - (k + 0.5) / num_feats)),
           dict(ROWS=cfg["ROWS"], BLOCK_F=block_f),
           cfg["num_warps"])
    return values, index


def maxk_config(block_f: int) -> Dict[str, int]:
    """Rows per program and warps for rows of ``block_f`` (padded) columns: one warp per row
    (every count reduces inside the warp; H100, 232,965 x 256, k = 32: 1 row x 1 warp 0.38 ms,
    4 rows x 4 warps 0.75 ms), more warps only for rows too wide for one warp's registers."""
    return {"ROWS": 1, "num_warps": 1 if block_f <= 512 else (2 if block_f <= 1024 else 4)}


@functools.lru_cache(maxsize=None)
def _normal_quantile(p: float) -> float:
    """``Phi^-1(p)`` of the standard normal, ``p`` clamped into (0, 1)."""
    return statistics.NormalDist().inv_cdf(min(max(p, 1e-6), 1.0 - 1e-6))
