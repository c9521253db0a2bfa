"""The big windows (or every window) of the sparse graph translation as a CUDA kernel compiled
at run time (CuPy ``RawModule``, NVRTC): the window's bit set in shared memory.

``kernels.translate._rank_by_bits`` (Triton) ranks a big window's edges by a bit set of its
columns in global memory: an ``atomic_or`` per edge into L2, the words' prefix counts written
back there, two gathers per edge, and ``2 ceil(M / 32)`` zeroed scratch words per big window
(854 MB memset on the Reddit stand-in).  That pass cost 2.9 ms of reddit's 6.0 ms translation
and 1.8 of ogbn-proteins' 3.5 (H100, stop 42), bound by L2 operations and latency, not bytes.
Triton 3.6 has no shared-memory atomics; here one block per big window keeps the bit set and
the prefix counts in shared memory (``8 ceil(M / 32)`` bytes: 58 KB for reddit's 233k columns),
so per edge only the column is read (twice, the second time mostly from L2) and the code
written: 20 bytes an edge with int64 columns.

Per big window ``w`` (edges ``e0 .. e1`` in CSR order, more than ``big``), the same result
as the Triton kernel:

    bits[c >> 5] |= 1 << (c & 31)                        for every edge's column c
    prefix[j]     = sum_{i < j} popcount(bits[i])          (over the words the window touches)
    code_e        = 2 (prefix[c >> 5] + popcount(bits[c >> 5] & (2^(c & 31) - 1))) + 1
    blocks[w + 1] = ceil(count / K), counts[w] = count      (count: the window's distinct columns)

Windows of at most ``big`` edges return at once (the Triton kernel sorts them); with ``big =
-1`` every window is ranked here, the empty ones writing zero counts
(``translate.CUDA_ALL_WINDOWS``: no Triton sort).  Deterministic.
"""
from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor

from . import _cupy

#: Threads per block (one block per window) for the big windows; :func:`rank_big_windows` takes
#: others (``translate.CUDA_ALL_THREADS`` where it ranks every window).
THREADS = 512

_SOURCE = r"""
#define FULL 0xffffffffu

__device__ __forceinline__ int warp_inclusive(int x) {
    const int lane = threadIdx.x & 31;
    #pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(FULL, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

// the columns of edges base + u THREADS + thread, u < 4 (-1 past e1): 4 loads in flight a thread
__device__ __forceinline__ void load4(const COL_T* __restrict__ col, long long base, long long e1, int* c) {
    #pragma unroll
    for (int u = 0; u < 4; ++u) {
        const long long e = base + u * THREADS + threadIdx.x;
        c[u] = e < e1 ? (int)col[e] : -1;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
rank_big_windows(const long long* __restrict__ rowptr, const COL_T* __restrict__ col, int* __restrict__ code,
                 long long* __restrict__ blocks, int* __restrict__ counts, long long num_rows, long long big,
                 int window, int block_k, int num_words) {
    extern __shared__ unsigned int smem[];
    unsigned int* bits = smem;                          // [num_words]
    int* prefix = (int*)(smem + num_words);              // [num_words]
    __shared__ int s_lo, s_hi;
    __shared__ int s_warp[THREADS / 32];
    const long long w = blockIdx.x;
    if (w == 0 && threadIdx.x == 0) blocks[0] = 0;
    const long long r0 = w * window;
    const long long r1 = r0 + window < num_rows ? r0 + window : num_rows;
    const long long e0 = rowptr[r0], e1 = rowptr[r1];
    if (e1 - e0 <= big) return;
    if (e1 == e0) {                                     // (big < 0: every window) an empty window
        if (threadIdx.x == 0) { blocks[w + 1] = 0; counts[w] = 0; }
        return;
    }
    for (int i = threadIdx.x; i < num_words; i += THREADS) bits[i] = 0u;
    if (threadIdx.x == 0) { s_lo = 0x7fffffff; s_hi = -1; }
    __syncthreads();
    // 1. the bit set (4 columns a thread in flight before their atomics)
    int lo = 0x7fffffff, hi = -1;
    for (long long base = e0; base < e1; base += 4 * THREADS) {
        int c[4];
        load4(col, base, e1, c);
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (c[u] >= 0) {
                atomicOr(&bits[c[u] >> 5], 1u << (c[u] & 31));
                lo = min(lo, c[u]);
                hi = max(hi, c[u]);
            }
        }
    }
    #pragma unroll
    for (int o = 16; o; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(FULL, lo, o));
        hi = max(hi, __shfl_xor_sync(FULL, hi, o));
    }
    if ((threadIdx.x & 31) == 0) { atomicMin(&s_lo, lo); atomicMax(&s_hi, hi); }
    __syncthreads();
    // 2. exclusive prefix counts over the touched words [w0, w1): a contiguous chunk a thread
    const int w0 = s_lo >> 5, w1 = (s_hi >> 5) + 1;
    const int per = (w1 - w0 + THREADS - 1) / THREADS;
    const int a = min(w0 + (int)threadIdx.x * per, w1), b = min(a + per, w1);
    int sum = 0;
    for (int j = a; j < b; ++j) sum += __popc(bits[j]);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int inclusive = warp_inclusive(sum);
    if (lane == 31) s_warp[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        int v = lane < THREADS / 32 ? s_warp[lane] : 0;
        v = warp_inclusive(v);
        if (lane < THREADS / 32) s_warp[lane] = v;
    }
    __syncthreads();
    int run = inclusive - sum + (warp ? s_warp[warp - 1] : 0);
    for (int j = a; j < b; ++j) { prefix[j] = run; run += __popc(bits[j]); }
    __syncthreads();
    // 3. each edge's rank among the window's distinct columns
    for (long long base = e0; base < e1; base += 4 * THREADS) {
        int c[4];
        load4(col, base, e1, c);
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (c[u] >= 0) {
                const int j = c[u] >> 5;
                const int rank = prefix[j] + __popc(bits[j] & ((1u << (c[u] & 31)) - 1u));
                code[base + u * THREADS + threadIdx.x] = 2 * rank + 1;
            }
        }
    }
    if (threadIdx.x == 0) {
        const int count = s_warp[THREADS / 32 - 1];
        blocks[w + 1] = (count + block_k - 1) / block_k;
        counts[w] = count;
    }
}
"""


