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

from . import sm_count
from ._launch import launch

#: Widest rows the kernel holds in registers.
MAX_FEATS = 4096


@triton.jit
def _popcount(m):
    """Set bits of each uint32 ``m`` (SWAR; the interpreter has no libdevice ``popc``)."""
    m = m - ((m >> 1) & 0x55555555)
    m = (m & 0x33333333) + ((m >> 2) & 0x33333333)
    m = (m + (m >> 4)) & 0x0F0F0F0F
    return (m * 0x01010101) >> 24


@triton.jit
def _before(flags):
    """Exclusive prefix count of ``flags`` in column order (column ``32 r + lane`` at ``[r, lane]``):
    each register row packed into a 32-bit word (a warp ballot, as one integer sum of distinct
    bits), then bit counts: no warp scan per register row."""
    lane = tl.arange(0, 32).to(tl.uint32)[None, :]
    words = tl.sum(flags.to(tl.uint32) << lane, axis=1)                  # [NR]
    lower = _popcount(words[:, None] & ((tl.full([1, 32], 1, tl.uint32) << lane) - 1))
    totals = _popcount(words)
    return (tl.cumsum(totals, axis=0) - totals)[:, None].to(tl.int32) + lower.to(tl.int32)


@triton.jit
def _maxk_kernel(x_ptr, val_ptr, idx_ptr, num_feats, stride_x, k, z, w_ptr, b_ptr, center_ptr, rstd_ptr, eps,
                 NR: tl.constexpr, EVEN: tl.constexpr, NORM: tl.constexpr, DENSE: tl.constexpr = False):
    """Row ``pid``'s ``k`` largest entries (module doc) as CBSR values and columns, or with ``DENSE``
    as a ``[N, num_feats]`` uint8 mask at ``val_ptr``: 1 on the kept entries, 0 elsewhere."""
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, NR)[:, None] * 32 + tl.arange(0, 32)[None, :]    # [NR, 32]: column 32 r + lane
    valid = col < num_feats
    # contiguity 1: one column per lane and register (the layout _before counts in), not
    # vectors of 4 that the stores would convert back through shared memory
    ptrs = x_ptr + row * stride_x + tl.max_contiguous(col, [1, 1])
    if EVEN:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=valid, other=0.0)
    # ranks on finite fp32 values: NaN and +inf count as the largest float, -inf as the smallest;
    # padding (columns past num_feats unless EVEN) ranks -inf, below every ranked value, so the
    # counts need no mask
    xf = x.to(tl.float32)
    if NORM:
        # LayerNorm first (fp32, two passes over the registers): y = (x - mean) rstd w + b; the
        # selection ranks y, and y (in the values' dtype) is what is kept.  The mean is taken
        # about the row's first entry s, with correctly rounded divisions: a constant row gets
        # d = 0 exactly (as torch's Welford update does), where a rounding of the mean, scaled by
        # rstd ~ eps^-1/2, would otherwise show in y
        n_f = num_feats.to(tl.float32)
        s = tl.sum(tl.where(col == 0, xf, 0.0))
        d = xf - s
        if not EVEN:
            d = tl.where(valid, d, 0.0)
        m = tl.div_rn(tl.sum(d), n_f)
        d = d - m
        if not EVEN:
            d = tl.where(valid, d, 0.0)
        rs = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(tl.sum(d * d), n_f) + eps))
        if EVEN:
            w = tl.load(w_ptr + col).to(tl.float32)
            b = tl.load(b_ptr + col).to(tl.float32)
        else:
            w = tl.load(w_ptr + col, mask=valid, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + col, mask=valid, other=0.0).to(tl.float32)
        xf = d * rs * w + b
        tl.store(center_ptr + row, m)            # the mean of x - s: the backward recomputes s from x
        tl.store(rstd_ptr + row, rs)
        x = xf.to(val_ptr.dtype.element_ty)
    v = tl.minimum(tl.maximum(xf, -3.4028234663852886e38), 3.4028234663852886e38)
    v = tl.where(xf != xf, 3.4028234663852886e38, v)               # tested first: max/min may drop NaN
    width = num_feats.to(tl.float32)
    mean = tl.sum(v) / width                                       # padding loads as 0: no mask needed
    var = tl.maximum(tl.sum(v * v) / width - mean * mean, 0.0)
    if EVEN:
        lo = tl.min(v)
    else:
        lo = tl.min(tl.where(valid, v, float("inf")))
        v = tl.where(valid, v, -float("inf"))
    hi = tl.max(v)
    c_lo = num_feats                                               # count(v >= lo) >= k
    c_hi = tl.sum((v >= hi).to(tl.int32))                          # count(v >= hi); count(v > hi) < k
    done = (c_lo == k) | (c_hi >= k)
    # first pivot: the k-th largest of a normal row with this mean and deviation (z = the
    # normal quantile of 1 - (k + 1/2) / F; a guess: inf / NaN moments fall back to bisection);
    # then the count interpolated linearly between lo and hi
    guess = mean + tl.sqrt(var) * z
    step = 0
    while done == 0:
        frac = tl.fdiv((c_lo - k).to(tl.float32), tl.maximum(c_lo - c_hi, 1).to(tl.float32))   # approximate
        frac = tl.minimum(tl.maximum(frac, 0.0625), 0.9375)
        half = lo * 0.5 + hi * 0.5                                 # no overflow, in [lo, hi]
        mid = lo + (hi - lo) * frac
        if step == 0:
            mid = guess
        if (mid <= lo) | (mid >= hi) | (mid != mid):               # also NaN / overflow
            mid = half
        collapsed = (half <= lo) | (half >= hi)                    # no float strictly inside (lo, hi)
        if collapsed:
            done = collapsed
        else:
            count = tl.sum((v >= mid).to(tl.int32))
            new_lo, new_hi = mid, mid
            if step % 4 == 3:
                # snap the bracket to data values: ties at the k-th value then close it in a
                # step or two instead of halving down to one ulp (up to ~150 steps around 0)
                new_lo = tl.min(tl.where(v >= mid, v, float("inf")))
                new_hi = tl.max(tl.where(v < mid, v, -float("inf")))
            if count >= k:
                lo, c_lo = new_lo, count
            else:
                hi, c_hi = new_hi, count
            done = (c_lo == k) | (lo >= hi)
        step += 1
    # count(v >= t) >= k > count(v > t): hi when it holds k or more (a snapped hi can be the
    # k-th value itself, with ties), else lo (then no float lies between lo and hi, or lo holds k)
    at_hi = tl.sum((v >= hi).to(tl.int32))
    t = tl.where(at_hi >= k, hi, lo)
    if tl.where(at_hi >= k, at_hi, c_lo) > k:
        # more than k entries tie at t: those above it and the first ties in column order
        above = v > t
        ties = v == t
        keep = above | (ties & (_before(ties) < k - tl.sum(above.to(tl.int32))))
    else:
        keep = v >= t
    if DENSE:
        kept = keep.to(tl.uint8)
        if EVEN:
            tl.store(val_ptr + row * num_feats + col, kept)
        else:
            tl.store(val_ptr + row * num_feats + col, kept, mask=valid)
    else:
        slot = row * k + _before(keep)
        tl.store(val_ptr + slot, x, mask=keep)
        tl.store(idx_ptr + slot, col.to(idx_ptr.dtype.element_ty), mask=keep)


