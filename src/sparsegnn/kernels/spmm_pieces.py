"""First-contact CSR SpMM: edge-balanced row pieces, found and reduced in one launch, no host sync.

``out[i, :] = sum_{e in row i} val[e] * x[col[e], :]`` (``mean``: divided by ``deg_i``).

A graph met for the first time cannot afford a work plan (``formats/plan.py``: sorts, host
reads) or a tuned config, yet must not leave one program walking a hub's whole edge list.
Here every row is cut at the multiples of ``chunk`` in the edge array: row ``r`` owns the
*slots* ``s(r) .. s(r + 1) - 1`` with ``s(r) = r + floor(rowptr[r] / chunk)``, one slot per
piece of at most ``chunk`` edges (an empty row: one empty slot), ``N + floor(E / chunk)`` slots
in all.  ``s`` is increasing, so a program finds the row of its first slot by a binary search
over ``rowptr`` alone: nothing is built or read back per graph, one launch (and the zeroed
output) per call.  Each program takes ``ROWS`` consecutive slots side by side
(``spmm_csr._rows_side_by_side``, ``GROUP_E`` edges of each per step):

- a row of one slot stores its sum (deterministic, as the row kernel);
- the pieces of a longer row add theirs atomically into the zeroed output (so hub rows sum in
  an order that may vary from run to run; ``torch.use_deterministic_algorithms(True)`` takes
  the unsplit row kernel instead, ``spmm_csr.spmm_csr``).

Half features accumulate in fp32 (the pieces add into an fp32 buffer, cast once at the end).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch
from .spmm_csr import _rows_side_by_side


@triton.jit(do_not_specialize=["num_rows", "num_slots"])
def _spmm_slots_kernel(
    rowptr_ptr, col_ptr, val_ptr, x_ptr, out_ptr,
    num_rows, num_slots, chunk, num_feats, stride_x, stride_out,
    MEAN: tl.constexpr, HAS_VAL: tl.constexpr, ROWS: tl.constexpr, GROUP_E: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """Program ``(g, b)``: slots ``g * ROWS ..`` (see the module doc), feature block ``b``."""
    first = tl.program_id(0).to(tl.int64) * ROWS
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    # the last row r with s(r) <= first (s(0) = 0 <= first)
    lo = (first * 0).to(tl.int64)
    hi = lo + num_rows - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid + tl.load(rowptr_ptr + mid) // chunk <= first:
            lo = mid
        else:
            hi = mid - 1
    # the slots' rows: lo plus how many of the next ROWS - 1 rows start at or before each slot
    slot = first + tl.arange(0, ROWS)
    nxt = lo + 1 + tl.arange(0, ROWS)
    nxt_start = tl.where(nxt < num_rows, nxt + tl.load(rowptr_ptr + nxt, mask=nxt < num_rows, other=0) // chunk,
                         num_slots)
    offset = tl.sum((nxt_start[None, :] <= slot[:, None]).to(tl.int64), axis=1)
    live = slot < num_slots
    row = tl.where(live, tl.minimum(lo + offset, num_rows - 1), 0)
    row_start = tl.load(rowptr_ptr + row)
    row_end = tl.load(rowptr_ptr + row + 1)
    base = row_start // chunk
    piece = slot - (row + base)
    start = tl.maximum(row_start, (base + piece) * chunk)
    end = tl.minimum(row_end, (base + piece + 1) * chunk)
    deg = tl.where(live, end - start, 0)
    split = (row_end // chunk - base) > 0       # the row owns more than one slot
    result = _rows_side_by_side(start, deg, tl.max(deg, axis=0), col_ptr, val_ptr, x_ptr, stride_x, feat,
                                feat_mask, 0, HAS_VAL, ROWS, GROUP_E, BLOCK_F)
    if MEAN:
        result = result / tl.maximum(row_end - row_start, 1).to(tl.float32)[:, None]
    target = out_ptr + row[:, None] * stride_out + feat[None, :]
    mask = live[:, None] & feat_mask[None, :]
    tl.store(target, result.to(out_ptr.dtype.element_ty), mask=mask & ~split[:, None])
    tl.atomic_add(target, result, mask=mask & split[:, None], sem="relaxed")


def _block_f(num_feats: int) -> int:
    """The whole feature row in one block, 16 to 128 features (plain ints: this runs per call)."""
    return min(max(1 << (max(num_feats, 1) - 1).bit_length(), 16), 128)


def first_contact_config(num_rows: int, num_edges: int, num_feats: int) -> Dict[str, int]:
    """Piece length and block sizes from what is known without reading the graph: its sizes.

    ``chunk`` (a runtime value, no new compilation): about 8x the mean degree within [64, 1024]
    edges, so a row of ordinary degree is one piece and a hub is cut into many.  The compiled
    part depends on the feature width only (a new graph never compiles a new variant): 8 slots
    side by side, 4 edges of each per step, the whole feature row up to 128 features.
    """
    avg = num_edges / max(num_rows, 1)
    chunk = 64
    while chunk < 8 * avg and chunk < 1024:
        chunk *= 2
    block_f = _block_f(num_feats)
    return {"chunk": chunk, "ROWS": 8, "GROUP_E": 4, "BLOCK_F": block_f, "num_warps": 4 if block_f >= 64 else 2}


def spmm_pieces(
    rowptr: Tensor,
    col: Tensor,
    edge_val: Optional[Tensor],
    x: Tensor,
    config: Dict[str, int],
    reduce: str = "sum",
) -> Tensor:
    """``A x`` (``reduce`` ``"sum"`` or ``"mean"``) over row pieces of ``config["chunk"]`` edges.

    Args:
        rowptr: [N + 1] int64 row offsets; col: [E] source indices.
        edge_val: [E] values or None (ones).
        x: [M, F] float32 / float16 / bfloat16 features (made contiguous here).
        config: ``chunk``, ``ROWS``, ``GROUP_E``, ``BLOCK_F``, ``num_warps`` (``first_contact_config``).

    Returns:
        [N, F] of ``x``'s dtype, fp32 accumulation.
    """
    x = x.contiguous()
    edge_val = edge_val.contiguous() if edge_val is not None else None     # read as val_ptr + edge
    num_rows, num_feats, num_edges = rowptr.numel() - 1, x.shape[1], col.numel()
    acc_dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    out = torch.zeros((num_rows, num_feats), dtype=acc_dtype, device=x.device)
    if num_rows == 0 or num_feats == 0:
        return out.to(x.dtype)
    num_slots = num_rows + num_edges // config["chunk"]
    grid = (-(-num_slots // config["ROWS"]), -(-num_feats // config["BLOCK_F"]))
    launch(_spmm_slots_kernel, grid,
           (rowptr, col, edge_val if edge_val is not None else col, x, out,
            num_rows, num_slots, config["chunk"], num_feats, x.stride(0), out.stride(0)),
           dict(MEAN=reduce == "mean", HAS_VAL=edge_val is not None, ROWS=config["ROWS"],
                GROUP_E=config["GROUP_E"], BLOCK_F=config["BLOCK_F"]),
           config["num_warps"])
    return out if out.dtype == x.dtype else out.to(x.dtype)



@triton.jit(do_not_specialize=["num_rows", "num_edges"])
def _push_kernel(
    rowptr_ptr, col_ptr, val_ptr, g_ptr, out_ptr,
    num_rows, num_edges, search_steps, num_feats, stride_g, stride_out,
    MEAN: tl.constexpr, HAS_VAL: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
):
    """Program ``(p, b)``: edges ``p * BLOCK_E ..`` push ``w_e g[row(e), feat]`` into ``out[col[e]]``."""
    edge = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    live = edge < num_edges
    # each edge's row: the last r with rowptr[r] <= e, by a binary search of search_steps halvings
    lo = tl.zeros([BLOCK_E], dtype=tl.int64)
    hi = lo + num_rows - 1
    for _ in range(search_steps):
        mid = (lo + hi + 1) // 2
        go_up = tl.load(rowptr_ptr + mid, mask=live, other=0) <= edge
        lo = tl.where(go_up, mid, lo)
        hi = tl.where(go_up, hi, mid - 1)
    row = lo
    weight = tl.where(live, 1.0, 0.0)
    if HAS_VAL:
        weight = tl.load(val_ptr + edge, mask=live, other=0.0).to(tl.float32)
    if MEAN:
        deg = tl.load(rowptr_ptr + row + 1, mask=live, other=1) - tl.load(rowptr_ptr + row, mask=live, other=0)
        weight = weight / tl.maximum(deg, 1).to(tl.float32)
    target = tl.load(col_ptr + edge, mask=live, other=0).to(tl.int64)
    mask = live[:, None] & (feat < num_feats)[None, :]
    grad = tl.load(g_ptr + row[:, None] * stride_g + feat[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.atomic_add(out_ptr + target[:, None] * stride_out + feat[None, :], grad * weight[:, None], mask=mask,
                  sem="relaxed")


def spmm_pieces_transposed(
    rowptr: Tensor,
    col: Tensor,
    edge_val: Optional[Tensor],
    g: Tensor,
    num_src: int,
    reduce: str = "sum",
) -> Tensor:
    """``A'^T g`` without the transpose: every edge ``e: j -> i`` adds ``w'_e g[i]`` into
    ``out[j]`` atomically (``A' = A`` for ``"sum"``, ``D^-1 A`` for ``"mean"``), one launch
    (and the zeroed output), nothing built per graph.  The backward of ``spmm_pieces`` on a
    graph met for the first time; sums in an order that may vary from run to run.

    Shapes:
        rowptr: [N + 1] int64; col: [E]; edge_val: [E] or None; g: [N, F] -> [num_src, F] of
        ``g``'s dtype (fp32 accumulation).
    """
    g = g.contiguous()
    edge_val = edge_val.contiguous() if edge_val is not None else None     # a gradient may be expanded
    num_rows, num_feats, num_edges = rowptr.numel() - 1, g.shape[1], col.numel()
    acc_dtype = torch.float32 if g.dtype in (torch.float16, torch.bfloat16) else g.dtype
    out = torch.zeros((num_src, num_feats), dtype=acc_dtype, device=g.device)
    if num_rows == 0 or num_feats == 0 or num_edges == 0:
        return out.to(g.dtype)
    block_f = _block_f(num_feats)
    block_e = max(8, 2048 // block_f)
    grid = (-(-num_edges // block_e), -(-num_feats // block_f))
    launch(_push_kernel, grid,
           (rowptr, col, edge_val if edge_val is not None else col, g, out,
            num_rows, num_edges, max(num_rows - 1, 1).bit_length(), num_feats, g.stride(0), out.stride(0)),
           dict(MEAN=reduce == "mean", HAS_VAL=edge_val is not None, BLOCK_E=block_e, BLOCK_F=block_f),
           4 if block_f >= 64 else 2)
    return out if out.dtype == g.dtype else out.to(g.dtype)
