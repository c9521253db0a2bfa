"""Batched SpMM over many small graphs in one launch (Batched SpMM paper).

A batch is one block-diagonal CSR whose graph ``b`` owns nodes ``ptr[b]:ptr[b+1]`` (rows and
columns).  A program takes one graph whole (at most ``MAXN`` nodes, a power of two >= 16),
``out[i] = reduce_{e in row i} w_e x[col[e]]`` for all its rows at once:

- ``_batched_gather_kernel`` (sparse graphs: molecules): the graph's rows side by side, each
  step gathers ``BLOCK_E`` edges of every row (a ``[MAXN, BLOCK_E, BLOCK_F]`` tile), until the
  graph's largest degree.  A sub-warp per row sized by F (the paper's SWA idea) is what the
  ``[rows, features]`` layout gives: a warp spans ``32 / (BLOCK_F / 4)`` rows.  sum / mean / max.
- ``_batched_tile_kernel`` (dense small graphs): every graph's adjacency as a dense
  ``[MAXN, MAXN]`` tile (``batch_tiles``, built once per structure and weights and cached by the
  dispatcher), read whole; the graph's feature rows are read once, contiguously (rows
  ``ptr[b]..`` are consecutive), and ``out = A x`` is one ``tl.dot`` per (graph, feature
  block) program (``input_precision="ieee"``: fp32 FMAs, no tf32 rounding).  sum / mean.  (Building the tile
  in registers from the CSR, one compare per row and column per edge step, measured 79 us on
  200 graphs of ~9 edges per node: the edge loop is a latency chain.)

Both are deterministic (no atomics: a graph's rows belong to one program) and read every graph
from its ``ptr`` range: no padding of ``x`` or of the output.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch
from .spmm_csr import _rows_side_by_side

REDUCE_CODES = {"sum": 0, "mean": 1, "max": 2}


@triton.jit
def graph_rows(rowptr_ptr, n0, n1, MAXN: tl.constexpr):
    """The rows ``n0 .. n1`` of one graph side by side (``MAXN`` lanes): ``(row, row_mask,
    start, deg, max_deg)`` with each row's first edge and degree, and the largest degree."""
    row = n0 + tl.arange(0, MAXN)
    row_mask = row < n1
    start = tl.load(rowptr_ptr + row, mask=row_mask, other=0)
    deg = tl.load(rowptr_ptr + row + 1, mask=row_mask, other=0) - start
    return row, row_mask, start, deg, tl.max(deg, axis=0)


@triton.jit
def _batched_gather_kernel(
    ptr_ptr, rowptr_ptr, col_ptr, val_ptr, x_ptr, out_ptr, num_feats, stride_x, stride_out,
    REDUCE: tl.constexpr, HAS_VAL: tl.constexpr, MAXN: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
):
    b = tl.program_id(0)
    n0 = tl.load(ptr_ptr + b)
    n1 = tl.load(ptr_ptr + b + 1)
    row, row_mask, start, deg, max_deg = graph_rows(rowptr_ptr, n0, n1, MAXN)
    for f0 in range(0, num_feats, BLOCK_F):
        feat = f0 + tl.arange(0, BLOCK_F)
        feat_mask = feat < num_feats
        result = _rows_side_by_side(start, deg, max_deg, col_ptr, val_ptr, x_ptr, stride_x, feat, feat_mask,
                                    REDUCE, HAS_VAL, MAXN, BLOCK_E, BLOCK_F)
        tl.store(out_ptr + row.to(tl.int64)[:, None] * stride_out + feat[None, :],
                 result.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & feat_mask[None, :])


@triton.jit
def _batched_tile_kernel(
    ptr_ptr, tile_ptr, x_ptr, out_ptr, num_feats, stride_x, stride_out,
    MAXN: tl.constexpr, BLOCK_F: tl.constexpr,
):
    b = tl.program_id(0)
    n0 = tl.load(ptr_ptr + b)
    n1 = tl.load(ptr_ptr + b + 1)
    local = tl.arange(0, MAXN)
    row = n0 + local
    row_mask = row < n1
    adj = tl.load(tile_ptr + b.to(tl.int64) * MAXN * MAXN + local[:, None] * MAXN + local[None, :])
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = row_mask[:, None] & (feat < num_feats)[None, :]
    xb = tl.load(x_ptr + row.to(tl.int64)[:, None] * stride_x + feat[None, :], mask=mask, other=0.0)
    result = tl.dot(adj, xb.to(tl.float32), input_precision="ieee")
    tl.store(out_ptr + row.to(tl.int64)[:, None] * stride_out + feat[None, :],
             result.to(out_ptr.dtype.element_ty), mask=mask)


