"""CPU kernels: Numba-compiled, row-parallel loops over the CSR (no atomics, no [E, F] temporaries).

Every kernel walks the rows of a CSR (``rowptr``, ``col``) split into chunks of about equal
work (``deg + 1`` per row, so empty rows count too), one chunk per ``prange`` iteration, with
a per-chunk accumulator of one row.  Inputs are float32 or float64 NumPy views of contiguous
CPU tensors (no copy); half types are computed in float32 by the callers.  Indices are int64.

Numba is imported on first use; ``numba_available()`` says whether it can be.  Kernels are
compiled on their first call per dtype (about a second each; ``cache=True`` keeps the machine
code on disk, so later processes load it).  The thread count follows
``torch.get_num_threads()`` (capped by Numba's pool size).

Tensors in, tensors out; no autograd, no Graph, no validation.
"""
from __future__ import annotations

import importlib.util
import types
from types import SimpleNamespace
from typing import Optional

import numpy as np
import torch
from torch import Tensor

#: Found once at import, without importing Numba.
_NUMBA_FOUND = importlib.util.find_spec("numba") is not None

#: Dtypes the kernels compute in directly (others go through float32).
NATIVE_DTYPES = (torch.float32, torch.float64)

#: Chunks per thread: enough slack for the dynamic assignment to even out uneven rows.
CHUNKS_PER_THREAD = 8
#: Below this much work (edges x width) a kernel runs on one thread: waking the pool costs more.
SERIAL_WORK = 1 << 18

_K: Optional[SimpleNamespace] = None


def numba_available() -> bool:
    """Whether the ``numba`` package can be imported."""
    return _NUMBA_FOUND


def _numba():
    """The numba module, its threading layer chosen before any parallel launch."""
    import os

    import numba

    if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
        # Numba's OpenMP layer loads a second OpenMP runtime beside PyTorch's: after each
        # parallel region the idle threads of both spin, and on a machine with as many threads
        # as cores every op following one of the other runtime ran 10-100x slow (a Cora GCN
        # epoch 196 ms instead of 11).  The workqueue layer's threads sleep when idle.
        numba.config.THREADING_LAYER = "workqueue"
    return numba


def max_threads() -> int:
    """``torch.get_num_threads()``, capped by Numba's pool size."""
    numba = _numba()
    return max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))


def set_threads(work: Optional[int] = None) -> int:
    """Make Numba's parallel loops use ``torch.get_num_threads()`` threads (one for less than
    ``SERIAL_WORK`` of ``work``); returns the count."""
    numba = _numba()

    threads = 1 if work is not None and work < SERIAL_WORK else max_threads()
    if numba.get_num_threads() != threads:
        numba.set_num_threads(threads)
    return threads


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
    def spmm_sum(bounds, rowptr, col, val, has_val, mean, x, out):
        nf = x.shape[1]
        for c in prange(bounds.shape[0] - 1):
            acc = np.empty(nf, dtype=out.dtype)
            for i in range(bounds[c], bounds[c + 1]):
                acc[:] = 0
                start, end = rowptr[i], rowptr[i + 1]
                if has_val:
                    for e in range(start, end):
                        w = val[e]
                        j = col[e]
                        for f in range(nf):
                            acc[f] += w * x[j, f]
                else:
                    for e in range(start, end):
                        j = col[e]
                        for f in range(nf):
                            acc[f] += x[j, f]
                s = 1.0 / (end - start) if mean and end > start else 1.0
                for f in range(nf):
                    out[i, f] = acc[f] * s

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
    def spmm_max(bounds, rowptr, col, val, has_val, x, out):
        nf = x.shape[1]
        for c in prange(bounds.shape[0] - 1):
            acc = np.empty(nf, dtype=out.dtype)
            for i in range(bounds[c], bounds[c + 1]):
                start, end = rowptr[i], rowptr[i + 1]
                if end == start:
                    for f in range(nf):
                        out[i, f] = 0
                    continue
                acc[:] = -np.inf
                for e in range(start, end):
                    j = col[e]
                    if has_val:
                        w = val[e]
                        for f in range(nf):
                            m = w * x[j, f]
                            if m > acc[f]:
                                acc[f] = m
                    else:
                        for f in range(nf):
                            if x[j, f] > acc[f]:
                                acc[f] = x[j, f]
                for f in range(nf):
                    out[i, f] = acc[f]

    @kernel
    def spmm_max_arg(bounds, rowptr, col, val, has_val, x, out, arg):
        # first edge whose message equals out[i, f]; E where none (empty rows)
        nf, num_edges = x.shape[1], col.shape[0]
        for c in prange(bounds.shape[0] - 1):
            for i in range(bounds[c], bounds[c + 1]):
                for f in range(nf):
                    arg[i, f] = num_edges
                for e in range(rowptr[i + 1] - 1, rowptr[i] - 1, -1):   # backwards: the first hit wins
                    j = col[e]
                    for f in range(nf):
                        m = val[e] * x[j, f] if has_val else x[j, f]
                        if m == out[i, f]:
                            arg[i, f] = e

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
    def softmax_fwd(bounds, rowptr, s, out):
        heads = s.shape[1]
        for c in prange(bounds.shape[0] - 1):
            for i in range(bounds[c], bounds[c + 1]):
                start, end = rowptr[i], rowptr[i + 1]
                for h in range(heads):
                    m = -np.inf
                    for e in range(start, end):
                        if s[e, h] > m:
                            m = s[e, h]
                    z = 0.0
                    for e in range(start, end):
                        v = np.exp(s[e, h] - m)
                        out[e, h] = v
                        z += v
                    inv = 1.0 / z if z > 0 else 0.0
                    for e in range(start, end):
                        out[e, h] *= inv

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

    options = dict(cache=True, nogil=True, boundscheck=False)
    return SimpleNamespace(
        parallel=SimpleNamespace(**{name: njit(parallel=True, **options)(fn) for name, fn in found.items()}),
        serial=SimpleNamespace(**{name: njit(**options)(serial_copy(fn)) for name, fn in found.items()}),
    )


