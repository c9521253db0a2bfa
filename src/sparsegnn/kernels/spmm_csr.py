"""CSR SpMM in Triton: ``out[i, :] = reduce_{e in row i} val[e] * x[col[e], :]``, reduce sum/mean/max.

Kernels:

- ``_spmm_rows_kernel``: the simple row-per-program schedule (one program per row and
  feature block).  ``spmm_csr`` launches it as the unplanned baseline ("naive-triton" in the
  benchmarks); the planned path uses it as its flat, single-launch schedule on small graphs.
- ``_grouped_kernel``: the planned schedule, one launch, heaviest work first.  Pieces of long
  rows go into a partials buffer and heavier rows are reduced one per program (``BLOCK_E`` edges
  per step); a program of the rest reduces ``GROUP_ROWS`` short rows side by side (rows of
  similar degree: the plan lists them by degree bucket), gathering ``GROUP_E`` edges of each
  per step, so many independent gathers are in flight even when rows have two edges.
- ``_segment_reduce_kernel``: each long row's partials in a fixed order (deterministic, no
  atomics); generally, any list of edge segments.

Every grid is ``(programs, feature blocks)`` with the feature block slowest, so while one
feature block is processed only ``N x BLOCK_F`` of ``x`` is gathered and it can stay in L2.

Feature and edge tails are masked; node and feature offsets are int64.  Every schedule can
also scale each gathered source row by a factor of its own (``src_scale``: features packed
to fp16 with a scale per row, ``kernels/pack.py``), and write an output of another dtype than
the features' (fp32 results of half features).
"""
from __future__ import annotations

import math
import threading
from typing import Dict, List, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import current_stream_key
from ._launch import Bound, launch
from .configs import spmm_csr_default, spmm_plan_config

REDUCE_CODES = {"sum": 0, "mean": 1, "max": 2}
#: Bytes of per-call temporaries (the partial sums of long rows' pieces) up to which a bound
#: launch keeps one set for all its calls instead of allocating them per call (a
#: ``torch.empty`` is 2-5 us of host on the H200's, on calls of 20-40 us): the binding is per
#: stream, so its calls run one after another and each fully writes them before reading.  The
#: set lives as long as the binding (the graph's cache entry for that width, dtype and stream).
KEEP_TEMPORARIES_BYTES = 1 << 22