def _register_rows(num_feats: int) -> int:
    """Register rows of 32 columns that hold a row of ``num_feats`` (a power of two, at least 1)."""
    return max(triton.next_power_of_2(num_feats), 32) // 32


def _select(x: Tensor, k: int, index_dtype: torch.dtype, num_warps: Optional[int], norm: Optional[tuple]):
    """Launches ``_maxk_kernel`` over the rows of ``x``; ``norm = (weight, bias, eps)`` normalises
    each row first and also returns its ``center`` and ``rstd``."""
    num_rows, num_feats = x.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    values = torch.empty((num_rows, k), dtype=x.dtype, device=x.device)
    index = torch.empty((num_rows, k), dtype=index_dtype, device=x.device)
    stats = [torch.empty(num_rows, dtype=torch.float32, device=x.device) for _ in range(2 if norm else 0)]
    if num_rows > 0:
        nr = _register_rows(num_feats)
        extra = ((norm[0].contiguous(), norm[1].contiguous(), *stats, float(norm[2])) if norm
                 else (x, x, x, x, 0.0))        # unused pointers without NORM
        launch(_maxk_kernel, (num_rows,),
               (x, values, index, num_feats, x.stride(0), k, _normal_quantile(1.0 - (k + 0.5) / num_feats), *extra),
               dict(NR=nr, EVEN=num_feats == 32 * nr, NORM=norm is not None),
               num_warps or maxk_config(32 * nr)["num_warps"])
    return (values, index, *stats)


