"""CPU kernels: Numba-compiled, row-parallel loops over the CSR (no atomics, no [E, F] temporaries).

Every kernel walks the rows of a CSR (``rowptr``, ``col``) split into chunks of about equal
work (``deg + 1`` per row, so empty rows count too), one chunk per ``prange`` iteration, with
a per-chunk accumulator of one row (the lane kernels of ``_lanes``: scalar accumulators held
in vector registers).  Inputs are float32 or float64 NumPy views of contiguous CPU tensors
(no copy); half types are computed in float32 by the callers.  Indices are int64.
``spmm_sum_runner`` / ``spmm_max_runner`` prepare everything but the features once (the
``cpu`` backend caches them per graph): the per-call Python cost drops from 6-8 us to 2.

Numba is imported on first use; ``numba_available()`` says whether it can be.  Kernels are
compiled on their first call per dtype (about a second each; ``cache=True`` keeps the machine
code on disk, so later processes load it).  The thread count follows
``torch.get_num_threads()`` (capped by Numba's pool size).

Tensors in, tensors out; no autograd, no Graph, no validation.
"""
from __future__ import annotations

import functools
import importlib.util
import math
import threading
import types
from types import SimpleNamespace
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ._lanes_gen import FASTMATH_OF, LANES

#: Found once at import, without importing Numba.
_NUMBA_FOUND = importlib.util.find_spec("numba") is not None

#: Dtypes the kernels compute in directly (others go through float32).
NATIVE_DTYPES = (torch.float32, torch.float64)

#: Chunks per thread: enough slack for the dynamic assignment to even out uneven rows.
CHUNKS_PER_THREAD = 8
#: Below this much work (edges x width) a kernel runs on one thread: waking the pool costs more.
SERIAL_WORK = 1 << 15
#: LLVM flags of every kernel: reassociation (vector reductions), FMA contraction, no signed
#: zeros.  No ``nnan`` / ``ninf``: infinities and NaNs propagate as in the reference.
FASTMATH = frozenset({"reassoc", "contract", "nsz"})

_K: Optional[SimpleNamespace] = None


def numba_available() -> bool:
    """Whether the ``numba`` package can be imported."""
    return _NUMBA_FOUND


def _numba():
    """The numba module (imported on first use)."""
    import numba

    return numba


_POOL: Optional[int] = None


def max_threads() -> int:
    """``torch.get_num_threads()``, capped by Numba's pool size."""
    global _POOL
    if _POOL is None:
        _POOL = max(1, _numba().config.NUMBA_NUM_THREADS)
    threads = torch.get_num_threads()
    return threads if threads <= _POOL else _POOL


def parallel(work: int) -> bool:
    """Whether ``work`` (edges x width) is worth the thread pool (``>= SERIAL_WORK`` and more
    than one thread allowed)."""
    return work >= SERIAL_WORK and max_threads() > 1


#: ``threading.get_ident() -> count`` this module last gave ``numba.set_num_threads`` (a
#: per-thread setting in Numba): asking Numba costs 0.6 us a call, this dict 0.1.
_SET_THREADS: dict = {}


def set_threads() -> int:
    """Make Numba's parallel loops use ``torch.get_num_threads()`` threads; returns the count."""
    threads = max_threads()
    _use_threads(threads)
    return threads


def _use_threads(threads: int) -> None:
    """``numba.set_num_threads(threads)`` unless this thread set that count last (a count set
    by other code through Numba directly is not seen: it stays until the count here changes)."""
    ident = threading.get_ident()
    if _SET_THREADS.get(ident) != threads:
        numba = _numba()
        if numba.get_num_threads() != threads:
            numba.set_num_threads(threads)
        _SET_THREADS[ident] = threads