def kernels(threads: int) -> SimpleNamespace:
    """The compiled-on-demand kernels (imports Numba on first use): the parallel versions for
    ``threads > 1``, else the serial ones (no hand-off to the thread pool: about 0.25 ms less
    per call, the whole cost of a small op)."""
    global _K
    if _K is None:
        _K = _build()
    return _K.parallel if threads > 1 else _K.serial


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
    threads = set_threads(col.numel() * x.shape[1])
    x = x.contiguous()
    out = torch.empty(rowptr.numel() - 1, x.shape[1], dtype=x.dtype)
    if out.numel() == 0:
        return out.zero_()
    k = kernels(threads)
    if val is not None and val.dim() == 2:
        k.spmm_heads(_np(bounds), _np(rowptr), _np(col), _values(val, x.dtype), _np(x), _np(out))
    else:
        k.spmm_sum(_np(bounds), _np(rowptr), _np(col), _values(val, x.dtype), val is not None, mean,
                   _np(x), _np(out))
    return out


def spmm_max(bounds: Tensor, rowptr: Tensor, col: Tensor, val: Optional[Tensor], x: Tensor) -> Tensor:
    """``out[i, f] = max_e w_e x[col e, f]`` (0 for rows without edges). Shapes: as ``spmm_sum``."""
    threads = set_threads(col.numel() * x.shape[1])
    x = x.contiguous()
    out = torch.empty(rowptr.numel() - 1, x.shape[1], dtype=x.dtype)
    if out.numel() == 0:
        return out
    kernels(threads).spmm_max(_np(bounds), _np(rowptr), _np(col), _values(val, x.dtype), val is not None, _np(x), _np(out))
    return out


def spmm_max_arg(bounds: Tensor, rowptr: Tensor, col: Tensor, val: Optional[Tensor], x: Tensor,
                 out: Tensor) -> Tensor:
    """First edge attaining ``out[i, f]`` of ``spmm_max`` (E where none). ``-> [N, F]`` int64."""
    threads = set_threads(col.numel() * x.shape[1])
    x, out = x.contiguous(), out.to(x.dtype).contiguous()
    arg = torch.empty(out.shape, dtype=torch.int64)
    if arg.numel() == 0:
        return arg
    kernels(threads).spmm_max_arg(_np(bounds), _np(rowptr), _np(col), _values(val, x.dtype), val is not None, _np(x),
                           _np(out), _np(arg))
    return arg


