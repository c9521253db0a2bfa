"""The big windows (or every window) of the sparse graph translation as a CUDA kernel compiled
at run time (CuPy ``RawModule``, NVRTC): the window's bit set in shared memory.

``kernels.translate._rank_by_bits`` (Triton) ranks a big window's edges by a bit set of its
columns in global memory: an ``atomic_or`` per edge into L2, the words' prefix counts written
back there, two gathers per edge, and ``2 ceil(M / 32)`` zeroed scratch words per big window
(854 MB memset on the Reddit stand-in).  That pass takes about half of a hub-heavy graph's
translation (reddit, ogbn-proteins), bound by L2 operations and latency, not bytes.
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

``translate_windows`` (``translate.CUDA_WINDOWS``: small graphs) does the whole translation in
one launch: windows numbered by a ticket (``ws[0]``), each one's bit set over only the words
between its smallest and largest column (batched graphs touch few), the same ranks, then its
first block by a decoupled look-back (state ``ws[4 + w]``: ``blocks << 2 | 1`` once counted,
``inclusive << 2 | 2`` once its prefix is known; a warp reads 32 earlier windows a step and
waits only on windows that started before it, so it cannot deadlock), and the writes of the
Triton slot pass and scan (``translate._edge_slot_kernel``, ``_scan_kernel``); the order flag
(``ws[2]``) by the last window to finish (``ws[1]`` counts them).  The index arrays are
deterministic; tile values are added by float atomics.
"""
from __future__ import annotations

import functools
import warnings
from typing import Optional

import torch
from torch import Tensor

from . import _cupy, device_properties

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

// the block's smallest and largest of every thread's lo / hi into s_lo / s_hi (by each warp's
// first lane; the caller syncs before reading them)
__device__ __forceinline__ void block_min_max(int lo, int hi, int* s_lo, int* s_hi) {
    #pragma unroll
    for (int o = 16; o; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(FULL, lo, o));
        hi = max(hi, __shfl_xor_sync(FULL, hi, o));
    }
    if ((threadIdx.x & 31) == 0) { atomicMin(s_lo, lo); atomicMax(s_hi, hi); }
}

// exclusive prefix counts of the set bits over the words [w0, w1) into prefix (a contiguous chunk
// a thread); returns the window's distinct columns (every thread; s_warp: THREADS / 32 ints)
__device__ __forceinline__ int prefix_counts(const unsigned int* bits, int* prefix, int w0, int w1, int* s_warp) {
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
    return s_warp[THREADS / 32 - 1];
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
    block_min_max(lo, hi, &s_lo, &s_hi);
    __syncthreads();
    // 2. exclusive prefix counts over the touched words [w0, w1): a contiguous chunk a thread
    const int count = prefix_counts(bits, prefix, s_lo >> 5, (s_hi >> 5) + 1, s_warp);
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
        blocks[w + 1] = (count + block_k - 1) / block_k;
        counts[w] = count;
    }
}

__device__ __forceinline__ long long read_state(const long long* p) {
    return *((volatile const long long*)p);
}

__device__ __forceinline__ long long warp_sum64(long long x) {
    #pragma unroll
    for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    return x;
}

