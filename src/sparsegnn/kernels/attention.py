"""Fused graph attention (GAT) in Triton: scores, online softmax, dropout and aggregation in one pass.

For target row ``i``, head ``h`` and incoming edge ``e: j -> i`` (CSR position ``e``)::

    z_e = a_dst[i, h] + a_src[j, h]            s_e = LeakyReLU(z_e)
    alpha_e = exp(s_e - lse_i) ,  lse_i = log sum_e exp(s_e)      (softmax over row i)
    keep_e ~ Bernoulli(1 - p)   (Philox: tl.rand(seed, e * H + h), the same draw in the backward)
    out[i, h, :] = sum_e alpha_e keep_e / (1 - p) * feat[j, h, :]

The forward keeps a running maximum ``m`` and running sum ``l`` per head and rescales the
accumulator when ``m`` grows (FlashAttention's online softmax), so scores and weights never
reach memory; it stores only ``lse`` ([N, H] fp32) for the backward.

Backward (``g = dOut``), one pass over the *transposed* graph (row ``j``, its outgoing edges),
recomputing each weight from ``a_dst[i]``, ``a_src[j]`` and ``lse_i``::

    D_i      = <g_i, out_i>  per head (computed by the caller)
    w_e      = alpha_e keep_e / (1 - p)
    dfeat_j  = sum_e w_e g_i
    ds_e     = alpha_e (keep_e / (1 - p) <g_i, feat_j> - D_i)
    dz_e     = ds_e * (1 if z_e > 0 else slope)
    da_src_j = sum_e dz_e
and ``da_dst_i = sum_{e in row i} dz_e`` from the ``dz`` written at each edge's CSR position.
Accumulation is fp32 for every input dtype.  No [E, H] tensor is kept between the passes.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import launch
from .configs import next_pow2


@triton.jit
def _leaky(z, slope):
    return tl.where(z > 0, z, z * slope)


@triton.jit
def _row_tile(num_heads, channels, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """Heads, their mask, and the [H, C] offsets and mask of one node's features in a row."""
    head = tl.arange(0, BLOCK_H)
    chan = tl.arange(0, BLOCK_C)
    hmask = head < num_heads
    return head, hmask, head[:, None] * channels + chan[None, :], hmask[:, None] & (chan < channels)[None, :]


@triton.jit(do_not_specialize=["num_rows"])
def _gat_fwd_kernel(
    rowptr_ptr, col_ptr, feat_ptr, asrc_ptr, adst_ptr, seed_ptr, out_ptr, lse_ptr,
    num_rows, num_heads, channels, slope, p_drop,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
    DROPOUT: tl.constexpr,
):
    head, hmask, foff, fmask = _row_tile(num_heads, channels, BLOCK_H, BLOCK_C)
    width = num_heads * channels
    if DROPOUT:
        seed = tl.load(seed_ptr)
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        if row < num_rows:
            start = tl.load(rowptr_ptr + row)
            end = tl.load(rowptr_ptr + row + 1)
            a_dst = tl.load(adst_ptr + row * num_heads + head, mask=hmask, other=0.0).to(tl.float32)
            run_max = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
            run_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
            acc = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
            for edge0 in range(start, end, BLOCK_E):
                edge = edge0 + tl.arange(0, BLOCK_E)
                emask = edge < end
                src = tl.load(col_ptr + edge, mask=emask, other=0).to(tl.int64)
                smask = emask[:, None] & hmask[None, :]
                a_src = tl.load(asrc_ptr + src[:, None] * num_heads + head[None, :], mask=smask, other=0.0)
                s = _leaky(a_dst[None, :] + a_src.to(tl.float32), slope)
                s = tl.where(smask, s, float("-inf"))
                new_max = tl.maximum(run_max, tl.max(s, axis=0))
                safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
                p = tl.exp(s - safe_max[None, :])                         # [E, H]; 0 on padding
                rescale = tl.exp(run_max - safe_max)
                run_sum = run_sum * rescale + tl.sum(p, axis=0)
                if DROPOUT:
                    draw = tl.rand(seed, (edge[:, None] * num_heads + head[None, :]).to(tl.int32))
                    p = tl.where(draw >= p_drop, p, 0.0)
                feat = tl.load(feat_ptr + src[:, None, None] * width + foff[None, :, :],
                               mask=emask[:, None, None] & fmask[None, :, :], other=0.0)
                acc = acc * rescale[:, None] + tl.sum(p[:, :, None] * feat.to(tl.float32), axis=0)
                run_max = new_max
            safe_sum = tl.where(run_sum > 0, run_sum, 1.0)
            scale = 1.0 / safe_sum
            if DROPOUT:
                scale = scale / (1.0 - p_drop)
            out = acc * scale[:, None]
            tl.store(out_ptr + row * width + foff, out.to(out_ptr.dtype.element_ty), mask=fmask)
            lse = tl.where(run_sum > 0, run_max + tl.log(safe_sum), 0.0)
            tl.store(lse_ptr + row * num_heads + head, lse, mask=hmask)


