"""GCN's graph transform on a CSR in a few launches: self loops replaced, values normalised.

``formats/csr.py`` does the same work with torch ops: ~30 small kernels to replace the self
loops (masks, cumulative sums, ranks, a scatter) and ~14 to normalise.  On a graph met for the
first time (an inference graph, a DataLoader batch) those launches are most of the transform's
cost, so here each step is one or two row-wise kernels (a program walks ``ROWS`` rows, each in
steps of ``BLOCK_E`` edges):

- ``replace_self_loops``: the rows' new lengths ``len_i - loops_i + 1`` (one kernel), their
  cumulative sum (``torch.cumsum``), one read-back of the total (it sizes the result), then the
  kept edges in place and each node's loop at the end of its row (one kernel; order within a row
  kept, by a prefix sum over each step's kept edges).
- ``normalize_values``: the weighted in-degree ``d_i = sum_{e in row i} w_e`` of each row, as
  ``d_i^{-1/2}`` (``"sym"``) or ``1 / d_i`` (``"row"``), zero where ``d_i = 0`` (one kernel); then
  ``w'_e = d_i^{-1/2} w_e d_j^{-1/2}`` or ``w_e / d_i`` (one kernel).  Degrees are summed in
  row order (deterministic; ``formats/csr.py`` adds atomically).

Results equal ``formats/csr.py``'s: the structure exactly, the values up to float rounding.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch

#: Rows per program and edges per step of the row walks.
ROWS, BLOCK_E = 4, 64


@triton.jit(do_not_specialize=["num_rows"])
def _kept_lengths_kernel(rowptr_ptr, col_ptr, out_ptr, num_rows, ROWS: tl.constexpr, BLOCK_E: tl.constexpr):
    """``out[i] = len_i - (self loops of row i) + 1``."""
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        if row < num_rows:
            start = tl.load(rowptr_ptr + row)
            end = tl.load(rowptr_ptr + row + 1)
            loops = tl.zeros([BLOCK_E], dtype=tl.int64)
            for e0 in range(start, end, BLOCK_E):
                edge = e0 + tl.arange(0, BLOCK_E)
                col = tl.load(col_ptr + edge, mask=edge < end, other=-1)
                loops += (col == row).to(tl.int64)
            tl.store(out_ptr + row, end - start - tl.sum(loops, axis=0) + 1)


@triton.jit(do_not_specialize=["num_rows", "num_edges"])
def _replace_loops_kernel(rowptr_ptr, col_ptr, new_rowptr_ptr, new_col_ptr, source_ptr, num_rows, num_edges,
                          ROWS: tl.constexpr, BLOCK_E: tl.constexpr):
    """Row ``i``'s non-loop edges to ``new_rowptr[i] ..`` in order, then its loop (source ``E + i``)."""
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        if row < num_rows:
            start = tl.load(rowptr_ptr + row)
            end = tl.load(rowptr_ptr + row + 1)
            out = tl.load(new_rowptr_ptr + row)
            for e0 in range(start, end, BLOCK_E):
                edge = e0 + tl.arange(0, BLOCK_E)
                col = tl.load(col_ptr + edge, mask=edge < end, other=-1).to(tl.int64)
                keep = (edge < end) & (col != row)
                step = keep.to(tl.int64)
                slot = out + tl.cumsum(step, axis=0) - step
                tl.store(new_col_ptr + slot, col, mask=keep)
                tl.store(source_ptr + slot, edge, mask=keep)
                out += tl.sum(step, axis=0)
            tl.store(new_col_ptr + out, row)
            tl.store(source_ptr + out, num_edges + row)


@triton.jit(do_not_specialize=["num_rows"])
def _inverse_degree_kernel(rowptr_ptr, val_ptr, out_ptr, num_rows, HAS_VAL: tl.constexpr, SYM: tl.constexpr,
                           ROWS: tl.constexpr, BLOCK_E: tl.constexpr):
    """``out[i] = d_i^{-1/2}`` (``SYM``) or ``1 / d_i``, 0 where ``d_i = 0``."""
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        if row < num_rows:
            start = tl.load(rowptr_ptr + row)
            end = tl.load(rowptr_ptr + row + 1)
            if HAS_VAL:
                total = tl.zeros([BLOCK_E], dtype=tl.float32)
                for e0 in range(start, end, BLOCK_E):
                    edge = e0 + tl.arange(0, BLOCK_E)
                    total += tl.load(val_ptr + edge, mask=edge < end, other=0.0).to(tl.float32)
                deg = tl.sum(total, axis=0)
            else:
                deg = (end - start).to(tl.float32)
            safe = tl.where(deg == 0.0, 1.0, deg)
            if SYM:
                inv = tl.math.div_rn(1.0, tl.sqrt_rn(safe))
            else:
                inv = tl.math.div_rn(1.0, safe)
            tl.store(out_ptr + row, tl.where(deg == 0.0, 0.0, inv))


