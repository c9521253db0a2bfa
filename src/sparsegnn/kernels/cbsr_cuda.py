"""CBSR SpGEMM forward and SSpMM backward as CUDA kernels compiled at run time (CuPy ``RawModule``, NVRTC).

Why not Triton: the forward adds each edge's ``k`` entries into scattered columns of the
target row.  Triton has no shared-memory scatter, and its atomic form (removed; ``notes/maxk.md``)
ran at 44 G atomics/s on the H100: 83.6 ms for the Reddit stand-in at k = 32 against 23.8 ms
for cuSPARSE's dense SpMM.  Here a warp owns a target row and accumulates it in shared memory
(``F`` floats per warp), as in MaxK-GNN: per edge, lane ``s`` adds ``w_e values[j, s]`` at
``index[j, s]``; the columns of one edge are distinct, so no two lanes touch one address in a
step, and ``__syncwarp`` orders the steps: no atomics, a fixed order, deterministic.  The
columns and weights of ``UNROLL`` edges are read at once and their values gathered before they
are applied (16 / CH edges of CH entries per lane, k <= 32 CH), so 16 loads per lane are in
flight; rows are taken heaviest first.  Bytes per edge: 8 (column,
weight; a mean's ``1 / deg`` is applied once per row) + ``k (4 + 1)`` (values, uint8 columns)
instead of ``4 F``.

Backward (``sspmm_cbsr_cuda``), MaxK-GNN's outer product: ``dvalues[j, s] += w_e dY[i,
index[j, s]]`` for every edge ``j -> i``.  A gather over the transpose (Triton,
removed) reads ``k`` scattered floats of a ``dY`` row per edge, ~21 of its 32
sectors at k = 32 of 256 (27.5 ms on the Reddit stand-in, 0.86x cuSPARSE).  Here a warp owns a
row ``i`` of ``A``: it reads ``dY[i]`` once, coalesced, into shared memory, then for each edge
lane ``q`` takes ``VEC`` entries: ``index[j, VEC q ..]`` (one 4-byte read), ``VEC`` shared-memory
reads, and one vector reduction (``atomicAdd`` of a ``float4``, sm_90) into the zeroed
``dvalues[j]``: ``k`` floats, coalesced across the lanes of an edge.  Bytes per edge: 8 (column,
weight) + ``k`` (columns) + ``4 k`` reduced in L2 (``dvalues`` of the Reddit stand-in, 30 MB at
k = 32, stays there).  The order of additions into one entry is not fixed (atomics): results
agree with the reference to rounding; under ``torch.use_deterministic_algorithms(True)``
``ops/cbsr.py`` takes the dense product instead.

``available()`` is False without CuPy or a GPU; ``ops/cbsr.py`` then takes the dense product.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor

_SOURCE = r"""
// CH: entries per lane (k <= 32 CH); UNROLL = 16 / CH edges per batch, so each lane keeps 16
// values and columns in flight whatever k is.
#define UNROLL (16 / CH)
extern "C" __global__ void cbsr_spgemm(
    const long long* __restrict__ rowptr, const int* __restrict__ order, const int* __restrict__ col,
    const float* __restrict__ w, const float* __restrict__ row_scale,
    const float* __restrict__ vals, const unsigned char* __restrict__ idx, float* __restrict__ out,
    int num_rows, int F, int k, int has_w, int has_s)
{
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float* acc = smem + (long long)warp * F;
    for (long long slot = (long long)blockIdx.x * warps + warp; slot < num_rows; slot += (long long)gridDim.x * warps) {
        const long long row = order[slot];
        for (int f = lane; f < F; f += 32) acc[f] = 0.f;
        __syncwarp();
        const long long start = rowptr[row], end = rowptr[row + 1];
        for (long long e0 = start; e0 < end; e0 += UNROLL) {
            const int n = (int)min((long long)UNROLL, end - e0);
            int my_j = 0; float my_w = 0.f;
            if (lane < n) { my_j = col[e0 + lane]; my_w = has_w ? w[e0 + lane] : 1.f; }
            float v[UNROLL][CH]; int c[UNROLL][CH];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = __shfl_sync(0xffffffffu, my_j, u);
                const float we = __shfl_sync(0xffffffffu, my_w, u);
                #pragma unroll
                for (int h = 0; h < CH; ++h) {
                    const int s = lane + 32 * h;
                    v[u][h] = 0.f; c[u][h] = -1;
                    if (u < n && s < k) {
                        const long long at = (long long)j * k + s;
                        v[u][h] = we * vals[at];
                        c[u][h] = idx[at];
                    }
                }
            }
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                #pragma unroll
                for (int h = 0; h < CH; ++h)
                    if (c[u][h] >= 0) acc[c[u][h]] += v[u][h];
                __syncwarp();
            }
        }
        const float scale = has_s ? row_scale[row] : 1.f;
        for (int f = lane; f < F; f += 32) out[row * F + f] = acc[f] * scale;
        __syncwarp();
    }
}
"""

_SSPMM_SOURCE = r"""
// K entries per CBSR row; VEC = 4 (float4 reductions, K % 4 == 0) or 1; TASKS lane-tasks per
// edge; a warp step covers 32 (edge, task) pairs of its row, UNROLL steps loaded at once.
#define TASKS ((K + VEC - 1) / VEC)
#define UNROLL 4
extern "C" __global__ void cbsr_sspmm(
    const long long* __restrict__ rowptr, const int* __restrict__ order, const int* __restrict__ col,
    const float* __restrict__ w, const float* __restrict__ row_scale, const float* __restrict__ grad,
    const unsigned char* __restrict__ idx, float* __restrict__ dval, int num_rows, int F, int has_w, int has_s)
{
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float* buf = smem + (long long)warp * F;
    for (long long slot = (long long)blockIdx.x * warps + warp; slot < num_rows; slot += (long long)gridDim.x * warps) {
        const long long row = order[slot];
        const long long start = rowptr[row], end = rowptr[row + 1];
        if (start == end) continue;   // rows come heaviest first: the rest of this warp's are empty too
        __syncwarp();
        const float scale = has_s ? row_scale[row] : 1.f;
        for (int f = lane; f < F; f += 32) buf[f] = grad[row * F + f] * scale;
        __syncwarp();
        const long long total = (end - start) * TASKS;
        for (long long t0 = 0; t0 < total; t0 += 32 * UNROLL) {
            int j[UNROLL], q[UNROLL]; float we[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const long long t = t0 + 32 * u + lane;
                j[u] = -1; q[u] = 0; we[u] = 0.f;
                if (t < total) {
                    const long long e = start + t / TASKS;
                    q[u] = (int)(t % TASKS);
                    j[u] = col[e];
                    we[u] = has_w ? w[e] : 1.f;
                }
            }
#if VEC == 4
            uchar4 c[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (j[u] >= 0) c[u] = *reinterpret_cast<const uchar4*>(idx + (long long)j[u] * K + 4 * q[u]);
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (j[u] < 0) continue;
                float4 v = make_float4(we[u] * buf[c[u].x], we[u] * buf[c[u].y], we[u] * buf[c[u].z], we[u] * buf[c[u].w]);
                float* at = dval + (long long)j[u] * K + 4 * q[u];
#if __CUDA_ARCH__ >= 900 && !defined(NO_VEC_ATOMIC)
                atomicAdd(reinterpret_cast<float4*>(at), v);
#else
                atomicAdd(at, v.x); atomicAdd(at + 1, v.y); atomicAdd(at + 2, v.z); atomicAdd(at + 3, v.w);
#endif
            }
#else
            unsigned char c[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (j[u] >= 0) c[u] = idx[(long long)j[u] * K + q[u]];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (j[u] >= 0) atomicAdd(dval + (long long)j[u] * K + q[u], we[u] * buf[c[u]]);
#endif
        }
    }
}
"""

WARPS = 8


@functools.lru_cache(maxsize=None)
def _kernel(ch: int):
    import cupy

    return cupy.RawModule(code=_SOURCE, options=("--std=c++14", f"-DCH={ch}")).get_function("cbsr_spgemm")


@functools.lru_cache(maxsize=None)
def _sspmm_kernel(k: int, vec: int):
    """The SSpMM kernel for ``k`` entries per row, ``vec`` = 4 (float4 reductions; a
    scalar-atomic build where the NVRTC headers lack the float4 ``atomicAdd``) or 1."""
    import cupy

    options = ("--std=c++14", f"-DK={k}", f"-DVEC={vec}")
    try:
        module = cupy.RawModule(code=_SSPMM_SOURCE, options=options)
        module.compile()
    except cupy.cuda.compiler.CompileException:
        module = cupy.RawModule(code=_SSPMM_SOURCE, options=options + ("-DNO_VEC_ATOMIC",))
    return module.get_function("cbsr_sspmm")


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether the CUDA kernel can run here (CuPy installed and a GPU)."""
    if not torch.cuda.is_available():
        return False
    try:
        import cupy  # noqa: F401
    except Exception:   # noqa: BLE001 - any import problem means: not here
        return False
    return True


def _run(kernel, num_rows: int, like: Tensor, rowptr: Tensor, order: Tensor, col32: Tensor, weight: Optional[Tensor],
         row_scale: Optional[Tensor], tensors, ints, shared_mem: int) -> None:
    """Launch a row-per-warp kernel of this module on the current torch stream: arguments
    ``rowptr, order, col, w, row_scale, *tensors, num_rows, *ints, has_w, has_s`` (``like``
    stands in for a missing ``w`` / ``row_scale``), ``WARPS`` warps per block, at most 8
    blocks per SM (warps loop over the rows)."""
    import cupy

    ptr = lambda t: cupy.uint64(t.data_ptr())  # noqa: E731
    w = weight.contiguous() if weight is not None else like
    scale = row_scale.contiguous() if row_scale is not None else like
    sms = torch.cuda.get_device_properties(like.device).multi_processor_count
    blocks = min((num_rows + WARPS - 1) // WARPS, sms * 8)
    args = ((ptr(rowptr), ptr(order), ptr(col32), ptr(w), ptr(scale)) + tuple(ptr(t) for t in tensors)
            + (cupy.int32(num_rows),) + tuple(cupy.int32(v) for v in ints)
            + (cupy.int32(weight is not None), cupy.int32(row_scale is not None)))
    with cupy.cuda.Device(like.device.index), cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        kernel((blocks,), (32 * WARPS,), args, shared_mem=shared_mem)


def spgemm_cbsr_cuda(rowptr: Tensor, order: Tensor, col32: Tensor, weight: Optional[Tensor], values: Tensor,
                     index: Tensor, num_rows: int, num_cols: int, row_scale: Optional[Tensor] = None) -> Tensor:
    """``Y[i] = s_i sum_{e: j -> i} w_e scatter(values[j], index[j])`` for fp32 ``values`` and uint8
    ``index`` (``num_cols <= 256``); ``s`` = ``row_scale`` (a mean's ``1 / deg``: read once per
    row, not per edge) or ones.

    Shapes:
        rowptr: [N + 1] int64; order: [N] int32 rows, heaviest first (warps take them round robin);
        col32: [E] int32; weight: [E] float32 or None; row_scale: [N] float32 or None;
        values, index: [M, k] -> [num_rows, num_cols] float32.
    """

    out = torch.empty((num_rows, num_cols), dtype=torch.float32, device=values.device)
    if num_rows == 0:
        return out
    values, index = values.contiguous(), index.contiguous()
    k = values.shape[1]
    ch = 1 if k <= 32 else (2 if k <= 64 else (4 if k <= 128 else 8))
    _run(_kernel(ch), num_rows, values, rowptr, order, col32, weight, row_scale, (values, index, out),
         (num_cols, k), 4 * num_cols * WARPS)
    return out


def sspmm_cbsr_cuda(rowptr: Tensor, order: Tensor, col32: Tensor, weight: Optional[Tensor], grad: Tensor,
                    index: Tensor, num_src: int, row_scale: Optional[Tensor] = None) -> Tensor:
    """``dvalues[j, s] = sum_{e: j -> i} w_e s_i grad[i, index[j, s]]`` (module doc: outer product,
    atomics) for fp32 ``grad`` and uint8 ``index``, over the forward CSR (no transpose);
    ``s`` = ``row_scale`` or ones.

    Shapes:
        rowptr: [N + 1] int64; order: [N] int32 rows, heaviest first; col32: [E] int32;
        weight: [E] float32 or None; row_scale: [N] float32 or None; grad: [N, F] float32;
        index: [M, k] uint8 -> [M, k] float32.
    """
    k = index.shape[1]
    out = torch.zeros((num_src, k), dtype=torch.float32, device=grad.device)
    num_rows, num_cols = grad.shape
    if num_rows == 0 or num_src == 0 or k == 0:
        return out
    grad, index = grad.contiguous(), index.contiguous()
    vec = 4 if k % 4 == 0 and index.data_ptr() % 4 == 0 else 1
    _run(_sspmm_kernel(k, vec), num_rows, grad, rowptr, order, col32, weight, row_scale, (grad, index, out),
         (num_cols,), 4 * num_cols * WARPS)
    return out
