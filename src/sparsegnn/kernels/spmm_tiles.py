"""Tensor-core SpMM and SDDMM on condensed tiles (TC-GNN; ``formats/tiles.py``).

One program per (row window, feature block): for each of the window's blocks ``b`` it gathers
the ``K`` source rows ``X[cols_b, f]`` once and accumulates ``tile_b [W, K] @ X[cols_b] [K, BF]``
with ``tl.dot`` (tensor cores on the GPU), fp32 accumulation.  ``precision`` picks ``tl.dot``'s
input precision for the fp32 operands: ``"ieee"`` (exact fp32), ``"tf32"``.  Half-precision
features are widened to fp32 in registers (the bytes moved are halved; the tile values stay fp32).

Reached through ``ops/tiles.py``: a reduced-precision SpMM (``precision="tf32"`` or ``"bf16"``,
``ops.tiles.spmm_precise``) runs on these kernels where they are the fastest (measurements:
``docs/design/tensor-cores.md``).
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
def _item(item_window_ptr, item_start_ptr, item_end_ptr, item_split_ptr, W: tl.constexpr):
    """``(window, first block, end block, split, rows [W])`` of this program's work item."""
    item = tl.program_id(0)
    win = tl.load(item_window_ptr + item)
    return (win, tl.load(item_start_ptr + item), tl.load(item_end_ptr + item), tl.load(item_split_ptr + item),
            win * W + tl.arange(0, W))