// The whole translation of a graph, one block a window (module doc, translate_windows).
// ws: [ticket, windows done, order flag (written by the last window), descents seen, a look-back
// state a window], all zero at the launch.  A state is (blocks << 2) | 1 once the window's own
// block count is known, (inclusive prefix << 2) | 2 once its first block past it is.
extern "C" __global__ void __launch_bounds__(THREADS)
translate_windows(const long long* __restrict__ rowptr, const long long* __restrict__ row,
                  const COL_T* __restrict__ col, long long* ws, long long* __restrict__ window_ptr,
                  long long* __restrict__ block_cols, long long* __restrict__ block_window,
                  long long* __restrict__ edge_index, const float* __restrict__ values, float* tiles,
                  long long num_rows, long long num_windows, int window, int block_k, int num_words) {
    extern __shared__ unsigned int smem[];
    unsigned int* bits = smem;                          // [num_words]
    int* prefix = (int*)(smem + num_words);              // [num_words]
    __shared__ long long s_w, s_first;
    __shared__ int s_lo, s_hi, s_descent;
    __shared__ int s_warp[THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {     // windows numbered in start order: a look-back waits only on started ones
        s_w = (long long)atomicAdd((unsigned long long*)ws, 1ull);
        s_lo = 0x7fffffff; s_hi = -1; s_descent = 0;
    }
    __syncthreads();
    const long long w = s_w;
    const long long r0 = w * window;
    const long long r1 = r0 + window < num_rows ? r0 + window : num_rows;
    const long long e0 = rowptr[r0], e1 = rowptr[r1];
    // 1. the window's smallest and largest column; a column below its predecessor's in a row
    int lo = 0x7fffffff, hi = -1, descent = 0;
    for (long long e = e0 + threadIdx.x; e < e1; e += THREADS) {
        const int c = (int)col[e];
        lo = min(lo, c);
        hi = max(hi, c);
        if (e > e0 && row[e - 1] == row[e] && (int)col[e - 1] > c) descent = 1;
    }
    block_min_max(lo, hi, &s_lo, &s_hi);
    if (__any_sync(FULL, descent) && lane == 0) s_descent = 1;
    __syncthreads();
    // 2. the bit set over the touched words [w0, w1) only, then their exclusive prefix counts
    const int w0 = s_hi >= 0 ? s_lo >> 5 : 0, w1 = s_hi >= 0 ? (s_hi >> 5) + 1 : 0;
    for (int j = w0 + threadIdx.x; j < w1; j += THREADS) bits[j] = 0u;
    __syncthreads();
    for (long long e = e0 + threadIdx.x; e < e1; e += THREADS) {
        const int c = (int)col[e];
        atomicOr(&bits[c >> 5], 1u << (c & 31));
    }
    __syncthreads();
    const int count = prefix_counts(bits, prefix, w0, w1, s_warp);
    const long long nblocks = (count + block_k - 1) / block_k;
    // 3. the window's first block: decoupled look-back over the earlier windows' states, 32 a step
    if (warp == 0) {
        long long* state = ws + 4;
        if (lane == 0 && w > 0)
            atomicExch((unsigned long long*)(state + w), (unsigned long long)((nblocks << 2) | 1));
        long long first = 0, j = w - 1;
        while (j >= 0) {
            const long long i = j - lane;                 // lane 0 the nearest window
            const long long s = i >= 0 ? read_state(state + i) : 2;   // before window 0: prefix 0
            const unsigned unknown = __ballot_sync(FULL, (s & 3) == 0);
            const unsigned known = __ballot_sync(FULL, (s & 3) == 2);
            const int nu = unknown ? __ffs(unknown) - 1 : 32, ni = known ? __ffs(known) - 1 : 32;
            if (ni < nu) {                                // every window up to the nearest prefix is counted
                first += warp_sum64(lane <= ni ? s >> 2 : 0);
                break;
            }
            if (nu > 0) {                                 // add the counted ones before the first unknown
                first += warp_sum64(lane < nu ? s >> 2 : 0);
                j -= nu;
            } else {
                __nanosleep(100);
            }
        }
        if (lane == 0) {
            atomicExch((unsigned long long*)(state + w), (unsigned long long)(((first + nblocks) << 2) | 2));
            s_first = first;
            window_ptr[w + 1] = first + nblocks;
            if (w == 0) window_ptr[0] = 0;
        }
    }
    __syncthreads();
    // 4. every edge's slot and its block's column (and value), the blocks' window, the last block's padding
    const long long first = s_first;
    const long long area = (long long)window * block_k;
    for (long long e = e0 + threadIdx.x; e < e1; e += THREADS) {
        const int c = (int)col[e];
        const int j = c >> 5;
        const int rank = prefix[j] + __popc(bits[j] & ((1u << (c & 31)) - 1u));
        const long long blk = first + rank / block_k;
        const int kk = rank % block_k;
        const long long slot = blk * area + (long long)(row[e] & (window - 1)) * block_k + kk;
        edge_index[e] = slot;
        block_cols[blk * block_k + kk] = c;          // each edge of a column writes the same value
        if (values) atomicAdd(tiles + slot, values[e]);
    }
    for (long long k = threadIdx.x; k < nblocks; k += THREADS) block_window[first + k] = w;
    for (long long t = count + threadIdx.x; t < nblocks * block_k; t += THREADS) block_cols[first * block_k + t] = 0;
    // 5. the order flag, by the last window to finish
    if (threadIdx.x == 0) {
        if (s_descent) atomicOr((unsigned long long*)(ws + 3), 1ull);
        __threadfence();
        const unsigned long long done = atomicAdd((unsigned long long*)(ws + 1), 1ull);
        if (done == (unsigned long long)(num_windows - 1)) {
            __threadfence();
            ws[2] = read_state(ws + 3) ? 0 : 1;
        }
    }
}
"""


@functools.lru_cache(maxsize=None)
def _module(col_bits: int, device_index: int, threads: int):
    """The module (both kernels) for int32 / int64 columns and ``threads`` a block, on device
    ``device_index`` (compiled on its first kernel's load)."""
    import cupy

    col_t = "long long" if col_bits == 64 else "int"
    with cupy.cuda.Device(device_index):
        return cupy.RawModule(code=_SOURCE, options=("--std=c++14", f"-DTHREADS={threads}", f"-DCOL_T={col_t}"))


@functools.lru_cache(maxsize=None)
def _kernel(col_bits: int, device_index: int, threads: int = THREADS, name: str = "rank_big_windows"):
    """Kernel ``name`` for int32 / int64 columns and ``threads`` a block (a multiple of 32, at
    most 1024), loaded on device ``device_index``; None where it does not compile or load there
    (then :func:`fits` is False and the Triton paths run)."""
    import cupy

    try:
        with cupy.cuda.Device(device_index):
            return _module(col_bits, device_index, threads).get_function(name)
    except Exception as error:    # noqa: BLE001 - NVRTC or the driver missing or broken: not here
        warnings.warn(f"translate: the CUDA bit-set kernel {name} ({threads} threads) is unavailable ({error}); "
                      "using the Triton sorts and bit sets", RuntimeWarning)
        return None


def shared_bytes(num_words: int) -> int:
    """Dynamic shared memory of a block: the bit set and its prefix counts."""
    return 8 * num_words


def fits(num_words: int, col: Tensor, threads: int = THREADS, name: str = "rank_big_windows") -> bool:
    """Whether kernel ``name`` (``rank_big_windows`` or ``translate_windows``) at ``threads`` a
    block can take windows of ``num_words`` bit-set words here: CuPy and a GPU, int32 or int64
    columns, the bit set with its prefix counts within a block's shared memory, and the kernel
    compiled and loaded."""
    return (col.is_cuda and col.dtype in (torch.int32, torch.int64) and _cupy.available()
            and shared_bytes(num_words) + 1024 <= _cupy.shared_bytes_optin(col.device)
            and _kernel(_bits(col), col.device.index, threads, name) is not None)


def _sm_limits(device_index: int) -> tuple:
    props = device_properties(device_index)
    return (props.multi_processor_count, getattr(props, "max_threads_per_multi_processor", 2048),
            getattr(props, "shared_memory_per_multiprocessor", 228 * 1024))


def resident_blocks(num_words: int, threads: int, device: torch.device) -> int:
    """How many blocks of ``threads`` with ``num_words`` bit-set words fit on ``device``'s SMs at
    once (threads and shared memory; 1 KB a block reserved, 1 KB of static shared memory
    allowed for); 0 without a CUDA device."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0
    sms, sm_threads, sm_shared = _sm_limits(device.index if device.index is not None else torch.cuda.current_device())
    return sms * max(0, min(sm_threads // threads, sm_shared // (shared_bytes(num_words) + 2048), 32))


def _bits(col: Tensor) -> int:
    return 64 if col.dtype == torch.int64 else 32


def _check_threads(name: str, threads: int) -> None:
    if not (32 <= threads <= 1024 and threads % 32 == 0):
        raise ValueError(f"{name}(): threads must be a multiple of 32 in [32, 1024], got {threads}")


def _ptr(tensor: Optional[Tensor]):
    """A tensor's device address as a kernel argument (0 for None)."""
    import cupy

    return cupy.uint64(0 if tensor is None else tensor.data_ptr())


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
    _check_threads("rank_big_windows", threads)
    import cupy

    ptr = _ptr
    args = (ptr(rowptr), ptr(col), ptr(code), ptr(blocks), ptr(counts), cupy.int64(rowptr.numel() - 1),
            cupy.int64(big), cupy.int32(window), cupy.int32(block_k), cupy.int32(num_words))
    _cupy.launch(_kernel(_bits(col), col.device.index, threads), num_windows, threads, args, col.device,
                 shared_bytes(num_words))


def translate_windows(rowptr: Tensor, row: Tensor, col: Tensor, ws: Tensor, window_ptr: Tensor, block_cols: Tensor,
                      block_window: Tensor, edge_index: Tensor, values: Optional[Tensor], tiles: Optional[Tensor],
                      num_windows: int, window: int, block_k: int, num_words: int, threads: int) -> None:
    """The whole translation in one launch (module doc): every window's ranks by its bit set,
    its first block by a look-back over the earlier windows' counts, then per edge its slot
    ``edge_index``, the blocks' columns (zero past a window's last), their ``block_window``,
    ``window_ptr``, and (``values``) each edge's value added into ``tiles`` at its slot; the
    order flag (1 where no row's columns fall) into ``ws[2]``.  Call only where :func:`fits`
    for ``"translate_windows"`` at the same ``threads``.

    Raises:
        ValueError: ``threads`` not a multiple of 32 in ``[32, 1024]``; ``ws`` not zero-filled
            int64 of ``4 + num_windows`` (only its length is checked).

    Shapes:
        rowptr: [N + 1] int64, row: [E] int64, col: [E] int32 or int64 (columns < 32 num_words),
        all contiguous; ws: [4 + num_windows] int64 zeros; window_ptr: [num_windows + 1];
        block_cols: [>= B, K]; block_window: [>= B]; edge_index: [E] (int64); values: [E]
        float32; tiles: [>= B, W, K] float32 zeros (B = the blocks the translation makes).
    """
    _check_threads("translate_windows", threads)
    if ws.numel() != 4 + num_windows or ws.dtype != torch.int64:
        raise ValueError(f"translate_windows(): ws must be {4 + num_windows} int64 zeros, got "
                         f"{ws.numel()} of {ws.dtype}")
    import cupy

    ptr = _ptr
    args = (ptr(rowptr), ptr(row), ptr(col), ptr(ws), ptr(window_ptr), ptr(block_cols), ptr(block_window),
            ptr(edge_index), ptr(values), ptr(tiles), cupy.int64(rowptr.numel() - 1), cupy.int64(num_windows),
            cupy.int32(window), cupy.int32(block_k), cupy.int32(num_words))
    _cupy.launch(_kernel(_bits(col), col.device.index, threads, "translate_windows"), num_windows, threads, args,
                 col.device, shared_bytes(num_words))
