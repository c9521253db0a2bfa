"""Pure-PyTorch implementations: the CPU path and the oracle for every kernel.

Edges are processed in chunks so that no ``[E, F]`` intermediate of the whole graph is
materialised: peak extra memory is about ``CHUNK_ELEMENTS`` elements whatever the graph.
Half-precision inputs are computed in float32 and cast back.

Notation: edge ``e`` goes from source ``col[e]`` (= j) to target ``row[e]`` (= i).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


#: Largest per-chunk intermediate, in elements (64 MB in float32).
CHUNK_ELEMENTS = 1 << 24


def _chunks(num_edges: int, width: int):
    step = max(1, CHUNK_ELEMENTS // max(1, width))
    for start in range(0, num_edges, step):
        yield start, min(start + step, num_edges)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def spmm_sum(
    row: Tensor, col: Tensor, num_rows: int, x: Tensor, weight: Optional[Tensor] = None
) -> Tensor:
    """``out[i] = sum_{e: row[e] = i} w_e * x[col[e]]``.

    ``weight`` may be per edge ([E]) or per edge and feature ([E, F]).

    Shapes:
        row, col: [E]; x: [M, F]; weight: [E] or [E, F] -> [num_rows, F].
    """
    dtype = _compute_dtype(x.dtype)
    num_feats = x.shape[1]
    out = torch.zeros(num_rows, num_feats, dtype=dtype, device=x.device)
    for start, end in _chunks(col.numel(), num_feats):
        msg = x.index_select(0, col[start:end]).to(dtype)
        if weight is not None:
            w = weight[start:end].to(dtype)
            msg.mul_(w.unsqueeze(-1) if w.dim() == 1 else w)
        out.index_add_(0, row[start:end], msg)
    return out.to(x.dtype)


def _messages(col: Tensor, x: Tensor, weight: Optional[Tensor], start: int, end: int, dtype) -> Tensor:
    msg = x.index_select(0, col[start:end]).to(dtype)
    if weight is not None:
        msg.mul_(weight[start:end].to(dtype).unsqueeze(-1))
    return msg


def spmm_max(row: Tensor, col: Tensor, num_rows: int, x: Tensor, weight: Optional[Tensor] = None) -> Tensor:
    """``out[i, f] = max_{e: row[e] = i} w_e * x[col[e], f]`` (0 for rows without edges).

    Shapes:
        row, col: [E]; x: [M, F]; weight: [E] -> [num_rows, F].
    """
    dtype = _compute_dtype(x.dtype)
    num_feats = x.shape[1]
    out = torch.full((num_rows, num_feats), float("-inf"), dtype=dtype, device=x.device)
    for start, end in _chunks(col.numel(), num_feats):
        index = row[start:end].unsqueeze(-1).expand(-1, num_feats)
        out.scatter_reduce_(0, index, _messages(col, x, weight, start, end, dtype), "amax", include_self=True)
    empty = torch.ones(num_rows, dtype=torch.bool, device=x.device).index_fill_(0, row, False)
    out = out.masked_fill(empty.unsqueeze(-1), 0.0)     # a row whose messages are all -inf stays -inf
    return out.to(x.dtype)


def spmm_max_arg(row: Tensor, col: Tensor, x: Tensor, weight: Optional[Tensor], out: Tensor) -> Tensor:
    """First edge attaining ``out[i, f]`` of a max aggregation (E where none, e.g. empty rows).

    Messages are rounded to ``out``'s dtype before comparing, so a half-precision ``out`` from
    any backend finds its edges.

    Shapes:
        row, col: [E]; x: [M, F]; out: [N, F] -> [N, F] int64.
    """
    dtype = _compute_dtype(x.dtype)
    num_edges, num_feats = col.numel(), x.shape[1]
    arg = torch.full(out.shape, num_edges, dtype=torch.int64, device=x.device)
    for start, end in _chunks(num_edges, num_feats):
        index = row[start:end].unsqueeze(-1).expand(-1, num_feats)
        hit = _messages(col, x, weight, start, end, dtype).to(out.dtype) == out.gather(0, index)
        edge_id = torch.arange(start, end, device=x.device).unsqueeze(-1).expand(-1, num_feats)
        candidate = torch.where(hit, edge_id, torch.full_like(edge_id, num_edges))
        arg.scatter_reduce_(0, index, candidate, "amin", include_self=True)
    return arg


def sddmm(row: Tensor, col: Tensor, a: Tensor, b: Tensor, op: str) -> Tensor:
    """Per-edge ``op(a[row[e]], b[col[e]])``: ``dot`` -> [E], ``add`` / ``mul`` -> [E, F].

    Shapes:
        row, col: [E]; a: [N, F]; b: [M, F].
    """
    dtype = _compute_dtype(a.dtype)
    num_edges, num_feats = col.numel(), a.shape[1]
    shape = (num_edges,) if op == "dot" else (num_edges, num_feats)
    out = torch.empty(shape, dtype=dtype, device=a.device)
    for start, end in _chunks(num_edges, num_feats):
        lhs = a.index_select(0, row[start:end]).to(dtype)
        rhs = b.index_select(0, col[start:end]).to(dtype)
        if op == "dot":
            out[start:end] = (lhs * rhs).sum(-1)
        elif op == "add":
            out[start:end] = lhs + rhs
        else:
            out[start:end] = lhs * rhs
    return out.to(a.dtype)


def segment_sum(index: Tensor, values: Tensor, num_segments: int) -> Tensor:
    """``out[s] = sum_{e: index[e] = s} values[e]``. Shapes: index [E], values [E, ...] -> [S, ...]."""
    dtype = _compute_dtype(values.dtype)
    out = torch.zeros((num_segments,) + tuple(values.shape[1:]), dtype=dtype, device=values.device)
    return out.index_add_(0, index, values.to(dtype)).to(values.dtype)


def edge_softmax(row: Tensor, num_rows: int, scores: Tensor) -> Tensor:
    """Softmax of ``scores`` over each target's incoming edges.

    ``out[e] = exp(s_e - m_i) / sum_{e': row[e'] = i} exp(s_e' - m_i)`` with ``i = row[e]``
    and ``m_i`` the row maximum (for stability).

    Shapes:
        row: [E]; scores: [E] or [E, H] -> same shape.
    """
    dtype = _compute_dtype(scores.dtype)
    s = scores.to(dtype)
    index = row.view((-1,) + (1,) * (s.dim() - 1)).expand_as(s)
    row_max = torch.full((num_rows,) + tuple(s.shape[1:]), float("-inf"), dtype=dtype, device=s.device)
    row_max.scatter_reduce_(0, index, s, "amax", include_self=True)
    exp = (s - row_max.gather(0, index)).exp()
    denom = torch.zeros_like(row_max).index_add_(0, row, exp)
    return (exp / denom.gather(0, index)).to(scores.dtype)

