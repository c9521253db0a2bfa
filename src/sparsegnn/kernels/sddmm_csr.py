"""Row-wise SDDMM in Triton: per edge ``e: j -> i``, ``op(a[i], b[j])``.

Schedule: a program takes ``ROWS`` segments of the plan (whole short rows, or pieces of long
rows: outputs are per edge, so pieces need no combining).  For each ``BLOCK_E`` edges it
gathers a ``[BLOCK_E, BLOCK_F]`` tile of source rows ``b[j]`` and combines it with the target
row ``a[i]``, loaded once per feature block and reused by every edge of the segment.

Edge-parallel schedule (config ``FLAT=1``): a program takes ``BLOCK_E`` consecutive edges in
CSR order and gathers both ``a[row[e]]`` (consecutive edges share rows: cache hits) and
``b[col[e]]``.  Two dependent loads per step (indices, then rows) instead of four (segment,
bounds, indices, rows), and every program has the same work whatever the degrees.

- ``dot``: ``out[e] = sum_f a[i, f] b[j, f]`` (fp32 accumulation over feature blocks)
- ``add`` / ``mul``: ``out[e, f] = a[i, f] + b[j, f]`` / ``a[i, f] * b[j, f]``
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch
from .configs import sddmm_config

OP_CODES = {"dot": 0, "add": 1, "mul": 2}


@triton.jit(do_not_specialize=["num_segments"])
def _sddmm_kernel(
    seg_row_ptr, seg_start_ptr, seg_end_ptr, col_ptr, a_ptr, b_ptr, out_ptr,
    num_segments, num_feats, stride_a, stride_b, stride_out,
    OP: tl.constexpr, ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
):
    fblock = tl.program_id(1)
    for r in tl.static_range(ROWS):
        seg = tl.program_id(0).to(tl.int64) * ROWS + r
        if seg < num_segments:
            row = tl.load(seg_row_ptr + seg).to(tl.int64)
            start = tl.load(seg_start_ptr + seg)
            end = tl.load(seg_end_ptr + seg)
            for edge0 in range(start, end, BLOCK_E):
                edge = edge0 + tl.arange(0, BLOCK_E)
                edge_mask = edge < end
                src = tl.load(col_ptr + edge, mask=edge_mask, other=0).to(tl.int64)
                if OP == 0:
                    acc = tl.zeros([BLOCK_E], dtype=tl.float32)
                    for f0 in range(0, num_feats, BLOCK_F):
                        feat = f0 + tl.arange(0, BLOCK_F)
                        feat_mask = feat < num_feats
                        lhs = tl.load(a_ptr + row * stride_a + feat, mask=feat_mask, other=0.0).to(tl.float32)
                        rhs = tl.load(b_ptr + src[:, None] * stride_b + feat[None, :],
                                      mask=edge_mask[:, None] & feat_mask[None, :], other=0.0).to(tl.float32)
                        acc += tl.sum(rhs * lhs[None, :], axis=1)
                    tl.store(out_ptr + edge, acc.to(out_ptr.dtype.element_ty), mask=edge_mask)
                else:
                    feat = fblock * BLOCK_F + tl.arange(0, BLOCK_F)
                    feat_mask = feat < num_feats
                    mask = edge_mask[:, None] & feat_mask[None, :]
                    lhs = tl.load(a_ptr + row * stride_a + feat, mask=feat_mask, other=0.0).to(tl.float32)
                    rhs = tl.load(b_ptr + src[:, None] * stride_b + feat[None, :], mask=mask, other=0.0).to(tl.float32)
                    if OP == 1:
                        res = rhs + lhs[None, :]
                    else:
                        res = rhs * lhs[None, :]
                    tl.store(out_ptr + edge.to(tl.int64)[:, None] * stride_out + feat[None, :],
                             res.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_edges"])
def _sddmm_edges_kernel(
    row_ptr, col_ptr, a_ptr, b_ptr, out_ptr,
    num_edges, num_feats, stride_a, stride_b, stride_out,
    OP: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
):
    edge = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    edge_mask = edge < num_edges
    dst = tl.load(row_ptr + edge, mask=edge_mask, other=0).to(tl.int64)
    src = tl.load(col_ptr + edge, mask=edge_mask, other=0).to(tl.int64)
    if OP == 0:
        acc = tl.zeros([BLOCK_E], dtype=tl.float32)
        for f0 in range(0, num_feats, BLOCK_F):
            feat = f0 + tl.arange(0, BLOCK_F)
            mask = edge_mask[:, None] & (feat < num_feats)[None, :]
            lhs = tl.load(a_ptr + dst[:, None] * stride_a + feat[None, :], mask=mask, other=0.0).to(tl.float32)
            rhs = tl.load(b_ptr + src[:, None] * stride_b + feat[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += tl.sum(lhs * rhs, axis=1)
        tl.store(out_ptr + edge, acc.to(out_ptr.dtype.element_ty), mask=edge_mask)
    else:
        feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        mask = edge_mask[:, None] & (feat < num_feats)[None, :]
        lhs = tl.load(a_ptr + dst[:, None] * stride_a + feat[None, :], mask=mask, other=0.0).to(tl.float32)
        rhs = tl.load(b_ptr + src[:, None] * stride_b + feat[None, :], mask=mask, other=0.0).to(tl.float32)
        if OP == 1:
            res = lhs + rhs
        else:
            res = lhs * rhs
        tl.store(out_ptr + edge[:, None] * stride_out + feat[None, :], res.to(out_ptr.dtype.element_ty), mask=mask)


def sddmm_csr(plan, a: Tensor, b: Tensor, op: str = "dot", config: Optional[Dict[str, int]] = None) -> Tensor:
    """Launch the SDDMM over a ``formats.plan.RowPlan``: its segments, or (``FLAT=1`` configs)
    its edges with their int32 target rows.

    Args:
        plan: the graph's RowPlan (segments, int32 columns and rows).
        a: [N, F] target-side features; b: [M, F] source-side features (same dtype).
        op: ``"dot"``, ``"add"`` or ``"mul"``.

    Returns:
        [E] (dot) or [E, F] tensor of ``a``'s dtype, in CSR edge order.
    """
    cfg = config or sddmm_config(a.shape[0], plan.col32.numel(), a.shape[1], op)
    if cfg.get("FLAT", 0):
        return _sddmm(plan.col32, a, b, op, cfg, rows=plan.row32)
    return _sddmm(plan.col32, a, b, op, cfg, segments=(plan.seg_row, plan.seg_start, plan.seg_end))


def sddmm_rows(rowptr: Tensor, col: Tensor, a: Tensor, b: Tensor, op: str = "dot",
               config: Optional[Dict[str, int]] = None) -> Tensor:
    """The SDDMM with one segment per CSR row, no plan: the kernel of transient graphs (a
    sampled mini-batch, used once; its rows are short).  Arguments and result as ``sddmm_csr``.

    Shapes:
        rowptr: [N + 1]; col: [E]; a: [N, F]; b: [M, F] -> [E] or [E, F].
    """
    rows = torch.arange(rowptr.numel() - 1, device=rowptr.device)
    cfg = config or sddmm_config(a.shape[0], col.numel(), a.shape[1], op)
    return _sddmm(col, a, b, op, cfg, segments=(rows, rowptr[:-1], rowptr[1:]))


def _sddmm(col: Tensor, a: Tensor, b: Tensor, op: str, cfg: Dict[str, int], rows: Optional[Tensor] = None,
           segments: Optional[tuple] = None) -> Tensor:
    """One launch: edge-parallel over ``rows`` ([E] target of every edge) or over ``segments``
    (``(seg_row, seg_start, seg_end)``)."""
    num_edges, num_feats = col.numel(), a.shape[1]
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty((num_edges,) if op == "dot" else (num_edges, num_feats), dtype=a.dtype, device=a.device)
    work = num_edges if rows is not None else segments[0].numel()
    if num_edges == 0 or work == 0:
        return out.zero_()
    fblocks = 1 if op == "dot" else triton.cdiv(num_feats, cfg["BLOCK_F"])
    tail = (num_feats, a.stride(0), b.stride(0), out.stride(0) if op != "dot" else 1)
    blocks = dict(OP=OP_CODES[op], BLOCK_E=cfg["BLOCK_E"], BLOCK_F=cfg["BLOCK_F"])
    if rows is not None:
        launch(_sddmm_edges_kernel, (triton.cdiv(num_edges, cfg["BLOCK_E"]), fblocks),
               (rows, col, a, b, out, num_edges) + tail, blocks, cfg["num_warps"])
    else:
        launch(_sddmm_kernel, (triton.cdiv(work, cfg["ROWS"]), fblocks),
               (*segments, col, a, b, out, work) + tail, dict(blocks, ROWS=cfg["ROWS"]), cfg["num_warps"])
    return out
