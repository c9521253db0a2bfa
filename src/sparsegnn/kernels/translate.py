"""Sparse graph translation's index work in Triton (``formats/tiles.py`` holds the reference
and the definitions; ``ops/tiles.py`` passes :func:`condense` to ``translate``).

**Per window** (the common case: every window holds at most ``CAPS[-1]`` edges).  The CSR
order puts window ``w``'s edges at ``rowptr[w W] .. rowptr[(w + 1) W]``, so one program per
window sorts them in registers, ``(col, local edge) -> col * CAP + local`` with ``tl.sort``
(int32 where it fits), marks the first edge of each column run (``tl.gather`` of the left
neighbour) and numbers the runs (``rank``, ``tl.cumsum`` of the marks); per edge it stores
``code = 2 rank + first``.  With ``c_w`` distinct columns, then one pass over the edges:

    blocks_w   = ceil(c_w / K);  window_ptr = [0, cumsum(blocks_w)]
    edge_index_e = (window_ptr[w] + rank / K) W K + (row_e mod W) K + rank mod K
    block_cols[window_ptr[w] K + rank] = col_e  (first edges of a run; 0 past c_w)

The sorting pass is launched once per size class of windows (``CAPS``: a window of 40 edges
sorts 64 lanes, not 1024), every program of other classes returning at once.  Two host syncs:
the largest window (which classes to launch) and the block count.

**Sorted keys** (a window over ``CAPS[-1]`` edges, or ``K > CAPS[0]``): keys
``key_e = (row_e >> log2 W) * M + col_e`` made unique and sorted by ``torch.unique`` (keys
only); then, with ``u`` the sorted distinct keys, window ``w`` owning keys
``bounds[w] .. bounds[w+1]`` (``bounds[w]`` = first key ``>= w M``, found by binary search):

    window_ptr = [0, cumsum(ceil((bounds[w+1] - bounds[w]) / K))]
    pos_i      = window_ptr[w_i] K + (i - bounds[w_i])          (flat slot: block * K + column)
    block_cols[pos_i] = u_i mod M;  block_window[pos_i / K] = w_i where (i - bounds[w_i]) mod K = 0
    edge_index_e = base[i_e] + (row_e mod W) K,  base_i = pos_i + (pos_i / K)(W - 1) K,
    i_e = the index of key_e in u, by binary search within its window's keys
(30 kernels with int32 keys, 38 with int64, ``torch.unique``'s included).

Why: done with tensor ops this is about 30 ops and ~70 kernel launches, whose host time (9-19
us per launch on the H100 host) made translation cost more than a GCN training epoch; the GPU
work is ~0.2 ms.
"""
from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch

BLOCK = 1024
#: Size classes of the per-window path: a window of ``n`` edges is sorted by the launch of the
#: smallest class ``>= n`` (padding lanes cost sort steps); larger windows take the sorted keys.
#: Few and small: every class is one more compile on a cold Triton cache, and large sorts
#: compile slowly (H100: classes 64..8192 in powers of two took 4.9 s for Cora and 19.8 s more
#: for wikipedia, a 4096 class ~5 s alone, against 2.2 s for the sorted keys' kernels).
CAPS = (64, 256, 1024, 2048)
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


@triton.jit
def _window_range(rowptr_ptr, w, num_rows, WINDOW: tl.constexpr):
    """``(first edge, edges)`` of window ``w`` (CSR order)."""
    r0 = w * WINDOW
    e0 = tl.load(rowptr_ptr + r0)
    e1 = tl.load(rowptr_ptr + tl.minimum(r0 + WINDOW, num_rows))
    return e0, e1 - e0


@triton.jit
def _window_max_kernel(rowptr_ptr, out_ptr, num_rows, num_windows, WINDOW: tl.constexpr, BLOCK: tl.constexpr):
    w = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = w < num_windows
    e0 = tl.load(rowptr_ptr + w * WINDOW, mask=mask, other=0)
    e1 = tl.load(rowptr_ptr + tl.minimum(w * WINDOW + WINDOW, num_rows), mask=mask, other=0)
    tl.atomic_max(out_ptr, tl.max(e1 - e0, 0))