def maxk_select(x: Tensor, k: int, index_dtype: torch.dtype, config: Optional[Dict[str, int]] = None
                ) -> Tuple[Tensor, Tensor]:
    """The ``k`` largest entries of each row of ``x`` and their columns (increasing).
    ``config``: ``num_warps`` per row (default: ``maxk_config``).

    Shapes:
        x: [N, F] with ``F <= MAX_FEATS`` -> values [N, k] (``x``'s dtype), index [N, k].
    """
    return _select(x, k, index_dtype, (config or {}).get("num_warps"), None)


def maxk_keep_mask(x: Tensor, k: int) -> Tensor:
    """Where ``x`` is among the ``k`` largest entries of its row (what :func:`maxk_select` keeps:
    the same ranking and ties), as a dense bool mask, so that ``torch.where(mask, x, 0)`` is MaxK's
    dense form: one pass over ``x`` and one native op whose backward is one native op too (no
    scatter, no Python autograd node; ``masked_fill`` would copy ``x`` first).

    Shapes:
        x: [N, F] with ``F <= MAX_FEATS`` -> bool [N, F].
    """
    num_rows, num_feats = x.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    mask = torch.empty((num_rows, num_feats), dtype=torch.bool, device=x.device)
    if num_rows > 0:
        nr = _register_rows(num_feats)
        launch(_maxk_kernel, (num_rows,),
               (x, mask.view(torch.uint8), x, num_feats, x.stride(0), k,
                _normal_quantile(1.0 - (k + 0.5) / num_feats), x, x, x, x, 0.0),
               dict(NR=nr, EVEN=num_feats == 32 * nr, NORM=False, DENSE=True), maxk_config(32 * nr)["num_warps"])
    return mask