def sddmm(bounds: Tensor, rowptr: Tensor, col: Tensor, a: Tensor, b: Tensor, op: str, heads: int = 0) -> Tensor:
    """Per edge ``op(a[row e], b[col e])``: ``dot`` -> [E] (``heads = H > 0``: per-head dots
    [E, H]), ``add`` / ``mul`` -> [E, F].

    Shapes:
        a: [N, F]; b: [M, F] (same dtype) -> [E], [E, H] or [E, F].
    """
    threads = set_threads(col.numel() * a.shape[1])
    a, b = a.contiguous(), b.contiguous()
    num_edges, k = col.numel(), kernels(threads)
    if op == "dot":
        out = torch.empty(num_edges, max(heads, 1), dtype=a.dtype)
        if num_edges:
            k.sddmm_dot(_np(bounds), _np(rowptr), _np(col), _np(a), _np(b), _np(out))
        return out if heads else out.view(num_edges)
    out = torch.empty(num_edges, a.shape[1], dtype=a.dtype)
    if out.numel():
        k.sddmm_elementwise(_np(bounds), _np(rowptr), _np(col), _np(a), _np(b), op == "add", _np(out))
    return out


def _as_2d(t: Tensor) -> Tensor:
    width = 1
    for size in t.shape[1:]:
        width *= size
    return t.contiguous().view(t.shape[0], width)


def edge_softmax(bounds: Tensor, rowptr: Tensor, scores: Tensor) -> Tensor:
    """Softmax of ``scores`` over each row's edges. Shapes: scores [E] or [E, H] -> same."""
    threads = set_threads(scores.numel())
    s = _as_2d(scores)
    out = torch.empty_like(s)
    if s.numel():
        kernels(threads).softmax_fwd(_np(bounds), _np(rowptr), _np(s), _np(out))
    return out.view(scores.shape)


def edge_softmax_backward(bounds: Tensor, rowptr: Tensor, out: Tensor, grad: Tensor) -> Tensor:
    """``ds_e = y_e (g_e - sum_{e' in row} g_e' y_e')``. Shapes: out, grad [E] or [E, H] -> same."""
    threads = set_threads(out.numel())
    y, g = _as_2d(out), _as_2d(grad.to(out.dtype))
    res = torch.empty_like(y)
    if y.numel():
        kernels(threads).softmax_bwd(_np(bounds), _np(rowptr), _np(y), _np(g), _np(res))
    return res.view(out.shape)


def segment_sum(bounds: Tensor, rowptr: Tensor, values: Tensor) -> Tensor:
    """``out[i] = sum_{e in row i} v_e``. Shapes: values [E] or [E, K] -> [N] or [N, K]."""
    threads = set_threads(values.numel())
    v = _as_2d(values)
    out = torch.empty(rowptr.numel() - 1, v.shape[1], dtype=v.dtype)
    if out.numel():
        kernels(threads).segment_sum(_np(bounds), _np(rowptr), _np(v), _np(out))
    return out.view((rowptr.numel() - 1,) + tuple(values.shape[1:]))


def dropout(x: Tensor, p: float, seed: int):
    """Inverted dropout: ``(x * mask / (1 - p), mask)``, ``mask`` uint8 of ``x``'s shape, each
    element kept with probability ``1 - p`` (24-bit resolution) by a hash of ``(seed, index)``."""
    threads = set_threads(x.numel())
    flat = x.contiguous().view(-1)
    out = torch.empty_like(flat)
    mask = torch.empty(flat.shape, dtype=torch.bool)
    if flat.numel():
        threshold = min(int(round(p * (1 << 24))), 1 << 24)
        kernels(threads).dropout(_np(flat), _np(out), _np(mask), np.uint64(seed), np.uint64(threshold), 1.0 / (1.0 - p))
    return out.view(x.shape), mask.view(x.shape)


def dropout_backward(grad: Tensor, mask: Tensor, p: float) -> Tensor:
    """``grad * mask / (1 - p)``. Shapes: grad, mask of one shape -> that shape."""
    threads = set_threads(grad.numel())
    g = grad.contiguous().view(-1)
    out = torch.empty_like(g)
    if g.numel():
        kernels(threads).masked_scale(_np(g), _np(mask.contiguous().view(-1)), 1.0 / (1.0 - p), _np(out))
    return out.view(grad.shape)