@triton.jit(do_not_specialize=["num_rows"])
def _normalized_values_kernel(rowptr_ptr, col_ptr, val_ptr, inv_ptr, out_ptr, num_rows, HAS_VAL: tl.constexpr,
                              SYM: tl.constexpr, ROWS: tl.constexpr, BLOCK_E: tl.constexpr):
    """``out[e] = inv_i * w_e * inv_j`` (``SYM``) or ``w_e * inv_i`` for the edges ``e: j -> i``."""
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        if row < num_rows:
            start = tl.load(rowptr_ptr + row)
            end = tl.load(rowptr_ptr + row + 1)
            inv_row = tl.load(inv_ptr + row)
            for e0 in range(start, end, BLOCK_E):
                edge = e0 + tl.arange(0, BLOCK_E)
                mask = edge < end
                if HAS_VAL:
                    w = tl.load(val_ptr + edge, mask=mask, other=0.0).to(tl.float32)
                else:
                    w = tl.full([BLOCK_E], 1.0, dtype=tl.float32)
                if SYM:
                    col = tl.load(col_ptr + edge, mask=mask, other=0)
                    value = inv_row * w * tl.load(inv_ptr + col, mask=mask, other=0.0)
                else:
                    value = w * inv_row
                tl.store(out_ptr + edge, value, mask=mask)


def _grid(num_rows: int) -> Tuple[int]:
    return (triton.cdiv(num_rows, ROWS),)


def replace_self_loops(rowptr: Tensor, col: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``formats.csr.replace_self_loops`` in two row kernels and one read-back.

    Shapes:
        rowptr: [N + 1] int64, col: [E] -> ``(rowptr' [N + 1], col' [E'] int64, source [E'] int64)``
        with ``E' = E - loops + N``; ``source[k] < E`` is the input edge of output edge ``k``,
        ``E + i`` the loop added to node ``i``.
    """
    rowptr, col = rowptr.contiguous(), col.contiguous()
    num_rows, num_edges, device = rowptr.numel() - 1, col.numel(), col.device
    new_rowptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=device)
    if num_rows == 0:
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return new_rowptr, empty, empty
    lengths = torch.empty(num_rows, dtype=torch.int64, device=device)
    launch(_kept_lengths_kernel, _grid(num_rows), (rowptr, col, lengths, num_rows),
           dict(ROWS=ROWS, BLOCK_E=BLOCK_E), 4)
    torch.cumsum(lengths, 0, out=new_rowptr[1:])
    total = int(new_rowptr[-1])                       # the one read-back: it sizes the result
    new_col = torch.empty(total, dtype=torch.int64, device=device)
    source = torch.empty(total, dtype=torch.int64, device=device)
    launch(_replace_loops_kernel, _grid(num_rows), (rowptr, col, new_rowptr, new_col, source, num_rows, num_edges),
           dict(ROWS=ROWS, BLOCK_E=BLOCK_E), 4)
    return new_rowptr, new_col, source


def normalize_values(rowptr: Tensor, col: Tensor, edge_val: Optional[Tensor], mode: str) -> Tensor:
    """``formats.csr.normalize_values`` for fp32 (or absent) values in two row kernels (not
    differentiable: values that need a gradient take the torch ops).

    Shapes:
        rowptr: [N + 1] int64, col: [E], edge_val: [E] fp32 or None -> [E] fp32.
    """
    rowptr, col = rowptr.contiguous(), col.contiguous()
    edge_val = edge_val.contiguous() if edge_val is not None else None
    num_rows, num_edges = rowptr.numel() - 1, col.numel()
    out = torch.empty(num_edges, dtype=torch.float32, device=col.device)
    if num_rows == 0 or num_edges == 0:
        return out
    inverse = torch.empty(num_rows, dtype=torch.float32, device=col.device)
    has_val, sym = edge_val is not None, mode == "sym"
    val = edge_val if has_val else col
    launch(_inverse_degree_kernel, _grid(num_rows), (rowptr, val, inverse, num_rows),
           dict(HAS_VAL=has_val, SYM=sym, ROWS=ROWS, BLOCK_E=BLOCK_E), 4)
    launch(_normalized_values_kernel, _grid(num_rows), (rowptr, col, val, inverse, out, num_rows),
           dict(HAS_VAL=has_val, SYM=sym, ROWS=ROWS, BLOCK_E=BLOCK_E), 4)
    return out