@triton.jit(do_not_specialize=["num_rows"])
def _gat_bwd_kernel(
    rowptr_t_ptr, col_t_ptr, perm_ptr, feat_ptr, asrc_ptr, adst_ptr, lse_ptr, dot_ptr, grad_ptr, seed_ptr,
    dfeat_ptr, dasrc_ptr, dz_ptr,
    num_rows, num_heads, channels, slope, p_drop,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
    DROPOUT: tl.constexpr,
):
    head, hmask, foff, fmask = _row_tile(num_heads, channels, BLOCK_H, BLOCK_C)
    width = num_heads * channels
    if DROPOUT:
        seed = tl.load(seed_ptr)
        inv_keep = 1.0 / (1.0 - p_drop)
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r            # a source node j
        if row < num_rows:
            start = tl.load(rowptr_t_ptr + row)
            end = tl.load(rowptr_t_ptr + row + 1)
            a_src = tl.load(asrc_ptr + row * num_heads + head, mask=hmask, other=0.0).to(tl.float32)
            feat = tl.load(feat_ptr + row * width + foff, mask=fmask, other=0.0).to(tl.float32)   # [H, C]
            dfeat = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
            dsrc = tl.zeros([BLOCK_H], dtype=tl.float32)
            for edge0 in range(start, end, BLOCK_E):
                edge = edge0 + tl.arange(0, BLOCK_E)
                emask = edge < end
                dst = tl.load(col_t_ptr + edge, mask=emask, other=0).to(tl.int64)
                orig = tl.load(perm_ptr + edge, mask=emask, other=0).to(tl.int64)   # CSR position
                smask = emask[:, None] & hmask[None, :]
                hoff = dst[:, None] * num_heads + head[None, :]
                a_dst = tl.load(adst_ptr + hoff, mask=smask, other=0.0).to(tl.float32)
                lse = tl.load(lse_ptr + hoff, mask=smask, other=0.0)
                dot_out = tl.load(dot_ptr + hoff, mask=smask, other=0.0)
                z = a_dst + a_src[None, :]
                alpha = tl.where(smask, tl.exp(_leaky(z, slope) - lse), 0.0)               # [E, H]
                g = tl.load(grad_ptr + dst[:, None, None] * width + foff[None, :, :],
                            mask=emask[:, None, None] & fmask[None, :, :], other=0.0).to(tl.float32)
                g_feat = tl.sum(g * feat[None, :, :], axis=2)                                 # [E, H]
                if DROPOUT:
                    draw = tl.rand(seed, (orig[:, None] * num_heads + head[None, :]).to(tl.int32))
                    keep = tl.where(draw >= p_drop, inv_keep, 0.0)
                    w = alpha * keep
                    ds = alpha * (keep * g_feat - dot_out)
                else:
                    w = alpha
                    ds = alpha * (g_feat - dot_out)
                dfeat += tl.sum(w[:, :, None] * g, axis=0)
                dz = tl.where(z > 0, ds, ds * slope)
                dsrc += tl.sum(tl.where(smask, dz, 0.0), axis=0)
                tl.store(dz_ptr + orig[:, None] * num_heads + head[None, :], dz, mask=smask)
            tl.store(dfeat_ptr + row * width + foff, dfeat.to(dfeat_ptr.dtype.element_ty), mask=fmask)
            tl.store(dasrc_ptr + row * num_heads + head, dsrc.to(dasrc_ptr.dtype.element_ty), mask=hmask)