def chunk_bounds(rowptr: Tensor, chunks: int) -> Tensor:
    """Row boundaries ``[C + 1]`` splitting ``rowptr``'s rows into ``<= chunks`` runs of about
    equal ``sum(deg + 1)`` (int64, strictly increasing, 0 .. N)."""
    n = rowptr.numel() - 1
    if n == 0:
        return torch.zeros(1, dtype=torch.int64)
    work = rowptr[1:] + torch.arange(1, n + 1, dtype=rowptr.dtype)   # cumulative deg + 1
    targets = torch.linspace(0, float(work[-1]), chunks + 1, dtype=torch.float64)[1:-1]
    inner = torch.searchsorted(work.double(), targets, right=True)
    return torch.unique(torch.cat([torch.zeros(1, dtype=torch.int64), inner, torch.tensor([n])]))


def _np(t: Tensor) -> np.ndarray:
    return t.detach().numpy()


def _build() -> SimpleNamespace:
    _numba()
    from numba import njit, prange

    found = {}

    def kernel(fn):
        found[fn.__name__] = fn
        return fn

    @kernel
    def spmm_heads(bounds, rowptr, col, val, x, out):
        # val [E, H], x [N, H * C]: feature f weighted by val[e, f // C]
        nf, heads = x.shape[1], val.shape[1]
        ch = nf // heads
        for c in prange(bounds.shape[0] - 1):
            acc = np.empty(nf, dtype=out.dtype)
            for i in range(bounds[c], bounds[c + 1]):
                acc[:] = 0
                for e in range(rowptr[i], rowptr[i + 1]):
                    j = col[e]
                    for h in range(heads):
                        w = val[e, h]
                        for f in range(h * ch, (h + 1) * ch):
                            acc[f] += w * x[j, f]
                for f in range(nf):
                    out[i, f] = acc[f]

    @kernel
    def sddmm_dot(bounds, rowptr, col, a, b, out):
        # out[e] = <a[row e], b[col e]>; heads: out[e, h] over each head's F / H features
        heads = out.shape[1]
        ch = a.shape[1] // heads
        for c in prange(bounds.shape[0] - 1):
            for i in range(bounds[c], bounds[c + 1]):
                for e in range(rowptr[i], rowptr[i + 1]):
                    j = col[e]
                    for h in range(heads):
                        s = 0.0
                        for f in range(h * ch, (h + 1) * ch):
                            s += a[i, f] * b[j, f]
                        out[e, h] = s

    @kernel
    def sddmm_elementwise(bounds, rowptr, col, a, b, add, out):
        nf = a.shape[1]
        for c in prange(bounds.shape[0] - 1):
            for i in range(bounds[c], bounds[c + 1]):
                for e in range(rowptr[i], rowptr[i + 1]):
                    j = col[e]
                    if add:
                        for f in range(nf):
                            out[e, f] = a[i, f] + b[j, f]
                    else:
                        for f in range(nf):
                            out[e, f] = a[i, f] * b[j, f]

    @kernel
    def softmax_shift(bounds, rowptr, s, out, floor):
        # out[e, h] = max(s[e, h] - (the row's max of head h), floor); NaN stays NaN (a NaN
        # score, or -inf - -inf in a row of -inf), so the row comes out NaN as in the reference
        heads = s.shape[1]
        for c in prange(bounds.shape[0] - 1):
            m = np.empty(heads, dtype=s.dtype)
            for i in range(bounds[c], bounds[c + 1]):
                start, end = rowptr[i], rowptr[i + 1]
                if end == start:
                    continue
                for h in range(heads):
                    m[h] = s[start, h]
                for e in range(start + 1, end):
                    for h in range(heads):
                        v = s[e, h]
                        m[h] = v if v > m[h] else m[h]
                for e in range(start, end):
                    for h in range(heads):
                        d = s[e, h] - m[h]
                        out[e, h] = floor if d < floor else d

    @kernel
    def softmax_scale(bounds, rowptr, p, tiny):
        # p[e, h] /= the row's sum of head h, values <= tiny (exp of the floor) counted as 0
        heads = p.shape[1]
        for c in prange(bounds.shape[0] - 1):
            z = np.empty(heads, dtype=p.dtype)
            for i in range(bounds[c], bounds[c + 1]):
                start, end = rowptr[i], rowptr[i + 1]
                for h in range(heads):
                    z[h] = 0
                for e in range(start, end):
                    for h in range(heads):
                        v = p[e, h]
                        v = v if v > tiny else v * 0
                        p[e, h] = v
                        z[h] += v
                for h in range(heads):
                    z[h] = 1 / z[h] if z[h] > 0 else z[h] * 0
                for e in range(start, end):
                    for h in range(heads):
                        p[e, h] *= z[h]

    @kernel
    def max_grad_w(bounds, rowptr, col, arg, x, g, out):
        # out[e] = sum_{f: arg[i, f] == e} x[col e, f] g[i, f] for e in row i
        nf = g.shape[1]
        for c in prange(bounds.shape[0] - 1):
            for i in range(bounds[c], bounds[c + 1]):
                for e in range(rowptr[i], rowptr[i + 1]):
                    j = col[e]
                    acc = out[e] * 0
                    for f in range(nf):
                        if arg[i, f] == e:
                            acc += x[j, f] * g[i, f]
                    out[e] = acc

    @kernel
    def softmax_bwd(bounds, rowptr, y, g, out):
        heads = y.shape[1]
        for c in prange(bounds.shape[0] - 1):
            for i in range(bounds[c], bounds[c + 1]):
                start, end = rowptr[i], rowptr[i + 1]
                for h in range(heads):
                    t = 0.0
                    for e in range(start, end):
                        t += g[e, h] * y[e, h]
                    for e in range(start, end):
                        out[e, h] = y[e, h] * (g[e, h] - t)

    @kernel
    def segment_sum(bounds, rowptr, v, out):
        k = v.shape[1]
        for c in prange(bounds.shape[0] - 1):
            for i in range(bounds[c], bounds[c + 1]):
                for f in range(k):
                    out[i, f] = 0
                for e in range(rowptr[i], rowptr[i + 1]):
                    for f in range(k):
                        out[i, f] += v[e, f]

    @kernel
    def dropout(x, out, mask, seed, threshold, scale):
        # mask[k] = hash(seed, k) >= threshold (24-bit uniform), splitmix64's finaliser
        n = x.shape[0]
        block = 16384
        for b in prange((n + block - 1) // block):
            for k in range(b * block, min(n, (b + 1) * block)):
                z = np.uint64(seed) + np.uint64(k) * np.uint64(0x9E3779B97F4A7C15)
                z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
                z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
                z = z ^ (z >> np.uint64(31))
                keep = (z >> np.uint64(40)) >= np.uint64(threshold)
                mask[k] = keep
                out[k] = x[k] * scale if keep else 0.0

    @kernel
    def masked_scale(g, mask, scale, out):
        n = g.shape[0]
        block = 16384
        for b in prange((n + block - 1) // block):
            for k in range(b * block, min(n, (b + 1) * block)):
                out[k] = g[k] * scale if mask[k] else 0.0

    def serial_copy(fn):
        # a distinct function object (and cache file) for the serial compilation
        copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial", fn.__defaults__,
                                  fn.__closure__)
        copy.__qualname__ = fn.__qualname__ + "_serial"
        return copy

    options = dict(cache=True, nogil=True, boundscheck=False, fastmath=set(FASTMATH))
    return SimpleNamespace(
        parallel=SimpleNamespace(**{name: njit(parallel=True, **options)(fn) for name, fn in found.items()}),
        serial=SimpleNamespace(**{name: njit(**options)(serial_copy(fn)) for name, fn in found.items()}),
        lanes=_build_lanes(njit, options),
    )


def _build_lanes(njit, options) -> SimpleNamespace:
    """The generated lane kernels (``_lanes``): chunk functions compiled first (the ``_par``
    drivers call them as globals of that module), then the drivers."""
    from . import _lanes

    def options_of(name: str) -> dict:
        kernel = name.rsplit("_", 2)[0]           # spmm_sum_16_chunk -> spmm_sum
        return dict(options, fastmath=set(FASTMATH_OF.get(kernel, options["fastmath"])))

    names = [name for name in vars(_lanes) if name.endswith(("_chunk", "_par"))]
    for name in names:
        if name.endswith("_chunk"):
            setattr(_lanes, name, njit(**options_of(name))(getattr(_lanes, name)))
    return SimpleNamespace(**{name: getattr(_lanes, name) if name.endswith("_chunk")
                              else njit(parallel=True, **options_of(name))(getattr(_lanes, name)) for name in names})


def _all() -> SimpleNamespace:
    global _K
    if _K is None:
        _K = _build()
    return _K


def kernels(threads: int) -> SimpleNamespace:
    """The compiled-on-demand kernels (imports Numba on first use): the parallel versions for
    ``threads > 1``, else the serial ones (no hand-off to the thread pool)."""
    k = _all()
    return k.parallel if threads > 1 else k.serial


def _threads(work: int) -> int:
    """Threads for ``work`` (edges x width): Numba's pool set to them when more than one."""
    return set_threads() if parallel(work) else 1


def _run(fn, *args) -> None:
    """Call a kernel with LLVM's SLP vectorizer on for its compilation (Numba leaves it off by
    default; the lane kernels depend on it).  Restored after the call: other Numba code in the
    process keeps its setting.  Cached machine code is loaded without compiling."""
    config = _numba().config
    if config.SLP_VECTORIZE:
        fn(*args)
        return
    config.SLP_VECTORIZE = 1
    try:
        fn(*args)
    finally:
        config.SLP_VECTORIZE = 0


def _lane_choices(kernel: str, dtype: torch.dtype) -> tuple:
    return LANES[kernel] if dtype == torch.float32 else (8,)


def lanes_for(width: int, kernel: str = "spmm_sum", dtype: torch.dtype = torch.float32) -> int:
    """Lane count of a row kernel over ``width`` features: blocks of ``L`` features run as vector
    code and the ``width % L`` rest as a scalar loop, so the choice minimises about
    ``(width // L) * max(1, L / 16) + width % L`` (vector ops of 16 floats plus scalar rest;
    ties to the larger ``L``, fewer passes over the edges).  float64: 8 (see ``_lanes_gen``)."""
    choices = _lane_choices(kernel, dtype)
    fitting = [lanes for lanes in choices if lanes <= width]
    if not fitting:
        return choices[0]
    return min(fitting, key=lambda lanes: ((width // lanes) * max(1, lanes // 16) + width % lanes, -lanes))


def lanes_dividing(width: int, kernel: str, dtype: torch.dtype) -> Optional[int]:
    """The largest lane count dividing ``width`` (per-head kernels, whose lane blocks must not
    straddle heads), or None: then the plain kernels run."""
    for lanes in sorted(_lane_choices(kernel, dtype), reverse=True):
        if width % lanes == 0:
            return lanes
    return None


def _lane_kernel(name: str, lanes: int, threads: int):
    """``fn(bounds, *args)``: the parallel driver, or the chunk function run over all rows."""
    k = _all().lanes
    if threads > 1:
        return getattr(k, f"{name}_{lanes}_par")
    chunk = getattr(k, f"{name}_{lanes}_chunk")
    return lambda bounds, *args: chunk(bounds[0], bounds[-1], *args)


def _scalars(dtype: torch.dtype):
    """``(0, 1)`` as NumPy scalars of ``dtype`` (typed constants for the lane kernels)."""
    kind = np.float32 if dtype == torch.float32 else np.float64
    return kind(0), kind(1)


_EMPTY = {}


def _no_values(dtype) -> np.ndarray:
    arr = _EMPTY.get(dtype)
    if arr is None:
        arr = _EMPTY[dtype] = np.zeros(1, dtype=dtype)
    return arr


def _values(val: Optional[Tensor], dtype: torch.dtype) -> np.ndarray:
    if val is None:
        return _no_values(np.float32 if dtype == torch.float32 else np.float64)
    return _np(val.to(dtype).contiguous())


def spmm_sum(bounds: Tensor, rowptr: Tensor, col: Tensor, val: Optional[Tensor], x: Tensor,
             mean: bool = False) -> Tensor:
    """``out[i] = s_i sum_e w_e x[col e]`` (``s_i = 1/deg_i`` if ``mean``, else 1; ``w = 1`` if
    ``val`` is None).  ``val`` [E, H] (``F % H == 0``, no ``mean``): per-head weights.

    Shapes:
        bounds: [C + 1]; rowptr: [N + 1]; col: [E]; val: [E], [E, H] or None; x: [M, F] -> [N, F].
    """
    x = x.contiguous()
    out = torch.empty(rowptr.numel() - 1, x.shape[1], dtype=x.dtype)
    if out.numel() == 0:
        return out.zero_()
    threads = _threads(col.numel() * x.shape[1])
    zero, one = _scalars(x.dtype)
    if val is not None and val.dim() == 2:
        lanes = lanes_dividing(x.shape[1] // val.shape[1], "spmm_heads", x.dtype)
        args = (_np(bounds), _np(rowptr), _np(col), _values(val, x.dtype), _np(x), _np(out))
        if lanes is None:
            _run(kernels(threads).spmm_heads, *args)
        else:
            _run(_lane_kernel("spmm_heads", lanes, threads), *args, zero)
        return out
    _run(_lane_kernel("spmm_sum", lanes_for(x.shape[1], "spmm_sum", x.dtype), threads), _np(bounds), _np(rowptr), _np(col),
         _values(val, x.dtype), val is not None, mean, _np(x), _np(out), zero, one)
    return out


def spmm_sum_runner(bounds: Tensor, rowptr: Tensor, col: Tensor, val: Optional[Tensor], dtype: torch.dtype,
                    width: int, mean: bool = False):
    """``run(x) -> out``: ``spmm_sum(bounds, rowptr, col, val, x, mean)`` for contiguous ``x``
    [M, width] of ``dtype`` (float32 or float64), with what does not depend on ``x`` prepared
    once: NumPy views, lane kernel, typed constants, serial or parallel (for the thread count
    now).  A width of exactly one lane block (8, 16 or 64 in float32, 8 in float64) runs
    ``spmm_sum_exact`` with the rows' scales precomputed (1 / in-degree for a mean).  What the ``cpu`` backend caches per graph: a call costs the kernel and about 2 us
    (``spmm_sum`` prepares all of it per call, 6-8 us).  ``val`` [E] or None; ``rowptr`` and
    ``col`` int64; ``width > 0`` and rows and edges present.

    The output is a NumPy allocation wrapped by ``torch.from_numpy`` (a tensor like any other,
    except that its storage cannot be resized): 0.7 us cheaper than ``torch.empty`` and its
    ``.numpy()``, and a loop that drops each output gets the same, cache-warm block back from
    ``malloc``, where ``torch.empty``'s aligned blocks alternate between two addresses (deezer
    F=16, 1.8 MB: 212 vs 221 us).
    """
    zero, one = _scalars(dtype)
    if width in _lane_choices("spmm_sum_exact", dtype):     # one lane block: the leaner kernel
        fn, threads, head, shape, np_dtype = _prepared("spmm_sum_exact", bounds, rowptr, col, dtype, width)
        scale = np.ones(shape[0], np_dtype)
        if mean:
            degree = np.diff(_np(rowptr))
            np.divide(one, degree, out=scale, where=degree > 0, casting="unsafe")
        rest = (_np(rowptr), _np(col), _values(val, dtype), val is not None, scale)
    else:
        fn, threads, head, shape, np_dtype = _prepared("spmm_sum", bounds, rowptr, col, dtype, width)
        rest = (_np(rowptr), _np(col), _values(val, dtype), val is not None, mean)
    use_threads, from_numpy = _use_threads, torch.from_numpy
    entry = None

    def run(x: Tensor) -> Tensor:
        nonlocal entry
        out = np.empty(shape, np_dtype)
        if threads > 1:
            use_threads(threads)
        typed = x.dtype is dtype and x.is_contiguous()   # the types the bound entry was looked up with
        if entry is not None and typed:
            entry(x.numpy(force=True), out, zero, one)
        else:
            args = (*head, *rest, x.numpy(force=True), out, zero, one)
            _run(fn, *args)
            if typed:
                entry = _bound_entry(fn, args, len(args) - 4)
        return from_numpy(out)

    return run


def _bound_entry(fn, args: tuple, fixed: int):
    """The machine code Numba compiled for ``args``' types, its first ``fixed`` arguments bound
    (``functools.partial``): a call skips the dispatcher's type resolution and the argument
    tuple (Cora F = 16: 0.6 of a 10 us runner).  The entry checks no types, so the caller uses
    it only for arguments of the types it was looked up with (same dtype, contiguous).  None
    where Numba keeps no such entry (the dispatcher then serves every call)."""
    try:
        compiled = fn.overloads[tuple(fn.typeof_pyval(a) for a in args)]
        return functools.partial(compiled.entry_point, *args[:fixed])
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _prepared(kernel: str, bounds: Tensor, rowptr: Tensor, col: Tensor, dtype: torch.dtype, width: int):
    """What a runner fixes once: ``(lane kernel, threads, its row-range arguments, output shape,
    NumPy dtype)`` (the parallel driver over ``bounds``' chunks, or the chunk function over all rows)."""
    num_rows = rowptr.numel() - 1
    threads = max_threads() if parallel(col.numel() * width) else 1
    lanes = lanes_for(width, kernel, dtype)
    fn = getattr(_all().lanes, f"{kernel}_{lanes}_{'par' if threads > 1 else 'chunk'}")
    head = (_np(bounds),) if threads > 1 else (0, num_rows)
    return fn, threads, head, (num_rows, width), (np.float32 if dtype == torch.float32 else np.float64)


def _arg_dtype(num_edges: int) -> torch.dtype:
    """int32 edge ids where they fit (half the memory of the [N, F] arg)."""
    return torch.int32 if num_edges < 2 ** 31 - 1 else torch.int64


def spmm_max(bounds: Tensor, rowptr: Tensor, col: Tensor, val: Optional[Tensor], x: Tensor,
             with_arg: bool = False):
    """``out[i, f] = max_e w_e x[col e, f]`` (0 for rows without edges); with ``with_arg`` also
    ``arg[i, f]``, the first edge attaining it (E for rows without edges).

    Shapes:
        as ``spmm_sum`` -> out [N, F] (and arg [N, F], int32 below 2^31 edges, else int64).
    """
    x = x.contiguous()
    out = torch.empty(rowptr.numel() - 1, x.shape[1], dtype=x.dtype)
    arg = torch.empty(out.shape if with_arg else (1, 1), dtype=_arg_dtype(col.numel()))
    if out.numel():
        threads = _threads(col.numel() * x.shape[1])
        _run(_lane_kernel("spmm_max", lanes_for(x.shape[1], "spmm_max", x.dtype), threads), _np(bounds), _np(rowptr), _np(col),
             _values(val, x.dtype), val is not None, _np(x), _np(out), with_arg, _np(arg), *_scalars(x.dtype))
    return (out, arg) if with_arg else out


def spmm_max_runner(bounds: Tensor, rowptr: Tensor, col: Tensor, val: Optional[Tensor], dtype: torch.dtype,
                    width: int, with_arg: bool = False):
    """``run(x)``: ``spmm_max(bounds, rowptr, col, val, x, with_arg)`` for contiguous ``x`` [M, width]
    of ``dtype``, prepared once as ``spmm_sum_runner`` (same conditions)."""
    fn, threads, head, shape, np_dtype = _prepared("spmm_max", bounds, rowptr, col, dtype, width)
    rest = (_np(rowptr), _np(col), _values(val, dtype), val is not None)
    zero, one = _scalars(dtype)
    arg_dtype = np.int32 if _arg_dtype(col.numel()) == torch.int32 else np.int64
    no_arg = np.empty((1, 1), arg_dtype)
    use_threads, from_numpy = _use_threads, torch.from_numpy

    def run(x: Tensor):
        out = np.empty(shape, np_dtype)
        arg = np.empty(shape, arg_dtype) if with_arg else no_arg
        if threads > 1:
            use_threads(threads)
        _run(fn, *head, *rest, x.numpy(force=True), out, with_arg, arg, zero, one)
        return (from_numpy(out), from_numpy(arg)) if with_arg else from_numpy(out)

    return run


def spmm_max_arg(bounds: Tensor, rowptr: Tensor, col: Tensor, val: Optional[Tensor], x: Tensor,
                 out: Tensor) -> Tensor:
    """First edge attaining ``out[i, f]`` of ``spmm_max`` (E where none). ``-> [N, F]`` (int32 or int64).

    The max is recomputed (it is deterministic: ``out`` is what ``spmm_max`` returns for these
    inputs), and its edge kept."""
    return spmm_max(bounds, rowptr, col, val, x, with_arg=True)[1]


def spmm_max_grad(bounds_t: Tensor, rowptr_t: Tensor, col_t: Tensor, perm: Tensor, val: Optional[Tensor],
                  arg: Tensor, grad: Tensor) -> Tensor:
    """``dX[j, f] = sum w_e dY[i, f]`` over the edges ``e: j -> i`` with ``arg[i, f] = e``,
    walking the transpose (``perm[t]``: the edge id of transposed position ``t``): row-parallel,
    no atomics, lane-vectorized (a masked SpMM).  Shapes: arg, grad [N, F] -> [M, F]."""
    grad = grad.contiguous()
    out = torch.empty(rowptr_t.numel() - 1, grad.shape[1], dtype=grad.dtype)
    if out.numel():
        threads = _threads(col_t.numel() * grad.shape[1])
        zero, one = _scalars(grad.dtype)
        _run(_lane_kernel("spmm_max_grad", lanes_for(grad.shape[1], "spmm_max_grad", grad.dtype), threads),
             _np(bounds_t), _np(rowptr_t), _np(col_t), _np(perm), _values(val, grad.dtype), val is not None,
             _np(arg), _np(grad), _np(out), zero, one)
    return out


def spmm_max_weight_grad(bounds: Tensor, rowptr: Tensor, col: Tensor, arg: Tensor, x: Tensor, grad: Tensor) -> Tensor:
    """``dw_e = sum_{f: arg[i, f] = e} X[col e, f] dY[i, f]``. Shapes: x [M, F]; arg, grad [N, F] -> [E]."""
    grad, x = grad.contiguous(), x.to(grad.dtype).contiguous()
    out = torch.zeros(col.numel(), dtype=grad.dtype)
    if out.numel():
        threads = _threads(col.numel() * grad.shape[1])
        _run(kernels(threads).max_grad_w, _np(bounds), _np(rowptr), _np(col), _np(arg), _np(x), _np(grad), _np(out))
    return out


def sddmm(bounds: Tensor, rowptr: Tensor, col: Tensor, a: Tensor, b: Tensor, op: str, heads: int = 0) -> Tensor:
    """Per edge ``op(a[row e], b[col e])``: ``dot`` -> [E] (``heads = H > 0``: per-head dots
    [E, H]), ``add`` / ``mul`` -> [E, F].

    Shapes:
        a: [N, F]; b: [M, F] (same dtype) -> [E], [E, H] or [E, F].
    """
    a, b = a.contiguous(), b.contiguous()
    num_edges = col.numel()
    threads = _threads(num_edges * a.shape[1])
    if op == "dot":
        out = torch.empty(num_edges, max(heads, 1), dtype=a.dtype)
        if num_edges and a.shape[1] == 0:
            out.zero_()                                 # empty dot products (no lane writes them)
        elif num_edges:
            lanes = lanes_dividing(a.shape[1] // max(heads, 1), "sddmm_dot", a.dtype)
            fn = kernels(threads).sddmm_dot if lanes is None else _lane_kernel("sddmm_dot", lanes, threads)
            _run(fn, _np(bounds), _np(rowptr), _np(col), _np(a), _np(b), _np(out))
        return out if heads else out.view(num_edges)
    out = torch.empty(num_edges, a.shape[1], dtype=a.dtype)
    if out.numel():
        _run(kernels(threads).sddmm_elementwise, _np(bounds), _np(rowptr), _np(col), _np(a), _np(b), op == "add",
             _np(out))
    return out


def _as_2d(t: Tensor) -> Tensor:
    width = 1
    for size in t.shape[1:]:
        width *= size
    return t.contiguous().view(t.shape[0], width)


#: Shifted scores are clamped to this floor before ``exp`` (per dtype: ``exp(floor)`` is still a
#: normal number); results at or below ``exp(floor)`` count as 0.  torch's vector ``exp`` takes a
#: slow path for results that underflow: 30 ms instead of 0.2 for 1.4M floats at -90, 3 ms for -inf.
SOFTMAX_FLOOR = {torch.float32: -87.0, torch.float64: -708.0}


def edge_softmax(bounds: Tensor, rowptr: Tensor, scores: Tensor) -> Tensor:
    """Softmax of ``scores`` over each row's edges: the row maximum subtracted (Numba), ``exp``
    in place by torch (vectorized; Numba has no vector ``exp`` without Intel's SVML), each row
    divided by its sum (Numba).  Shifted scores below ``SOFTMAX_FLOOR`` give exactly 0 (the
    true value is below the smallest normal float: at most 1.2e-38 of the row's sum).

    Shapes:
        scores [E] or [E, H] -> same.
    """
    s = _as_2d(scores)
    out = torch.empty_like(s)
    if s.numel():
        k = kernels(_threads(s.numel()))
        floor = SOFTMAX_FLOOR[s.dtype]
        kind = np.float32 if s.dtype == torch.float32 else np.float64
        _run(k.softmax_shift, _np(bounds), _np(rowptr), _np(s), _np(out), kind(floor))
        out.exp_()
        _run(k.softmax_scale, _np(bounds), _np(rowptr), _np(out), kind(math.exp(floor)))
    return out.view(scores.shape)


def edge_softmax_backward(bounds: Tensor, rowptr: Tensor, out: Tensor, grad: Tensor) -> Tensor:
    """``ds_e = y_e (g_e - sum_{e' in row} g_e' y_e')``. Shapes: out, grad [E] or [E, H] -> same."""
    threads = _threads(out.numel())
    y, g = _as_2d(out), _as_2d(grad.to(out.dtype))
    res = torch.empty_like(y)
    if y.numel():
        _run(kernels(threads).softmax_bwd, _np(bounds), _np(rowptr), _np(y), _np(g), _np(res))
    return res.view(out.shape)


def segment_sum(bounds: Tensor, rowptr: Tensor, values: Tensor) -> Tensor:
    """``out[i] = sum_{e in row i} v_e``. Shapes: values [E] or [E, K] -> [N] or [N, K]."""
    threads = _threads(values.numel())
    v = _as_2d(values)
    out = torch.empty(rowptr.numel() - 1, v.shape[1], dtype=v.dtype)
    if out.numel():
        _run(kernels(threads).segment_sum, _np(bounds), _np(rowptr), _np(v), _np(out))
    return out.view((rowptr.numel() - 1,) + tuple(values.shape[1:]))


def dropout(x: Tensor, p: float, seed: int):
    """Inverted dropout: ``(x * mask / (1 - p), mask)``, ``mask`` uint8 of ``x``'s shape, each
    element kept with probability ``1 - p`` (24-bit resolution) by a hash of ``(seed, index)``."""
    threads = _threads(x.numel())
    flat = x.contiguous().view(-1)
    out = torch.empty_like(flat)
    mask = torch.empty(flat.shape, dtype=torch.bool)
    if flat.numel():
        threshold = min(int(round(p * (1 << 24))), 1 << 24)
        _run(kernels(threads).dropout, _np(flat), _np(out), _np(mask), np.uint64(seed), np.uint64(threshold), 1.0 / (1.0 - p))
    return out.view(x.shape), mask.view(x.shape)


def dropout_backward(grad: Tensor, mask: Tensor, p: float) -> Tensor:
    """``grad * mask / (1 - p)``. Shapes: grad, mask of one shape -> that shape."""
    threads = _threads(grad.numel())
    g = grad.contiguous().view(-1)
    out = torch.empty_like(g)
    if g.numel():
        _run(kernels(threads).masked_scale, _np(g), _np(mask.contiguous().view(-1)), 1.0 / (1.0 - p), _np(out))
    return out.view(grad.shape)
