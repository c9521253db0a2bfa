"""CBSR SpGEMM forward and SSpMM backward as CUDA kernels compiled at run time (CuPy ``RawModule``, NVRTC).

Why not Triton: the forward adds each edge's ``k`` entries into scattered columns of the
target row.  Triton has no shared-memory scatter, and its atomic form (``docs/design/maxk.md``)
runs at ~44 G atomics/s on an H100, 3.5x slower than cuSPARSE's dense SpMM on the Reddit
stand-in.  Here a warp owns a target row and accumulates it in shared memory (``F`` floats per
warp), as in MaxK-GNN: per edge, lane ``s`` adds ``w_e values[j, s]`` at
``index[j, s]``; the columns of one edge are distinct, so no two lanes touch one address in a
step, and ``__syncwarp`` orders the steps: no atomics, a fixed order, deterministic.  The
columns and weights of ``UNROLL`` edges are read at once and their values gathered before they
are applied (16 / CH edges of CH entries per lane, k <= 32 CH), so 16 loads per lane are in
flight; rows are taken heaviest first.  Bytes per edge: 8 (column,
weight; a mean's ``1 / deg`` is applied once per row) + ``k (4 + 1)`` (values, uint8 columns)
instead of ``4 F``.

Backward (``sspmm_cbsr_cuda``), MaxK-GNN's outer product: ``dvalues[j, s] += w_e dY[i,
index[j, s]]`` for every edge ``j -> i``.  A gather over the transpose (in
Triton) reads ``k`` scattered floats of a ``dY`` row per edge, ~21 of its 32
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
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _cupy
from . import current_stream_key, device_properties, sm_count

_SOURCE = r"""
// CH: entries per lane (k <= 32 CH); UNROLL = 16 / CH edges per batch, so each lane keeps 16
// values and columns in flight whatever k is.
#define UNROLL (16 / CH)
extern "C" __global__ void cbsr_spgemm(
    const long long* __restrict__ rowptr, const int* __restrict__ order, const int* __restrict__ col,
    const float* __restrict__ w, const float* __restrict__ row_scale,
    const float* __restrict__ vals, const unsigned char* __restrict__ idx, const float* __restrict__ self_eps,
    float* __restrict__ out, int num_rows, int F, int k, int has_self, int has_w, int has_s)
{
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float* acc = smem + (long long)warp * F;
    for (long long slot = (long long)blockIdx.x * warps + warp; slot < num_rows; slot += (long long)gridDim.x * warps) {
        const long long row = order[slot];
        for (int f = lane; f < F; f += 32) acc[f] = 0.f;
        __syncwarp();
        if (has_self) {     // GIN's (1 + eps) x_i: the row's own entries first (distinct columns)
            // (eps read here: held over the edge loop it made the kernel 6 % slower on the Reddit stand-in)
            const float gain = 1.f + __ldg(self_eps);
            for (int s = lane; s < k; s += 32) acc[idx[row * k + s]] += gain * vals[row * k + s];
            __syncwarp();
        }
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
    const unsigned char* __restrict__ idx, const float* __restrict__ self_eps, float* __restrict__ dval,
    int num_rows, int F, int has_self, int has_w, int has_s)
{
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float* buf = smem + (long long)warp * F;
    for (long long slot = (long long)blockIdx.x * warps + warp; slot < num_rows; slot += (long long)gridDim.x * warps) {
        const long long row = order[slot];
        const long long start = rowptr[row], end = rowptr[row + 1];
        if (has_self) {     // GIN's (1 + eps) x_i: dval[i, s] += (1 + eps) dY[i, index[i, s]], every row
            const float gain = 1.f + __ldg(self_eps);
            for (int s = lane; s < K; s += 32)
                atomicAdd(dval + row * K + s, gain * grad[row * F + idx[row * K + s]]);
        }
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

_ROOT_SOURCE = r"""
// The linear map of a CBSR matrix, X W^T with X = (vals, idx) of K entries per row, and its
// sampled transpose.  Wt = W^T is [FI, FO] row-major; a block holds one tile of TW = 128 of
// its columns in shared memory ([FI][TW]: 128 KB at FI = 256).  A warp takes 4 rows at once,
// 8 lanes per row; lane l of a row owns the tile's columns 32 j + 4 l .. + 3 (j < 4), so the
// 8 lanes of a row read one 128-byte line of a Wt row per float4 access: one conflict-free
// wavefront per quarter warp.  The lanes of a row read its K values and columns themselves
// (broadcasts), 16 at a time as vectors when K % 16 == 0; entries come from registers.
#define TW 128
#define FULL 0xffffffffu
#define RB 16          // entries per transposed reduction of the gradient kernel
#if K % 16 == 0
#define CHUNK 16
#else
#define CHUNK 1
#endif

// entries s0 .. s0 + CHUNK - 1 of row `row`: columns c[] and (with vals) values v[]
__device__ __forceinline__ void load_chunk(const float* __restrict__ vals, const unsigned char* __restrict__ idx,
                                           long long row, int s0, int* c, float* v)
{
#if CHUNK == 16
    const uint4 iw = __ldg(reinterpret_cast<const uint4*>(idx + row * K + s0));
    const unsigned int words[4] = {iw.x, iw.y, iw.z, iw.w};
    #pragma unroll
    for (int u = 0; u < 16; ++u) c[u] = (words[u >> 2] >> (8 * (u & 3))) & 0xff;
    if (vals != nullptr) {
        #pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float4 f = __ldg(reinterpret_cast<const float4*>(vals + row * K + s0) + q);
            v[4 * q] = f.x; v[4 * q + 1] = f.y; v[4 * q + 2] = f.z; v[4 * q + 3] = f.w;
        }
    }
#else
    c[0] = __ldg(idx + row * K + s0);
    if (vals != nullptr) v[0] = __ldg(vals + row * K + s0);
#endif
}

// this block's tile of Wt into shared memory; returns its first column
__device__ __forceinline__ int load_tile(float4* w4, const float* __restrict__ Wt, int FI, int FO)
{
    const int tiles = (FO + TW - 1) / TW, c0 = (blockIdx.x % tiles) * TW;
    for (int t = threadIdx.x; t < FI * (TW / 4); t += blockDim.x) {
        const int r = t / (TW / 4), col = c0 + 4 * (t % (TW / 4));
        w4[t] = col < FO ? *reinterpret_cast<const float4*>(Wt + (long long)r * FO + col) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __syncthreads();
    return c0;
}

#define FMA4(acc, v, w) { acc.x = fmaf(v, w.x, acc.x); acc.y = fmaf(v, w.y, acc.y); \
                          acc.z = fmaf(v, w.z, acc.z); acc.w = fmaf(v, w.w, acc.w); }

extern "C" __global__ void __launch_bounds__(512) cbsr_root(
    const float* __restrict__ vals, const unsigned char* __restrict__ idx, const float* __restrict__ Wt,
    const float* __restrict__ bias, float* __restrict__ out, int N, int FI, int FO, int has_b)
{
    // out[i, o] = b[o] + sum_s vals[i, s] Wt[idx[i, s], o]
    extern __shared__ float4 w4[];
    const int tiles = (FO + TW - 1) / TW, per = gridDim.x / tiles, b = blockIdx.x / tiles;
    const int c0 = load_tile(w4, Wt, FI, FO);
    const int lane = threadIdx.x & 31, l = lane & 7, grp = lane >> 3;
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float4 bb[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int col = c0 + 32 * j + 4 * l;
        bb[j] = (has_b && col < FO) ? *reinterpret_cast<const float4*>(bias + col) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (long long r0 = 4 * ((long long)b * warps + warp); r0 < N; r0 += 4LL * per * warps) {
        const long long row = r0 + grp;
        if (row >= N) break;
        float4 acc[4] = {bb[0], bb[1], bb[2], bb[3]};
        for (int s0 = 0; s0 < K; s0 += CHUNK) {
            int c[CHUNK]; float v[CHUNK];
            load_chunk(vals, idx, row, s0, c, v);
            #pragma unroll
            for (int u = 0; u < CHUNK; ++u) {
                const float4* wr = w4 + c[u] * (TW / 4) + l;
                #pragma unroll
                for (int j = 0; j < 4; ++j) { const float4 w = wr[8 * j]; FMA4(acc[j], v[u], w); }
            }
        }
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = c0 + 32 * j + 4 * l;
            if (col < FO) *reinterpret_cast<float4*>(out + row * FO + col) = acc[j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(512) cbsr_root_grad(
    const float* __restrict__ grad, const unsigned char* __restrict__ idx, const float* __restrict__ Wt,
    float* __restrict__ dval, float* __restrict__ dbias, float* __restrict__ part, int* __restrict__ counter,
    int N, int FI, int FO)
{
    // dval[i, s] (+)= sum_{o in tile} grad[i, o] Wt[idx[i, s], o]  (several tiles add into zeros atomically);
    // with dbias: dbias[o] = sum_i grad[i, o].  Block (b, tile) sums the rows it took (its warps' sums
    // added in warp order) into part[b, tile's columns]; the last block to arrive (counter, reset to 0
    // for the next launch of the stream) adds part[0 .. per) up: a fixed order whichever block is last
    extern __shared__ float4 w4[];
    const int tiles = (FO + TW - 1) / TW, per = gridDim.x / tiles, b = blockIdx.x / tiles;
    const int c0 = load_tile(w4, Wt, FI, FO);
    const int lane = threadIdx.x & 31, l = lane & 7, grp = lane >> 3;
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float4 gs[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) gs[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (long long r0 = 4 * ((long long)b * warps + warp); r0 < N; r0 += 4LL * per * warps) {
        // all lanes stay in the loop (the reduction shuffles across the warp): rows past N are masked
        const long long row = r0 + grp;
        const bool real = row < N;
        const long long rr = real ? row : r0;
        float4 g[4];
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = c0 + 32 * j + 4 * l;
            g[j] = (real && col < FO) ? *reinterpret_cast<const float4*>(grad + rr * FO + col) : make_float4(0.f, 0.f, 0.f, 0.f);
            gs[j].x += g[j].x; gs[j].y += g[j].y; gs[j].z += g[j].z; gs[j].w += g[j].w;
        }
        for (int s0 = 0; s0 < K; s0 += RB) {
            float p[RB];
            #pragma unroll
            for (int u0 = 0; u0 < RB; u0 += CHUNK) {
                int c[CHUNK];
                if (s0 + u0 < K) load_chunk(nullptr, idx, rr, s0 + u0, c, nullptr);
                #pragma unroll
                for (int u = 0; u < CHUNK; ++u) {
                    float acc = 0.f;
                    if (s0 + u0 < K) {
                        const float4* wr = w4 + c[u] * (TW / 4) + l;
                        #pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            const float4 w = wr[8 * j];
                            acc = fmaf(g[j].x, w.x, fmaf(g[j].y, w.y, fmaf(g[j].z, w.z, fmaf(g[j].w, w.w, acc))));
                        }
                    }
                    p[u0 + u] = acc;
                }
            }
            // transposed reduction over the 8 lanes of a row: afterwards lane l holds in
            // p[0 .. RB / 8) the sums of entries s0 + (RB / 8) l + q
            #pragma unroll
            for (int q = 0; q < RB / 2; ++q) {
                const bool up = (l & 4) != 0;
                const float send = up ? p[q] : p[q + RB / 2], keep = up ? p[q + RB / 2] : p[q];
                p[q] = keep + __shfl_xor_sync(FULL, send, 4);
            }
            #pragma unroll
            for (int q = 0; q < RB / 4; ++q) {
                const bool up = (l & 2) != 0;
                const float send = up ? p[q] : p[q + RB / 4], keep = up ? p[q + RB / 4] : p[q];
                p[q] = keep + __shfl_xor_sync(FULL, send, 2);
            }
            #pragma unroll
            for (int q = 0; q < RB / 8; ++q) {
                const bool up = (l & 1) != 0;
                const float send = up ? p[q] : p[q + RB / 8], keep = up ? p[q + RB / 8] : p[q];
                p[q] = keep + __shfl_xor_sync(FULL, send, 1);
            }
            if (real) {
                #pragma unroll
                for (int q = 0; q < RB / 8; ++q) {
                    const int s = s0 + (RB / 8) * l + q;
                    if (s < K) {
                        if (tiles == 1) dval[row * K + s] = p[q];
                        else atomicAdd(dval + row * K + s, p[q]);
                    }
                }
            }
        }
    }
    if (dbias != nullptr) {         // the 4 row groups of the warp summed, then one row of partials per warp
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            #pragma unroll
            for (int m = 8; m <= 16; m <<= 1) {
                gs[j].x += __shfl_xor_sync(FULL, gs[j].x, m); gs[j].y += __shfl_xor_sync(FULL, gs[j].y, m);
                gs[j].z += __shfl_xor_sync(FULL, gs[j].z, m); gs[j].w += __shfl_xor_sync(FULL, gs[j].w, m);
            }
        }
        __syncthreads();                                // every warp is done with the tile: its memory is reused
        if (grp == 0) {
            #pragma unroll
            for (int j = 0; j < 4; ++j) w4[warp * (TW / 4) + 8 * j + l] = gs[j];
        }
        __syncthreads();
        if (threadIdx.x < TW / 4) {
            float4 s = w4[threadIdx.x];
            for (int v = 1; v < warps; ++v) {
                const float4 t = w4[v * (TW / 4) + threadIdx.x];
                s.x += t.x; s.y += t.y; s.z += t.z; s.w += t.w;
            }
            const int col = c0 + 4 * threadIdx.x;
            if (col < FO) *reinterpret_cast<float4*>(part + (long long)b * FO + col) = s;
        }
        __threadfence();
        __shared__ int last;
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
        __syncthreads();
        if (last) {
            // thread (g, q) adds rows g, g + G, ... of column quad q; then the G sums in order of g
            __threadfence();
            const int nq = FO / 4, groups = nq >= (int)blockDim.x ? 1 : (int)blockDim.x / nq;
            const int g = threadIdx.x / nq;
            for (int q = threadIdx.x % nq; g < groups && q < nq; q += (groups == 1 ? blockDim.x : nq)) {
                float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
                for (int r = g; r < per; r += groups) {
                    const float4 t = __ldcg(reinterpret_cast<const float4*>(part + (long long)r * FO) + q);
                    s.x += t.x; s.y += t.y; s.z += t.z; s.w += t.w;
                }
                if (groups == 1) reinterpret_cast<float4*>(dbias)[q] = s;
                else w4[g * nq + q] = s;
            }
            __syncthreads();
            if (groups > 1 && (int)threadIdx.x < nq) {
                float4 s = w4[threadIdx.x];
                for (int v = 1; v < groups; ++v) {
                    const float4 t = w4[v * nq + threadIdx.x];
                    s.x += t.x; s.y += t.y; s.z += t.z; s.w += t.w;
                }
                reinterpret_cast<float4*>(dbias)[threadIdx.x] = s;
            }
            if (threadIdx.x == 0) *counter = 0;
        }
    }
}

extern "C" __global__ void cbsr_densify(
    const float* __restrict__ vals, const unsigned char* __restrict__ idx, float* __restrict__ out, int N, int F, int k)
{
    // out[i] = zeros with vals[i, s] at idx[i, s]: a warp per row, built in shared memory, stored coalesced
    extern __shared__ float rowbuf[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float* buf = rowbuf + (long long)warp * F;
    for (long long row = (long long)blockIdx.x * warps + warp; row < N; row += (long long)gridDim.x * warps) {
        for (int f = lane; f < F; f += 32) buf[f] = 0.f;
        __syncwarp();
        for (int s = lane; s < k; s += 32) buf[idx[row * k + s]] = vals[row * k + s];
        __syncwarp();
        if ((F & 3) == 0) {
            for (int f = 4 * lane; f < F; f += 128)
                *reinterpret_cast<float4*>(out + row * F + f) = *reinterpret_cast<const float4*>(buf + f);
        } else {
            for (int f = lane; f < F; f += 32) out[row * F + f] = buf[f];
        }
        __syncwarp();
    }
}
"""

#: Columns of ``W^T`` one block of the root kernels holds in shared memory.
ROOT_TILE = 128

WARPS = 8
#: At most this many blocks of the row-per-warp kernels an SM (their warps loop over the rows).
BLOCKS_PER_SM = 8


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
def _root_kernels(k: int):
    """``(cbsr_root, cbsr_root_grad)`` for ``k`` entries per row."""
    import cupy

    module = cupy.RawModule(code=_ROOT_SOURCE, options=("--std=c++14", f"-DK={k}"))
    return module.get_function("cbsr_root"), module.get_function("cbsr_root_grad")


@functools.lru_cache(maxsize=None)
def _densify_kernel():
    import cupy

    return cupy.RawModule(code=_ROOT_SOURCE, options=("--std=c++14", "-DK=1")).get_function("cbsr_densify")


#: Whether the CUDA kernels can run here (CuPy installed and a GPU).
available = _cupy.available


def _run(kernel, num_rows: int, like: Tensor, rowptr: Tensor, order: Tensor, col32: Tensor, weight: Optional[Tensor],
         row_scale: Optional[Tensor], tensors, ints, shared_mem: int) -> None:
    """Launch a row-per-warp kernel of this module on the current torch stream: arguments
    ``rowptr, order, col, w, row_scale, *tensors, num_rows, *ints, has_w, has_s`` (``like``
    stands in for a missing ``w`` / ``row_scale``), ``WARPS`` warps per block, at most
    ``BLOCKS_PER_SM`` blocks per SM (warps loop over the rows)."""
    w = weight.contiguous() if weight is not None else like
    scale = row_scale.contiguous() if row_scale is not None else like
    blocks = min((num_rows + WARPS - 1) // WARPS, sm_count(like.device) * BLOCKS_PER_SM)
    args = ((rowptr.data_ptr(), order.data_ptr(), col32.data_ptr(), w.data_ptr(), scale.data_ptr())
            + tuple(t.data_ptr() for t in tensors) + (num_rows,) + tuple(ints)
            + (int(weight is not None), int(row_scale is not None)))
    fmt = "@" + "Q" * (5 + len(tensors)) + "i" * (3 + len(ints))
    _cupy.launch(kernel, blocks, 32 * WARPS, args, like.device, shared_mem, fmt)


def _self_eps(self_eps: Optional[Tensor], rows: int, like: Tensor, row_scale: Optional[Tensor], fn: str) -> Tensor:
    """GIN's ``eps`` as the fp32 scalar the kernels read on the device (``like`` stands in when
    there is none); the self term needs ``rows`` CBSR rows, one per target, and a sum."""
    if self_eps is None:
        return like
    if like.shape[0] != rows or row_scale is not None or self_eps.numel() != 1:
        raise ValueError(f"{fn}(): the self term needs one CBSR row per target ({like.shape[0]} for {rows}), a sum "
                         f"and a one-element eps, got {tuple(self_eps.shape)}")
    return self_eps.detach().reshape(1).to(device=like.device, dtype=torch.float32)


def spgemm_cbsr_cuda(rowptr: Tensor, order: Tensor, col32: Tensor, weight: Optional[Tensor], values: Tensor,
                     index: Tensor, num_rows: int, num_cols: int, row_scale: Optional[Tensor] = None,
                     self_eps: Optional[Tensor] = None) -> Tensor:
    """``Y[i] = s_i sum_{e: j -> i} w_e scatter(values[j], index[j])`` for fp32 ``values`` and uint8
    ``index`` (``num_cols <= 256``); ``s`` = ``row_scale`` (a mean's ``1 / deg``: read once per
    row, not per edge) or ones.  With ``self_eps`` (a sum over a square graph) GIN's self term
    ``(1 + eps) scatter(values[i], index[i])`` is added to row ``i`` in the same pass (the row's
    accumulator starts from it): no separate scatter-add, no int64 columns.

    Shapes:
        rowptr: [N + 1] int64; order: [N] int32 rows, heaviest first (warps take them round robin);
        col32: [E] int32; weight: [E] float32 or None; row_scale: [N] float32 or None;
        values, index: [M, k] (M = N with self_eps); self_eps: [1] -> [num_rows, num_cols] float32.
    """

    out = torch.empty((num_rows, num_cols), dtype=torch.float32, device=values.device)
    eps = _self_eps(self_eps, num_rows, values, row_scale, "spgemm_cbsr_cuda")
    if num_rows == 0:
        return out
    values, index = values.contiguous(), index.contiguous()
    k = values.shape[1]
    ch = 1 if k <= 32 else (2 if k <= 64 else (4 if k <= 128 else 8))
    _run(_kernel(ch), num_rows, values, rowptr, order, col32, weight, row_scale, (values, index, eps, out),
         (num_cols, k, int(self_eps is not None)), 4 * num_cols * WARPS)
    return out


def sspmm_cbsr_cuda(rowptr: Tensor, order: Tensor, col32: Tensor, weight: Optional[Tensor], grad: Tensor,
                    index: Tensor, num_src: int, row_scale: Optional[Tensor] = None,
                    self_eps: Optional[Tensor] = None, out: Optional[Tensor] = None) -> Tensor:
    """``dvalues[j, s] = sum_{e: j -> i} w_e s_i grad[i, index[j, s]]`` (module doc: outer product,
    atomics) for fp32 ``grad`` and uint8 ``index``, over the forward CSR (no transpose);
    ``s`` = ``row_scale`` or ones.  With ``self_eps`` (the gradient of ``spgemm_cbsr_cuda``'s
    self term) also ``+ (1 + eps) grad[j, index[j, s]]``, added by the warp that holds row ``j``.
    ``out``: a contiguous fp32 ``[num_src, k]`` tensor the products are reduced into (added to
    what it holds, and returned), instead of zeros.

    Shapes:
        rowptr: [N + 1] int64; order: [N] int32 rows, heaviest first; col32: [E] int32;
        weight: [E] float32 or None; row_scale: [N] float32 or None; grad: [N, F] float32;
        index: [M, k] uint8 (M = N with self_eps); self_eps: [1] -> [M, k] float32.
    """
    k = index.shape[1]
    if out is None:
        out = torch.zeros((num_src, k), dtype=torch.float32, device=grad.device)
    elif out.shape != (num_src, k) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"sspmm_cbsr_cuda(): out must be a contiguous float32 [{num_src}, {k}] tensor, got "
                         f"{out.dtype} {tuple(out.shape)}")
    num_rows, num_cols = grad.shape
    eps = _self_eps(self_eps, num_rows, index, row_scale, "sspmm_cbsr_cuda")
    if num_rows == 0 or num_src == 0 or k == 0:
        return out
    grad, index = grad.contiguous(), index.contiguous()
    # float4 reductions need 16-byte aligned rows of ``out`` (a caller's ``out`` may be an offset view)
    vec = 4 if k % 4 == 0 and index.data_ptr() % 4 == 0 and out.data_ptr() % 16 == 0 else 1
    _run(_sspmm_kernel(k, vec), num_rows, grad, rowptr, order, col32, weight, row_scale, (grad, index, eps, out),
         (num_cols, int(self_eps is not None)), 4 * num_cols * WARPS)
    return out


#: Warps per block of the root kernels.
_ROOT_WARPS = 16


def _root_blocks(rows: int, fi: int, fo: int, like: Tensor) -> int:
    """Blocks of a root kernel: per column tile, as many as fit the multiprocessors (each holds a
    ``[fi, ROOT_TILE]`` tile of ``W^T``), at most one per 4 x 16 rows."""
    props = device_properties(like.device)
    per_sm = max(1, min(4, (props.shared_memory_per_multiprocessor - 1024) // (root_shared_bytes(fi) + 1024)))
    tiles = (fo + ROOT_TILE - 1) // ROOT_TILE
    return tiles * max(1, min(props.multi_processor_count * per_sm // tiles, (rows + 4 * _ROOT_WARPS - 1)
                              // (4 * _ROOT_WARPS)))


def _root_run(kernel, blocks: int, fi: int, like: Tensor, args, fmt: str) -> None:
    """Launch a root kernel on ``blocks`` blocks of ``_ROOT_WARPS`` warps on the current torch stream
    (``args`` Python ints of the ``struct`` format ``fmt``)."""
    _cupy.launch(kernel, blocks, 32 * _ROOT_WARPS, args, like.device, root_shared_bytes(fi), fmt)


def root_shared_bytes(fi: int) -> int:
    """Shared memory a root kernel block needs for an input width ``fi``: the ``[fi, ROOT_TILE]``
    tile of ``W^T``, at least one ``float4`` per thread (the gradient's bias reduction reuses it)."""
    return max(fi * ROOT_TILE * 4, 16 * 32 * _ROOT_WARPS)


#: Per (device, stream): the int32 arrival counter of the root gradient's bias reduction.
_ARRIVALS = {}


def _arrival_counter(like: Tensor) -> Tensor:
    """The zeroed int32 counter the root gradient's blocks arrive at, one per device and stream
    (kept: the last block resets it to 0, so it serves every launch of the stream, one after the
    other; launches on two streams may overlap, so each has its own).  Inside a CUDA-graph
    capture a new one per launch (its memset is part of the graph): a graph replays on whatever
    stream it is given, so a counter kept per capture stream could be shared by two replays
    running at once."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(1, dtype=torch.int32, device=like.device)
    key = (like.device.index, current_stream_key(like.device))
    counter = _ARRIVALS.get(key)
    if counter is None:
        counter = _ARRIVALS[key] = torch.zeros(1, dtype=torch.int32, device=like.device)
    return counter


def cbsr_root_cuda(values: Tensor, index: Tensor, weight_t: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``X W^T + b`` for the CBSR ``X = (values, index)``: ``out[i, o] = b[o] + sum_s values[i, s]
    Wt[index[i, s], o]`` (``k`` fused multiply-adds per output instead of ``F_in``), fp32.

    Shapes:
        values, index: [N, k] float32 / uint8; weight_t: [F_in, F_out] float32 (= W^T, contiguous,
        F_out % 4 == 0); bias: [F_out] or None -> [N, F_out] float32.
    """
    n, k = values.shape
    fi, fo = weight_t.shape
    out = torch.empty((n, fo), dtype=torch.float32, device=values.device)
    if n == 0:
        return out
    values, index, weight_t = values.contiguous(), index.contiguous(), weight_t.contiguous()
    b = bias.contiguous() if bias is not None else weight_t
    _root_run(_root_kernels(k)[0], _root_blocks(n, fi, fo, values), fi, values,
              (values.data_ptr(), index.data_ptr(), weight_t.data_ptr(), b.data_ptr(), out.data_ptr(), n, fi, fo,
               int(bias is not None)), "@QQQQQiiii")
    return out


def cbsr_root_grad_cuda(grad: Tensor, index: Tensor, weight_t: Tensor,
                        bias_grad: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """The gradient of :func:`cbsr_root_cuda` in ``values``: ``dvalues[i, s] = sum_o grad[i, o]
    Wt[index[i, s], o]`` (``grad W`` sampled at the kept columns).  Deterministic while
    ``F_out <= 2 ROOT_TILE`` (at most two partial sums per entry, added into zeros).  Returns
    ``(dvalues, db)``: with ``bias_grad``, ``db = grad.sum(0)`` from the same read of ``grad`` in
    the same launch (per-block partial sums, added up by the last block to arrive in a fixed
    order: deterministic), else None.

    Shapes:
        grad: [N, F_out] float32; index: [N, k] uint8; weight_t: [F_in, F_out] -> [N, k] float32,
        [F_out] or None.
    """
    n, k = index.shape
    fi, fo = weight_t.shape
    tiles = (fo + ROOT_TILE - 1) // ROOT_TILE
    out = (torch.zeros if tiles > 1 else torch.empty)((n, k), dtype=torch.float32, device=grad.device)
    if n == 0:
        return out, (grad.new_zeros(fo) if bias_grad else None)
    grad, index, weight_t = grad.contiguous(), index.contiguous(), weight_t.contiguous()
    blocks = _root_blocks(n, fi, fo, grad)
    # every block writes its row of partial sums (zeros where it took no rows): no memset
    db = part = counter = None
    if bias_grad:
        db = torch.empty(fo, dtype=torch.float32, device=grad.device)
        part = torch.empty((blocks // tiles, fo), dtype=torch.float32, device=grad.device)
        counter = _arrival_counter(grad)
    _root_run(_root_kernels(k)[1], blocks, fi, grad,
              (grad.data_ptr(), index.data_ptr(), weight_t.data_ptr(), out.data_ptr(),
               0 if db is None else db.data_ptr(), 0 if part is None else part.data_ptr(),
               0 if counter is None else counter.data_ptr(), n, fi, fo), "@QQQQQQQiii")
    return out, db


def densify_cuda(values: Tensor, index: Tensor, num_cols: int) -> Tensor:
    """The dense ``[N, num_cols]`` matrix of a CBSR (zeros off the kept entries) in one pass:
    a warp builds a row in shared memory and stores it coalesced (``torch.zeros`` + ``scatter_``
    write the matrix twice).  Not differentiable.

    Shapes:
        values, index: [N, k] float32 / uint8 -> [N, num_cols] float32.
    """
    n, k = values.shape
    out = torch.empty((n, num_cols), dtype=torch.float32, device=values.device)
    if n == 0:
        return out
    values, index = values.contiguous(), index.contiguous()
    blocks = min((n + WARPS - 1) // WARPS, sm_count(values.device) * 8)
    _cupy.launch(_densify_kernel(), blocks, 32 * WARPS,
                 (values.data_ptr(), index.data_ptr(), out.data_ptr(), n, num_cols, k), values.device,
                 4 * num_cols * WARPS, "@QQQiii")
    return out
