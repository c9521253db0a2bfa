"""Sparse graph translation's index work in Triton (``formats/tiles.py`` holds the reference
and the definitions; ``ops/tiles.py`` passes :func:`condense` to ``translate``), and, where
CuPy runs and the graph is small, in one CUDA launch (below).

**In one CUDA launch** (``CUDA_WINDOWS``: ``kernels.translate_cuda.translate_windows``; the
mean window at most ``CAPS[-1]`` edges, the bit set at most ``CUDA_WINDOWS_WORDS`` words, the
windows at most ``CUDA_WINDOWS_WAVES`` waves of resident blocks; checked first, from sizes the
host has).  A block a window, numbered by a ticket: its columns' bit set over the words it
touches, their prefix counts (the ranks, as the bit sets below), its first block by a
decoupled look-back over the earlier windows' counts (as the fused pass's), then the slots,
block columns, padding, the blocks' window, the tile values and the order flag (by the last
window to finish).  One memset, one launch and the block count's read, where the paths
below take 2-4 launches and two reads: host-bound graphs gain most.

**Per window** (the common case: every window holds at most ``CAPS[-1]`` edges).  The CSR
order puts window ``w``'s edges at ``rowptr[w W] .. rowptr[(w + 1) W]``, so one program per
window sorts them in registers, ``(col, local edge) -> col * CAP + local`` with ``tl.sort``
(int32 where it fits), marks the first edge of each column run (``tl.gather`` of the left
neighbour) and numbers the runs (``rank``, ``tl.cumsum`` of the marks); per edge it stores
``code = 2 rank + first`` (on a GPU with CuPy where the column bit sets are small for the
edges, every window is ranked by its bit set instead: below).  With ``c_w`` distinct columns,
then one pass over the edges:

    blocks_w   = ceil(c_w / K);  window_ptr = [0, cumsum(blocks_w)]
    edge_index_e = (window_ptr[w] + rank / K) W K + (row_e mod W) K + rank mod K
    block_cols[window_ptr[w] K + rank] = col_e  (first edges of a run)

(``window_ptr`` by a scan over chunks of 256 windows, each chunk's offset by the same
decoupled look-back as the fused pass below; it also writes the zeros past ``c_w`` in a
window's last block); the edge pass sets the order flag where an edge's rank is below its
predecessor's in the row (``formats.tiles.rows_ordered``) and adds each edge's value into its
tile slot (atomics; ``index_add_`` after it where deterministic algorithms are asked for or the
values need a gradient).

The sorting pass sorts each window at its size class (``CAPS``: a window of 40 edges
sorts 64 lanes, not 1024), all classes in one launch.  Host syncs: the window sizes (the
largest, the number over ``CAPS[-1]`` and their edges: one read), and the block count.

**Fused** (no big windows, and at most ``FUSED_MAX_WINDOWS`` windows or none over
``FUSED_SMALL_WINDOW`` edges: the small graphs, whose translation is host-bound).  One launch
does the sort, the scan and the slot writes: each program takes the next window by a ticket,
sorts it, finds ``window_ptr[w]`` by a single-pass scan with decoupled look-back over the
earlier windows' published counts (``_look_back``), and writes its edges' slots, block columns
and padding from registers (the order flag from the columns in CSR order).  Two launches (and
four allocations) less than the three passes; where windows of very different sizes are many,
a slow sort holds up the look-backs after it, so those graphs keep the three passes.

**Big windows** (over ``CAPS[-1]`` edges: a hub's window; wikipedia has 12 of 727, artist 28 of
3158, yelp 13 of 44803, reddit all of its 14.6k).  One program per big window marks its
columns in a bit set of ``M`` bits (``atomic_or`` into ``ceil(M / 32)`` int32 words, zeroed
scratch of its own), scans the words' population counts (``prefix[j]`` = set bits in words
``< j``, over the words between its smallest and largest column; word and prefix side by
side, one 8-byte load) and gives each edge

    rank_e = prefix[col_e >> 5] + popcount(word[col_e >> 5] & (2^(col_e & 31) - 1))

(the number of the window's distinct columns below ``col_e``: the same rank as the sort's);
``code = 2 rank + 1`` (every edge of a column writes the same block column, so each may act as
the run's first).  No sort, so no size limit; the scratch is ``2 ceil(M / 32)`` words a big
window, and where the bit sets' half of it outgrows ``max(2^24, 2 E)`` words (``BIG_WORDS``),
or ``M >= 2^31``, the graph takes the sorted keys.  Where the big windows' work is large
(``CUDA_MIN_WORK``: reddit, ogbn-proteins) and a bit set fits a block's shared memory,
``kernels.translate_cuda`` ranks them there instead (CuPy, no scratch; the Triton kernel
then sorts only the small windows, and is not launched where every window is big).

**Every window by its bit set in CUDA** (``CUDA_ALL_WINDOWS``, a switch of its own: where the
fused pass does not run, CuPy runs, the bit set fits a block's shared memory and its
``ceil(M / 32)`` words are few for the edges, at most ``CUDA_ALL_WORDS_PER_EDGE`` times a
window's mean): the same CUDA kernel ranks every window, a block of ``CUDA_ALL_THREADS`` each
(the big windows' 512 where the mean window is over ``CAPS[-1]`` edges), and no Triton sort
runs.  A block clears and scans its bit set once, where a sort of ``n`` lanes takes
``~log2(n)^2 / 2`` passes over them (a 6-7x faster ranking on soc-BlogCatalog and ppi).  Where
the fused pass cannot run either way (over ``FUSED_MAX_WINDOWS`` windows, a mean window over
``FUSED_SMALL_WINDOW`` edges) the window sizes are not read back.

**Sorted keys** (big windows whose bit sets would not fit, or ``K > CAPS[0]``): keys
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
us per launch) makes translation cost more than a GCN training epoch; the GPU work is ~0.2 ms.
Measurements: ``docs/design/tensor-cores.md``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import translate_cuda
from . import interpreting
from ._launch import launch

BLOCK = 1024
#: Size classes of the per-window path: a window of ``n`` edges is sorted at the smallest class
#: ``>= n`` (padding lanes cost sort steps); larger windows take their bit sets.
#: Few and small: every class is one more compile on a cold Triton cache, and large sorts
#: compile slowly (a 4096 class takes ~5 s alone, against 2.2 s for the sorted keys' kernels).
CAPS = (64, 256, 1024, 2048)
#: Windows per program of the binary searches: one per thread (4 warps), so that the ~2 log2(keys)
#: dependent loads of each run side by side (1024 per program: 0.08 ms on amazon0505's 26k windows).
WINDOW_BLOCK = 128
#: Up to this many windows one program reads the window sizes (no zeroed output, no atomics),
#: beyond one program per ``BLOCK`` windows (and a zero fill).  The one program takes ~3.5 us a
#: ``BLOCK`` of windows (dependent steps), so past ~4k windows the extra launch costs less.
SIZES_ONE_PROGRAM = 4 * BLOCK
#: Windows a program of the block counts' scan (which also writes ``[SCAN_BLOCK, K]`` padding zeros).
SCAN_BLOCK = 256
#: Bit-set scratch of the big windows, in int32 words: at most
#: ``max(BIG_WORDS, BIG_WORDS_PER_EDGE E)`` for the bit sets (as many again for their prefix
#: counts); beyond it the sorted keys run.
BIG_WORDS, BIG_WORDS_PER_EDGE = 2 ** 24, 2
#: Big windows by ``kernels.translate_cuda`` (their bit sets in shared memory) where CuPy runs,
#: the bit set fits (M up to ~900k columns on an H100), and
#:
#: * the big windows' scratch words plus edges reach ``CUDA_MIN_WORK``: the ranking is 4-6x
#:   faster on reddit and ogbn-proteins, but CuPy's launch costs 0.1-0.2 ms of host time in a
#:   translation, a loss where the bit sets are small (yelp, soc-BlogCatalog);
#: * at least one window in ``CUDA_BIG_SHARE`` is big: the kernel runs a block per window, and
#:   each block, also a small window's that returns at once, holds the bit set's shared memory
#:   (one block an SM past 114 KB): 100k windows would cost ~0.75 ms of empty waves (reddit and
#:   ogbn-proteins: every window big).
CUDA_BIG_WINDOWS, CUDA_MIN_WORK, CUDA_BIG_SHARE = True, 2 ** 23, 4
#: Every window by ``kernels.translate_cuda``'s bit sets (one block of ``CUDA_ALL_THREADS`` a
#: window, no Triton sorts) where the fused pass does not run, CuPy runs, the bit set fits and
#: its ``ceil(M / 32)`` words are at most ``CUDA_ALL_WORDS_PER_EDGE`` times a window's mean
#: edges (module doc).  Up to 16 words a mean edge the bit sets beat the sorts (soc-BlogCatalog
#: at 7.4: 0.44 against ~0.65 ms a translation); at 64 the graphs with wider bit sets lost.
#: 128 threads a block (256 / 512 are no better); where the mean window is big (over
#: ``CAPS[-1]`` edges: reddit, ogbn-proteins) the big windows' 512 (``translate_cuda.THREADS``).
CUDA_ALL_WINDOWS, CUDA_ALL_WORDS_PER_EDGE, CUDA_ALL_THREADS = True, 16, 128
#: The whole translation in one CUDA launch (``kernels.translate_cuda.translate_windows``: per
#: window the bit set's ranks, the look-back scan of the blocks and the slot writes; no window
#: sizes read back, no size classes) where CuPy runs, the mean window holds at most ``CAPS[-1]``
#: edges, the bit set has at most ``CUDA_WINDOWS_WORDS`` words (64 KB of shared memory with its
#: prefix counts: at least 3 blocks an SM) and the windows fill at most ``CUDA_WINDOWS_WAVES``
#: waves of resident blocks of ``CUDA_WINDOWS_THREADS``.  Its time is waves of blocks, each a
#: latency-bound chain (ticket, three passes, look-back), so it wins where the host's launches
#: and syncs cost more than the waves: up to ~16 waves it saves 13-58 % of a small graph's
#: translation (pubmed 0.81 -> 0.34 ms); past ~40 waves its GPU time grows 2-14x.
#: The gate sees the mean window only (no sizes read back): a graph of one huge hub window among
#: empty ones passes it, and that window's block then makes its three passes alone while the
#: later windows' look-backs wait on its count (not met in the benchmark suites).
CUDA_WINDOWS, CUDA_WINDOWS_WORDS, CUDA_WINDOWS_WAVES, CUDA_WINDOWS_THREADS = True, 8192, 16, 128
#: Graphs without big windows in one launch after the window sizes (``_fused_windows_kernel``:
#: sort, look-back scan of the blocks and the slot writes per window), not three.
FUSED_WINDOWS = True
#: Windows a look-back step reads, and ns a waiting program sleeps before it reads again (> 0;
#: ``_look_back``; 128 is within a few % of the best of 32-1024; without the sleep 5-10 % slower).
LOOK_BACK, LOOK_BACK_SLEEP_NS = 128, 200
#: The fused launch where a graph has at most ``FUSED_MAX_WINDOWS`` windows, or none over
#: ``FUSED_SMALL_WINDOW`` edges.  Beyond, a slow window (a large class's sort) holds up every
#: window after it (their look-backs wait for its count while they hold the SM's slots), wave
#: after wave: past ~2k windows of mixed sizes the fused pass takes ~3x the three launches' GPU
#: time; with every window small (no slow one) it stays ahead.
FUSED_MAX_WINDOWS, FUSED_SMALL_WINDOW = 2048, 256


class Condensed(NamedTuple):
    """What :func:`condense` returns (the definitions: ``formats.tiles.TileGraph``).  The last two
    are None where this index work does not build them (``translate`` then does, by tensor ops):
    ``block_vals`` the tiles of the edge values, ``ordered`` a 0-d bool tensor, True where no
    row's slots fall (``formats.tiles.rows_ordered``; kept on the device: read when first needed)."""

    window_ptr: Tensor
    block_window: Tensor
    block_cols: Tensor
    edge_index: Tensor
    block_vals: Optional[Tensor] = None
    ordered: Optional[Tensor] = None


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
def _check_order(flag_ptr, row_ptr, order_ptr, e, row, order, mask, ORDER_SHIFT: tl.constexpr):
    """Clear ``flag`` (int64, 1 before: ordered) where an edge's ``order`` (``order_ptr[e] >>
    ORDER_SHIFT``: anything that rises with the column within a window) is below its
    predecessor's in the same row: columns unsorted within a row (``formats.tiles.rows_ordered``;
    duplicates are allowed).  Every writer stores the same 0, so no atomics; the caller reads
    the flag's first byte as a bool (no comparison kernel).  Costs 0.35 ms of reddit's 114M
    edges."""
    before = mask & (e > 0)
    prev_row = tl.load(row_ptr + e - 1, mask=before, other=-1).to(tl.int64)
    prev = tl.load(order_ptr + e - 1, mask=before, other=0).to(tl.int64) >> ORDER_SHIFT
    bad = tl.max((before & (prev_row == row) & (prev > order)).to(tl.int32), 0)
    if bad != 0:
        tl.store(flag_ptr, 0)