@triton.jit
def _store_rows(out_ptr, acc, rows, num_rows, feat, feat_mask, stride_out, split, SWAP: tl.constexpr):
    """The item's ``acc`` (``[BF, W]`` with ``SWAP``, else ``[W, BF]``) into its rows: stored, or
    added with atomics where the window is spread over several items (rows zeroed first)."""
    if SWAP:
        mask = (rows < num_rows)[None, :] & feat_mask[:, None]
        ptrs = out_ptr + rows[None, :] * stride_out + feat[:, None]
    else:
        mask = (rows < num_rows)[:, None] & feat_mask[None, :]
        ptrs = out_ptr + rows[:, None] * stride_out + feat[None, :]
    if split != 0:
        tl.atomic_add(ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _spmm_tiles_kernel(
    item_window_ptr, item_start_ptr, item_end_ptr, item_split_ptr, cols_ptr, vals_ptr, x_ptr, out_ptr,
    num_rows, num_feats, stride_x, stride_out,
    W: tl.constexpr, K: tl.constexpr, BLOCK_F: tl.constexpr, PRECISION: tl.constexpr,
    NATIVE: tl.constexpr, SWAP: tl.constexpr,
):
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    r = tl.arange(0, W)
    k = tl.arange(0, K)
    win, start, end, split, rows = _item(item_window_ptr, item_start_ptr, item_end_ptr, item_split_ptr, W)
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
    _store_rows(out_ptr, acc, rows, num_rows, feat, feat_mask, stride_out, split, SWAP)


@triton.jit
def _spmm_runs_kernel(
    item_window_ptr, item_start_ptr, item_end_ptr, item_split_ptr, window_ptr_ptr, rowptr_ptr, cols_ptr, slots_ptr,
    evals_ptr, x_ptr, out_ptr, num_rows, num_feats, stride_x, stride_out, steps,
    W: tl.constexpr, K: tl.constexpr, BLOCK_F: tl.constexpr, PRECISION: tl.constexpr,
    NATIVE: tl.constexpr, SWAP: tl.constexpr, HAS_VALS: tl.constexpr,
):
    """``_spmm_tiles_kernel`` on the runs encoding (``formats.tiles.TileGraph``, rows with sorted
    columns): each tile is built in registers from the edges' slots and values in CSR order.
    Row ``r`` keeps ``p_r``, its first edge not yet in a tile; at block ``b`` its next ``K``
    edges are the candidates, those with ``slot / (W K) = b`` (a prefix) are the row's edges in
    ``b``, at tile column ``slot mod K``:

        tile[r, k] = sum over those edges e with slot_e mod K = k of evals[e],   p_r += their count,

    again with the next ``K`` while a row's last candidate was still in ``b`` (duplicate edges:
    more than ``K`` edges in one block row).  An item starting mid-window finds ``p_r`` by
    binary search (``steps``: log2 of the longest row) for the row's first slot in its first
    block.  Bytes a block: the candidates' slots (8 each, mostly cached: ``p_r`` moves by the
    row's edges in the block) and the values of its edges, against ``4 W K`` for a dense fp32
    tile; work: a ``[W, K, K]`` one-hot sum on CUDA cores."""
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    k = tl.arange(0, K)
    win, start, end, split, rows = _item(item_window_ptr, item_start_ptr, item_end_ptr, item_split_ptr, W)
    p = tl.load(rowptr_ptr + tl.minimum(rows, num_rows))                               # [W] int64
    row_end = tl.load(rowptr_ptr + tl.minimum(rows + 1, num_rows))
    if start > tl.load(window_ptr_ptr + win):
        target = start * (W * K)                # the first slot of block `start`
        hi = row_end
        for _ in range(steps):
            open_ = p < hi
            mid = (p + hi) // 2
            v = tl.load(slots_ptr + mid, mask=open_, other=0)
            p = tl.where(open_ & (v < target), mid + 1, p)
            hi = tl.where(open_ & (v >= target), mid, hi)
    if SWAP:
        acc = tl.zeros([BLOCK_F, W], dtype=tl.float32)
    else:
        acc = tl.zeros([W, BLOCK_F], dtype=tl.float32)
    for b in range(start, end):
        cols = tl.load(cols_ptr + b * K + k)                                           # [K]
        tile = tl.zeros([W, K], dtype=tl.float32)
        more = tl.full([], 1, tl.int32)
        while more != 0:
            cand = p[:, None] + k[None, :]                                             # [W, K] candidates
            slot = tl.load(slots_ptr + cand, mask=cand < row_end[:, None], other=-1)
            inside = (slot >= 0) & (slot // (W * K) == b)
            if HAS_VALS:
                val = tl.load(evals_ptr + cand, mask=inside, other=0.0).to(tl.float32)
            else:
                val = inside.to(tl.float32)
            hit = inside[:, :, None] & ((slot & (K - 1))[:, :, None] == k[None, None, :])   # [W, cand, K]
            tile += tl.sum(tl.where(hit, val[:, :, None], 0.0), 1)
            p += tl.sum(inside.to(tl.int64), 1)
            more = tl.max(tl.sum(inside.to(tl.int32), 1) // K, 0)     # a row's K candidates all in b
        if SWAP:
            tile = tl.trans(tile)                                                      # [K, W]
            xs = tl.load(x_ptr + cols[None, :] * stride_x + feat[:, None], mask=feat_mask[:, None],
                         other=0.0)                                                    # [BF, K]
            if NATIVE:
                acc += tl.dot(xs, tile.to(xs.dtype))
            else:
                acc += tl.dot(xs.to(tl.float32), tile, input_precision=PRECISION)
        else:
            xs = tl.load(x_ptr + cols[:, None] * stride_x + feat[None, :], mask=feat_mask[None, :],
                         other=0.0)                                                    # [K, BF]
            if NATIVE:
                acc += tl.dot(tile.to(xs.dtype), xs)
            else:
                acc += tl.dot(tile, xs.to(tl.float32), input_precision=PRECISION)
    _store_rows(out_ptr, acc, rows, num_rows, feat, feat_mask, stride_out, split, SWAP)


ENCODINGS = ("dense", "runs")


class TileLaunch:
    """A tile SpMM prepared once for a graph's tiles, tile values and launch config: calling it
    with features ``x`` costs one allocation and one launch (plus the zeroing of the rows of
    windows spread over several items).  See :func:`spmm_tiles` for the arguments."""

    def __init__(self, tiles, values: Optional[Tensor], dtype: torch.dtype, num_feats: int,
                 precision: str = "tf32", block_f: Optional[int] = None, swap: bool = False, num_warps: int = 4,
                 num_stages: Optional[int] = None, chunk: int = 16, encoding: str = "dense") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"spmm_tiles(): precision must be one of {PRECISIONS}, got {precision!r}")
        if encoding not in ENCODINGS:
            raise ValueError(f"spmm_tiles(): encoding must be one of {ENCODINGS}, got {encoding!r}")
        half = dtype in (torch.float16, torch.bfloat16)
        self.runs = encoding == "runs"
        if self.runs:
            if not tiles.ordered:
                raise ValueError("spmm_tiles(): encoding='runs' needs rows with sorted columns "
                                 "(TileGraph.ordered); use encoding='dense'")
            if values is not None and values.shape != tiles.edge_index.shape:
                raise ValueError(f"spmm_tiles(): with encoding='runs', values are one per edge in CSR order, "
                                 f"shape {tuple(tiles.edge_index.shape)}; got {tuple(values.shape)}")
            native = half and (values is None or values.dtype == dtype)
            if values is not None:
                values = values if native else values.to(torch.float32)
        else:
            vals = tiles.block_vals if values is None else values
            native = half and vals.dtype == dtype
            values = vals if native else vals.to(torch.float32)
        if native and dtype == torch.bfloat16 and interpreting():
            native = False  # the Triton 3.6 interpreter's tl.dot misreads bf16 operands (fp16 is fine)
            values = None if values is None else values.to(torch.float32)
        self.vals = None if values is None else values.contiguous()
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
        if self.runs:
            self.constexprs["HAS_VALS"] = self.vals is not None
            self.steps = self.sched.max_row.bit_length()
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
        sched, tiles = self.sched, self.tiles
        items = (sched.item_window, sched.item_start, sched.item_end, sched.item_split)
        sizes = (x, target, tiles.num_rows, self.num_feats, x.stride(0), target.stride(0))
        if self.runs:
            vals = self.vals if self.vals is not None else tiles.edge_index   # (never read without values)
            launch(_spmm_runs_kernel, self.grid,
                   (*items, tiles.window_ptr, tiles.rowptr, tiles.block_cols, tiles.edge_index, vals, *sizes,
                    self.steps), self.constexprs, self.num_warps, self.num_stages)
        else:
            launch(_spmm_tiles_kernel, self.grid, (*items, tiles.block_cols, self.vals, *sizes),
                   self.constexprs, self.num_warps, self.num_stages)
        if target is not out:
            out.copy_(target)
        return out


def spmm_tiles(tiles, x: Tensor, values: Optional[Tensor] = None, precision: str = "tf32",
               block_f: Optional[int] = None, swap: bool = False, num_warps: int = 4,
               num_stages: Optional[int] = None, chunk: int = 16, encoding: str = "dense") -> Tensor:
    """``out = A x`` on a :class:`~sparsegnn.formats.tiles.TileGraph` (sum aggregation).

    ``out[w W + r] = sum_b tile_b[r, :] @ X[cols_b]`` over the blocks ``b`` of window ``w``,
    computed by work items of at most ``chunk`` blocks (``TileGraph.schedule``): a window
    spread over several items is accumulated with atomics (fp32) into rows zeroed first.

    Args:
        tiles: the translated graph.
        x: ``[M, F]`` float32 / float16 / bfloat16 source features.
        values: with ``encoding="dense"``, ``[B, W, K]`` tile values (default ``tiles.block_vals``;
            ``tiles.tiles_of(w)`` for other edge values); with ``"runs"``, ``[E]`` edge values
            in CSR order (None: ones).  fp32 values with fp32 features: ``tl.dot`` in
            ``precision``.  Values of ``x``'s half dtype with half features: a native half
            ``tl.dot`` (fp32 accumulation; half the value bytes).  Any other mix: both widened to fp32.
        precision: ``"ieee"`` (exact fp32 products) or ``"tf32"`` (fp32 operands only).
        block_f: features per program (default: up to 64, at least 16).
        swap: compute ``out^T = X^T A^T`` tile by tile (features on the MMA's M side).
        num_warps, num_stages: launch options.
        chunk: at most this many blocks per program.
        encoding: ``"dense"`` (tile values read from ``[B, W, K]``) or ``"runs"`` (each tile built
            in registers from ``tiles.edge_index`` and the edge values in CSR order; needs
            ``tiles.ordered``; see ``formats.tiles.TileGraph``).

    Returns:
        ``[N, F]`` of ``x``'s dtype.

    Shapes:
        x: [M, F] -> [N, F].
    """
    return TileLaunch(tiles, values, x.dtype, x.shape[1], precision, block_f, swap, num_warps, num_stages, chunk,
                      encoding)(x)


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
