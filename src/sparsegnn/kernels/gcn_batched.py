"""Fused batched GCN layer: ``out = act((A X) W + b)`` over many small graphs in one launch.

A batch is one block-diagonal CSR whose graph ``b`` owns nodes ``ptr[b]:ptr[b+1]`` (every edge
inside its graph, at most ``MAXN`` nodes per graph).  A program takes one graph (``PACK = 0``)
and one block of ``BLOCK_FOUT`` output features:

1. for each block of ``BLOCK_FIN`` input features it aggregates the graph's rows
   ``H = A X`` exactly as the batched gather kernel does (``_rows_side_by_side``: the rows side
   by side, ``BLOCK_E`` edges of every row per step), a fp32 ``[MAXN, BLOCK_FIN]`` tile;
2. instead of storing ``H`` it multiplies the tile by ``W[fin block, fout block]`` with
   ``tl.dot`` (fp32: ``input_precision="ieee"``, plain FMAs, no tf32 rounding; half types: the
   tile rounded to the input dtype, as an SpMM would store it, on tensor cores), accumulating
   ``[MAXN, BLOCK_FOUT]`` in fp32;
3. adds the bias, applies the activation (relu) and stores ``out[rows, fout block]``.

With ``STORE_H`` the programs of the first output block also store ``H`` (``[N, F_in]``, the
input dtype): the backward's ``dW = H^T dY`` reads it instead of aggregating again.

``PACK = 1`` takes ``MAXN`` consecutive rows per program instead of one graph (the rows of
several graphs, or a piece of one: aggregation never looks at graph boundaries, only the
rows' own edges).  No rows are padded then (one graph per program pads every graph to the
power of two above the largest); a program's edge loop runs to the largest degree among its
rows, which in a batch of small graphs is small everywhere.

Every program owns its output rows (no atomics): deterministic.  ``x`` is read with unit
feature stride; ``W`` through its strides (a transposed view needs no copy).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch
from .spmm_csr import _rows_side_by_side
from .spmm_batched import graph_rows

ACTIVATIONS = {None: 0, "relu": 1}


@triton.jit
def _gcn_batched_kernel(
    ptr_ptr, rowptr_ptr, col_ptr, val_ptr, x_ptr, w_ptr, bias_ptr, out_ptr, h_ptr,
    num_rows, f_in, f_out, stride_x, stride_wk, stride_wn, stride_out, stride_h,
    HAS_VAL: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, STORE_H: tl.constexpr,
    IEEE: tl.constexpr, PACK: tl.constexpr, MAXN: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_FIN: tl.constexpr, BLOCK_FOUT: tl.constexpr,
):
    pid = tl.program_id(0)
    fblock = tl.program_id(1)
    if PACK:
        n0 = pid.to(tl.int64) * MAXN
        n1 = tl.minimum(n0 + MAXN, num_rows)
    else:
        n0 = tl.load(ptr_ptr + pid)
        n1 = tl.load(ptr_ptr + pid + 1)
    row, row_mask, start, deg, max_deg = graph_rows(rowptr_ptr, n0, n1, MAXN)
    fout = fblock * BLOCK_FOUT + tl.arange(0, BLOCK_FOUT)
    fout_mask = fout < f_out
    # H is stored by the first output block's programs only (every block aggregates the same H);
    # the flag broadcast over the features (the interpreter rejects a scalar-bool mask term)
    store_h = (fblock == 0).to(tl.int32) + tl.zeros([BLOCK_FIN], dtype=tl.int32) > 0
    acc = tl.zeros([MAXN, BLOCK_FOUT], dtype=tl.float32)
    for k0 in range(0, f_in, BLOCK_FIN):
        fin = k0 + tl.arange(0, BLOCK_FIN)
        fin_mask = fin < f_in
        h = _rows_side_by_side(start, deg, max_deg, col_ptr, val_ptr, x_ptr, stride_x, fin, fin_mask,
                               0, HAS_VAL, MAXN, BLOCK_E, BLOCK_FIN)
        if STORE_H:
            tl.store(h_ptr + row.to(tl.int64)[:, None] * stride_h + fin[None, :], h.to(h_ptr.dtype.element_ty),
                     mask=row_mask[:, None] & (fin_mask & store_h)[None, :])
        w = tl.load(w_ptr + fin[:, None] * stride_wk + fout[None, :] * stride_wn,
                    mask=fin_mask[:, None] & fout_mask[None, :], other=0.0)
        if IEEE:
            acc += tl.dot(h, w.to(tl.float32), input_precision="ieee")
        else:   # half types: H rounded to the input dtype (what an SpMM stores), fp32 accumulation
            acc += tl.dot(h.to(w.dtype), w)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + fout, mask=fout_mask, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        acc = tl.maximum(acc, 0.0)
    tl.store(out_ptr + row.to(tl.int64)[:, None] * stride_out + fout[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & fout_mask[None, :])


#: Per tile height ``MAXN``: (widest ``BLOCK_FOUT``, ``BLOCK_E``, ``num_warps``).  ``BLOCK_FIN`` is 16
#: throughout.  Registers a thread (ptxas for sm_90, fp32, ``cuobjdump --dump-resource-usage``),
#: no spills: 124 (16 rows), 73 (32), 176 (64), 126 (128).  Wider blocks spill or sit at 255:
#: 64 rows with ``BLOCK_FIN`` 32 and 4 warps, or 128 rows at 8 warps, spill 128-2480 bytes.
_GCN_BLOCKS = {16: (256, 1, 4), 32: (128, 1, 8), 64: (128, 2, 8), 128: (64, 2, 16)}


def gcn_config(max_nodes: int, f_in: int, f_out: int) -> Dict[str, int]:
    """Blocks for a batch whose largest graph has ``max_nodes`` (<= 128) nodes; chosen by
    register counts, not yet timed on a GPU.

    ``MAXN``: the next power of two >= 16 (``tl.dot`` needs 16 rows).  ``BLOCK_FIN`` 16 (the
    smallest ``tl.dot`` depth: the FMA dot's operand registers grow with it).  ``BLOCK_FOUT``: as
    wide as ``F_out`` (every further output block aggregates ``H`` again) up to 256 / 128 / 128 /
    64 columns for 16 / 32 / 64 / 128 rows, where the fp32 accumulator still leaves registers
    for the gather.  ``BLOCK_E`` 2 edges a step from 64 rows (as the batched gather kernel).
    ``PACK`` 0: one graph per program."""
    maxn = max(16, triton.next_power_of_2(max(int(max_nodes), 1)))
    widest, block_e, num_warps = _GCN_BLOCKS[min(maxn, 128)]
    block_fout = min(max(16, triton.next_power_of_2(max(int(f_out), 1))), widest)
    return dict(MAXN=maxn, BLOCK_FIN=16, BLOCK_FOUT=block_fout, BLOCK_E=block_e, num_warps=num_warps, PACK=0)


def gcn_batched(ptr: Tensor, rowptr: Tensor, col: Tensor, edge_val: Optional[Tensor], x: Tensor, weight: Tensor,
                bias: Optional[Tensor], config: Dict[str, int], activation: Optional[str] = None,
                store_h: bool = False):
    """``act((A x) weight + bias)`` on a block-diagonal batch, one program per (graph, output block).

    Args:
        ptr: [B + 1] int64 node offsets of the graphs (every edge stays inside its graph; each
            graph has at most ``config["MAXN"]`` nodes).  Unused (may be None) with ``PACK``.
        rowptr: [N + 1] int64; col: [E] int32 / int64 sources; edge_val: [E] or None (ones).
        x: [N, F_in] float32 / float16 / bfloat16 (made contiguous).
        weight: [F_in, F_out] of ``x``'s dtype, any strides; bias: [F_out] or None.
        config: ``MAXN``, ``BLOCK_FIN``, ``BLOCK_FOUT``, ``BLOCK_E``, ``num_warps``, ``PACK``
            (``gcn_config``).
        activation: None or ``"relu"``.
        store_h: also return ``H = A x`` ([N, F_in], ``x``'s dtype).

    Returns:
        ``(out [N, F_out] of x's dtype, H or None)``; fp32 accumulation, deterministic.
    """
    x = x.contiguous()
    num_rows, f_in = x.shape
    f_out = weight.shape[1]
    out = torch.empty((num_rows, f_out), dtype=x.dtype, device=x.device)
    h = torch.empty((num_rows, f_in), dtype=x.dtype, device=x.device) if store_h else None
    maxn = config["MAXN"]
    pack = bool(config.get("PACK"))
    programs = triton.cdiv(num_rows, maxn) if pack else ptr.numel() - 1
    if num_rows == 0 or f_out == 0 or programs == 0:
        return out, h
    grid = (programs, triton.cdiv(f_out, config["BLOCK_FOUT"]))
    launch(_gcn_batched_kernel, grid,
           (ptr if ptr is not None else rowptr, rowptr, col, edge_val if edge_val is not None else rowptr, x, weight,
            bias if bias is not None else weight, out, h if h is not None else out,
            num_rows, f_in, f_out, x.stride(0), weight.stride(0), weight.stride(1), out.stride(0),
            h.stride(0) if h is not None else 0),
           dict(HAS_VAL=edge_val is not None, HAS_BIAS=bias is not None, ACT=ACTIVATIONS[activation],
                STORE_H=h is not None, IEEE=x.dtype == torch.float32, PACK=int(pack),
                MAXN=maxn, BLOCK_E=config["BLOCK_E"], BLOCK_FIN=config["BLOCK_FIN"],
                BLOCK_FOUT=config["BLOCK_FOUT"]),
           config["num_warps"])
    return out, h
