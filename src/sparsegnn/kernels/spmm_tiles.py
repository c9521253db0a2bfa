"""Tensor-core SpMM and SDDMM on condensed tiles (TC-GNN; ``formats/tiles.py``), first versions.

One program per (row window, feature block): for each of the window's blocks ``b`` it gathers
the ``K`` source rows ``X[cols_b, f]`` once and accumulates ``tile_b [W, K] @ X[cols_b] [K, BF]``
with ``tl.dot`` (tensor cores on the GPU), fp32 accumulation.  ``precision`` picks ``tl.dot``'s
input precision for the fp32 operands: ``"ieee"`` (exact fp32), ``"tf32"``.  Half-precision
features are widened to fp32 in registers (the bytes moved are halved; the tile values stay fp32).

Not yet dispatched by ``backend="auto"`` (issue 9: the H100 measurements decide where it wins).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import interpreting
from ._launch import launch

PRECISIONS = ("ieee", "tf32")


@triton.jit
def _spmm_tiles_kernel(
    item_window_ptr, item_start_ptr, item_end_ptr, item_split_ptr, cols_ptr, vals_ptr, x_ptr, out_ptr,
    num_rows, num_feats, stride_x, stride_out,
    W: tl.constexpr, K: tl.constexpr, BLOCK_F: tl.constexpr, PRECISION: tl.constexpr,
    NATIVE: tl.constexpr, SWAP: tl.constexpr,
):
    item = tl.program_id(0)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    r = tl.arange(0, W)
    k = tl.arange(0, K)
    win = tl.load(item_window_ptr + item)
    start = tl.load(item_start_ptr + item)
    end = tl.load(item_end_ptr + item)
    split = tl.load(item_split_ptr + item)
    rows = win * W + r
    if SWAP:
        # out^T [BF, W] = X[cols]^T [BF, K] @ tile^T [K, W]: the feature side on the MMA's M
        acc = tl.zeros([BLOCK_F, W], dtype=tl.float32)
        for b in range(start, end):
            cols = tl.load(cols_ptr + b * K + k)                                           # [K]
            xs = tl.load(x_ptr + cols[None, :] * stride_x + feat[:, None], mask=feat_mask[:, None],
                         other=0.0)                                                        # [BF, K]
            tile = tl.load(vals_ptr + b * (W * K) + r[None, :] * K + k[:, None])           # [K, W]
            if NATIVE:
                acc += tl.dot(xs, tile)
            else:
                acc += tl.dot(xs.to(tl.float32), tile.to(tl.float32), input_precision=PRECISION)
        mask = (rows < num_rows)[None, :] & feat_mask[:, None]
        ptrs = out_ptr + rows[None, :] * stride_out + feat[:, None]
    else:
        acc = tl.zeros([W, BLOCK_F], dtype=tl.float32)
        for b in range(start, end):
            cols = tl.load(cols_ptr + b * K + k)                                           # [K]
            xs = tl.load(x_ptr + cols[:, None] * stride_x + feat[None, :], mask=feat_mask[None, :],
                         other=0.0)                                                        # [K, BF]
            tile = tl.load(vals_ptr + b * (W * K) + r[:, None] * K + k[None, :])           # [W, K]
            if NATIVE:
                acc += tl.dot(tile, xs)
            else:
                acc += tl.dot(tile.to(tl.float32), xs.to(tl.float32), input_precision=PRECISION)
        mask = (rows < num_rows)[:, None] & feat_mask[None, :]
        ptrs = out_ptr + rows[:, None] * stride_out + feat[None, :]
    if split != 0:   # the window is spread over several items: accumulate into the zeroed rows
        tl.atomic_add(ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


class TileLaunch:
    """A tile SpMM prepared once for a graph's tiles, tile values and launch config: calling it
    with features ``x`` costs one allocation and one launch (plus the zeroing of the rows of
    windows spread over several items).  See :func:`spmm_tiles` for the arguments."""

    def __init__(self, tiles, values: Optional[Tensor], dtype: torch.dtype, num_feats: int,
                 precision: str = "tf32", block_f: Optional[int] = None, swap: bool = False, num_warps: int = 4,
                 num_stages: Optional[int] = None, chunk: int = 16) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"spmm_tiles(): precision must be one of {PRECISIONS}, got {precision!r}")
        vals = tiles.block_vals if values is None else values
        native = dtype in (torch.float16, torch.bfloat16) and vals.dtype == dtype
        if native and dtype == torch.bfloat16 and interpreting():
            native = False  # the Triton 3.6 interpreter's tl.dot misreads bf16 operands (fp16 is fine)
        self.vals = (vals if native else vals.to(torch.float32)).contiguous()
        self.tiles, self.dtype, self.num_feats = tiles, dtype, num_feats
        self.empty = tiles.num_rows == 0 or num_feats == 0 or tiles.num_blocks == 0
        if self.empty:
            return
        self.sched = tiles.schedule(chunk)
        self.split_rows = self.sched.split_rows if self.sched.split_rows.numel() else None
        block_f = block_f or min(max(triton.next_power_of_2(num_feats), 16), 64)
        self.grid = (self.sched.num_items, triton.cdiv(num_feats, block_f))
        self.constexprs = dict(W=tiles.window, K=tiles.block_k, BLOCK_F=block_f, PRECISION=precision,
                               NATIVE=native, SWAP=bool(swap))
        self.num_warps, self.num_stages = num_warps, num_stages

    def __call__(self, x: Tensor) -> Tensor:
        x = x.contiguous()
        out = torch.empty((self.tiles.num_rows, self.num_feats), dtype=x.dtype, device=x.device)
        if self.empty:
            return out if self.tiles.num_rows == 0 or self.num_feats == 0 else out.zero_()
        target = out
        if self.split_rows is not None:
            # atomics need fp32 rows; half outputs go through an fp32 buffer
            if x.dtype != torch.float32:
                target = torch.empty(out.shape, dtype=torch.float32, device=x.device)
            target.index_fill_(0, self.split_rows, 0.0)
        sched = self.sched
        launch(_spmm_tiles_kernel, self.grid,
               (sched.item_window, sched.item_start, sched.item_end, sched.item_split, self.tiles.block_cols,
                self.vals, x, target, self.tiles.num_rows, self.num_feats, x.stride(0), target.stride(0)),
               self.constexprs, self.num_warps, self.num_stages)
        if target is not out:
            out.copy_(target)
        return out


def spmm_tiles(tiles, x: Tensor, values: Optional[Tensor] = None, precision: str = "tf32",
               block_f: Optional[int] = None, swap: bool = False, num_warps: int = 4,
               num_stages: Optional[int] = None, chunk: int = 16) -> Tensor:
    """``out = A x`` on a :class:`~sparsegnn.formats.tiles.TileGraph` (sum aggregation).

    ``out[w W + r] = sum_b tile_b[r, :] @ X[cols_b]`` over the blocks ``b`` of window ``w``,
    computed by work items of at most ``chunk`` blocks (``TileGraph.schedule``): a window
    spread over several items is accumulated with atomics (fp32) into rows zeroed first.

    Args:
        tiles: the translated graph.
        x: ``[M, F]`` float32 / float16 / bfloat16 source features.
        values: ``[B, W, K]`` tile values (default ``tiles.block_vals``; ``tiles.tiles_of(w)``
            for other edge values).  fp32 values with fp32 features: ``tl.dot`` in ``precision``.
            Values of ``x``'s half dtype with half features: a native half ``tl.dot`` (fp32
            accumulation; half the tile bytes).  Any other mix: both widened to fp32.
        precision: ``"ieee"`` (exact fp32 products) or ``"tf32"`` (fp32 operands only).
        block_f: features per program (default: up to 64, at least 16).
        swap: compute ``out^T = X^T A^T`` tile by tile (features on the MMA's M side).
        num_warps, num_stages: launch options.
        chunk: at most this many blocks per program.

    Returns:
        ``[N, F]`` of ``x``'s dtype.

    Shapes:
        x: [M, F] -> [N, F].
    """
    return TileLaunch(tiles, values, x.dtype, x.shape[1], precision, block_f, swap, num_warps, num_stages, chunk)(x)


@triton.jit
def _sddmm_tiles_kernel(
    block_window_ptr, cols_ptr, a_ptr, b_ptr, out_ptr, num_rows, num_feats, stride_a, stride_b,
    W: tl.constexpr, K: tl.constexpr, BLOCK_F: tl.constexpr, PRECISION: tl.constexpr,
):
    blk = tl.program_id(0)
    win = tl.load(block_window_ptr + blk)
    r = tl.arange(0, W)
    k = tl.arange(0, K)
    rows = win.to(tl.int64) * W + r
    row_mask = rows < num_rows
    cols = tl.load(cols_ptr + blk * K + k)
    acc = tl.zeros([W, K], dtype=tl.float32)
    for f0 in range(0, num_feats, BLOCK_F):
        feat = f0 + tl.arange(0, BLOCK_F)
        feat_mask = feat < num_feats
        lhs = tl.load(a_ptr + rows[:, None] * stride_a + feat[None, :], mask=row_mask[:, None] & feat_mask[None, :],
                      other=0.0).to(tl.float32)                                           # [W, BF]
        rhs = tl.load(b_ptr + cols[None, :] * stride_b + feat[:, None], mask=feat_mask[:, None],
                      other=0.0).to(tl.float32)                                           # [BF, K]
        acc += tl.dot(lhs, rhs, input_precision=PRECISION)
    tl.store(out_ptr + blk * (W * K) + r[:, None] * K + k[None, :], acc)


def sddmm_tiles(tiles, a: Tensor, b: Tensor, precision: str = "tf32", block_f: int = 32) -> Tensor:
    """``out[e] = <a_i, b_j>`` for every edge ``e: j -> i``, tile by tile: one
    ``[W, F] @ [F, K]`` product per block (every position of the tile, then the edges' positions
    gathered).  Duplicate edges get the same value each.

    Shapes:
        a: [N, F] targets; b: [M, F] sources -> [E] fp32 in CSR order.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"sddmm_tiles(): precision must be one of {PRECISIONS}, got {precision!r}")
    a, b = a.contiguous(), b.contiguous()
    num_edges = tiles.edge_index.numel()
    if num_edges == 0 or tiles.num_blocks == 0:
        return torch.zeros(num_edges, dtype=torch.float32, device=a.device)
    dense = torch.empty(tiles.num_blocks * tiles.window * tiles.block_k, dtype=torch.float32, device=a.device)
    launch(_sddmm_tiles_kernel, (tiles.num_blocks,),
           (tiles.block_window, tiles.block_cols, a, b, dense, tiles.num_rows, a.shape[1], a.stride(0), b.stride(0)),
           dict(W=tiles.window, K=tiles.block_k, BLOCK_F=block_f, PRECISION=precision), 4)
    return dense.index_select(0, tiles.edge_index)