@functools.lru_cache(maxsize=None)
def _kernel(col_bits: int, device_index: int, threads: int = THREADS):
    """The kernel for int32 / int64 columns and ``threads`` a block (a multiple of 32, at most
    1024), loaded on device ``device_index``; None where it does not compile or load there
    (then :func:`fits` is False and the Triton bit sets run)."""
    import cupy

    col_t = "long long" if col_bits == 64 else "int"
    options = ("--std=c++14", f"-DTHREADS={threads}", f"-DCOL_T={col_t}")
    try:
        with cupy.cuda.Device(device_index):
            kernel = cupy.RawModule(code=_SOURCE, options=options).get_function("rank_big_windows")
    except Exception as error:    # noqa: BLE001 - NVRTC or the driver missing or broken: not here
        warnings.warn(f"translate: the CUDA bit-set kernel ({threads} threads) is unavailable ({error}); "
                      "using the Triton sorts and bit sets", RuntimeWarning)
        return None
    return kernel


def shared_bytes(num_words: int) -> int:
    """Dynamic shared memory of a block: the bit set and its prefix counts."""
    return 8 * num_words


def fits(num_words: int, col: Tensor, threads: int = THREADS) -> bool:
    """Whether the kernel at ``threads`` a block can rank windows of ``num_words`` bit-set words
    here: CuPy and a GPU, int32 or int64 columns, the bit set with its prefix counts within a
    block's shared memory, and the kernel compiled and loaded."""
    return (col.is_cuda and col.dtype in (torch.int32, torch.int64) and _cupy.available()
            and shared_bytes(num_words) + 1024 <= _cupy.shared_bytes_optin(col.device)
            and _kernel(_bits(col), col.device.index, threads) is not None)


def _bits(col: Tensor) -> int:
    return 64 if col.dtype == torch.int64 else 32


def rank_big_windows(rowptr: Tensor, col: Tensor, code: Tensor, blocks: Tensor, counts: Tensor, num_windows: int,
                     big: int, window: int, block_k: int, num_words: int, threads: int = THREADS) -> None:
    """Rank the edges of every window of more than ``big`` edges (module doc; ``big = -1``: every
    window, the empty ones too) into ``code``, and write those windows' ``blocks[w + 1]``,
    ``counts[w]`` (and ``blocks[0] = 0``); other windows are left as they are.  ``threads`` a
    block (a multiple of 32, at most 1024: the warp shuffles use full masks).  Call only where
    :func:`fits` at the same ``threads``.

    Raises:
        ValueError: ``threads`` not a multiple of 32 in ``[32, 1024]``.

    Shapes:
        rowptr: [N + 1] int64; col: [E] int32 or int64 (columns < 32 num_words), both contiguous;
        code: [E] int32; blocks: [num_windows + 1] int64; counts: [num_windows] int32.
    """
    import cupy

    if not (32 <= threads <= 1024 and threads % 32 == 0):
        raise ValueError(f"rank_big_windows(): threads must be a multiple of 32 in [32, 1024], got {threads}")
    ptr = lambda t: cupy.uint64(t.data_ptr())  # noqa: E731
    args = (ptr(rowptr), ptr(col), ptr(code), ptr(blocks), ptr(counts), cupy.int64(rowptr.numel() - 1),
            cupy.int64(big), cupy.int32(window), cupy.int32(block_k), cupy.int32(num_words))
    _cupy.launch(_kernel(_bits(col), col.device.index, threads), num_windows, threads, args, col.device,
                 shared_bytes(num_words))
