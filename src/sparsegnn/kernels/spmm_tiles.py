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

from ._launch import launch

PRECISIONS = ("ieee", "tf32")


@triton.jit
def _spmm_tiles_kernel(
    window_ptr_ptr, cols_ptr, vals_ptr, x_ptr, out_ptr, num_rows, num_feats, stride_x, stride_out,
    W: tl.constexpr, K: tl.constexpr, BLOCK_F: tl.constexpr, PRECISION: tl.constexpr,
):
    win = tl.program_id(0)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    r = tl.arange(0, W)
    k = tl.arange(0, K)
    start = tl.load(window_ptr_ptr + win)
    end = tl.load(window_ptr_ptr + win + 1)
    acc = tl.zeros([W, BLOCK_F], dtype=tl.float32)
    for b in range(start, end):
        cols = tl.load(cols_ptr + b * K + k)                                               # [K]
        xs = tl.load(x_ptr + cols[:, None] * stride_x + feat[None, :], mask=feat_mask[None, :],
                     other=0.0).to(tl.float32)                                             # [K, BF]
        tile = tl.load(vals_ptr + b * (W * K) + r[:, None] * K + k[None, :])               # [W, K]
        acc += tl.dot(tile, xs, input_precision=PRECISION)
    rows = win.to(tl.int64) * W + r
    mask = (rows < num_rows)[:, None] & feat_mask[None, :]
    tl.store(out_ptr + rows[:, None] * stride_out + feat[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


def spmm_tiles(tiles, x: Tensor, values: Optional[Tensor] = None, precision: str = "tf32",
               block_f: Optional[int] = None) -> Tensor:
    """``out = A x`` on a :class:`~sparsegnn.formats.tiles.TileGraph` (sum aggregation).

    Args:
        tiles: the translated graph.
        x: ``[M, F]`` float32 / float16 / bfloat16 source features.
        values: ``[B, W, K]`` fp32 tile values (default ``tiles.block_vals``; ``tiles.tiles_of(w)``
            for other edge values).
        precision: ``"ieee"`` (exact fp32 products) or ``"tf32"``.
        block_f: features per program (default: up to 64, at least 16).

    Returns:
        ``[N, F]`` of ``x``'s dtype.

    Shapes:
        x: [M, F] -> [N, F].
    """
    if precision not in PRECISIONS:
        raise ValueError(f"spmm_tiles(): precision must be one of {PRECISIONS}, got {precision!r}")
    x = x.contiguous()
    vals = (tiles.block_vals if values is None else values).to(torch.float32).contiguous()
    num_feats = x.shape[1]
    out = torch.empty((tiles.num_rows, num_feats), dtype=x.dtype, device=x.device)
    windows = tiles.window_ptr.numel() - 1
    if tiles.num_rows == 0 or num_feats == 0:
        return out
    if tiles.num_blocks == 0:
        return out.zero_()
    block_f = block_f or min(max(triton.next_power_of_2(num_feats), 16), 64)
    launch(_spmm_tiles_kernel, (windows, triton.cdiv(num_feats, block_f)),
           (tiles.window_ptr, tiles.block_cols, vals, x, out, tiles.num_rows, num_feats, x.stride(0), out.stride(0)),
           dict(W=tiles.window, K=tiles.block_k, BLOCK_F=block_f, PRECISION=precision), 4)
    return out


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
