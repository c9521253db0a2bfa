"""Sparse graph translation's index work in four small launches (``formats/tiles.py`` holds the
reference and the definitions; ``ops/tiles.py`` passes :func:`condense` to ``translate``).

Keys ``key_e = (row_e >> log2 W) * M + col_e`` (window, column) are made unique and sorted by
``torch.unique`` (keys only); then, with ``u`` the sorted distinct keys, window ``w`` owning keys
``bounds[w] .. bounds[w+1]`` (``bounds[w]`` = first key ``>= w M``, found by binary search):

    window_ptr = [0, cumsum(ceil((bounds[w+1] - bounds[w]) / K))]
    pos_i      = window_ptr[w_i] K + (i - bounds[w_i])          (flat slot: block * K + column)
    block_cols[pos_i] = u_i mod M;  block_window[pos_i / K] = w_i where (i - bounds[w_i]) mod K = 0
    edge_index_e = base[i_e] + (row_e mod W) K,  base_i = pos_i + (pos_i / K)(W - 1) K,
    i_e = the index of key_e in u, by binary search within its window's keys

Why: done with tensor ops this is about 30 ops and ~70 kernel launches, whose host time (9-19
us per launch on the H100 host) made translation cost more than a GCN training epoch; the GPU
work is ~0.2 ms.  Here: one launch before the sort, three after it, plus the sort's own, a
``cumsum`` and three allocations (30 kernels in all with int32 keys, 38 with int64, ``torch.unique``'s
included).
"""
from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch

BLOCK = 1024
#: Windows per program of the binary searches: one per thread (4 warps), so that the ~2 log2(keys)
#: dependent loads of each run side by side (1024 per program: 0.08 ms on amazon0505's 26k windows).
WINDOW_BLOCK = 128


