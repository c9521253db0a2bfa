r"""Uniform neighbour sampling in Triton: one hop in four kernels, no host sync until the batch ends.

The torch implementation (``sampling._core``) runs ~50 tensor ops and two host syncs per hop;
on a GPU host that spends tens of microseconds of Python per op, that is 4-6 ms a batch, more
than the training step it feeds.  Here a hop is:

1. ``_hop_sample_kernel``, one program per ``BLOCK_R`` frontier rows, ``[BLOCK_R, KP]`` tiles
   (``KP`` = next power of two >= ``K``): the row's in-degree :math:`d`; for :math:`d \le K`
   all offsets :math:`0 .. d-1`; else a uniform :math:`K`-subset of :math:`[0, d)` by Floyd's
   algorithm (for :math:`j = d-K .. d-1`: draw :math:`t` uniform in :math:`[0, j]`, take
   :math:`t` unless already taken, then :math:`j`; every :math:`K`-subset has probability
   :math:`1 / \binom{d}{K}`), or :math:`K` i.i.d. offsets with ``REPLACE``; offsets sorted
   (ascending CSR position, as the torch sampler returns them).  Writes the padded
   ``[F_ub, K]`` edge ids and sources (``-1`` where a row keeps fewer), the per-row count,
   and ``atomic_min(slot[src], BASE + p)`` for the padded position ``p`` of every kept edge.
2. ``_hop_first_kernel``: ``first[p] = slot[src[p]] == BASE + p`` (the first occurrence of a
   node not sampled before: ``slot`` holds local ids ``< BASE`` for those), then an inclusive
   ``cumsum`` (torch) numbers the new nodes in first-seen order.
3. ``_hop_assign_kernel``: new node ``v`` first seen at ``p`` gets local id
   ``end + cumsum[p] - 1`` (``end`` = first id after this hop's frontier) in ``slot[v]`` and
   in ``n_id``; program 0 writes the next hop's frontier end to ``meta``.
4. ``_hop_compact_kernel``, after a ``cumsum`` of the counts: the kept edges packed target by
   target, ``src`` relabelled through ``slot``, ``dst``, ``e_id`` and the sub-graph's
   ``rowptr`` entries of the frontier; program 0 writes the edge total to ``meta``.

Sizes stay on the device (``meta``: frontier bounds per hop, edge offsets per hop); grids come
from host-known upper bounds (``F_{h+1} <= F_h K_h``), programs past the device-side frontier
exit early.  Random numbers: Philox (``tl.randint4x``) keyed by one 62-bit seed per hop drawn
from the caller's ``torch.Generator`` and counter ``row * K + draw``; two 32-bit words make a
62-bit integer whose ``mod (j + 1)`` has bias below :math:`j / 2^{62}`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import launch

#: Slot value of a node not sampled yet (as in ``sampling._core``), and the base of positions.
SENTINEL = 2 ** 62
BASE = 2 ** 61
#: Largest fanout the kernels take (``KP`` columns of int64 per row in registers).
MAX_FANOUT = 64
BLOCK = 1024


@triton.jit
def _rand62(seed, counter):
    """A uniform 62-bit non-negative int64 per ``counter`` (uint32) from Philox."""
    r0, r1, _, _ = tl.randint4x(seed, counter)
    hi = r0.to(tl.uint64, bitcast=False)
    lo = r1.to(tl.uint64, bitcast=False)
    return (((hi << 32) | lo) >> 2).to(tl.int64)


@triton.jit
def _hop_sample_kernel(rowptr_ptr, col_ptr, nid_ptr, meta_ptr, seed_ptr, eid_ptr, src_ptr, cnt_ptr, slot_ptr,
                       hop, f_ub, pad, base,
                       K: tl.constexpr, KP: tl.constexpr, REPLACE: tl.constexpr, BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    f = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    fstart = tl.load(meta_ptr + hop)
    nf = tl.load(meta_ptr + hop + 1) - fstart
    live = f < nf
    node = tl.load(nid_ptr + fstart + f, mask=live, other=0)
    start = tl.load(rowptr_ptr + node, mask=live, other=0)
    deg = tl.load(rowptr_ptr + node + 1, mask=live, other=0) - start
    c = tl.arange(0, KP)[None, :]
    seed = tl.load(seed_ptr + hop)
    counter = f.to(tl.uint32) * K
    if REPLACE:
        cnt = tl.where(deg > 0, K, 0)
        draws = _rand62(seed, counter[:, None] + c.to(tl.uint32))
        chosen = draws % tl.maximum(deg, 1)[:, None]
        chosen = tl.where(c < K, chosen, pad)
    else:
        cnt = tl.minimum(deg, K)
        chosen = tl.zeros((BLOCK_R, KP), dtype=tl.int64) + pad
        for i in range(K):                                   # Floyd: j = d - K + i
            j = tl.maximum(deg - K + i, 0)
            t = _rand62(seed, counter + i) % (j + 1)
            taken = tl.max(tl.where(chosen == t[:, None], 1, 0), axis=1) > 0
            pick = tl.where(taken, j, t)
            chosen = tl.where(c == i, pick[:, None], chosen)
        every = c.to(tl.int64) + tl.zeros((BLOCK_R, KP), dtype=tl.int64)
        chosen = tl.where((deg <= K)[:, None], tl.where(c < deg[:, None], every, pad), chosen)
    chosen = tl.sort(chosen, 1)
    kept = (c < cnt[:, None]) & live[:, None]
    eid = start[:, None] + chosen
    src = tl.load(col_ptr + eid, mask=kept, other=-1)
    pos = f[:, None] * K + c
    inside = (c < K) & (f < f_ub)[:, None]
    tl.store(eid_ptr + pos, tl.where(kept, eid, -1), mask=inside)
    tl.store(src_ptr + pos, src, mask=inside)
    tl.atomic_min(slot_ptr + src, base + pos, mask=kept)
    tl.store(cnt_ptr + f, tl.where(live, cnt, 0), mask=f < f_ub)


@triton.jit
def _hop_first_kernel(src_ptr, slot_ptr, first_ptr, n, base, BLOCK: tl.constexpr):
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = p < n
    src = tl.load(src_ptr + p, mask=inside, other=-1)
    kept = src >= 0
    s = tl.load(slot_ptr + src, mask=kept, other=0)
    tl.store(first_ptr + p, (kept & (s == base + p)).to(tl.int32), mask=inside)


@triton.jit
def _hop_assign_kernel(src_ptr, first_ptr, csum_ptr, slot_ptr, nid_ptr, meta_ptr, hop, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    p = pid * BLOCK + tl.arange(0, BLOCK)
    inside = p < n
    end = tl.load(meta_ptr + hop + 1)
    first = tl.load(first_ptr + p, mask=inside, other=0) != 0
    src = tl.load(src_ptr + p, mask=first, other=0)
    local = end + tl.load(csum_ptr + p, mask=first, other=1) - 1
    tl.store(slot_ptr + src, local, mask=first)
    tl.store(nid_ptr + local, src, mask=first)
    if pid == 0:
        tl.store(meta_ptr + hop + 2, end + tl.load(csum_ptr + n - 1))


@triton.jit
def _hop_compact_kernel(eid_ptr, src_ptr, cnt_ptr, ecsum_ptr, slot_ptr, meta_ptr, emeta_ptr,
                        out_src_ptr, out_dst_ptr, out_eid_ptr, rowptr_ptr, hop, f_ub,
                        K: tl.constexpr, KP: tl.constexpr, BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    f = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rows = f < f_ub
    fstart = tl.load(meta_ptr + hop)
    ebase = tl.load(emeta_ptr + hop)
    cnt = tl.load(cnt_ptr + f, mask=rows, other=0)
    after = tl.load(ecsum_ptr + f, mask=rows, other=0)        # inclusive: edges up to this row
    c = tl.arange(0, KP)[None, :]
    kept = c < cnt[:, None]
    pos = f[:, None] * K + c
    src = tl.load(src_ptr + pos, mask=kept, other=0)
    eid = tl.load(eid_ptr + pos, mask=kept, other=0)
    q = ebase + (after - cnt)[:, None] + c
    tl.store(out_src_ptr + q, tl.load(slot_ptr + src, mask=kept, other=0), mask=kept)
    tl.store(out_dst_ptr + q, (fstart + f)[:, None] + tl.zeros((BLOCK_R, KP), dtype=tl.int64), mask=kept)
    tl.store(out_eid_ptr + q, eid, mask=kept)
    nf = tl.load(meta_ptr + hop + 1) - fstart
    tl.store(rowptr_ptr + fstart + f + 1, ebase + after, mask=f < nf)
    if pid == 0:
        tl.store(emeta_ptr + hop + 1, ebase + tl.load(ecsum_ptr + f_ub - 1))


def _rows_block(kp: int) -> int:
    """Rows per program: tiles of about 2048 int64 entries."""
    return max(16, min(128, 2048 // kp))


def hop_sample(rowptr, col, nid, meta, seeds, eid, src, cnt, slot, hop: int, f_ub: int, k: int, kp: int,
               replace: bool) -> None:
    """Kernel 1 (see the module doc) over ``f_ub`` padded frontier rows."""
    block_r = _rows_block(kp)
    launch(_hop_sample_kernel, (triton.cdiv(f_ub, block_r),),
           (rowptr, col, nid, meta, seeds, eid, src, cnt, slot, hop, f_ub, SENTINEL, BASE),
           {"K": k, "KP": kp, "REPLACE": replace, "BLOCK_R": block_r}, num_warps=4)


def hop_first(src, slot, first, n: int) -> None:
    launch(_hop_first_kernel, (triton.cdiv(n, BLOCK),), (src, slot, first, n, BASE), {"BLOCK": BLOCK}, num_warps=4)


def hop_assign(src, first, csum, slot, nid, meta, hop: int, n: int) -> None:
    launch(_hop_assign_kernel, (triton.cdiv(n, BLOCK),), (src, first, csum, slot, nid, meta, hop, n),
           {"BLOCK": BLOCK}, num_warps=4)


def hop_compact(eid, src, cnt, ecsum, slot, meta, emeta, out_src, out_dst, out_eid, rowptr, hop: int, f_ub: int,
                k: int, kp: int) -> None:
    block_r = _rows_block(kp)
    launch(_hop_compact_kernel, (triton.cdiv(f_ub, block_r),),
           (eid, src, cnt, ecsum, slot, meta, emeta, out_src, out_dst, out_eid, rowptr, hop, f_ub),
           {"K": k, "KP": kp, "BLOCK_R": block_r}, num_warps=4)