@triton.jit
def _edge_kernel(key_ptr, keys_ptr, bounds_ptr, row_ptr, base_ptr, edge_index_ptr, flag_ptr,
                 num_edges, steps, SHIFT_W: tl.constexpr, WINDOW: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK: tl.constexpr):
    """Each edge finds its key among its window's keys (``bounds[w] .. bounds[w+1]``: a short,
    contiguous range) by binary search: no inverse from the sort.  ``steps`` covers the longest
    window's range (log2 of its edge count, or of the whole key list); a lane stops loading
    once its window's range is searched.  Then the order flag (``_check_order``)."""
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
    slot = base + (row % WINDOW) * BLOCK_K
    tl.store(edge_index_ptr + e, slot, mask=mask)
    _check_order(flag_ptr, row_ptr, key_ptr, e, row, key, mask, 0)


@triton.jit
def _window_range(rowptr_ptr, w, num_rows, WINDOW: tl.constexpr):
    """``(first edge, edges)`` of window ``w`` (CSR order)."""
    r0 = w * WINDOW
    e0 = tl.load(rowptr_ptr + r0)
    e1 = tl.load(rowptr_ptr + tl.minimum(r0 + WINDOW, num_rows))
    return e0, e1 - e0


@triton.jit
def _window_sizes(rowptr_ptr, w, num_rows, num_windows, big, WINDOW: tl.constexpr):
    """Of windows ``w`` (a block of them): the most edges, how many hold over ``big``, their edges."""
    mask = w < num_windows
    e0 = tl.load(rowptr_ptr + w * WINDOW, mask=mask, other=0)
    e1 = tl.load(rowptr_ptr + tl.minimum(w * WINDOW + WINDOW, num_rows), mask=mask, other=0)
    n = (e1 - e0).to(tl.int64)
    return tl.max(n, 0), tl.sum((n > big).to(tl.int64), 0), tl.sum(tl.where(n > big, n, 0), 0)