@triton.jit
def _reduce_range(
    start, end, col_ptr, val_ptr, x_ptr, stride_x, feat, feat_mask,
    REDUCE: tl.constexpr, HAS_VAL: tl.constexpr, IDENTITY: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, HEAD_DIM: tl.constexpr = 0, num_heads=1,
    SRC_SCALE: tl.constexpr = False, scale_ptr=None,
):
    """``reduce_{e in [start, end)} val[e] * x[col[e], feat]`` as an fp32 [BLOCK_F] vector,
    BLOCK_E edges per step (mean divides by ``end - start``; max of no edges is 0).
    ``IDENTITY`` gathers row ``e`` of ``x`` for edge ``e`` (reducing partial results).
    ``HEAD_DIM > 0``: multi-head weights ``val[e, feat // HEAD_DIM]`` of a ``[E, num_heads]``
    tensor (feature ``f`` of ``x`` belongs to head ``f // HEAD_DIM``).  ``SRC_SCALE``: each
    gathered row is scaled by ``scale[col[e]]`` too (features packed with a factor per row,
    ``kernels/pack.py``; single-head values only)."""
    if REDUCE == 2:
        acc = tl.full([BLOCK_E, BLOCK_F], float("-inf"), dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)
    for edge0 in range(start, end, BLOCK_E):
        edge = edge0 + tl.arange(0, BLOCK_E)
        edge_mask = edge < end
        if IDENTITY:
            src = edge.to(tl.int64)
        else:
            src = tl.load(col_ptr + edge, mask=edge_mask, other=0).to(tl.int64)
        mask = edge_mask[:, None] & feat_mask[None, :]
        tile = tl.load(x_ptr + src[:, None] * stride_x + feat[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_VAL:
            if HEAD_DIM > 0:
                head = (feat // HEAD_DIM).to(tl.int64)
                weight2 = tl.load(val_ptr + edge.to(tl.int64)[:, None] * num_heads + head[None, :], mask=mask,
                                  other=0.0).to(tl.float32)
                tile = tile * weight2
            else:
                weight = tl.load(val_ptr + edge, mask=edge_mask, other=0.0).to(tl.float32)
                if SRC_SCALE:
                    weight = weight * tl.load(scale_ptr + src, mask=edge_mask, other=0.0).to(tl.float32)
                tile = tile * weight[:, None]
        elif SRC_SCALE:
            tile = tile * tl.load(scale_ptr + src, mask=edge_mask, other=0.0).to(tl.float32)[:, None]
        if REDUCE == 2:
            acc = tl.maximum(acc, tl.where(mask, tile, float("-inf")), propagate_nan=tl.PropagateNan.ALL)
        else:
            acc += tile
    if REDUCE == 2:
        # tl.max skips NaN; adding 0 (NaN where a lane holds NaN) makes the max NaN as in PyG
        result = tl.where(end > start, tl.max(acc, axis=0) + tl.sum(tl.where(acc != acc, acc, 0.0), axis=0), 0.0)
    else:
        result = tl.sum(acc, axis=0)
        if REDUCE == 1:
            result = result / tl.maximum(end - start, 1).to(tl.float32)
    return result


@triton.jit
def _spmm_rows_kernel(
    rowptr_ptr, col_ptr, val_ptr, scale_ptr, x_ptr, out_ptr, heavy_ptr,
    num_heavy, light_max, num_feats, stride_x, stride_out, num_heads,
    REDUCE: tl.constexpr, HAS_VAL: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
    HEAVY_E: tl.constexpr = 0, HEAD_DIM: tl.constexpr = 0, SRC_SCALE: tl.constexpr = False,
):
    """One program per (row, feature block), ``BLOCK_E`` edges per step: few arguments, cheap
    to launch.  With ``HEAVY_E > 0`` the first ``num_heavy`` programs take the listed heavy
    rows (``heavy_ptr``) with ``HEAVY_E`` edges per step, and the row programs skip rows of
    more than ``light_max`` edges: a hub then takes few steps, and it starts first."""
    pid = tl.program_id(0)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    if HEAVY_E > 0:
        # Both loops run in every program, one over an empty range: no loop inside if/else.
        # (With the loops in nested branches the GPU gave NaN rows that the interpreter did not;
        # this form is right on both.)
        is_heavy = pid < num_heavy
        listed = tl.load(heavy_ptr + pid, mask=is_heavy, other=0).to(tl.int64)
        row = tl.where(is_heavy, listed, (pid - num_heavy).to(tl.int64))
        start = tl.load(rowptr_ptr + row)
        end = tl.load(rowptr_ptr + row + 1)
        is_light = (pid >= num_heavy) & (end - start <= light_max)
        heavy = _reduce_range(start, tl.where(is_heavy, end, start), col_ptr, val_ptr, x_ptr, stride_x, feat,
                              feat_mask, REDUCE, HAS_VAL, False, HEAVY_E, BLOCK_F, HEAD_DIM, num_heads,
                              SRC_SCALE, scale_ptr)
        light = _reduce_range(start, tl.where(is_light, end, start), col_ptr, val_ptr, x_ptr, stride_x, feat,
                              feat_mask, REDUCE, HAS_VAL, False, BLOCK_E, BLOCK_F, HEAD_DIM, num_heads,
                              SRC_SCALE, scale_ptr)
        result = tl.where(is_heavy, heavy, light)
        # the row's flag broadcast over the features (the interpreter rejects a scalar-bool mask term)
        written = feat_mask & ((is_heavy | is_light).to(tl.int32) + tl.zeros_like(feat) > 0)
        tl.store(out_ptr + row * stride_out + feat, result.to(out_ptr.dtype.element_ty), mask=written)
    else:
        row = pid.to(tl.int64)
        start = tl.load(rowptr_ptr + row)
        end = tl.load(rowptr_ptr + row + 1)
        result = _reduce_range(start, end, col_ptr, val_ptr, x_ptr, stride_x, feat, feat_mask,
                               REDUCE, HAS_VAL, False, BLOCK_E, BLOCK_F, HEAD_DIM, num_heads, SRC_SCALE, scale_ptr)
        tl.store(out_ptr + row * stride_out + feat, result.to(out_ptr.dtype.element_ty), mask=feat_mask)


@triton.jit
def _segment_reduce_kernel(
    seg_ids_ptr, start_ptr, end_ptr, col_ptr, val_ptr, src_scale_ptr, x_ptr, out_ptr, out_rows_ptr, scale_ptr,
    num_segments, num_feats, stride_x, stride_out, num_heads,
    REDUCE: tl.constexpr, HAS_SEG_IDS: tl.constexpr, HAS_OUT_ROWS: tl.constexpr,
    HAS_VAL: tl.constexpr, HAS_SCALE: tl.constexpr, IDENTITY: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, HEAD_DIM: tl.constexpr = 0,
    SRC_SCALE: tl.constexpr = False,
):
    """Segment ``s`` covers edges ``[start[id], end[id])`` with ``id = seg_ids[s]`` (or ``s``);
    its result goes to row ``out_rows[s]`` (or ``id``) of ``out``; ``scale`` multiplies it
    (``src_scale``: each gathered row, see ``_reduce_range``)."""
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    for r in tl.static_range(ROWS):
        seg = tl.program_id(0).to(tl.int64) * ROWS + r
        if seg < num_segments:
            if HAS_SEG_IDS:
                seg_id = tl.load(seg_ids_ptr + seg).to(tl.int64)
            else:
                seg_id = seg
            start = tl.load(start_ptr + seg_id)
            end = tl.load(end_ptr + seg_id)
            result = _reduce_range(start, end, col_ptr, val_ptr, x_ptr, stride_x, feat, feat_mask,
                                   REDUCE, HAS_VAL, IDENTITY, BLOCK_E, BLOCK_F, HEAD_DIM, num_heads,
                                   SRC_SCALE, src_scale_ptr)
            if HAS_SCALE:
                result = result * tl.load(scale_ptr + seg).to(tl.float32)
            if HAS_OUT_ROWS:
                out_row = tl.load(out_rows_ptr + seg).to(tl.int64)
            else:
                out_row = seg_id
            tl.store(out_ptr + out_row * stride_out + feat, result.to(out_ptr.dtype.element_ty), mask=feat_mask)


@triton.jit
def _last_piece_combines(
    partial_ptr, count_ptr, group, first, last, is_piece, feat, feat_mask, num_feats,
    REDUCE: tl.constexpr, BLOCK_F: tl.constexpr,
):
    """For a program that stored its piece's partial (``is_piece``): count it in
    ``count[group, feature block]`` (acq_rel atomic after a CTA barrier) and, in the piece that
    arrives last, combine the group's partials ``first .. last`` *in piece order* (sum, or max
    for ``REDUCE == 2``; deterministic whatever the arrival order) and reset the counter to 0
    for the next call.  Returns ``(combined fp32 [BLOCK_F], whether this piece arrived last)``."""
    counter = count_ptr + group * tl.num_programs(1) + tl.program_id(1)
    tl.debug_barrier()  # every thread's partial is stored before the acq_rel atomic below
    arrived = tl.atomic_add(counter, 1, mask=is_piece, sem="acq_rel")
    is_last = is_piece & (arrived == last - first - 1)
    if REDUCE == 2:
        acc = tl.full([BLOCK_F], float("-inf"), dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_F], dtype=tl.float32)
    for q in range(first, tl.where(is_last, last, first)):
        other = tl.load(partial_ptr + q * num_feats + feat, mask=feat_mask, other=0.0, cache_modifier=".cg")
        if REDUCE == 2:
            acc = tl.maximum(acc, other, propagate_nan=tl.PropagateNan.ALL)
        else:
            acc += other
    tl.store(counter, 0, mask=is_last)
    return acc, is_last


@triton.jit
def _spmm_split_kernel(
    rowptr_ptr, col_ptr, val_ptr, scale_ptr, x_ptr, out_ptr,
    piece_heavy_ptr, piece_start_ptr, heavy_rows_ptr, heavy_first_ptr, partial_ptr, count_ptr,
    num_pieces, light_max, num_feats, stride_x, stride_out, num_heads,
    REDUCE: tl.constexpr, HAS_VAL: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
    PIECE_REDUCE: tl.constexpr, HEAVY_E: tl.constexpr, PIECE_E: tl.constexpr, INLINE: tl.constexpr,
    HEAD_DIM: tl.constexpr = 0, SRC_SCALE: tl.constexpr = False,
):
    """Flat launch with heavy rows split: programs ``[0, num_pieces)`` each reduce one piece of
    ``PIECE_E`` edges of a heavy row (``HEAVY_E`` edges per step), the rest one light row each
    (``BLOCK_E`` per step; rows of more than ``light_max`` edges are skipped: they are pieces).

    A piece writes its fp32 partial to ``partial[piece]``.  With ``INLINE``, it then counts
    itself in ``count[heavy row, feature block]`` (acq_rel atomic after a CTA barrier); the
    program that arrives last sums the row's partials *in piece order* (deterministic whatever
    the arrival order), writes the row and resets the counter to 0 for the next call.  Without
    ``INLINE`` a second launch combines (``_segment_reduce_kernel`` with ``IDENTITY``).
    Every loop runs unconditionally, over an empty range where it does not apply."""
    pid = tl.program_id(0)
    fblock = tl.program_id(1)
    feat = fblock * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    is_piece = pid < num_pieces
    piece = tl.minimum(pid, tl.maximum(num_pieces - 1, 0)).to(tl.int64)
    heavy = tl.load(piece_heavy_ptr + piece, mask=is_piece, other=0).to(tl.int64)
    piece_start = tl.load(piece_start_ptr + piece, mask=is_piece, other=0)
    heavy_row = tl.load(heavy_rows_ptr + heavy, mask=is_piece, other=0).to(tl.int64)
    heavy_start = tl.load(rowptr_ptr + heavy_row, mask=is_piece, other=0)
    heavy_end = tl.load(rowptr_ptr + heavy_row + 1, mask=is_piece, other=0)
    piece_end = tl.minimum(piece_start + PIECE_E, heavy_end)
    row = tl.where(is_piece, heavy_row, (pid - num_pieces).to(tl.int64))
    start = tl.load(rowptr_ptr + row)
    end = tl.load(rowptr_ptr + row + 1)
    is_light = (pid >= num_pieces) & (end - start <= light_max)
    # pieces reduce sums (PIECE_REDUCE = 0; mean divides at the end) or maxima (2)
    part = _reduce_range(piece_start, tl.where(is_piece, piece_end, piece_start), col_ptr, val_ptr, x_ptr,
                         stride_x, feat, feat_mask, PIECE_REDUCE, HAS_VAL, False, HEAVY_E, BLOCK_F,
                         HEAD_DIM, num_heads, SRC_SCALE, scale_ptr)
    light = _reduce_range(start, tl.where(is_light, end, start), col_ptr, val_ptr, x_ptr, stride_x, feat,
                          feat_mask, REDUCE, HAS_VAL, False, BLOCK_E, BLOCK_F, HEAD_DIM, num_heads,
                          SRC_SCALE, scale_ptr)
    zeros = tl.zeros_like(feat)
    tl.store(out_ptr + row * stride_out + feat, light.to(out_ptr.dtype.element_ty),
             mask=feat_mask & (is_light.to(tl.int32) + zeros > 0))
    tl.store(partial_ptr + piece * num_feats + feat, part, mask=feat_mask & (is_piece.to(tl.int32) + zeros > 0))
    if INLINE:
        first = tl.load(heavy_first_ptr + heavy, mask=is_piece, other=0)
        last = tl.load(heavy_first_ptr + heavy + 1, mask=is_piece, other=0)
        acc, is_last = _last_piece_combines(partial_ptr, count_ptr, heavy, first, last, is_piece, feat, feat_mask,
                                            num_feats, REDUCE, BLOCK_F)
        if REDUCE == 1:
            acc = acc / tl.maximum(heavy_end - heavy_start, 1).to(tl.float32)
        tl.store(out_ptr + heavy_row * stride_out + feat, acc.to(out_ptr.dtype.element_ty),
                 mask=feat_mask & (is_last.to(tl.int32) + zeros > 0))


@triton.jit
def _rows_side_by_side(
    start, deg, max_deg, col_ptr, val_ptr, x_ptr, stride_x, feat, feat_mask,
    REDUCE: tl.constexpr, HAS_VAL: tl.constexpr, ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
    SRC_SCALE: tl.constexpr = False, scale_ptr=None,
):
    """``reduce_{e in row} w_e x[col[e], feat]`` of ``ROWS`` rows at once (edges ``start[r] ..
    start[r] + deg[r]``), as a fp32 ``[ROWS, BLOCK_F]`` tile: step ``k`` gathers edges
    ``k..k+BLOCK_E`` of every row (a [ROWS, BLOCK_E, BLOCK_F] tile), until ``max_deg``.  Mean
    divides by the degree; the max of no edges is 0.  ``SRC_SCALE`` scales each gathered row by
    ``scale[col[e]]`` (see ``_reduce_range``).  (``_grouped_kernel`` here and the batched
    kernels of ``spmm_batched`` share it.)"""
    if REDUCE == 2:
        acc = tl.full([ROWS, BLOCK_E, BLOCK_F], float("-inf"), dtype=tl.float32)
    else:
        acc = tl.zeros([ROWS, BLOCK_E, BLOCK_F], dtype=tl.float32)
    for k in range(0, max_deg, BLOCK_E):
        slot = k + tl.arange(0, BLOCK_E)
        edge_mask = slot[None, :] < deg[:, None]
        edge = start[:, None] + slot[None, :]
        src = tl.load(col_ptr + edge, mask=edge_mask, other=0).to(tl.int64)
        mask = edge_mask[:, :, None] & feat_mask[None, None, :]
        tile = tl.load(x_ptr + src[:, :, None] * stride_x + feat[None, None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_VAL:
            weight = tl.load(val_ptr + edge, mask=edge_mask, other=0.0).to(tl.float32)
            if SRC_SCALE:    # rows packed with a factor each (see _reduce_range)
                weight = weight * tl.load(scale_ptr + src, mask=edge_mask, other=0.0).to(tl.float32)
            tile = tile * weight[:, :, None]
        elif SRC_SCALE:
            tile = tile * tl.load(scale_ptr + src, mask=edge_mask, other=0.0).to(tl.float32)[:, :, None]
        if REDUCE == 2:
            acc = tl.maximum(acc, tl.where(mask, tile, float("-inf")), propagate_nan=tl.PropagateNan.ALL)
        else:
            acc += tile
    if REDUCE == 2:
        result = tl.max(acc, axis=1) + tl.sum(tl.where(acc != acc, acc, 0.0), axis=1)   # NaN kept, as above
        result = tl.where(deg[:, None] > 0, result, 0.0)
    else:
        result = tl.sum(acc, axis=1)
        if REDUCE == 1:
            result = result / tl.maximum(deg, 1).to(tl.float32)[:, None]
    return result


@triton.jit
def _grouped_kernel(
    rows_ptr, rowptr_ptr, piece_start_ptr, piece_end_ptr, col_ptr, val_ptr, scale_ptr, x_ptr, out_ptr, partial_ptr,
    piece_long_ptr, long_rows_ptr, long_first_ptr, count_ptr,
    num_pieces, num_heavy, num_listed, num_feats, stride_x, stride_out,
    REDUCE: tl.constexpr, HAS_VAL: tl.constexpr, ROWS: tl.constexpr, GROUP_E: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, SRC_SCALE: tl.constexpr = False, INLINE: tl.constexpr = False,
):
    """Every short row and long-row piece in one launch, the longest work first:

    - programs ``[0, num_pieces)``: piece ``p`` (edges ``piece_start[p] .. piece_end[p]``) into
      row ``p`` of the fp32 ``partial`` buffer (sums, or maxima for max), ``BLOCK_E`` edges per
      step; with ``INLINE`` (set when there are pieces) the piece then counts itself in
      ``count[long row, feature block]`` (acq_rel atomic after a CTA barrier) and the piece
      that arrives last combines its row's partials *in piece order* (deterministic whatever
      the arrival order: sum, mean or max), writes the row and resets the counter to 0 for the
      next call (``long_first``: the row's pieces; ``piece_long``: each piece's row);
    - the next ``num_heavy``: listed row ``p - num_pieces`` alone, ``BLOCK_E`` edges per step;
    - the rest: ``ROWS`` listed rows each, side by side (``_rows_side_by_side``, ``GROUP_E``
      edges of each per step), until ``num_listed``.

    ``rows`` lists rows heaviest first (``RowPlan.short_desc``): the longest programs start
    first and the short rows' groups fill the GPU while they finish (two launches, or the
    rows in ascending order, left a tail: 1.1-1.5x slower on the mid-size stand-ins).
    Every loop runs in every program, over an empty range where it does not apply."""
    pid = tl.program_id(0)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    zeros = tl.zeros_like(feat)
    is_piece = pid < num_pieces
    is_heavy = (pid >= num_pieces) & (pid < num_pieces + num_heavy)
    row = tl.load(rows_ptr + (pid - num_pieces), mask=is_heavy, other=0).to(tl.int64)
    piece = tl.minimum(pid, tl.maximum(num_pieces - 1, 0)).to(tl.int64)
    start = tl.where(is_piece, tl.load(piece_start_ptr + piece, mask=is_piece, other=0),
                     tl.load(rowptr_ptr + row, mask=is_heavy, other=0))
    end = tl.where(is_piece, tl.load(piece_end_ptr + piece, mask=is_piece, other=0),
                   tl.load(rowptr_ptr + row + 1, mask=is_heavy, other=0))
    end = tl.where(is_piece | is_heavy, end, start)
    # pieces and heavy rows: sums (mean divides a whole row below) or maxima
    alone = _reduce_range(start, end, col_ptr, val_ptr, x_ptr, stride_x, feat, feat_mask,
                          2 if REDUCE == 2 else 0, HAS_VAL, False, BLOCK_E, BLOCK_F, 0, 1, SRC_SCALE, scale_ptr)
    tl.store(partial_ptr + piece * num_feats + feat, alone, mask=feat_mask & (is_piece.to(tl.int32) + zeros > 0))
    if INLINE:   # the last piece of a long row to arrive combines the row
        owner = tl.load(piece_long_ptr + piece, mask=is_piece, other=0).to(tl.int64)
        first = tl.load(long_first_ptr + owner, mask=is_piece, other=0)
        last = tl.load(long_first_ptr + owner + 1, mask=is_piece, other=0)
        acc, is_last = _last_piece_combines(partial_ptr, count_ptr, owner, first, last, is_piece, feat, feat_mask,
                                            num_feats, REDUCE, BLOCK_F)
        long_row = tl.load(long_rows_ptr + owner, mask=is_piece, other=0).to(tl.int64)
        if REDUCE == 1:
            row_start = tl.load(rowptr_ptr + long_row, mask=is_piece, other=0)
            row_end = tl.load(rowptr_ptr + long_row + 1, mask=is_piece, other=0)
            acc = acc / tl.maximum(row_end - row_start, 1).to(tl.float32)
        tl.store(out_ptr + long_row * stride_out + feat, acc.to(out_ptr.dtype.element_ty),
                 mask=feat_mask & (is_last.to(tl.int32) + zeros > 0))
    if REDUCE == 1:
        alone = alone / tl.maximum(end - start, 1).to(tl.float32)
    tl.store(out_ptr + row * stride_out + feat, alone.to(out_ptr.dtype.element_ty),
             mask=feat_mask & (is_heavy.to(tl.int32) + zeros > 0))
    first = num_heavy + (pid - num_pieces - num_heavy).to(tl.int64) * ROWS
    listed = first + tl.arange(0, ROWS)
    row_mask = (listed < num_listed) & (listed >= num_heavy)  # (a group starts at num_heavy + k ROWS)
    rows = tl.load(rows_ptr + listed, mask=row_mask, other=0).to(tl.int64)
    starts = tl.load(rowptr_ptr + rows, mask=row_mask, other=0)
    deg = tl.load(rowptr_ptr + rows + 1, mask=row_mask, other=0) - starts
    result = _rows_side_by_side(starts, deg, tl.max(deg, axis=0), col_ptr, val_ptr, x_ptr, stride_x, feat,
                                feat_mask, REDUCE, HAS_VAL, ROWS, GROUP_E, BLOCK_F, SRC_SCALE, scale_ptr)
    tl.store(out_ptr + rows[:, None] * stride_out + feat[None, :], result.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & feat_mask[None, :])


_RECORD = threading.local()


def _emit(kernel, grid, args, constexprs, num_warps, num_stages=None) -> None:
    """``launch``, or, inside ``_recorded``, note the launch instead (``bind_planned``)."""
    calls = getattr(_RECORD, "calls", None)
    if calls is None:
        launch(kernel, grid, args, constexprs, num_warps, num_stages)
    else:
        calls.append((kernel, grid, tuple(args), dict(constexprs), num_warps, num_stages))


def _recorded(fn) -> list:
    """The launches ``fn()`` would make, in order, made nothing (this thread only)."""
    _RECORD.calls = []
    try:
        fn()
        return _RECORD.calls
    finally:
        _RECORD.calls = None


def _bind_recorded(rowptr: Tensor, plan, edge_val: Optional[Tensor], reduce: str, config: Dict[str, int],
                   x: Tensor):
    """``bind_planned`` for any config: the launches of ``spmm_planned`` recorded twice, with
    different features, outputs and temporaries (the first recording's kept alive, so no
    address repeats); an argument whose address differs between the two is per call (features,
    output, a temporary: reallocated per call with its recorded shape and dtype, or on CUDA, up
    to ``KEEP_TEMPORARIES_BYTES``, allocated once and kept), the rest is bound
    (``_launch.Bound``)."""
    num_rows, num_feats = rowptr.numel() - 1, x.shape[1]
    probes = []

    def record():
        xp = torch.empty_like(x, memory_format=torch.contiguous_format)
        outp = torch.empty((num_rows, num_feats), dtype=x.dtype, device=x.device)
        probes.append((xp, outp))
        calls = _recorded(lambda: spmm_planned(rowptr, plan, edge_val, xp, reduce, config=config, out=outp))
        probes.append(calls)                     # keeps the temporaries alive
        return xp, outp, calls

    x1, out1, first = record()
    _, _, second = record()
    if len(first) != len(second):
        return lambda x: spmm_planned(rowptr, plan, edge_val, x, reduce, config=config)
    temps: Dict[int, tuple] = {}                 # data_ptr in the first recording -> (slot, shape, dtype)
    launches = []
    for (kernel, grid, args, cons, warps, stages), (_, _, args2, _, _, _) in zip(first, second):
        varying, sources = [], []
        for i, (a, a2) in enumerate(zip(args, args2)):
            if not isinstance(a, Tensor) or a.data_ptr() == a2.data_ptr():
                continue
            varying.append(i)
            if a.data_ptr() == x1.data_ptr():
                sources.append("x")
            elif a.data_ptr() == out1.data_ptr():
                sources.append("out")
            elif a._base is not None or not a.is_contiguous():
                # a per-call tensor that is not a plain fresh buffer (a view, a derived copy):
                # what it holds cannot be rebuilt by an empty allocation, so nothing is bound
                return lambda x: spmm_planned(rowptr, plan, edge_val, x, reduce, config=config)
            else:
                slot = temps.setdefault(a.data_ptr(), (len(temps), tuple(a.shape), a.dtype))[0]
                sources.append(slot)
        # the per-call positions hold placeholders: the probes are not kept by the binding
        fixed = tuple(None if i in varying else a for i, a in enumerate(args))
        launches.append((Bound(kernel, fixed, cons, warps, stages, varying=tuple(varying)), grid, tuple(sources)))
    shapes = [None] * len(temps)
    for slot, shape, dtype in temps.values():
        shapes[slot] = (shape, dtype)
    probes.clear()

    # each launch's per-call values as positions in [x, out, temporaries...]
    picks = [(bound, grid, tuple(0 if s == "x" else 1 if s == "out" else 2 + s for s in sources))
             for bound, grid, sources in launches]
    if not shapes and len(picks) == 1 and picks[0][2] == (0, 1):   # the common case: one launch of x -> out
        (bound, grid, _), = picks

        def run_one(x: Tensor) -> Tensor:
            x = x.contiguous()
            out = torch.empty((num_rows, num_feats), dtype=x.dtype, device=x.device)
            bound(grid, (x, out))
            return out

        return run_one

    kept: List[Tensor] = []
    keep = x.is_cuda and sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                             for shape, dtype in shapes) <= KEEP_TEMPORARIES_BYTES

    def run(x: Tensor) -> Tensor:
        x = x.contiguous()
        slots = [x, torch.empty((num_rows, num_feats), dtype=x.dtype, device=x.device)]
        if keep:        # one set per binding: its calls run one after another on its stream
            if not kept:    # (one whole assignment: two threads filling at once keep one set)
                kept[:] = [torch.empty(shape, dtype=dtype, device=x.device) for shape, dtype in shapes]
            slots += kept
        else:
            slots += [torch.empty(shape, dtype=dtype, device=x.device) for shape, dtype in shapes]
        for bound, grid, pick in picks:
            bound(grid, tuple(map(slots.__getitem__, pick)))
        return slots[1]

    return run


def _prepare(rowptr: Tensor, x: Tensor, out: Optional[Tensor]):
    """Contiguous ``x`` and the [N, F] output buffer (allocated unless given)."""
    x = x.contiguous()
    if out is None:
        out = torch.empty((rowptr.numel() - 1, x.shape[1]), dtype=x.dtype, device=x.device)
    return x, out


def spmm_csr(
    rowptr: Tensor,
    col: Tensor,
    edge_val: Optional[Tensor],
    x: Tensor,
    config: Optional[Dict[str, int]] = None,
    out: Optional[Tensor] = None,
    reduce: str = "sum",
    src_scale: Optional[Tensor] = None,
) -> Tensor:
    """Row-per-program CSR SpMM, unplanned: the baseline, and the kernel of transient graphs
    (a sampled mini-batch is used once: building a row plan would cost more than it saves).

    Args:
        rowptr: [N + 1] int64 row offsets.
        col: [E] column (source) indices.
        edge_val: [E] values, [E, H] multi-head values (``F % H == 0``) or None (all ones).
        x: [M, F] features (float32 / float16 / bfloat16), made contiguous here.
        config: ``BLOCK_E``, ``BLOCK_F``, ``num_warps``; default from ``configs.spmm_csr_default``.
        out: optional contiguous [N, F] output buffer, every element written (default: ``x``'s
            dtype; an fp32 buffer for half features keeps the fp32 accumulation).
        reduce: ``"sum"``, ``"mean"`` (over the stored edges) or ``"max"`` (0 for empty rows).
        src_scale: optional [M] fp32 factor per source row (features packed with a scale per
            row, ``kernels/pack.py``): edge ``e`` weighs ``val[e] * src_scale[col[e]]``.

    Returns:
        ``out``, or a new [N, F] tensor of ``x``'s dtype; fp32 accumulation; deterministic.
    """
    x, out = _prepare(rowptr, x, out)
    num_rows, num_feats = out.shape
    if num_rows == 0 or num_feats == 0:
        return out
    cfg = dict(config or spmm_csr_default(num_feats))
    num_warps = cfg.pop("num_warps", 4)
    multi_head = edge_val is not None and edge_val.dim() == 2
    _check_src_scale(src_scale, multi_head, x, "spmm_csr")
    num_heads = edge_val.shape[1] if multi_head else 1
    grid = (num_rows, triton.cdiv(num_feats, cfg["BLOCK_F"]))
    launch(_spmm_rows_kernel, grid,
           (rowptr, col, edge_val if edge_val is not None else col, src_scale if src_scale is not None else col,
            x, out, rowptr, 0, 0, num_feats, x.stride(0), out.stride(0), num_heads),
           dict(REDUCE=REDUCE_CODES[reduce], HAS_VAL=edge_val is not None,
                HEAD_DIM=num_feats // num_heads if multi_head else 0, SRC_SCALE=src_scale is not None, **cfg),
           num_warps)
    return out


def _check_src_scale(src_scale: Optional[Tensor], multi_head: bool, x: Tensor, fn: str) -> None:
    """``src_scale``: None, or a contiguous float32 [M] on ``x``'s device, with single-head values."""
    if src_scale is None:
        return
    if multi_head:
        raise ValueError(f"{fn}(): src_scale needs single-head edge values ([E] or None)")
    if (src_scale.dim() != 1 or src_scale.numel() != x.shape[0] or src_scale.dtype != torch.float32
            or src_scale.stride(0) != 1 or src_scale.device != x.device):
        raise ValueError(f"{fn}(): src_scale must be a contiguous float32 tensor of shape [{x.shape[0]}] on "
                         f"{x.device}, got {src_scale.dtype} of shape {tuple(src_scale.shape)} on {src_scale.device}")


def _launch(seg_ids, start, end, col, val, x, out, out_rows, scale, num_segments, reduce_code, identity, cfg,
            head_dim=0, num_heads=1, src_scale=None):
    rows, block_f = cfg["ROWS"], cfg["BLOCK_F"]
    grid = (triton.cdiv(num_segments, rows), triton.cdiv(x.shape[1], block_f))
    dummy = start
    _emit(_segment_reduce_kernel, grid,
           (seg_ids if seg_ids is not None else dummy, start, end,
            col if col is not None else dummy, val if val is not None else dummy,
            src_scale if src_scale is not None else dummy,
            x, out, out_rows if out_rows is not None else dummy, scale if scale is not None else dummy,
            num_segments, x.shape[1], x.stride(0), out.stride(0), num_heads),
           dict(REDUCE=reduce_code, HAS_SEG_IDS=seg_ids is not None, HAS_OUT_ROWS=out_rows is not None,
                HAS_VAL=val is not None, HAS_SCALE=scale is not None, IDENTITY=identity,
                ROWS=rows, BLOCK_E=cfg["BLOCK_E"], BLOCK_F=block_f, HEAD_DIM=head_dim,
                SRC_SCALE=src_scale is not None),
           cfg["num_warps"], cfg.get("num_stages", 2))


def bind_planned(rowptr: Tensor, plan, edge_val: Optional[Tensor], reduce: str, config: Dict[str, int],
                 x: Tensor):
    """``run(x) -> spmm_planned(rowptr, plan, edge_val, x, reduce, config)`` for features of
    ``x``'s width, dtype and device (``x``: a sample, not kept), with what does not depend on
    the features prepared once: every launch of the config is bound (``_launch.Bound``: the
    specialisation of the graph's tensors is not recomputed per call), through a recording of
    ``spmm_planned``'s launches (``_bind_recorded``), whose per-call temporaries must be
    ``torch.empty`` buffers that every call fully writes before it reads them (fresh per call,
    or kept for the binding's calls on one stream).

    Shapes:
        x: [M, F] -> run: [M, F] -> [N, F].
    """
    if rowptr.numel() == 1 or x.shape[1] == 0 or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        # inside a capture the recording would see the capture's own arrival counters (new per
        # call, ``formats.plan``) and bind none of them: unbound there
        return lambda x: spmm_planned(rowptr, plan, edge_val, x, reduce, config=config)
    return _bind_recorded(rowptr, plan, edge_val, reduce, config, x)


def spmm_planned(
    rowptr: Tensor,
    plan,
    edge_val: Optional[Tensor],
    x: Tensor,
    reduce: str = "sum",
    config: Optional[Dict[str, int]] = None,
    out: Optional[Tensor] = None,
    src_scale: Optional[Tensor] = None,
) -> Tensor:
    """Planned CSR SpMM with ``reduce`` in {sum, mean, max}.

    Args:
        rowptr: [N + 1] int64 row offsets.
        plan: ``formats.plan.RowPlan`` of this CSR (short rows, long-row pieces, int32 columns).
        edge_val: [E] values or None.
        x: [M, F] float32 / float16 / bfloat16 features.
        reduce: ``"sum"``, ``"mean"`` (divide by the number of edges) or ``"max"`` (0 for empty rows).
        config: ``GROUP_ROWS`` x ``GROUP_E`` (short-row groups; ``ROWS`` when absent), ``BLOCK_E``
            (edges per step of a heavier row or long-row piece), ``LIGHT_STEPS``, ``BLOCK_F``,
            ``num_warps`` (default: ``configs.spmm_plan_config``); with
            ``FLAT`` set, a single launch reduces every row whole (``BLOCK_E`` edges per step;
            with ``HEAVY_E``, rows of more than ``LIGHT_STEPS`` steps take ``HEAVY_E`` per step).
        out: optional contiguous [N, F] output buffer, every element written (default: ``x``'s
            dtype; an fp32 buffer for half features keeps the fp32 accumulation).
        src_scale: optional [M] fp32 factor per source row (as in ``spmm_csr``).

    Returns:
        ``out``, or a new [N, F] tensor of ``x``'s dtype; fp32 accumulation; deterministic.
    """
    x, out = _prepare(rowptr, x, out)
    num_rows, num_feats = out.shape
    if num_rows == 0 or num_feats == 0:
        return out
    cfg = config or spmm_plan_config(num_rows, plan.col32.numel(), num_feats, x.element_size(), plan.max_degree)
    code = REDUCE_CODES[reduce]
    # multi-head weights [E, H]: feature f of x belongs to head f // (F / H)
    num_heads = edge_val.shape[1] if edge_val is not None and edge_val.dim() == 2 else 1
    head_dim = num_feats // num_heads if edge_val is not None and edge_val.dim() == 2 else 0
    _check_src_scale(src_scale, head_dim > 0, x, "spmm_planned")
    val = edge_val if edge_val is not None else rowptr
    scale = src_scale if src_scale is not None else rowptr
    if cfg.get("SPLIT"):  # one launch; heavy rows in pieces of PIECE_STEPS x HEAVY_E edges
        return _spmm_split(rowptr, plan, val, edge_val is not None, x, out, code, cfg, head_dim, num_heads,
                           scale, src_scale is not None)
    if cfg.get("FLAT"):  # one launch, one row per program: least host overhead (small graphs)
        block_f, heavy_e = cfg["BLOCK_F"], cfg.get("HEAVY_E", 0)
        heavy, light_max = rowptr, 0
        if heavy_e:  # rows of more than LIGHT_STEPS light steps: listed first, HEAVY_E edges per step
            heavy, light_max = plan.heavy_rows(cfg.get("LIGHT_STEPS", 8) * cfg["BLOCK_E"])
        num_heavy = heavy.numel() if heavy_e else 0
        _emit(_spmm_rows_kernel, (num_heavy + num_rows, triton.cdiv(num_feats, block_f)),
               (rowptr, plan.col32, val, scale, x, out, heavy,
                num_heavy, light_max, num_feats, x.stride(0), out.stride(0), num_heads),
               dict(REDUCE=code, HAS_VAL=edge_val is not None, BLOCK_E=cfg["BLOCK_E"], BLOCK_F=block_f,
                    HEAVY_E=heavy_e, HEAD_DIM=head_dim, SRC_SCALE=src_scale is not None),
               cfg["num_warps"], cfg.get("num_stages", 3))
        return out
    if head_dim:
        raise ValueError("spmm_planned(): multi-head edge values need a FLAT or SPLIT config")
    num_short, num_long = plan.short_rows.numel(), plan.long_rows.numel()
    group = cfg.get("GROUP_ROWS", cfg["ROWS"])
    group_e = cfg.get("GROUP_E", cfg["BLOCK_E"])
    # Light rows (at most LIGHT_STEPS steps of GROUP_E edges) side by side; heavier short rows
    # one per program with BLOCK_E-edge steps, so a hub does not serialise a whole group; long
    # rows in pieces: all in one launch, heaviest first (``_grouped_kernel``).
    if group == 1 and group_e >= cfg["BLOCK_E"]:  # row groups are as wide as the segment steps
        num_light = num_short
    else:
        num_light = plan.num_short_below(cfg.get("LIGHT_STEPS", 4) * group_e)
    num_heavy, num_pieces = num_short - num_light, plan.num_pieces
    # no pieces: nothing is written to the partials (``out`` stands in, no allocation per call)
    partial = torch.empty((num_pieces, num_feats), dtype=torch.float32, device=x.device) if num_pieces else out
    fblocks = triton.cdiv(num_feats, cfg["BLOCK_F"])
    grid = (num_pieces + num_heavy + triton.cdiv(num_light, group), fblocks)
    # long rows' pieces combined in the same launch (INLINE): one launch whatever the graph
    # (a second one cost ~30 us of host time per call on the H200's host)
    counts = plan.long_counters(fblocks, current_stream_key(x.device)) if num_long else rowptr
    _emit(_grouped_kernel, grid,
           (plan.short_desc, rowptr, plan.piece_start, plan.piece_end, plan.col32, val, scale, x, out, partial,
            plan.piece_long, plan.long_rows, plan.long_piece_ptr, counts,
            num_pieces, num_heavy, num_short, num_feats, x.stride(0), out.stride(0)),
           dict(REDUCE=code, HAS_VAL=edge_val is not None, ROWS=group, GROUP_E=group_e, BLOCK_E=cfg["BLOCK_E"],
                BLOCK_F=cfg["BLOCK_F"], SRC_SCALE=src_scale is not None, INLINE=num_long > 0),
           cfg["num_warps"], cfg.get("num_stages"))
    return out


def _spmm_split(rowptr, plan, val, has_val, x, out, code, cfg, head_dim, num_heads, scale, has_scale):
    """Launch ``_spmm_split_kernel`` (and, without ``INLINE``, the combine pass)."""
    num_rows, num_feats = out.shape
    block_f, heavy_e = cfg["BLOCK_F"], cfg["HEAVY_E"]
    piece_e = heavy_e * cfg["PIECE_STEPS"]
    split = plan.split_pieces(cfg.get("LIGHT_STEPS", 8) * cfg["BLOCK_E"], piece_e)
    fblocks = triton.cdiv(num_feats, block_f)
    inline = bool(cfg.get("INLINE", 1))
    # no pieces: nothing is written to the partials (``out`` stands in, no allocation per call)
    partial = (torch.empty((split.num_pieces, num_feats), dtype=torch.float32, device=x.device)
               if split.num_pieces else out)
    counts = split.counters(fblocks, current_stream_key(x.device)) if inline else split.piece_heavy
    piece_code = REDUCE_CODES["max"] if code == REDUCE_CODES["max"] else REDUCE_CODES["sum"]
    _emit(_spmm_split_kernel, (split.num_pieces + num_rows, fblocks),
           (rowptr, plan.col32, val, scale, x, out,
            split.piece_heavy, split.piece_start, split.heavy_rows, split.heavy_first, partial, counts,
            split.num_pieces, split.light_max, num_feats, x.stride(0), out.stride(0), num_heads),
           dict(REDUCE=code, HAS_VAL=has_val, BLOCK_E=cfg["BLOCK_E"], BLOCK_F=block_f, PIECE_REDUCE=piece_code,
                HEAVY_E=heavy_e, PIECE_E=piece_e, INLINE=inline, HEAD_DIM=head_dim, SRC_SCALE=has_scale),
           cfg["num_warps"], cfg.get("num_stages", 3))
    if not inline and split.num_heavy:
        _launch(None, split.heavy_first, split.heavy_first[1:], None, None, partial, out, split.heavy_rows,
                split.inv_deg if code == REDUCE_CODES["mean"] else None, split.num_heavy, piece_code, True,
                dict(cfg, ROWS=1, BLOCK_E=8, num_warps=cfg.get("SEG_WARPS", 4)))
    return out