def batch_tiles(ptr: Tensor, rowptr: Tensor, row: Tensor, col: Tensor, weight: Optional[Tensor], reduce: str,
                maxn: int) -> Tensor:
    """Every graph's adjacency as a dense ``[maxn, maxn]`` fp32 tile: ``tiles[b, i - ptr[b], j -
    ptr[b]] = sum of w'_e over the edges j -> i`` (``w' = w``, or ``w / deg(i)`` for ``reduce =
    "mean"``; ones for None), built once per structure and weights (cached by
    the caller) and read whole by ``_batched_tile_kernel``.  One ``index_add_`` (atomic on CUDA:
    an entry of two duplicate edges still sums in a fixed order, a + b = b + a; three or more may
    round differently run to run unless ``torch.use_deterministic_algorithms`` is on).  (An
    ``index_put_(accumulate=True)``, sort-based, took 320-500 us on 200 graphs.)

    Shapes:
        ptr: [B + 1]; rowptr: [N + 1]; row, col: [E] (each edge inside its graph); weight: [E] or
        None -> [B, maxn, maxn].
    """
    num_graphs = ptr.numel() - 1
    tiles = torch.zeros((num_graphs, maxn, maxn), dtype=torch.float32, device=ptr.device)
    if row.numel() == 0:
        return tiles
    sizes = ptr[1:] - ptr[:-1]
    graph_of_node = torch.repeat_interleave(torch.arange(num_graphs, device=ptr.device), sizes,
                                            output_size=rowptr.numel() - 1)
    graph = graph_of_node[row]
    base = ptr[graph]
    flat = (graph * maxn + (row - base)) * maxn + (col.to(base.dtype) - base)
    w = weight.float() if weight is not None else torch.ones(row.numel(), dtype=torch.float32, device=ptr.device)
    if reduce == "mean":
        w = w / rowptr.diff().clamp(min=1).float()[row]
    tiles.view(-1).index_add_(0, flat, w)
    return tiles


def batched_config(max_nodes: int, num_feats: int, mean_degree: float, reduce: str) -> Dict[str, int]:
    """The kernel and blocks for a batch whose largest graph has ``max_nodes`` nodes (H100,
    ``docs/design/batched.md``): ``DENSE`` (1: the tile kernel, cached dense tiles and
    ``tl.dot``) for graphs of mean degree >= 6 up to 64 nodes with sum / mean; else the gather
    kernel, 2 edges per step and 8 warps on 64-node tiles (molecules, 200 x 25-50 nodes: 9.2 us
    vs 20 us at 1 edge and 4 warps), 32 features per block on smaller ones.  ``MAXN`` the next
    power of two >= 16."""
    maxn = max(16, triton.next_power_of_2(max_nodes))
    dense = int(reduce != "max" and mean_degree >= 6.0 and maxn <= 64)
    block_f = min(64 if maxn >= 64 else 32, max(16, triton.next_power_of_2(num_feats)))
    return dict(DENSE=dense, MAXN=maxn, BLOCK_F=block_f, BLOCK_E=2 if maxn >= 64 else 1,
                num_warps=8 if maxn >= 64 else 4)


def spmm_batched(ptr: Tensor, rowptr: Tensor, col: Tensor, edge_val: Optional[Tensor], x: Tensor, config: Dict[str, int],
                 reduce: str = "sum", out: Optional[Tensor] = None, tiles: Optional[Tensor] = None) -> Tensor:
    """``out[i] = reduce_{e in row i} w_e x[col[e]]`` on a block-diagonal batch, one program per graph.

    Args:
        ptr: [B + 1] int64 node offsets of the graphs (every edge stays inside its graph).
        rowptr: [N + 1] int64; col: [E] int32 / int64 sources; edge_val: [E] or None (ones).
        x: [N, F] float32 / float16 / bfloat16 (made contiguous).
        config: ``DENSE``, ``MAXN`` (>= the largest graph's nodes, a power of two >= 16),
            ``BLOCK_F``, ``BLOCK_E`` (gather), ``num_warps`` (``batched_config``).
        reduce: ``"sum"``, ``"mean"`` or ``"max"`` (max: gather kernel only; 0 for empty rows).
        out: optional contiguous [N, F] output of ``x``'s dtype.
        tiles: with ``DENSE``, ``batch_tiles`` of these weights and ``reduce``, ``[B, MAXN, MAXN]``
            (the dispatcher caches them per graph); built here when None.

    Returns:
        [N, F] of ``x``'s dtype, fp32 accumulation, deterministic.
    """
    x = x.contiguous()
    if out is None:
        out = torch.empty((rowptr.numel() - 1, x.shape[1]), dtype=x.dtype, device=x.device)
    num_graphs = ptr.numel() - 1
    if num_graphs == 0 or x.shape[1] == 0 or out.shape[0] == 0:
        return out
    if config["DENSE"] and reduce == "max":
        raise ValueError("spmm_batched(): the dense-tile kernel sums; reduce='max' needs DENSE=0")
    val = edge_val if edge_val is not None else rowptr
    args = (ptr, rowptr, col, val, x, out, x.shape[1], x.stride(0), out.stride(0))
    if config["DENSE"]:
        if tiles is None:
            row = torch.repeat_interleave(torch.arange(rowptr.numel() - 1, device=rowptr.device), rowptr.diff(),
                                          output_size=col.numel())
            tiles = batch_tiles(ptr, rowptr, row, col, edge_val, reduce, config["MAXN"])
        grid = (num_graphs, triton.cdiv(x.shape[1], config["BLOCK_F"]))     # feature blocks in parallel
        launch(_batched_tile_kernel, grid, (ptr, tiles, x, out, x.shape[1], x.stride(0), out.stride(0)),
               dict(MAXN=config["MAXN"], BLOCK_F=config["BLOCK_F"]), config["num_warps"])
    else:
        launch(_batched_gather_kernel, (num_graphs,), args,
               dict(REDUCE=REDUCE_CODES[reduce], HAS_VAL=edge_val is not None, MAXN=config["MAXN"],
                    BLOCK_E=config["BLOCK_E"], BLOCK_F=config["BLOCK_F"]),
               config["num_warps"])
    return out