@triton.jit
def _window_sizes_kernel(rowptr_ptr, out_ptr, num_rows, num_windows, big, WINDOW: tl.constexpr, ONE: tl.constexpr,
                       BLOCK: tl.constexpr):
    """``out[0]``: the most edges of any window; ``out[1]``: windows of more than ``big`` edges;
    ``out[2] = 1`` (the order flag, cleared by the slot pass: ``_check_order``); ``out[3]``: the
    edges of the windows over ``big``; ``out[4]`` (the fused pass's or the scan's ticket),
    ``out[5]`` (the look-back's error flag) and ``out[8 + w]`` (window or scan chunk ``w``'s
    look-back state: ``_look_back``) zero.  With ``ONE``, one program walks every window and
    stores them (``out`` needs no zeros: one launch less on graphs of few windows); else one
    program per ``BLOCK`` windows adds into the zeroed ``out`` by atomics (the zeros stay)."""
    if ONE:
        largest = tl.zeros([], dtype=tl.int64)
        num_big = tl.zeros([], dtype=tl.int64)
        big_edges = tl.zeros([], dtype=tl.int64)
        for start in range(0, num_windows, BLOCK):
            w = start + tl.arange(0, BLOCK).to(tl.int64)
            m, c, e = _window_sizes(rowptr_ptr, w, num_rows, num_windows, big, WINDOW)
            largest = tl.maximum(largest, m)
            num_big += c
            big_edges += e
            tl.store(out_ptr + 8 + w, tl.zeros([BLOCK], dtype=tl.int64), mask=w < num_windows)
        tl.store(out_ptr, largest)
        tl.store(out_ptr + 1, num_big)
        tl.store(out_ptr + 3, big_edges)
        tl.store(out_ptr + 4, 0)
        tl.store(out_ptr + 5, 0)
    else:
        m, c, e = _window_sizes(rowptr_ptr, tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK), num_rows,
                                num_windows, big, WINDOW)
        tl.atomic_max(out_ptr, m)
        tl.atomic_add(out_ptr + 1, c)
        tl.atomic_add(out_ptr + 3, e)
    if tl.program_id(0) == 0:
        tl.store(out_ptr + 2, 1)