@triton.jit
def _key_kernel(row_ptr, col_ptr, key_ptr, num_edges, span, SHIFT_W: tl.constexpr, BLOCK: tl.constexpr):
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = e < num_edges
    row = tl.load(row_ptr + e, mask=mask, other=0).to(tl.int64)
    col = tl.load(col_ptr + e, mask=mask, other=0).to(tl.int64)
    key = (row >> SHIFT_W) * span + col
    tl.store(key_ptr + e, key.to(key_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _lower_bound(keys_ptr, num_keys, target, mask, steps):
    """First index whose key is ``>= target`` (``num_keys`` if none), per lane."""
    lo = tl.zeros(target.shape, dtype=tl.int64)
    hi = tl.zeros(target.shape, dtype=tl.int64) + num_keys
    for _ in range(steps):
        open_ = mask & (lo < hi)
        mid = (lo + hi) // 2
        v = tl.load(keys_ptr + mid, mask=open_, other=0).to(tl.int64)
        right = open_ & (v < target)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(open_ & (v >= target), mid, hi)
    return lo


@triton.jit
def _window_kernel(keys_ptr, bounds_ptr, blocks_ptr, num_keys, num_windows, span, steps,
                   BLOCK_K: tl.constexpr, BLOCK: tl.constexpr):
    w = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = w <= num_windows
    first = _lower_bound(keys_ptr, num_keys, w * span, mask, steps)
    last = _lower_bound(keys_ptr, num_keys, (w + 1) * span, mask & (w < num_windows), steps)
    tl.store(bounds_ptr + w, first, mask=mask)
    tl.store(blocks_ptr + w, (last - first + BLOCK_K - 1) // BLOCK_K, mask=w < num_windows)


@triton.jit
def _slot_kernel(keys_ptr, bounds_ptr, window_ptr_ptr, block_cols_ptr, block_window_ptr, base_ptr, num_keys, span,
                 WINDOW: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < num_keys
    key = tl.load(keys_ptr + i, mask=mask, other=0).to(tl.int64)
    w = key // span
    rank = i - tl.load(bounds_ptr + w, mask=mask, other=0)
    pos = tl.load(window_ptr_ptr + w, mask=mask, other=0) * BLOCK_K + rank
    tl.store(block_cols_ptr + pos, key - w * span, mask=mask)
    tl.store(block_window_ptr + pos // BLOCK_K, w, mask=mask & (rank % BLOCK_K == 0))
    tl.store(base_ptr + i, pos + (pos // BLOCK_K) * ((WINDOW - 1) * BLOCK_K), mask=mask)


@triton.jit
def _edge_kernel(key_ptr, keys_ptr, bounds_ptr, row_ptr, base_ptr, edge_index_ptr, num_edges, steps,
                 SHIFT_W: tl.constexpr, WINDOW: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK: tl.constexpr):
    """Each edge finds its key among its window's keys (``bounds[w] .. bounds[w+1]``: a short,
    contiguous range) by binary search: no inverse from the sort.  ``steps`` covers the whole key
    list (log2 of it); a lane stops loading once its window's range is searched."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = e < num_edges
    key = tl.load(key_ptr + e, mask=mask, other=0).to(tl.int64)
    row = tl.load(row_ptr + e, mask=mask, other=0).to(tl.int64)
    w = row >> SHIFT_W
    lo = tl.load(bounds_ptr + w, mask=mask, other=0)
    hi = tl.load(bounds_ptr + w + 1, mask=mask, other=0)
    for _ in range(steps):
        open_ = mask & (lo < hi)
        mid = (lo + hi) // 2
        v = tl.load(keys_ptr + mid, mask=open_, other=0).to(tl.int64)
        lo = tl.where(open_ & (v < key), mid + 1, lo)
        hi = tl.where(open_ & (v >= key), mid, hi)
    base = tl.load(base_ptr + lo, mask=mask, other=0)
    tl.store(edge_index_ptr + e, base + (row % WINDOW) * BLOCK_K, mask=mask)


def condense(row: Tensor, col: Tensor, num_src: int, num_windows: int, window: int,
             block_k: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(window_ptr, block_window, block_cols, edge_index)`` of the condensed tiles of
    ``num_windows`` row windows (the definitions of ``formats.tiles.translate``; module doc).

    Args:
        row, col: ``[E]`` target and source of every edge (any order; CUDA, or CPU under
            ``TRITON_INTERPRET=1``).
        num_src: ``M``; num_windows: ``ceil(N / W)``; window, block_k: ``W``, ``K`` (powers of two).

    Shapes:
        row, col: [E] -> window_ptr [num_windows + 1], block_window [B], block_cols [B, K],
        edge_index [E]; all int64.

    Two host syncs: ``torch.unique``'s size and the block count.  Deterministic (no atomics).
    """
    device = row.device
    row, col = row.contiguous(), col.contiguous()     # the kernels index them with stride 1
    num_edges = row.numel()
    span = max(int(num_src), 1)
    wide = num_windows * span >= 2 ** 31
    key = torch.empty(num_edges, dtype=torch.int64 if wide else torch.int32, device=device)
    if num_edges:
        launch(_key_kernel, (triton.cdiv(num_edges, BLOCK),), (row, col, key, num_edges, span),
               dict(SHIFT_W=window.bit_length() - 1, BLOCK=BLOCK), 4)
    keys = torch.unique(key, sorted=True)       # keys only: no payload in the radix sort, no inverse
    num_keys = keys.numel()
    bounds = torch.empty(num_windows + 1, dtype=torch.int64, device=device)
    blocks = torch.zeros(num_windows + 1, dtype=torch.int64, device=device)   # [0, blocks of each window]
    launch(_window_kernel, (triton.cdiv(num_windows + 1, WINDOW_BLOCK),),
           (keys, bounds, blocks[1:], num_keys, num_windows, span, num_keys.bit_length()),
           dict(BLOCK_K=block_k, BLOCK=WINDOW_BLOCK), 4)
    window_ptr = torch.cumsum(blocks, 0)
    num_blocks = int(window_ptr[-1]) if num_windows else 0
    block_cols = torch.zeros((num_blocks, block_k), dtype=torch.int64, device=device)
    block_window = torch.empty(num_blocks, dtype=torch.int64, device=device)
    base = torch.empty(num_keys, dtype=torch.int64, device=device)
    edge_index = torch.empty(num_edges, dtype=torch.int64, device=device)
    if num_keys:
        launch(_slot_kernel, (triton.cdiv(num_keys, BLOCK),),
               (keys, bounds, window_ptr, block_cols, block_window, base, num_keys, span),
               dict(WINDOW=window, BLOCK_K=block_k, BLOCK=BLOCK), 4)
        launch(_edge_kernel, (triton.cdiv(num_edges, BLOCK),),
               (key, keys, bounds, row, base, edge_index, num_edges, num_keys.bit_length()),
               dict(SHIFT_W=window.bit_length() - 1, WINDOW=window, BLOCK_K=block_k, BLOCK=BLOCK), 4)
    return window_ptr, block_window, block_cols, edge_index
