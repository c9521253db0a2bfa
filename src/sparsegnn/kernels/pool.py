r"""Global pooling of a batch of graphs in Triton: one vector per graph (sum, mean or max).

Graph ``b`` owns rows ``ptr[b]:ptr[b+1]`` of ``x``; with :math:`n_b = \mathrm{ptr}_{b+1} - \mathrm{ptr}_b`:

- forward ``_pool_fwd_kernel``, one program per (graph, feature block): the graph's rows in chunks
  of ``BLOCK_N``, accumulated in fp32 lane by lane in a ``[BLOCK_N, BLOCK_F]`` tile and reduced
  over the lanes once at the end,
  :math:`y_b = \sum_i x_i` (sum), :math:`y_b = \frac{1}{n_b} \sum_i x_i` (mean),
  :math:`y_{bf} = \max_i x_{if}` (max; NaN propagates as in ``torch.max``); 0 for an empty graph.
  Max also writes ``arg[b, f]``: the graph-local offset :math:`i - \mathrm{ptr}_b` of the
  *first* row attaining the maximum (the first NaN row where the column has a NaN; -1 for an
  empty graph), so ties give their gradient to one entry, the same one every run.
- backward ``_pool_bwd_kernel``, one program per (graph, feature block), writing every row of
  its graph once: :math:`dx_i = dy_b` (sum), :math:`dy_b / n_b` (mean),
  :math:`dx_{if} = dy_{bf} [i - \mathrm{ptr}_b = \mathrm{arg}_{bf}]` (max).  One more program
  row (``b = B``) writes zeros to the rows ``ptr[B]:N`` that belong to no graph (none when
  ``ptr[B] = N``), so ``dx`` needs no zero fill.

Deterministic (no atomics: each output entry and each row of ``dx`` belongs to one program),
no host syncs (grids come from shapes, never from ``ptr``'s values: CUDA-graph capturable), int64
row offsets.  Graphs must have fewer than 2^31 nodes (``arg`` is int32).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch
from .configs import next_pow2

REDUCE_CODES = {"sum": 0, "mean": 1, "max": 2}

#: Programs (graphs x feature blocks) below which ``pool_config`` narrows the feature blocks.
_TARGET_PROGRAMS = 1024
#: Largest ``BLOCK_N * BLOCK_F`` tile (fp32 values, plus int32 offsets for max).
_MAX_TILE = 4096


@triton.jit
def _pool_fwd_kernel(
    ptr_ptr, x_ptr, out_ptr, arg_ptr, num_feats, stride_xn, stride_xf, stride_out,
    REDUCE: tl.constexpr, WRITE_ARG: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr,
):
    b = tl.program_id(0)
    n0 = tl.load(ptr_ptr + b).to(tl.int64)
    n1 = tl.load(ptr_ptr + b + 1).to(tl.int64)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    col = feat.to(tl.int64)[None, :] * stride_xf
    local = tl.arange(0, BLOCK_N)
    if REDUCE == 2:
        # first chunk peeled: every lane starts at a row offset (padding lanes at offsets >= n_b,
        # value -inf), so a column of -inf values still has an arg, the graph's first row
        row = n0 + local
        mask = (row < n1)[:, None] & feat_mask[None, :]
        best = tl.load(x_ptr + row[:, None] * stride_xn + col, mask=mask, other=float("-inf")).to(tl.float32)
        best_at = tl.zeros([BLOCK_N, BLOCK_F], dtype=tl.int32) + local[:, None]
        for start in range(n0 + BLOCK_N, n1, BLOCK_N):
            row = start + local
            mask = (row < n1)[:, None] & feat_mask[None, :]
            v = tl.load(x_ptr + row[:, None] * stride_xn + col, mask=mask, other=float("-inf")).to(tl.float32)
            # strictly greater: a lane keeps its first row of a tie; a lane's first NaN wins
            take = (v > best) | ((v != v) & (best == best))
            best = tl.where(take, v, best)
            best_at = tl.where(take, (start - n0).to(tl.int32) + local[:, None], best_at)
        is_nan = best != best
        any_nan = tl.max(is_nan.to(tl.int32), axis=0) > 0
        top = tl.max(tl.where(is_nan, float("-inf"), best), axis=0)
        hit = tl.where(any_nan[None, :], is_nan, best == top[None, :])
        at = tl.min(tl.where(hit, best_at, 2147483647), axis=0)        # the first row over all lanes
        top = tl.where(any_nan, float("nan"), top)
        nonempty = n1 > n0
        result = tl.where(nonempty, top, 0.0)
        if WRITE_ARG:
            tl.store(arg_ptr + b.to(tl.int64) * num_feats + feat, tl.where(nonempty, at, -1), mask=feat_mask)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_F], dtype=tl.float32)
        for start in range(n0, n1, BLOCK_N):
            row = start + local
            mask = (row < n1)[:, None] & feat_mask[None, :]
            acc += tl.load(x_ptr + row[:, None] * stride_xn + col, mask=mask, other=0.0).to(tl.float32)
        result = tl.sum(acc, axis=0)
        if REDUCE == 1:
            result = result / tl.maximum(n1 - n0, 1).to(tl.float32)
    tl.store(out_ptr + b.to(tl.int64) * stride_out + feat, result.to(out_ptr.dtype.element_ty), mask=feat_mask)


@triton.jit
def _pool_bwd_kernel(
    ptr_ptr, g_ptr, arg_ptr, dx_ptr, num_graphs, num_rows, num_feats, stride_gb, stride_gf, stride_dx,
    REDUCE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr,
):
    b = tl.program_id(0)
    in_graph = b < num_graphs                      # b = num_graphs: the rows ptr[B]:N of no graph
    n0 = tl.load(ptr_ptr + b).to(tl.int64)
    n1 = tl.load(ptr_ptr + tl.where(in_graph, b + 1, b)).to(tl.int64)
    n1 = tl.where(in_graph, n1, num_rows)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    g_mask = feat_mask & ((feat * 0 + b) < num_graphs)
    g = tl.load(g_ptr + b.to(tl.int64) * stride_gb + feat.to(tl.int64) * stride_gf, mask=g_mask,
                other=0.0).to(tl.float32)
    if REDUCE == 1:
        g = g / tl.maximum(n1 - n0, 1).to(tl.float32)
    if REDUCE == 2:
        at = tl.load(arg_ptr + b.to(tl.int64) * num_feats + feat, mask=g_mask, other=-1)
    local = tl.arange(0, BLOCK_N)
    for start in range(n0, n1, BLOCK_N):
        row = start + local
        mask = (row < n1)[:, None] & feat_mask[None, :]
        if REDUCE == 2:
            val = tl.where(((start - n0).to(tl.int32) + local)[:, None] == at[None, :], g[None, :], 0.0)
        else:
            val = tl.zeros([BLOCK_N, BLOCK_F], dtype=tl.float32) + g[None, :]
        tl.store(dx_ptr + row[:, None] * stride_dx + feat[None, :], val.to(dx_ptr.dtype.element_ty), mask=mask)


def pool_config(num_rows: int, num_graphs: int, num_feats: int) -> Dict[str, int]:
    """Blocks from shapes only (no read of ``ptr``): ``BLOCK_F`` the next power of two >= F in
    16..128, halved down to 32 while the grid has fewer than ``_TARGET_PROGRAMS`` programs;
    ``BLOCK_N`` the next power of two >= the mean graph size ``N / B`` in 8..64 (a graph of the
    mean size is one chunk), capped so the tile holds at most ``_MAX_TILE`` entries; 4 warps
    (8 on a full 4096 tile, 2 below 2048)."""
    block_f = min(128, max(16, next_pow2(num_feats)))
    while block_f > 32 and num_graphs * triton.cdiv(num_feats, block_f) < _TARGET_PROGRAMS:
        block_f //= 2
    mean = triton.cdiv(num_rows, max(num_graphs, 1))
    block_n = min(64, max(8, next_pow2(mean)), max(8, _MAX_TILE // block_f))
    tile = block_n * block_f
    num_warps = 8 if tile >= 4096 else 4 if tile >= 2048 else 2
    return dict(BLOCK_N=block_n, BLOCK_F=block_f, num_warps=num_warps)


def _ptr_for_kernel(ptr: Tensor) -> Tensor:
    """``ptr`` as int32 / int64 (other integer dtypes converted on the device: no sync)."""
    return ptr if ptr.dtype in (torch.int32, torch.int64) else ptr.to(torch.int64)


def pool_forward(x: Tensor, ptr: Tensor, reduce: str, need_arg: bool = True,
                 config: Optional[Dict[str, int]] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """``(out, arg)``: per-graph sum / mean / max of the rows of ``x`` (module doc).

    Args:
        x: [N, F] float32 / float16 / bfloat16, any strides.
        ptr: [B + 1] integer node offsets on ``x``'s device (``ptr[0] = 0``, non-decreasing,
            ``ptr[B] <= N``; not checked here).
        reduce: ``"sum"``, ``"mean"`` or ``"max"``.
        need_arg: for max, also return ``arg`` (else None).
        config: ``BLOCK_N``, ``BLOCK_F`` (powers of two), ``num_warps`` (default ``pool_config``).

    Shapes:
        x: [N, F]; ptr: [B + 1] -> out [B, F] of ``x``'s dtype (fp32 accumulation); arg [B, F]
        int32 graph-local row offsets (-1 for empty graphs) or None.
    """
    num_rows, num_feats = x.shape
    num_graphs = ptr.numel() - 1
    out = torch.empty((num_graphs, num_feats), dtype=x.dtype, device=x.device)
    write_arg = reduce == "max" and need_arg
    arg = torch.empty((num_graphs, num_feats), dtype=torch.int32, device=x.device) if write_arg else None
    if num_graphs == 0 or num_feats == 0:
        return out, arg
    cfg = config or pool_config(num_rows, num_graphs, num_feats)
    grid = (num_graphs, triton.cdiv(num_feats, cfg["BLOCK_F"]))
    launch(_pool_fwd_kernel, grid,
           (_ptr_for_kernel(ptr), x, out, arg if write_arg else out, num_feats, x.stride(0), x.stride(1), out.stride(0)),
           dict(REDUCE=REDUCE_CODES[reduce], WRITE_ARG=write_arg, BLOCK_N=cfg["BLOCK_N"], BLOCK_F=cfg["BLOCK_F"]),
           cfg["num_warps"])
    return out, arg


def pool_backward(grad_out: Tensor, ptr: Tensor, num_rows: int, reduce: str, arg: Optional[Tensor] = None,
                  dtype: Optional[torch.dtype] = None, config: Optional[Dict[str, int]] = None,
                  out: Optional[Tensor] = None) -> Tensor:
    """``dx`` of :func:`pool_forward`: ``dy_b`` (sum), ``dy_b / n_b`` (mean) on every row of
    graph ``b``; max: ``dy_bf`` on row ``ptr[b] + arg[b, f]`` only.  Rows ``ptr[B]:N`` get zeros.
    Every row is written once (no zero fill, no atomics).

    Args:
        grad_out: [B, F] float32 / float16 / bfloat16, any strides (an expanded gradient is fine).
        ptr: [B + 1] integer node offsets (as in the forward).
        num_rows: ``N``, the rows of ``x``.
        reduce: ``"sum"``, ``"mean"`` or ``"max"`` (then ``arg`` from the forward is required).
        dtype: of ``dx`` (default ``grad_out``'s).
        config: as in :func:`pool_forward` (default ``pool_config``).
        out: optional contiguous [N, F] output of ``dtype`` (every row overwritten).

    Shapes:
        grad_out: [B, F]; ptr: [B + 1]; arg: [B, F] int32 -> [N, F].
    """
    num_graphs, num_feats = grad_out.shape
    dx = out if out is not None else torch.empty((num_rows, num_feats), dtype=dtype or grad_out.dtype,
                                                 device=grad_out.device)
    if num_rows == 0 or num_feats == 0:
        return dx
    if num_graphs == 0:
        return dx.zero_()
    if reduce == "max" and arg is None:
        raise ValueError("pool_backward(): reduce='max' needs the forward's arg")
    cfg = config or pool_config(num_rows, num_graphs, num_feats)
    grid = (num_graphs + 1, triton.cdiv(num_feats, cfg["BLOCK_F"]))
    launch(_pool_bwd_kernel, grid,
           (_ptr_for_kernel(ptr), grad_out, arg if arg is not None else grad_out, dx, num_graphs, num_rows, num_feats,
            grad_out.stride(0), grad_out.stride(1), dx.stride(0)),
           dict(REDUCE=REDUCE_CODES[reduce], BLOCK_N=cfg["BLOCK_N"], BLOCK_F=cfg["BLOCK_F"]),
           cfg["num_warps"])
    return dx