@triton.jit
def _window_rank_kernel(rowptr_ptr, col_ptr, code_ptr, blocks_ptr, num_rows, big, low,
                        WINDOW: tl.constexpr, BLOCK_K: tl.constexpr, CAP: tl.constexpr, KEY64: tl.constexpr):
    """For the windows of ``low < edges <= CAP``: sort the edges by column in registers
    (``col * CAP + local edge``), mark each column run's first edge, and store per edge
    ``code = 2 rank + first`` (``rank``: the run's index among the window's distinct columns)
    and per window ``blocks[w + 1] = ceil(distinct / K)``."""
    w = tl.program_id(0).to(tl.int64)
    e0, n = _window_range(rowptr_ptr, w, num_rows, WINDOW)
    if (n > low) & (n <= CAP):
        lane = tl.arange(0, CAP)
        live = lane < n
        c = tl.load(col_ptr + e0 + lane, mask=live, other=0)
        c = tl.where(live, c, big)                                   # padding sorts last
        if KEY64:
            s = tl.sort(c.to(tl.int64) * CAP + lane)
        else:
            s = tl.sort(c.to(tl.int32) * CAP + lane)
        col = s // CAP
        prev = tl.gather(col, tl.maximum(lane - 1, 0), 0)
        first = live & ((lane == 0) | (col != prev))                # sorted position < n: a live edge
        rank = tl.cumsum(first.to(tl.int32), 0) - 1
        tl.store(code_ptr + e0 + (s % CAP), rank * 2 + first.to(tl.int32), mask=live)
        count = tl.sum(first.to(tl.int32), 0)
        tl.store(blocks_ptr + w + 1, (count + BLOCK_K - 1) // BLOCK_K)


@triton.jit
def _edge_slot_kernel(row_ptr, col_ptr, code_ptr, window_ptr_ptr, block_cols_ptr, block_window_ptr, edge_index_ptr,
                      num_edges, SHIFT_W: tl.constexpr, WINDOW: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK: tl.constexpr):
    """Per edge: its tile slot; the first edge of each column run writes the block's column (and
    the block's window, for a block's first column)."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = e < num_edges
    row = tl.load(row_ptr + e, mask=mask, other=0).to(tl.int64)
    code = tl.load(code_ptr + e, mask=mask, other=0)
    w = row >> SHIFT_W
    rank = code >> 1
    first = mask & ((code & 1) == 1)
    blk = tl.load(window_ptr_ptr + w, mask=mask, other=0) + rank // BLOCK_K
    kk = rank % BLOCK_K
    tl.store(edge_index_ptr + e, blk * (WINDOW * BLOCK_K) + (row % WINDOW) * BLOCK_K + kk, mask=mask)
    col = tl.load(col_ptr + e, mask=first, other=0).to(tl.int64)
    tl.store(block_cols_ptr + blk * BLOCK_K + kk, col, mask=first)
    tl.store(block_window_ptr + blk, w, mask=first & (kk == 0))


def _condense_sorted(row: Tensor, col: Tensor, num_src: int, num_windows: int, window: int,
                     block_k: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The sorted-keys path of :func:`condense` (module doc): rows in any order.

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


def condense(rowptr: Tensor, row: Tensor, col: Tensor, num_src: int, window: int,
             block_k: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(window_ptr, block_window, block_cols, edge_index)`` of the condensed tiles of a CSR
    graph (the definitions of ``formats.tiles.translate``; module doc): per window in registers
    where every window holds at most ``CAPS[-1]`` edges and ``K <= CAPS[0]``, else by sorted keys.

    Args:
        rowptr: ``[N + 1]`` row offsets; row, col: ``[E]`` target and source of every edge in
            CSR order (CUDA, or CPU under ``TRITON_INTERPRET=1``).
        num_src: ``M``; window, block_k: ``W``, ``K`` (powers of two).

    Shapes:
        rowptr: [N + 1], row, col: [E] -> window_ptr [ceil(N / W) + 1], block_window [B],
        block_cols [B, K], edge_index [E]; all int64.

    Two host syncs (the largest window, the block count); the sorted-keys path adds
    ``torch.unique``'s size, after the largest window where that sent it there (three), without
    it where ``K > CAPS[0]`` or no rows did (two).  Deterministic (no atomics on values).
    """
    device = col.device
    rowptr, row, col = rowptr.contiguous(), row.contiguous(), col.contiguous()
    num_rows, num_edges = rowptr.numel() - 1, col.numel()
    num_windows = -(-num_rows // window)
    if num_windows == 0 or block_k > CAPS[0]:
        return _condense_sorted(row, col, num_src, num_windows, window, block_k)
    largest = torch.zeros(1, dtype=torch.int64, device=device)
    launch(_window_max_kernel, (triton.cdiv(num_windows, BLOCK),), (rowptr, largest, num_rows, num_windows),
           dict(WINDOW=window, BLOCK=BLOCK), 4)
    largest = int(largest)
    if largest > CAPS[-1]:
        return _condense_sorted(row, col, num_src, num_windows, window, block_k)
    big = max(int(num_src), 1)                      # sorts after every column
    blocks = torch.zeros(num_windows + 1, dtype=torch.int64, device=device)
    code = torch.empty(num_edges, dtype=torch.int32, device=device)
    low = -1
    for cap in CAPS:
        launch(_window_rank_kernel, (num_windows,), (rowptr, col, code, blocks, num_rows, big, low),
               dict(WINDOW=window, BLOCK_K=block_k, CAP=cap, KEY64=(big + 1) * cap >= 2 ** 31),
               max(1, min(8, cap // 256)))
        if largest <= cap:
            break
        low = cap
    window_ptr = torch.cumsum(blocks, 0)
    num_blocks = int(window_ptr[-1])
    block_cols = torch.zeros((num_blocks, block_k), dtype=torch.int64, device=device)
    block_window = torch.empty(num_blocks, dtype=torch.int64, device=device)
    edge_index = torch.empty(num_edges, dtype=torch.int64, device=device)
    if num_edges:
        launch(_edge_slot_kernel, (triton.cdiv(num_edges, BLOCK),),
               (row, col, code, window_ptr, block_cols, block_window, edge_index, num_edges),
               dict(SHIFT_W=window.bit_length() - 1, WINDOW=window, BLOCK_K=block_k, BLOCK=BLOCK), 4)
    return window_ptr, block_window, block_cols, edge_index