def layer_norm_maxk_select(x: Tensor, weight: Tensor, bias: Tensor, eps: float, k: int, index_dtype: torch.dtype
                           ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """MaxK of the LayerNorm of ``x`` in one pass: ``y = (x - mean) rstd weight + bias`` per row (fp32),
    then the ``k`` largest entries of ``y`` (ranked in fp32) as in :func:`maxk_select`.  The normalised
    row is never written: one read of ``x``, ``k`` values and columns and two floats per row.  The
    mean is formed about the row's first entry ``s``: ``center`` is the mean of ``x - s`` (the
    backward rebuilds ``x - mean`` as ``(x - s) - center``, exactly as the forward did).

    Shapes:
        x: [N, F] (``F <= MAX_FEATS``); weight, bias: [F] -> values [N, k] (``x``'s dtype),
        index [N, k], center [N] and rstd [N] (float32, for the backward).
    """
    return _select(x, k, index_dtype, None, (weight, bias, eps))


@triton.jit
def _ln_maxk_backward_kernel(x_ptr, dv_ptr, idx_ptr, w_ptr, center_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr,
                             num_rows, num_feats, stride_x, k, NR: tl.constexpr, KB: tl.constexpr,
                             EVEN: tl.constexpr):
    """Rows ``pid, pid + P, ...`` of LayerNorm's backward where the output gradient ``dy`` has ``k``
    entries a row (at the CBSR's columns): ``g = w dy``,
    ``dx = rstd (g - mean(g) - xhat mean(g xhat))``, and this program's partial sums of ``dy xhat``
    (dw) and ``dy`` (db) written to row ``pid`` of ``dw_ptr`` / ``db_ptr``."""
    pid = tl.program_id(0)
    lane = tl.arange(0, 32)
    col = tl.arange(0, NR)[:, None] * 32 + lane[None, :]          # [NR, 32]: column 32 r + lane
    valid = col < num_feats
    kk = tl.arange(0, KB)
    kmask = kk < k
    n_f = num_feats.to(tl.float32)
    w = tl.load(w_ptr + col, mask=valid, other=0.0).to(tl.float32)
    dw = tl.zeros([NR, 32], dtype=tl.float32)
    db = tl.zeros([NR, 32], dtype=tl.float32)
    one = tl.full([1, KB], 1, tl.uint32)
    nprog = tl.num_programs(0)
    # software pipelining: the next row's x, columns, center and rstd are loaded while this row is
    # computed, so a row waits on one round trip (its gradient gather) instead of three
    r64 = pid.to(tl.int64)
    xf_n = tl.load(x_ptr + r64 * stride_x + col, mask=valid, other=0.0)
    idx_n = tl.load(idx_ptr + r64 * k + kk, mask=kmask, other=0)
    c_n = tl.load(center_ptr + pid)
    rs_n = tl.load(rstd_ptr + pid)
    for i in range(0, tl.cdiv(num_rows - pid, nprog)):
        row = pid + i * nprog
        r64 = row.to(tl.int64)
        xf, idx, c, rs = xf_n.to(tl.float32), idx_n.to(tl.int32)[None, :], c_n, rs_n
        nxt = tl.minimum(row + nprog, num_rows - 1)        # the last iteration reloads a row, unused
        n64 = nxt.to(tl.int64)
        xf_n = tl.load(x_ptr + n64 * stride_x + col, mask=valid, other=0.0)
        idx_n = tl.load(idx_ptr + n64 * k + kk, mask=kmask, other=0)
        c_n = tl.load(center_ptr + nxt)
        rs_n = tl.load(rstd_ptr + nxt)
        # xhat = ((x - s) - center) rstd as the forward formed it (s: the row's first entry)
        xhat = ((xf - tl.sum(tl.where(col == 0, xf, 0.0))) - c) * rs
        # the kept columns as one 32-bit word per register row (distinct bits: their sum is their
        # OR), then each kept column's slot in the CBSR row = kept columns before it (they increase)
        hit = kmask[None, :] & ((idx >> 5) == tl.arange(0, NR)[:, None])
        words = tl.sum(tl.where(hit, one << (idx & 31).to(tl.uint32), 0), axis=1)      # [NR]
        kept = ((words[:, None] >> lane[None, :].to(tl.uint32)) & 1) != 0
        dy = tl.load(dv_ptr + r64 * k + _before(kept), mask=kept, other=0.0).to(tl.float32)
        g = dy * w
        s1 = tl.sum(g) / n_f
        s2 = tl.sum(g * xhat) / n_f
        dx = rs * (g - s1 - xhat * s2)
        if EVEN:
            tl.store(dx_ptr + r64 * stride_x + col, dx.to(dx_ptr.dtype.element_ty))
        else:
            tl.store(dx_ptr + r64 * stride_x + col, dx.to(dx_ptr.dtype.element_ty), mask=valid)
        dw += dy * xhat
        db += dy
    tl.store(dw_ptr + pid * num_feats + col, dw, mask=valid)
    tl.store(db_ptr + pid * num_feats + col, db, mask=valid)


def layer_norm_maxk_backward(grad_values: Tensor, index: Tensor, x: Tensor, weight: Tensor, center: Tensor,
                             rstd: Tensor, programs: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward of :func:`layer_norm_maxk_select`: ``(dx, dweight, dbias)`` from the gradient of
    the kept values.  Each program (one warp) takes rows ``pid, pid + P, ...`` and sums its rows'
    parameter gradients; the ``P`` partial rows are then summed in a fixed order (deterministic).
    ``index`` must be the forward's (columns strictly increasing along each row: the CBSR
    invariant the slot of each kept column is computed from); the shapes are checked.
    ``programs``: ``P`` (default: 16 per SM, at most ``N``; H100, 232,965 x 256, k = 32: 8 per SM
    0.309 ms, 16 0.233, 32 0.243, 64 0.257).

    Shapes:
        grad_values, index: [N, k]; x: [N, F]; weight: [F]; center, rstd: [N] ->
        dx [N, F] (``x``'s dtype), dweight and dbias [F] (``weight``'s dtype).
    """
    num_rows, num_feats = x.shape
    k = index.shape[1]
    if (grad_values.shape != index.shape or index.shape[0] != num_rows or k > num_feats
            or tuple(weight.shape) != (num_feats,) or center.shape != (num_rows,) or rstd.shape != (num_rows,)):
        raise ValueError(f"layer_norm_maxk_backward(): shapes do not match: grad_values {tuple(grad_values.shape)}, "
                         f"index {tuple(index.shape)}, x {tuple(x.shape)}, weight {tuple(weight.shape)}, "
                         f"center {tuple(center.shape)}, rstd {tuple(rstd.shape)}")
    x = x.contiguous()
    dx = torch.empty_like(x)
    if programs is None:
        sms = sm_count(x.device) if x.is_cuda else 4
        programs = 16 * sms
    programs = max(1, min(programs, num_rows))
    # the partial rows of dw and db in one tensor: one reduction sums both
    partial = torch.empty((2, programs, num_feats), dtype=torch.float32, device=x.device)
    dw, db = partial[0], partial[1]
    if num_rows == 0:
        return dx, weight.new_zeros(num_feats), weight.new_zeros(num_feats)
    nr = _register_rows(num_feats)
    launch(_ln_maxk_backward_kernel, (programs,),
           (x, grad_values.contiguous(), index.contiguous(), weight.contiguous(), center, rstd, dx, dw, db,
            num_rows, num_feats, x.stride(0), k),
           dict(NR=nr, KB=triton.next_power_of_2(k), EVEN=num_feats == 32 * nr), maxk_config(32 * nr)["num_warps"])
    sums = partial.sum(1).to(weight.dtype)
    # db copied out (an [F] copy is cheaper than a second reduction): the two gradients must not
    # share a storage (autograd keeps them as .grad of two parameters)
    return dx, sums[0], sums[1].clone()


@triton.jit
def _gather_kept_kernel(dense_ptr, idx_ptr, out_ptr, also_ptr, eps_ptr, num_rows, stride_d, stride_a, k,
                        ROWS: tl.constexpr, KB: tl.constexpr, ALSO: tl.constexpr):
    """``out[i, s] = dense[i, index[i, s]]`` (``ALSO``: ``+ (1 + eps) also[i, index[i, s]]``, summed
    in fp32) for ``ROWS`` rows a program (columns of any integer dtype)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    kk = tl.arange(0, KB)[None, :]
    mask = (rows < num_rows) & (kk < k)
    r64 = rows.to(tl.int64)
    col = tl.load(idx_ptr + r64 * k + kk, mask=mask, other=0).to(tl.int64)
    v = tl.load(dense_ptr + r64 * stride_d + col, mask=mask, other=0.0)
    if ALSO:
        gain = 1.0 + tl.load(eps_ptr).to(tl.float32)
        a = tl.load(also_ptr + r64 * stride_a + col, mask=mask, other=0.0)
        v = v.to(tl.float32) + gain * a.to(tl.float32)
    tl.store(out_ptr + r64 * k + kk, v.to(out_ptr.dtype.element_ty), mask=mask)


def _kept_rows(k: int):
    """``(KB, ROWS)`` of the row-block kernels over a CBSR's ``k`` kept entries (~1024 a program)."""
    kb = triton.next_power_of_2(k)
    return kb, max(1, min(64, 1024 // kb))


def gather_kept(dense: Tensor, index: Tensor, dtype: torch.dtype, also: Optional[Tensor] = None,
                eps: Optional[Tensor] = None) -> Tensor:
    """``dense`` sampled at a CBSR's kept columns, in ``dtype``: ``out[i, s] = dense[i, index[i, s]]``
    in one pass reading the (uint8 / int) columns as they are, where ``dense.gather(1,
    index.long())`` is two kernels (the int64 columns, the gather), which a small graph's step
    pays in launches (the backward of MaxK's dense schedules, per layer).  With ``also`` and
    ``eps`` (GIN's self term): ``+ (1 + eps) also[i, index[i, s]]`` in the same pass (fp32 sum,
    the result in ``dense``'s dtype before the cast to ``dtype``).

    Shapes:
        dense, also: [N, F] (unit column stride); index: [N, k]; eps: [1] -> [N, k].
    """
    num_rows, k = index.shape
    if dense.dim() != 2 or dense.shape[0] != num_rows or k > dense.shape[1]:
        raise ValueError(f"gather_kept(): dense {tuple(dense.shape)} does not match index {tuple(index.shape)}")
    if (also is None) != (eps is None) or (also is not None and (also.shape != dense.shape or eps.numel() != 1)):
        raise ValueError(f"gather_kept(): also must match dense {tuple(dense.shape)} and come with a one-element eps")
    out = torch.empty((num_rows, k), dtype=dense.dtype, device=dense.device)
    if num_rows == 0 or k == 0:
        return out.to(dtype)
    dense = dense if dense.stride(1) == 1 else dense.contiguous()
    if also is not None:
        also = also if also.stride(1) == 1 else also.contiguous()
    kb, rows = _kept_rows(k)
    launch(_gather_kept_kernel, (triton.cdiv(num_rows, rows),),
           (dense, index.contiguous(), out, dense if also is None else also, dense if eps is None else eps,
            num_rows, dense.stride(0), dense.stride(0) if also is None else also.stride(0), k),
           dict(ROWS=rows, KB=kb, ALSO=also is not None), 4)
    return out.to(dtype)        # a cast kernel only where the gradient's dtype differs (torch rounds)


@triton.jit
def _add_kept_kernel(out_ptr, val_ptr, idx_ptr, eps_ptr, num_rows, stride_o, k, ROWS: tl.constexpr,
                     KB: tl.constexpr):
    """``out[i, index[i, s]] += (1 + eps) values[i, s]`` for ``ROWS`` rows a program, in fp32: a
    row's columns are distinct, so no two lanes touch one entry (no atomics)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    kk = tl.arange(0, KB)[None, :]
    mask = (rows < num_rows) & (kk < k)
    r64 = rows.to(tl.int64)
    col = tl.load(idx_ptr + r64 * k + kk, mask=mask, other=0).to(tl.int64)
    v = tl.load(val_ptr + r64 * k + kk, mask=mask, other=0.0).to(tl.float32)
    gain = 1.0 + tl.load(eps_ptr).to(tl.float32)
    at = out_ptr + r64 * stride_o + col
    o = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    tl.store(at, (o + gain * v).to(out_ptr.dtype.element_ty), mask=mask)


def add_kept_(out: Tensor, values: Tensor, index: Tensor, eps: Tensor) -> Tensor:
    """GIN's self term added in place from a CBSR, ``out[i, index[i, s]] += (1 + eps) values[i, s]``,
    in one pass (where ``out.scatter_add_(1, index.long(), (1 + eps) * values)`` is three kernels).
    Returns ``out``.

    Shapes:
        out: [N, F] (unit column stride); values, index: [N, k]; eps: [1] -> out.
    """
    num_rows, k = index.shape
    if (out.dim() != 2 or out.shape[0] != num_rows or k > out.shape[1] or values.shape != index.shape
            or out.stride(1) != 1 or eps.numel() != 1):
        raise ValueError(f"add_kept_(): out {tuple(out.shape)} (unit column stride), values {tuple(values.shape)}, "
                         f"index {tuple(index.shape)} and a one-element eps ({tuple(eps.shape)}) do not match")
    if num_rows == 0 or k == 0:
        return out
    kb, rows = _kept_rows(k)
    launch(_add_kept_kernel, (triton.cdiv(num_rows, rows),),
           (out, values.contiguous(), index.contiguous(), eps.detach(), num_rows, out.stride(0), k),
           dict(ROWS=rows, KB=kb), 4)
    return out


def maxk_config(block_f: int) -> Dict[str, int]:
    """Warps per row of ``block_f`` (padded) columns: one (every count reduces inside the warp;
    H100, 232,965 x 256, k = 32: 1 row x 1 warp twice as fast as 4 rows x 4 warps), more only
    for rows too wide for one warp's registers."""
    return {"num_warps": 1 if block_f <= 512 else (2 if block_f <= 1024 else 4)}


@functools.lru_cache(maxsize=None)
def _normal_quantile(p: float) -> float:
    """``Phi^-1(p)`` of the standard normal, ``p`` clamped into (0, 1)."""
    return statistics.NormalDist().inv_cdf(min(max(p, 1e-6), 1.0 - 1e-6))