@triton.jit
def _popcount(x):
    """Set bits of each int32 lane (SWAR on uint32: no libdevice, so the interpreter runs it)."""
    x = x.to(tl.uint32, bitcast=True)
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _rank_by_bits(col_ptr, code_ptr, blocks_ptr, count_ptr, scratch_ptr, w, e0, n, num_words,
                  BLOCK_K: tl.constexpr, BLOCK: tl.constexpr):
    """One big window (module doc): per edge ``code = 2 rank + 1``, ``blocks[w + 1] = ceil(distinct / K)``,
    ``count[w] = distinct``.
    ``scratch``: a slot counter (int32, zero) then zeroed int32 pairs ``(word j, prefix j)``,
    ``num_words`` a big window (one 8-byte load per edge in the third phase); the window takes
    the next slot.  Three phases over its edges and words, ``tl.debug_barrier`` between them
    (the CTA's threads read each other's global writes, bypassing L1: ``.cg``).
    (Slower alternatives: zeroing the bit set in the program and taking ``first`` from
    ``atomic_or``'s old value, as the returning atomics wait; ranking and writing the slots per
    window in one program, as it walks its edges with dependent loads where the per-edge pass
    has 8x the programs in flight; the order check here, one more load an edge in this
    latency-bound pass.)"""
    slot = tl.atomic_add(scratch_ptr, 1).to(tl.int64)
    pairs_ptr = scratch_ptr + 2 + slot * 2 * num_words          # (8-byte aligned: the counter's pair skipped)
    lane = tl.arange(0, BLOCK)
    one = tl.full([BLOCK], 1, tl.uint32)
    lo = tl.full([BLOCK], 2 ** 31 - 1, tl.int32)
    hi = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, n, BLOCK):
        live = start + lane < n
        c = tl.load(col_ptr + e0 + start + lane, mask=live, other=0).to(tl.int32)
        bit = (one << (c & 31).to(tl.uint32)).to(tl.int32, bitcast=True)
        tl.atomic_or(pairs_ptr + 2 * (c >> 5), bit, mask=live)
        lo = tl.where(live, tl.minimum(lo, c), lo)
        hi = tl.where(live, tl.maximum(hi, c), hi)
    tl.debug_barrier()
    first_word = tl.min(lo, 0) >> 5
    last_word = tl.max(hi, 0) >> 5
    count = 0
    for start in range(first_word, last_word + 1, BLOCK):
        word = start + lane
        inside = word <= last_word
        pop = _popcount(tl.load(pairs_ptr + 2 * word, mask=inside, other=0, cache_modifier=".cg"))
        tl.store(pairs_ptr + 2 * word + 1, count + tl.cumsum(pop, 0) - pop, mask=inside)
        count += tl.sum(pop, 0)
    tl.debug_barrier()
    pairs64 = pairs_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    for start in range(0, n, BLOCK):
        live = start + lane < n
        e = e0 + start + lane
        c = tl.load(col_ptr + e, mask=live, other=0)
        pair = tl.load(pairs64 + (c >> 5), mask=live, other=0, cache_modifier=".cg")
        below = pair.to(tl.uint32) & ((one << (c & 31).to(tl.uint32)) - 1)
        rank = (pair >> 32).to(tl.int32) + _popcount(below.to(tl.int32, bitcast=True))
        tl.store(code_ptr + e, rank * 2 + 1, mask=live)
    tl.store(blocks_ptr + w + 1, (count + BLOCK_K - 1) // BLOCK_K)
    tl.store(count_ptr + w, count)


@triton.jit
def _sorted_runs(c, live, big, CAP: tl.constexpr, KEY64: tl.constexpr):
    """The ``CAP`` lanes ``c`` of a window's columns (``live``: its edges) sorted by column in
    registers (``col * CAP + local edge``; padding sorts last): ``(s, col, first, rank)`` per
    sorted position, ``s % CAP`` its local edge, ``first`` the first edge of a column run,
    ``rank`` (int32) the run's index among the window's distinct columns."""
    lane = tl.arange(0, CAP)
    c = tl.where(live, c, big)
    if KEY64:
        s = tl.sort(c.to(tl.int64) * CAP + lane)
    else:
        s = tl.sort(c.to(tl.int32) * CAP + lane)
    col = s // CAP
    prev = tl.gather(col, tl.maximum(lane - 1, 0), 0)
    first = live & ((lane == 0) | (col != prev))                # sorted position < n: a live edge
    return s, col, first, tl.cumsum(first.to(tl.int32), 0) - 1


@triton.jit
def _rank_by_sort(col_ptr, code_ptr, blocks_ptr, count_ptr, w, e0, n, big, BLOCK_K: tl.constexpr, CAP: tl.constexpr,
                  KEY64: tl.constexpr):
    """One window of at most ``CAP`` edges (``_sorted_runs``): store per edge
    ``code = 2 rank + first``, ``blocks[w + 1] = ceil(distinct / K)`` and ``count[w] = distinct``."""
    lane = tl.arange(0, CAP)
    live = lane < n
    s, _, first, rank = _sorted_runs(tl.load(col_ptr + e0 + lane, mask=live, other=0), live, big, CAP, KEY64)
    tl.store(code_ptr + e0 + (s % CAP), rank * 2 + first.to(tl.int32), mask=live)
    count = tl.sum(first.to(tl.int32), 0)
    tl.store(blocks_ptr + w + 1, (count + BLOCK_K - 1) // BLOCK_K)
    tl.store(count_ptr + w, count)


@triton.jit
def _window_rank_kernel(rowptr_ptr, col_ptr, code_ptr, blocks_ptr, count_ptr, scratch_ptr, num_rows, big, num_words,
                        WINDOW: tl.constexpr, BLOCK_K: tl.constexpr, CAP0: tl.constexpr, CAP1: tl.constexpr,
                        CAP2: tl.constexpr, CAP3: tl.constexpr, CAP4: tl.constexpr, CLASSES: tl.constexpr,
                        KEY64: tl.constexpr, BIG: tl.constexpr, BLOCK: tl.constexpr):
    """Every window in one launch: a window of ``n`` edges is sorted by the smallest of the
    ``CLASSES`` size classes ``CAP0 < CAP1 < ...`` holding it (``_rank_by_sort``; int64 keys for
    class ``i`` where bit ``i`` of ``KEY64`` is set); with ``BIG``, a window over the last of
    them (``CAP4``, padded on the host) takes its bit set (``_rank_by_bits``).  Classes past
    ``CLASSES`` are not compiled, so a graph of small windows never compiles the large sorts.
    One launch at the largest class's warps beats one launch per warp count (yelp: 1.07 against
    1.26 ms of GPU time): the launches run one after another, each with a tail."""
    w = tl.program_id(0).to(tl.int64)
    e0, n = _window_range(rowptr_ptr, w, num_rows, WINDOW)
    if w == 0:
        tl.store(blocks_ptr, 0)
    if n <= CAP0:
        _rank_by_sort(col_ptr, code_ptr, blocks_ptr, count_ptr, w, e0, n, big, BLOCK_K, CAP0, KEY64 & 1)
    if CLASSES > 1:
        if (n > CAP0) & (n <= CAP1):
            _rank_by_sort(col_ptr, code_ptr, blocks_ptr, count_ptr, w, e0, n, big, BLOCK_K, CAP1, (KEY64 >> 1) & 1)
    if CLASSES > 2:
        if (n > CAP1) & (n <= CAP2):
            _rank_by_sort(col_ptr, code_ptr, blocks_ptr, count_ptr, w, e0, n, big, BLOCK_K, CAP2, (KEY64 >> 2) & 1)
    if CLASSES > 3:
        if (n > CAP2) & (n <= CAP3):
            _rank_by_sort(col_ptr, code_ptr, blocks_ptr, count_ptr, w, e0, n, big, BLOCK_K, CAP3, (KEY64 >> 3) & 1)
    if CLASSES > 4:
        if (n > CAP3) & (n <= CAP4):
            _rank_by_sort(col_ptr, code_ptr, blocks_ptr, count_ptr, w, e0, n, big, BLOCK_K, CAP4, (KEY64 >> 4) & 1)
    if BIG:
        if n > CAP4:
            _rank_by_bits(col_ptr, code_ptr, blocks_ptr, count_ptr, scratch_ptr, w, e0, n, num_words, BLOCK_K, BLOCK)


@triton.jit
def _pad_cols(block_cols_ptr, first_block, count, end_block, live, BLOCK_K: tl.constexpr):
    """Zeros in ``block_cols`` past each (``live``) window's ``count`` columns up to its last
    block's end: slots ``first_block K + count .. end_block K`` (fewer than ``K``)."""
    slot = (first_block * BLOCK_K + count)[:, None] + tl.arange(0, BLOCK_K)[None, :]
    tl.store(block_cols_ptr + slot, tl.zeros(slot.shape, dtype=tl.int64),
             mask=live[:, None] & (slot < (end_block * BLOCK_K)[:, None]))


@triton.jit
def _scan_kernel(x_ptr, out_ptr, count_ptr, block_cols_ptr, ws_ptr, n, BLOCK_K: tl.constexpr, BLOCK: tl.constexpr,
                 LOOK: tl.constexpr, SLEEP: tl.constexpr):
    """``out = cumsum(x)`` by a single-pass scan, ``BLOCK`` entries a program: the program that
    takes ticket ``t`` (``ws[4]``, zero before: ``_window_sizes_kernel``) sums entries
    ``t BLOCK ..``, finds the sum before them by ``_look_back`` over the chunks' states
    (``ws[8 + t]``, zero before; error flag ``ws[5]``) and writes its part of the cumsum; and
    the padding zeros: window ``i`` (``x[i + 1]`` blocks, ``count[i]`` columns) pads
    ``block_cols`` from ``out[i] K + count[i]`` to ``out[i + 1] K``.  One launch at any length
    (one program over all windows costs 50 us at 5.5k windows; ``torch.cumsum`` plus the
    padding takes four launches)."""
    t = tl.atomic_add(ws_ptr + 4, 1)
    i = t * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    x = tl.load(x_ptr + i, mask=live, other=0)
    first = _look_back(ws_ptr + 8, ws_ptr + 5, t, tl.sum(x, 0), LOOK, SLEEP)
    out = first + tl.cumsum(x, 0)
    tl.store(out_ptr + i, out, mask=live)
    window = live & (i < n - 1)
    # out[i] is window i's first block: the running sum before x[i + 1], its blocks
    _pad_cols(block_cols_ptr, out, tl.load(count_ptr + i, mask=window, other=0),
              out + tl.load(x_ptr + i + 1, mask=window, other=0), window, BLOCK_K)


@triton.jit
def _edge_slot_kernel(row_ptr, col_ptr, code_ptr, window_ptr_ptr, block_cols_ptr, block_window_ptr, edge_index_ptr,
                      flag_ptr, vals_ptr, tiles_ptr, num_edges, SHIFT_W: tl.constexpr,
                      WINDOW: tl.constexpr, BLOCK_K: tl.constexpr, VALUES: tl.constexpr, BLOCK: tl.constexpr):
    """Per edge: its tile slot and the order flag (``_check_order``); the first edge
    of each column run writes the block's column (and the block's window, for a block's first
    column); with ``VALUES``, the edge's value is added into its slot of the zeroed tiles
    (``formats.tiles.tile_values``'s sum without a second pass over the slots)."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = e < num_edges
    row = tl.load(row_ptr + e, mask=mask, other=0).to(tl.int64)
    code = tl.load(code_ptr + e, mask=mask, other=0)
    w = row >> SHIFT_W
    rank = code >> 1
    first = mask & ((code & 1) == 1)
    blk = tl.load(window_ptr_ptr + w, mask=mask, other=0) + rank // BLOCK_K
    kk = rank % BLOCK_K
    slot = blk * (WINDOW * BLOCK_K) + (row % WINDOW) * BLOCK_K + kk
    tl.store(edge_index_ptr + e, slot, mask=mask)
    col = tl.load(col_ptr + e, mask=first, other=0).to(tl.int64)
    tl.store(block_cols_ptr + blk * BLOCK_K + kk, col, mask=first)
    tl.store(block_window_ptr + blk, w, mask=first & (kk == 0))
    _check_order(flag_ptr, row_ptr, code_ptr, e, row, rank.to(tl.int64), mask, 1)
    if VALUES:
        tl.atomic_add(tiles_ptr + slot, tl.load(vals_ptr + e, mask=mask, other=0.0), mask=mask, sem="relaxed")


@triton.jit
def _pause(ns):
    """Sleep about ``ns`` nanoseconds (PTX ``nanosleep``) and return 0 (kept: the caller uses it):
    a waiting program leaves the SM's issue slots and L2 to the programs it waits for."""
    return tl.inline_asm_elementwise("nanosleep.u32 $1;\n mov.u32 $0, 0;", "=r,r", [ns], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _look_back(state_ptr, error_ptr, w, blocks, LOOK: tl.constexpr, SLEEP: tl.constexpr):
    """Window ``w``'s first block: the blocks of windows ``< w``, by a single-pass scan with
    decoupled look-back (Merrill & Garland): ``state[w]`` (zero before) becomes ``4 blocks + 1``
    (its own count known), then ``4 (first + blocks) + 2`` (its inclusive prefix known).  Window
    ``w`` reads the states of windows ``w - 1, w - 2, ...``, ``LOOK`` at a time, adding their
    counts back to the nearest inclusive prefix.  Where a state it needs is still zero it reads
    again: after ``SLEEP`` ns where ``SLEEP > 0``, at once where 0.  The windows take their
    numbers in launch order (the caller's ticket), so every window waited on has started and
    waits on earlier ones only: no deadlock.  ``SLEEP < 0``: programs run one at a time in
    ticket order (the Triton interpreter), so every earlier state is set and a zero is a bug:
    the look-back stores 1 in ``error[0]`` and ends (the caller raises) instead of spinning
    forever.  ``_scan_kernel``'s chunks use it alike (``w`` a chunk, ``blocks`` its sum)."""
    tl.atomic_xchg(state_ptr + w, blocks * 4 + 1)
    lane = tl.arange(0, LOOK)
    first = tl.zeros([], dtype=tl.int64)
    j = first + w - 1                   # int64 whatever ``w`` is (a ticket, or an int32 argument)
    while j >= 0:
        idx = j - lane
        st = tl.load(state_ptr + idx, mask=idx >= 0, other=2, volatile=True)   # before window 0: prefix 0
        flag = st & 3
        unknown = tl.min(tl.where(flag == 0, lane, LOOK), 0)
        inclusive = tl.min(tl.where(flag == 2, lane, LOOK), 0)
        if (unknown > inclusive) | (unknown == LOOK):
            first += tl.sum(tl.where(lane <= inclusive, st >> 2, 0), 0)
            j = tl.where(inclusive < LOOK, -1, j - LOOK)
        elif SLEEP > 0:
            j += _pause(tl.full([], SLEEP, tl.int32)).to(tl.int64)
        elif SLEEP < 0:
            tl.store(error_ptr, 1)
            j = tl.full([], -1, tl.int64)
    tl.atomic_xchg(state_ptr + w, (first + blocks) * 4 + 2)
    return first


@triton.jit
def _fused_window(row_ptr, col_ptr, ws_ptr, window_ptr_ptr, block_cols_ptr, block_window_ptr, edge_index_ptr,
                  vals_ptr, tiles_ptr, w, e0, n, big, WINDOW: tl.constexpr, BLOCK_K: tl.constexpr, CAP: tl.constexpr,
                  KEY64: tl.constexpr, VALUES: tl.constexpr, LOOK: tl.constexpr, SLEEP: tl.constexpr):
    """One window of at most ``CAP`` edges, everything in one program: the order flag (a column
    below its predecessor's in a row, CSR order), the sort and ranks (``_sorted_runs``), the
    window's first block (``_look_back``), then per edge its slot, the block columns, the
    blocks' window, the padding zeros of the last block and (``VALUES``) the edge values added
    into their tile slots (``_edge_slot_kernel``'s and ``_scan_kernel``'s writes)."""
    lane = tl.arange(0, CAP)
    live = lane < n
    c = tl.load(col_ptr + e0 + lane, mask=live, other=0)
    r = tl.load(row_ptr + e0 + lane, mask=live, other=0).to(tl.int64)
    before = tl.maximum(lane - 1, 0)
    descent = live & (lane > 0) & (tl.gather(r, before, 0) == r) & (tl.gather(c, before, 0) > c)
    if tl.max(descent.to(tl.int32), 0) != 0:
        tl.store(ws_ptr + 2, 0)
    s, col, head, rank = _sorted_runs(c, live, big, CAP, KEY64)
    rank = rank.to(tl.int64)
    count = tl.sum(head.to(tl.int64), 0)
    blocks = (count + BLOCK_K - 1) // BLOCK_K
    first = _look_back(ws_ptr + 8, ws_ptr + 5, w, blocks, LOOK, SLEEP)
    tl.store(window_ptr_ptr + w + 1, first + blocks)
    if w == 0:
        tl.store(window_ptr_ptr, 0)
    local = s % CAP
    blk = first + rank // BLOCK_K
    kk = rank % BLOCK_K
    slot = blk * (WINDOW * BLOCK_K) + (tl.gather(r, local, 0) % WINDOW) * BLOCK_K + kk
    e = e0 + local
    tl.store(edge_index_ptr + e, slot, mask=live)
    tl.store(block_cols_ptr + blk * BLOCK_K + kk, col.to(tl.int64), mask=head)
    tl.store(block_window_ptr + blk, w, mask=head & (kk == 0))
    one = tl.full([1], 1, tl.int64)
    _pad_cols(block_cols_ptr, first * one, count * one, (first + blocks) * one, one == 1, BLOCK_K)
    if VALUES:
        tl.atomic_add(tiles_ptr + slot, tl.load(vals_ptr + e, mask=live, other=0.0), mask=live, sem="relaxed")


@triton.jit
def _fused_windows_kernel(rowptr_ptr, row_ptr, col_ptr, ws_ptr, window_ptr_ptr, block_cols_ptr, block_window_ptr,
                          edge_index_ptr, vals_ptr, tiles_ptr, num_rows, big, WINDOW: tl.constexpr,
                          BLOCK_K: tl.constexpr, CAP0: tl.constexpr, CAP1: tl.constexpr, CAP2: tl.constexpr,
                          CAP3: tl.constexpr, CAP4: tl.constexpr, CLASSES: tl.constexpr, KEY64: tl.constexpr,
                          VALUES: tl.constexpr, LOOK: tl.constexpr, SLEEP: tl.constexpr):
    """The whole translation of a graph without big windows in one launch (after the window
    sizes): each program takes the next window number (``ws[4]``, a ticket: windows start in
    order, as ``_look_back`` needs) and runs ``_fused_window`` at its size class (as
    ``_window_rank_kernel``)."""
    w = tl.atomic_add(ws_ptr + 4, 1).to(tl.int64)
    e0, n = _window_range(rowptr_ptr, w, num_rows, WINDOW)
    if n <= CAP0:
        _fused_window(row_ptr, col_ptr, ws_ptr, window_ptr_ptr, block_cols_ptr, block_window_ptr, edge_index_ptr,
                      vals_ptr, tiles_ptr, w, e0, n, big, WINDOW, BLOCK_K, CAP0, KEY64 & 1, VALUES, LOOK, SLEEP)
    if CLASSES > 1:
        if (n > CAP0) & (n <= CAP1):
            _fused_window(row_ptr, col_ptr, ws_ptr, window_ptr_ptr, block_cols_ptr, block_window_ptr,
                          edge_index_ptr, vals_ptr, tiles_ptr, w, e0, n, big, WINDOW, BLOCK_K, CAP1,
                          (KEY64 >> 1) & 1, VALUES, LOOK, SLEEP)
    if CLASSES > 2:
        if (n > CAP1) & (n <= CAP2):
            _fused_window(row_ptr, col_ptr, ws_ptr, window_ptr_ptr, block_cols_ptr, block_window_ptr,
                          edge_index_ptr, vals_ptr, tiles_ptr, w, e0, n, big, WINDOW, BLOCK_K, CAP2,
                          (KEY64 >> 2) & 1, VALUES, LOOK, SLEEP)
    if CLASSES > 3:
        if (n > CAP2) & (n <= CAP3):
            _fused_window(row_ptr, col_ptr, ws_ptr, window_ptr_ptr, block_cols_ptr, block_window_ptr,
                          edge_index_ptr, vals_ptr, tiles_ptr, w, e0, n, big, WINDOW, BLOCK_K, CAP3,
                          (KEY64 >> 3) & 1, VALUES, LOOK, SLEEP)
    if CLASSES > 4:
        if (n > CAP3) & (n <= CAP4):
            _fused_window(row_ptr, col_ptr, ws_ptr, window_ptr_ptr, block_cols_ptr, block_window_ptr,
                          edge_index_ptr, vals_ptr, tiles_ptr, w, e0, n, big, WINDOW, BLOCK_K, CAP4,
                          (KEY64 >> 4) & 1, VALUES, LOOK, SLEEP)


def _flag_bool(flag: Tensor) -> Tensor:
    """The 0-d bool view of an int64 order flag (1 or 0) in ``flag[0]``: its first byte (little endian)."""
    return flag.view(torch.bool)[0]


def _condense_sorted(row: Tensor, col: Tensor, num_src: int, num_windows: int, window: int,
                     block_k: int, largest: Optional[int] = None) -> Condensed:
    """The sorted-keys path of :func:`condense` (module doc): rows in any order.

    Args:
        row, col: ``[E]`` target and source of every edge (any order; CUDA, or CPU under
            ``TRITON_INTERPRET=1``).
        num_src: ``M``; num_windows: ``ceil(N / W)``; window, block_k: ``W``, ``K`` (powers of two).
        largest: the most edges of any window, if known (the binary searches then take
            ``log2`` of it steps instead of ``log2`` of the key count).

    Shapes:
        row, col: [E] -> window_ptr [num_windows + 1], block_window [B], block_cols [B, K],
        edge_index [E]; all int64; ordered [] bool.

    Two host syncs: ``torch.unique``'s size and the block count.  Deterministic.
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
    flag = torch.ones(1, dtype=torch.int64, device=device)
    if num_keys:
        steps = min(num_keys, largest if largest is not None else num_keys).bit_length()
        launch(_slot_kernel, (triton.cdiv(num_keys, BLOCK),),
               (keys, bounds, window_ptr, block_cols, block_window, base, num_keys, span),
               dict(WINDOW=window, BLOCK_K=block_k, BLOCK=BLOCK), 4)
        launch(_edge_kernel, (triton.cdiv(num_edges, BLOCK),),
               (key, keys, bounds, row, base, edge_index, flag, num_edges, steps),
               dict(SHIFT_W=window.bit_length() - 1, WINDOW=window, BLOCK_K=block_k, BLOCK=BLOCK), 4)
    return Condensed(window_ptr, block_window, block_cols, edge_index, None, _flag_bool(flag))


def _look_back_sleep() -> int:
    """``_look_back``'s ``SLEEP``: -1 under the interpreter (programs in order: a wait is a bug),
    0 on ROCm (no PTX ``nanosleep``: read again at once), else ``LOOK_BACK_SLEEP_NS``."""
    if interpreting():
        return -1
    return 0 if getattr(torch.version, "hip", None) else LOOK_BACK_SLEEP_NS


def _read_sizes(ws: Tensor) -> tuple:
    """``(largest window, windows over CAPS[-1] edges, their edges)`` from the window sizes'
    output: a host sync."""
    largest, num_big, _, big_edges = ws[:4].tolist()
    return largest, num_big, big_edges


def _raise_on_look_back_error(ws: Tensor) -> None:
    """Under the interpreter: raise where a look-back met a state not yet set (``ws[5]``), a bug
    with the programs run in order (on the GPU it waits instead: no flag, no sync)."""
    if interpreting() and int(ws[5]):
        raise RuntimeError("condense(): a look-back met a window (or scan chunk) not yet counted, "
                           "with the programs run in order (a bug)")


class _Outputs:
    """The arrays that the per-window paths write: ``window_ptr``, and the block arrays (and the
    tile values, zeroed, where the slot pass adds them: ``fused``) allocated for the bound
    ``B <= (E + windows (K - 1)) / K`` blocks; ``values``, ``tiles``: the kernels' value pointers
    (any tensor where ``fused`` is off: never read).  :meth:`condensed` reads the block count
    (the last sync) and returns the first ``B`` blocks."""

    def __init__(self, num_edges: int, num_windows: int, window: int, block_k: int, values: Optional[Tensor],
                 device) -> None:
        self.bound = (num_edges + num_windows * (block_k - 1)) // block_k
        # two allocations: the per-window and per-edge arrays, the per-block ones (copied out
        # of theirs where the bound is far over the blocks made: ``condensed``); each array
        # starts on 128 bytes, as a fresh allocation would (Triton specialises on 16-byte
        # alignment: vector loads and stores)
        start = -(-(num_windows + 1) // 16) * 16
        edges = torch.empty(start + num_edges, dtype=torch.int64, device=device)
        self.window_ptr, self.edge_index = edges[:num_windows + 1], edges[start:]
        start = -(-(self.bound * block_k) // 16) * 16
        blocks = torch.empty(start + self.bound, dtype=torch.int64, device=device)
        self.block_cols = blocks[:self.bound * block_k].view(self.bound, block_k)
        self.block_window = blocks[start:]
        # the tile values added by the slot pass (atomics, as index_add_'s), unless deterministic
        # algorithms are asked for or the values need a gradient: then left to the caller (index_add_)
        self.fused = (values is not None and not values.requires_grad
                      and not torch.are_deterministic_algorithms_enabled())
        self.block_vals = None
        self.values = self.tiles = self.edge_index
        if self.fused:
            self.block_vals = torch.zeros((self.bound, window, block_k), dtype=torch.float32, device=device)
            self.values, self.tiles = values.to(torch.float32).contiguous(), self.block_vals

    def condensed(self, ws: Tensor) -> Condensed:
        """The result, with the order flag ``ws[2]`` (set to 1 by the window sizes' kernel)."""
        num_blocks = int(self.window_ptr[-1])
        kept = [self.block_window[:num_blocks], self.block_cols[:num_blocks],
                None if self.block_vals is None else self.block_vals[:num_blocks]]
        if 2 * num_blocks < self.bound:      # rows sharing columns: the bound's tail would double the memory
            kept = [None if t is None else t.clone() for t in kept]
        return Condensed(self.window_ptr, kept[0], kept[1], self.edge_index, kept[2], _flag_bool(ws[2:3]))


def condense(rowptr: Tensor, row: Tensor, col: Tensor, num_src: int, window: int, block_k: int,
             values: Optional[Tensor] = None) -> Condensed:
    """:class:`Condensed` tiles of a CSR graph (the definitions of ``formats.tiles.translate``;
    module doc): per window in one launch where ``K <= CAPS[0]`` (windows over ``CAPS[-1]``
    edges by their bit sets, where those fit; every window by its bit set in CUDA where the
    words are few for the edges), else by sorted keys; ``block_vals``: the tiles of
    ``values`` (their sums per slot, as ``formats.tiles.tile_values``) where the slot pass adds
    them, else None (no values; values that need a gradient; deterministic algorithms; the
    sorted keys): ``translate`` then builds them with ``index_add_``; ``ordered`` from the edge
    pass.

    Args:
        rowptr: ``[N + 1]`` row offsets; row, col: ``[E]`` target and source of every edge in
            CSR order (CUDA, or CPU under ``TRITON_INTERPRET=1``).
        num_src: ``M``; window, block_k: ``W``, ``K`` (powers of two).
        values: ``[E]`` edge values in CSR order, or None.

    Shapes:
        rowptr: [N + 1], row, col: [E] -> window_ptr [ceil(N / W) + 1], block_window [B],
        block_cols [B, K], edge_index [E] (all int64), block_vals [B, W, K] float32, ordered [] bool.

    One host sync where the translation runs in one CUDA launch (``CUDA_WINDOWS``: the block
    count), else two: the window sizes (at the start, the queue empty: the largest window, and
    the count and edges of those over ``CAPS[-1]``; not read where every window goes to the
    CUDA bit sets and the fused pass cannot run), and the block count, read last (two
    launches in all where the fused pass runs: module doc)
    (a fourth sync, ``torch.unique``'s, where the sorted keys run after the count): the block
    arrays (and the tile values) are allocated for the bound ``B <= (E + windows (K - 1)) / K``
    and returned as views of their first ``B`` blocks, so every kernel is queued before the host
    waits (copied out where the bound is over twice ``B``: windows whose rows share their
    columns).  The sorted-keys path
    adds ``torch.unique``'s size (two syncs where ``K > CAPS[0]`` or no rows sent it there).
    The index arrays are deterministic (the big windows' scratch slots are taken by atomics,
    but the ranks do not depend on the slot); the tile values are added by float atomics, so
    three or more duplicates of an edge may sum in a different order from call to call (as
    ``index_add_``'s, which ``translate`` runs instead under deterministic algorithms).

    Raises:
        ValueError: ``values`` not one per edge.
    """
    device = col.device
    rowptr, row, col = rowptr.contiguous(), row.contiguous(), col.contiguous()
    num_rows, num_edges = rowptr.numel() - 1, col.numel()
    if values is not None and values.shape != (num_edges,):
        raise ValueError(f"condense(): values must have shape ({num_edges},), one per edge, got {tuple(values.shape)}")
    num_windows = -(-num_rows // window)
    if num_windows == 0 or block_k > CAPS[0]:
        return _condense_sorted(row, col, num_src, num_windows, window, block_k)
    if len(CAPS) > 5:
        raise ValueError(f"condense(): at most 5 size classes, CAPS = {CAPS}")
    big = max(int(num_src), 1)                      # sorts after every column
    num_words = -(-max(int(num_src), 1) // 32)
    # the whole translation in one CUDA launch where the windows fill few waves of blocks (CuPy:
    # its first use compiles the module, or loads it from CuPy's cache); else every window's bit
    # set in shared memory where the words are few for the edges (not where the fused pass
    # runs); else the big windows' there where they fit and the work pays for CuPy's launch,
    # else in global scratch (Triton) where that fits, else sorted keys
    narrow = num_src < 2 ** 31                      # int32 columns in the bit sets
    # (windows of big ones on average: the big windows' block size)
    threads = CUDA_ALL_THREADS if num_edges <= CAPS[-1] * num_windows else translate_cuda.THREADS
    if (CUDA_WINDOWS and narrow and num_edges <= CAPS[-1] * num_windows and num_words <= CUDA_WINDOWS_WORDS
            and num_windows <= CUDA_WINDOWS_WAVES * translate_cuda.resident_blocks(num_words, CUDA_WINDOWS_THREADS,
                                                                                   device)
            and translate_cuda.fits(num_words, col, CUDA_WINDOWS_THREADS, "translate_windows")):
        ws = torch.zeros(4 + num_windows, dtype=torch.int64, device=device)
        out = _Outputs(num_edges, num_windows, window, block_k, values, device)
        translate_cuda.translate_windows(rowptr.to(torch.int64), row.to(torch.int64), col, ws, out.window_ptr,
                                         out.block_cols, out.block_window, out.edge_index,
                                         out.values if out.fused else None, out.tiles if out.fused else None,
                                         num_windows, window, block_k, num_words, CUDA_WINDOWS_THREADS)
        return out.condensed(ws)
    # [largest window, windows over CAPS[-1] edges, the order flag, edges of those windows, the
    # fused pass's (or the scan's) ticket, the look-back's error flag, -, -, a look-back state
    # per window (or scan chunk)]
    one = num_windows <= SIZES_ONE_PROGRAM
    ws = (torch.empty if one else torch.zeros)(8 + num_windows, dtype=torch.int64, device=device)
    launch(_window_sizes_kernel, (1 if one else triton.cdiv(num_windows, BLOCK),),
           (rowptr, ws, num_rows, num_windows, CAPS[-1]), dict(WINDOW=window, ONE=one, BLOCK=BLOCK), 4)
    few_words = CUDA_ALL_WINDOWS and narrow and num_words * num_windows <= CUDA_ALL_WORDS_PER_EDGE * num_edges
    # where the fused pass cannot run (over FUSED_MAX_WINDOWS windows, the largest at least the
    # mean, over FUSED_SMALL_WINDOW edges) the choice needs no read-back (one sync less); the
    # fused graphs do not ask CuPy here (``fits`` compiles the module on its first call; the
    # one-launch gate above may have)
    cuda_all = (few_words and num_windows > FUSED_MAX_WINDOWS and num_edges > FUSED_SMALL_WINDOW * num_windows
                and translate_cuda.fits(num_words, col, threads))
    if cuda_all:
        num_big = big_edges = 0                     # (not used where every window goes to CUDA)
    else:
        largest, num_big, big_edges = _read_sizes(ws)
        caps = tuple(c for c in CAPS if c < largest) + tuple(c for c in CAPS if c >= largest)[:1]
        classes = dict(CAP0=caps[0], CAP1=caps[min(1, len(caps) - 1)], CAP2=caps[min(2, len(caps) - 1)],
                       CAP3=caps[min(3, len(caps) - 1)], CAP4=caps[-1], CLASSES=len(caps),
                       KEY64=sum(1 << i for i, cap in enumerate(caps) if (big + 1) * cap >= 2 ** 31))
        warps = max(1, min(8, caps[-1] // 256))         # at most 8 lanes a thread
        if not num_big and FUSED_WINDOWS and (num_windows <= FUSED_MAX_WINDOWS or largest <= FUSED_SMALL_WINDOW):
            out = _Outputs(num_edges, num_windows, window, block_k, values, device)
            launch(_fused_windows_kernel, (num_windows,),
                   (rowptr, row, col, ws, out.window_ptr, out.block_cols, out.block_window, out.edge_index,
                    out.values, out.tiles, num_rows, big),
                   dict(WINDOW=window, BLOCK_K=block_k, **classes, VALUES=out.fused, LOOK=LOOK_BACK,
                        SLEEP=_look_back_sleep()), warps)
            _raise_on_look_back_error(ws)
            return out.condensed(ws)
        cuda_all = few_words and translate_cuda.fits(num_words, col, threads)
    scratch_words = num_big * num_words
    cuda_big = not cuda_all and (scratch_words + big_edges >= CUDA_MIN_WORK and CUDA_BIG_SHARE * num_big >= num_windows
                                 and CUDA_BIG_WINDOWS and narrow and translate_cuda.fits(num_words, col,
                                                                                        translate_cuda.THREADS))
    if (num_big and not (cuda_all or cuda_big)
            and (not narrow or scratch_words > max(BIG_WORDS, BIG_WORDS_PER_EDGE * num_edges))):
        return _condense_sorted(row, col, num_src, num_windows, window, block_k, largest)
    code = torch.empty(num_edges, dtype=torch.int32, device=device)
    blocks = torch.empty(num_windows + 1, dtype=torch.int64, device=device)
    counts = torch.empty(num_windows, dtype=torch.int32, device=device)
    # the big windows' bit sets and prefix counts: a slot counter, then int32 pairs (any tensor
    # where there are none: that branch is not compiled)
    triton_big = bool(num_big) and not (cuda_all or cuda_big)
    out = _Outputs(num_edges, num_windows, window, block_k, values, device)
    scratch = torch.zeros(2 + 2 * num_big * num_words, dtype=torch.int32, device=device) if triton_big else code
    if cuda_all:
        translate_cuda.rank_big_windows(rowptr.to(torch.int64), col, code, blocks, counts, num_windows, -1,
                                        window, block_k, num_words, threads)
    elif num_big < num_windows or triton_big:     # the sorts (and the bit sets in global memory)
        launch(_window_rank_kernel, (num_windows,),
               (rowptr, col, code, blocks, counts, scratch, num_rows, big, num_words),
               dict(WINDOW=window, BLOCK_K=block_k, **classes, BIG=triton_big, BLOCK=BLOCK),
               max(4, warps) if triton_big else warps)
    if cuda_big:
        translate_cuda.rank_big_windows(rowptr.to(torch.int64), col, code, blocks, counts, num_windows, CAPS[-1],
                                        window, block_k, num_words)
    launch(_scan_kernel, (triton.cdiv(num_windows + 1, SCAN_BLOCK),),     # the scan pads the columns too
           (blocks, out.window_ptr, counts, out.block_cols, ws, num_windows + 1),
           dict(BLOCK_K=block_k, BLOCK=SCAN_BLOCK, LOOK=LOOK_BACK, SLEEP=_look_back_sleep()), 4)
    _raise_on_look_back_error(ws)
    if num_edges:
        launch(_edge_slot_kernel, (triton.cdiv(num_edges, BLOCK),),
               (row, col, code, out.window_ptr, out.block_cols, out.block_window, out.edge_index, ws[2:],
                out.values, out.tiles, num_edges),
               dict(SHIFT_W=window.bit_length() - 1, WINDOW=window, BLOCK_K=block_k, VALUES=out.fused, BLOCK=BLOCK), 4)
    return out.condensed(ws)