@triton.jit(do_not_specialize=["num_rows"])
def _row_sum_kernel(rowptr_ptr, val_ptr, out_ptr, num_rows, num_heads,
                    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """``out[i, h] = sum_{e in row i} val[e, h]`` (fp32 accumulation)."""
    head = tl.arange(0, BLOCK_H)
    hmask = head < num_heads
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        if row < num_rows:
            start = tl.load(rowptr_ptr + row)
            end = tl.load(rowptr_ptr + row + 1)
            total = tl.zeros([BLOCK_H], dtype=tl.float32)
            for edge0 in range(start, end, BLOCK_E):
                edge = edge0 + tl.arange(0, BLOCK_E)
                mask = (edge < end)[:, None] & hmask[None, :]
                v = tl.load(val_ptr + edge.to(tl.int64)[:, None] * num_heads + head[None, :], mask=mask, other=0.0)
                total += tl.sum(v.to(tl.float32), axis=0)
            tl.store(out_ptr + row * num_heads + head, total.to(out_ptr.dtype.element_ty), mask=hmask)


#: Fused-attention search space (edges per step, rows per program, warps).
GAT_SPACE: Dict[str, Tuple[int, ...]] = {
    "BLOCK_E": (4, 8, 16, 32, 64),
    "ROWS": (1, 2, 4),
    "num_warps": (1, 2, 4, 8),
}


def _tile_config(num_rows: int, num_edges: int, row_width: int, max_tile: int) -> Dict[str, int]:
    """Heuristic launch config of a row-wise attention pass: a [BLOCK_E, row_width] tile of at
    most ``max_tile`` elements, more rows per program on low-degree graphs (short rows leave a
    lone program idle)."""
    avg = num_edges / max(num_rows, 1)
    block_e = max(4, min(64, max_tile // row_width, next_pow2(int(avg) + 1)))
    rows = 4 if avg <= 4 else (2 if avg <= 16 else 1)
    warps = 1 if row_width * block_e <= 256 else (2 if row_width * block_e <= 1024 else 4)
    return {"BLOCK_E": block_e, "ROWS": rows, "num_warps": warps}


def _neighbours(base: Dict[str, int]) -> List[Dict[str, int]]:
    """``base`` and its neighbours in ``GAT_SPACE`` (half / double edges per step and warps,
    the other rows-per-program choice): the candidates the autotuner times."""
    out = [base]
    for key in ("BLOCK_E", "num_warps"):
        out += [dict(base, **{key: v}) for v in (base[key] // 2, base[key] * 2) if v in GAT_SPACE[key]]
    return out + [dict(base, ROWS=1 if base["ROWS"] > 1 else 2)]


#: The mean degree a first-contact config assumes (``first_contact_config``).
FIRST_CONTACT_DEGREE = 8


def gat_config(num_rows: int, num_edges: int, heads: int, channels: int) -> Dict[str, int]:
    """Heuristic launch config: a [BLOCK_E, H, C] tile of at most 2k elements."""
    return _tile_config(num_rows, num_edges, next_pow2(heads) * next_pow2(channels), 2048)


def first_contact_config(op: str, heads: int, channels: int) -> Dict[str, int]:
    """The launch config of a graph not invested in (``tune.reuse``): ``gat_config`` (``op``
    ``"gat"``) or ``agnn_config`` (``"agnn"``, ``heads = 1``, ``channels = F``) at a nominal
    mean degree of ``FIRST_CONTACT_DEGREE``, so it depends on the widths alone.  Each new
    graph then runs a variant the process has loaded already: one picked by the graph's
    degree could need loading from Triton's cache (~10-20 ms) or compiling (~1 s).  GAT's
    config also names its backward's row-sum config (``SUM_ROWS``, ``SUM_E``; else by degree).
    """
    max_tile = {"gat": 2048, "agnn": 4096}[op]
    config = _tile_config(1, FIRST_CONTACT_DEGREE, next_pow2(heads) * next_pow2(channels), max_tile)
    if op == "gat":     # the backward's row sums (``gat_backward``), at the same nominal degree
        config.update(SUM_ROWS=4, SUM_E=next_pow2(FIRST_CONTACT_DEGREE + 1))
    return config


def gat_candidates(num_rows: int, num_edges: int, heads: int, channels: int) -> List[Dict[str, int]]:
    """The heuristic and its neighbours in the space, for the autotuner."""
    return _neighbours(gat_config(num_rows, num_edges, heads, channels))


def _shape(feat: Tensor) -> Tuple[int, int, int]:
    return feat.shape[0], feat.shape[1], feat.shape[2]


def gat_forward(rowptr: Tensor, col: Tensor, feat: Tensor, a_src: Tensor, a_dst: Tensor, slope: float,
                p_drop: float, seed: Optional[Tensor], config: Optional[Dict[str, int]] = None,
                out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """Fused GAT aggregation; returns ``(out [N, H, C], lse [N, H] fp32)`` for the ``N`` rows
    (targets) of the CSR; ``feat`` / ``a_src`` have a row per source (``M``, bipartite or ``N``).

    ``seed``: int64 [1] tensor on the device (used when ``p_drop > 0``).  ``out`` has
    ``out_dtype`` (default: feat's); the backward wants an fp32 ``out`` for half inputs, since
    its ``D_i = <g_i, out_i>`` cancels against per-edge terms.
    """
    _, heads, channels = _shape(feat)
    num_rows = rowptr.numel() - 1
    feat, a_src, a_dst = feat.contiguous(), a_src.contiguous(), a_dst.contiguous()
    out = torch.empty((num_rows, heads, channels), dtype=out_dtype or feat.dtype, device=feat.device)
    lse = torch.empty(num_rows, heads, dtype=torch.float32, device=feat.device)
    if num_rows == 0:
        return out, lse
    cfg = config or gat_config(num_rows, col.numel(), heads, channels)
    dropout = p_drop > 0.0
    launch(_gat_fwd_kernel, (triton.cdiv(num_rows, cfg["ROWS"]),),
           (rowptr, col, feat, a_src, a_dst, seed if dropout else rowptr, out, lse,
            num_rows, heads, channels, float(slope), float(p_drop)),
           dict(ROWS=cfg["ROWS"], BLOCK_E=cfg["BLOCK_E"], BLOCK_H=next_pow2(heads), BLOCK_C=next_pow2(channels),
                DROPOUT=dropout), cfg["num_warps"])
    return out, lse


def gat_backward(rowptr: Tensor, transpose: Tuple[Tensor, Tensor, Tensor], feat: Tensor, a_src: Tensor,
                 a_dst: Tensor, lse: Tensor, out: Tensor, grad: Tensor, slope: float, p_drop: float,
                 seed: Optional[Tensor], config: Optional[Dict[str, int]] = None
                 ) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dfeat, da_src, da_dst)`` of :func:`gat_forward` (see the module doc)."""
    rowptr_t, col_t, perm = transpose
    num_rows, heads, channels = _shape(feat)          # sources: the transpose's rows
    num_dst = rowptr.numel() - 1
    feat, a_src, a_dst, grad = feat.contiguous(), a_src.contiguous(), a_dst.contiguous(), grad.contiguous()
    dot_out = (grad.float() * out.float()).sum(-1).contiguous()                    # D_i, [N, H]
    dfeat = torch.empty_like(feat)
    da_src = torch.empty_like(a_src)
    da_dst = torch.empty_like(a_dst)
    num_edges = col_t.numel()
    if num_rows == 0 or num_dst == 0:
        return dfeat.zero_(), da_src.zero_(), da_dst.zero_()
    dz = torch.empty(num_edges, heads, dtype=torch.float32, device=feat.device)
    cfg = config or gat_config(num_rows, num_edges, heads, channels)
    dropout = p_drop > 0.0
    block_h = next_pow2(heads)
    launch(_gat_bwd_kernel, (triton.cdiv(num_rows, cfg["ROWS"]),),
           (rowptr_t, col_t, perm, feat, a_src, a_dst, lse, dot_out, grad, seed if dropout else rowptr,
            dfeat, da_src, dz, num_rows, heads, channels, float(slope), float(p_drop)),
           dict(ROWS=cfg["ROWS"], BLOCK_E=cfg["BLOCK_E"], BLOCK_H=block_h, BLOCK_C=next_pow2(channels),
                DROPOUT=dropout), cfg["num_warps"])
    # the row sums' config: by the mean degree, or the first-contact config's (one compiled
    # variant per width, see ``first_contact_config``)
    rows, sum_e = cfg.get("SUM_ROWS"), cfg.get("SUM_E")
    if rows is None:
        avg = num_edges / max(num_dst, 1)
        rows, sum_e = (4 if avg <= 8 else 1), max(4, min(128, next_pow2(int(avg) + 1)))
    launch(_row_sum_kernel, (triton.cdiv(num_dst, rows),), (rowptr, dz, da_dst, num_dst, heads),
           dict(ROWS=rows, BLOCK_E=max(4, sum_e // max(1, block_h // 4)), BLOCK_H=block_h), 2)
    return dfeat, da_src, da_dst


# ---------------------------------------------------------------------------- AGNN
# Scores ``s_e = beta <q_i, q_j>`` of unit rows ``q = x / |x|``; values ``x_j = nrm_j q_j``, so
# one gathered row ``q_j`` (and the scalar ``nrm_j``) serves both.  Backward, with
# ``c_e = <q_i, q_j>``, ``D_i = <g_i, out_i>`` and ``ds_e = alpha_e (nrm_j <g_i, q_j> - D_i)``:
#   dq_j   += beta ds_e q_i + alpha_e nrm_j g_i      dnrm_j += alpha_e <g_i, q_j>   (transposed pass)
#   dq_i   += beta sum_e ds_e q_j                     dbeta   = sum_e ds_e c_e        (ds at CSR slots)


@triton.jit(do_not_specialize=["num_rows"])
def _agnn_fwd_kernel(
    rowptr_ptr, col_ptr, q_ptr, nrm_ptr, beta_ptr, out_ptr, lse_ptr, num_rows, feats,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
):
    f = tl.arange(0, BLOCK_F)
    fmask = f < feats
    beta = tl.load(beta_ptr).to(tl.float32)
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r
        if row < num_rows:
            start = tl.load(rowptr_ptr + row)
            end = tl.load(rowptr_ptr + row + 1)
            q_i = tl.load(q_ptr + row * feats + f, mask=fmask, other=0.0).to(tl.float32)
            run_max = tl.full([1], float("-inf"), dtype=tl.float32)
            run_sum = tl.zeros([1], dtype=tl.float32)
            acc = tl.zeros([BLOCK_F], dtype=tl.float32)
            for edge0 in range(start, end, BLOCK_E):
                edge = edge0 + tl.arange(0, BLOCK_E)
                emask = edge < end
                src = tl.load(col_ptr + edge, mask=emask, other=0).to(tl.int64)
                q_j = tl.load(q_ptr + src[:, None] * feats + f[None, :], mask=emask[:, None] & fmask[None, :],
                              other=0.0).to(tl.float32)
                nrm = tl.load(nrm_ptr + src, mask=emask, other=0.0).to(tl.float32)
                s = tl.where(emask, beta * tl.sum(q_j * q_i[None, :], axis=1), float("-inf"))     # [E]
                new_max = tl.maximum(run_max, tl.max(s, axis=0))
                safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
                p = tl.exp(s - safe_max)
                rescale = tl.exp(run_max - safe_max)
                run_sum = run_sum * rescale + tl.sum(p, axis=0)
                acc = acc * rescale + tl.sum((p * nrm)[:, None] * q_j, axis=0)
                run_max = new_max
            safe_sum = tl.where(run_sum > 0, run_sum, 1.0)
            tl.store(out_ptr + row * feats + f, (acc / safe_sum).to(out_ptr.dtype.element_ty), mask=fmask)
            lse = tl.where(run_sum > 0, run_max + tl.log(safe_sum), 0.0)
            tl.store(lse_ptr + row + tl.arange(0, 1), lse)


@triton.jit(do_not_specialize=["num_rows"])
def _agnn_bwd_kernel(
    rowptr_t_ptr, col_t_ptr, perm_ptr, q_ptr, nrm_ptr, beta_ptr, lse_ptr, dot_ptr, grad_ptr,
    dq_ptr, dnrm_ptr, dbeta_ptr, ds_ptr, num_rows, feats,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
):
    f = tl.arange(0, BLOCK_F)
    fmask = f < feats
    beta = tl.load(beta_ptr).to(tl.float32)
    for r in tl.static_range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + r            # a source node j
        if row < num_rows:
            start = tl.load(rowptr_t_ptr + row)
            end = tl.load(rowptr_t_ptr + row + 1)
            q_j = tl.load(q_ptr + row * feats + f, mask=fmask, other=0.0).to(tl.float32)
            nrm_j = tl.load(nrm_ptr + row).to(tl.float32)
            dq = tl.zeros([BLOCK_F], dtype=tl.float32)
            dnrm = tl.zeros([BLOCK_E], dtype=tl.float32)
            dbeta = tl.zeros([BLOCK_E], dtype=tl.float32)
            for edge0 in range(start, end, BLOCK_E):
                edge = edge0 + tl.arange(0, BLOCK_E)
                emask = edge < end
                dst = tl.load(col_t_ptr + edge, mask=emask, other=0).to(tl.int64)
                orig = tl.load(perm_ptr + edge, mask=emask, other=0).to(tl.int64)
                tile_mask = emask[:, None] & fmask[None, :]
                q_i = tl.load(q_ptr + dst[:, None] * feats + f[None, :], mask=tile_mask, other=0.0).to(tl.float32)
                g_i = tl.load(grad_ptr + dst[:, None] * feats + f[None, :], mask=tile_mask, other=0.0).to(tl.float32)
                lse = tl.load(lse_ptr + dst, mask=emask, other=0.0)
                dot_out = tl.load(dot_ptr + dst, mask=emask, other=0.0)
                c = tl.sum(q_i * q_j[None, :], axis=1)                                   # [E]
                alpha = tl.where(emask, tl.exp(beta * c - lse), 0.0)
                gq = tl.sum(g_i * q_j[None, :], axis=1)
                ds = alpha * (nrm_j * gq - dot_out)
                dq += tl.sum((beta * ds)[:, None] * q_i + (alpha * nrm_j)[:, None] * g_i, axis=0)
                dnrm += alpha * gq
                dbeta += ds * c
                tl.store(ds_ptr + orig, ds, mask=emask)
            tl.store(dq_ptr + row * feats + f, dq, mask=fmask)
            tl.store(dnrm_ptr + row, tl.sum(dnrm, axis=0))
            tl.store(dbeta_ptr + row, tl.sum(dbeta, axis=0))


def agnn_config(num_rows: int, num_edges: int, feats: int) -> Dict[str, int]:
    """Heuristic launch config: a [BLOCK_E, F] tile of at most 4k elements."""
    return _tile_config(num_rows, num_edges, next_pow2(feats), 4096)


def agnn_candidates(num_rows: int, num_edges: int, feats: int) -> List[Dict[str, int]]:
    """The heuristic and its neighbours in the space, for the autotuner."""
    return _neighbours(agnn_config(num_rows, num_edges, feats))


def agnn_forward(rowptr: Tensor, col: Tensor, q: Tensor, nrm: Tensor, beta: Tensor,
                 config: Optional[Dict[str, int]] = None, out_dtype: Optional[torch.dtype] = None
                 ) -> Tuple[Tensor, Tensor]:
    """Fused AGNN propagation ``out_i = sum_e softmax_i(beta <q_i, q_j>) nrm_j q_j``.

    Returns ``(out [N, F] of out_dtype (default q's), lse [N] fp32)``.
    Shapes: q [N, F]; nrm [N]; beta [1].
    """
    num_rows, feats = q.shape
    q, nrm = q.contiguous(), nrm.contiguous()
    out = torch.empty(q.shape, dtype=out_dtype or q.dtype, device=q.device)
    lse = torch.empty(num_rows, dtype=torch.float32, device=q.device)
    if num_rows == 0:
        return out, lse
    cfg = config or agnn_config(num_rows, col.numel(), feats)
    launch(_agnn_fwd_kernel, (triton.cdiv(num_rows, cfg["ROWS"]),),
           (rowptr, col, q, nrm, beta, out, lse, num_rows, feats),
           dict(ROWS=cfg["ROWS"], BLOCK_E=cfg["BLOCK_E"], BLOCK_F=next_pow2(feats)), cfg["num_warps"])
    return out, lse


def agnn_backward(transpose: Tuple[Tensor, Tensor, Tensor], q: Tensor, nrm: Tensor, beta: Tensor, lse: Tensor,
                  out: Tensor, grad: Tensor, config: Optional[Dict[str, int]] = None
                  ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The transposed pass of the AGNN backward (see above).

    Returns ``(dq_col [N, F] fp32, dnrm [N] fp32, dbeta_rows [N] fp32, ds [E] fp32)``: the caller
    adds ``beta * A_ds q`` (an SpMM with ``ds`` as edge weights) to ``dq_col`` and sums ``dbeta_rows``.
    """
    rowptr_t, col_t, perm = transpose
    num_rows, feats = q.shape
    q, nrm, grad = q.contiguous(), nrm.contiguous(), grad.contiguous()
    dot_out = (grad.float() * out.float()).sum(-1).contiguous()
    dq = torch.empty(num_rows, feats, dtype=torch.float32, device=q.device)
    dnrm = torch.empty(num_rows, dtype=torch.float32, device=q.device)
    dbeta = torch.empty(num_rows, dtype=torch.float32, device=q.device)
    ds = torch.empty(col_t.numel(), dtype=torch.float32, device=q.device)
    if num_rows == 0:
        return dq, dnrm, dbeta, ds
    cfg = config or agnn_config(num_rows, col_t.numel(), feats)
    launch(_agnn_bwd_kernel, (triton.cdiv(num_rows, cfg["ROWS"]),),
           (rowptr_t, col_t, perm, q, nrm, beta, lse, dot_out, grad, dq, dnrm, dbeta, ds, num_rows, feats),
           dict(ROWS=cfg["ROWS"], BLOCK_E=cfg["BLOCK_E"], BLOCK_F=next_pow2(feats)), cfg["num_warps"])
    return dq, dnrm, dbeta, ds
