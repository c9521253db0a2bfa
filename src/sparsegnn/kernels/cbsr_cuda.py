"""CBSR SpGEMM forward as a CUDA kernel compiled at run time (CuPy ``RawModule``, NVRTC).

Why not Triton: the forward adds each edge's ``k`` entries into scattered columns of the
target row.  Triton has no shared-memory scatter, and its atomic form (``kernels/cbsr.py``)
ran at 44 G atomics/s on the H100: 83.6 ms for the Reddit stand-in at k = 32 against 23.8 ms
for cuSPARSE's dense SpMM.  Here a warp owns a target row and accumulates it in shared memory
(``F`` floats per warp), as in MaxK-GNN: per edge, lane ``s`` adds ``w_e values[j, s]`` at
``index[j, s]``; the columns of one edge are distinct, so no two lanes touch one address in a
step, and ``__syncwarp`` orders the steps: no atomics, a fixed order, deterministic.  The
columns and weights of ``UNROLL`` edges are read at once and their values gathered before they
are applied (16 / CH edges of CH entries per lane, k <= 32 CH), so 16 loads per lane are in
flight; rows are taken heaviest first.  Bytes per edge: 8 (column,
weight) + ``k (4 + 1)`` (values, uint8 columns) instead of ``4 F``.

``available()`` is False without CuPy or a GPU; the caller then uses the Triton kernels.
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
    const float* __restrict__ w,
    const float* __restrict__ vals, const unsigned char* __restrict__ idx, float* __restrict__ out,
    int num_rows, int F, int k, int has_w)
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
        for (int f = lane; f < F; f += 32) out[row * F + f] = acc[f];
        __syncwarp();
    }
}
"""

WARPS = 8


@functools.lru_cache(maxsize=None)
def _kernel(ch: int):
    import cupy

    return cupy.RawModule(code=_SOURCE, options=("--std=c++14", f"-DCH={ch}")).get_function("cbsr_spgemm")


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


def spgemm_cbsr_cuda(rowptr: Tensor, order: Tensor, col32: Tensor, weight: Optional[Tensor], values: Tensor,
                     index: Tensor, num_rows: int, num_cols: int) -> Tensor:
    """``Y[i] = sum_{e: j -> i} w_e scatter(values[j], index[j])`` for fp32 ``values`` and uint8
    ``index`` (``num_cols <= 256``).

    Shapes:
        rowptr: [N + 1] int64; order: [N] int32 rows, heaviest first (warps take them round robin);
        col32: [E] int32; weight: [E] float32 or None;
        values, index: [M, k] -> [num_rows, num_cols] float32.
    """
    import cupy

    out = torch.empty((num_rows, num_cols), dtype=torch.float32, device=values.device)
    if num_rows == 0:
        return out
    values, index = values.contiguous(), index.contiguous()
    w = weight.contiguous() if weight is not None else values
    ptr = lambda t: cupy.uint64(t.data_ptr())  # noqa: E731
    sms = torch.cuda.get_device_properties(values.device).multi_processor_count
    blocks = min((num_rows + WARPS - 1) // WARPS, sms * 8)
    with cupy.cuda.Device(values.device.index), cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        ch = 1 if values.shape[1] <= 32 else (2 if values.shape[1] <= 64 else (4 if values.shape[1] <= 128 else 8))
        _kernel(ch)((blocks,), (32 * WARPS,),
                  (ptr(rowptr), ptr(order), ptr(col32), ptr(w), ptr(values), ptr(index), ptr(out), cupy.int32(num_rows),
                   cupy.int32(num_cols), cupy.int32(values.shape[1]), cupy.int32(weight is not None)),
                  shared_mem=4 * num_cols * WARPS)
    return out
