"""Backend dispatch: which backend runs a call, and the graph-level computations behind every op.

An op validates its inputs, resolves its backend with ``choose_backend`` and calls one of the
functions below, which hand the work to that backend's module (``BACKEND_MODULES``):

=============  =================  ===============================================================
backend        module             runs
=============  =================  ===============================================================
``triton``     ``_triton.py``     Triton kernels on CUDA tensors (planned, first-contact, batched)
``cpu``        ``_cpu.py``        Numba kernels and ``torch.sparse`` on CPU tensors
``reference``  ``_torch.py``      PyTorch scatter formulations, any device and dtype
=============  =================  ===============================================================

Every backend module offers the same functions (``aggregate``, ``edge_values``, ``head_dots``,
``edge_sum``, ``softmax``, ``softmax_grad``, ``max_backward``).  The eager autograd functions
(``spmm.py``, ``sddmm.py``, ``softmax.py``) and the custom ops (``_library.py``) both call the
functions here, so the eager and the compiled paths share one implementation.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._checks import check
from ..graph import Graph
from ..kernels import interpreting, triton_available
from ..kernels.cpu import numba_available
from . import _cpu, _torch, _triton
from ._common import mean_scale, scaled

BACKENDS = ("auto", "reference", "triton", "cpu")
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: The module implementing each resolved backend.
BACKEND_MODULES = {"triton": _triton, "cpu": _cpu, "reference": _torch}


def choose_backend(fn: str, backend: str, x: Tensor, triton_supported: Optional[str] = None) -> str:
    """Resolve ``backend`` for input ``x``.

    Args:
        fn: public op name, for error messages.
        backend: ``"auto"``, ``"reference"``, ``"triton"`` or ``"cpu"``.
        x: the dense input that decides device and dtype.
        triton_supported: ``None`` when a Triton kernel exists for this call, else the reason
            why not (used in the error for an explicit ``backend="triton"``).

    ``"auto"`` picks Triton for CUDA tensors of a supported dtype, the CPU backend (Numba
    kernels and ``torch.sparse``, see ``_cpu``) for CPU tensors of a floating dtype when
    Numba is installed, the reference otherwise.
    """
    if backend == "auto" and triton_supported is None and x.is_cuda and x.dtype in TRITON_DTYPES:  # the hot path
        return "triton" if triton_available() else "reference"
    if backend not in BACKENDS:
        raise ValueError(f"{fn}(): backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if x.device.type == "cpu":
            return "cpu" if x.is_floating_point() and numba_available() else "reference"
        usable = triton_supported is None and x.is_cuda and x.dtype in TRITON_DTYPES and triton_available()
        return "triton" if usable else "reference"
    if backend == "cpu":
        check(numba_available(), fn, "backend='cpu' needs the numba package (pip install numba)")
        check(x.device.type == "cpu", fn, f"backend='cpu' needs CPU tensors, got {x.device}")
        check(x.is_floating_point(), fn, f"backend='cpu' needs floating-point tensors, got {x.dtype}")
    if backend == "triton":
        check(triton_supported is None, fn, f"backend='triton' {triton_supported}")
        check(triton_available(), fn, "backend='triton' needs the triton package (pip install triton)")
        check(x.is_cuda or interpreting(), fn,
              "backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run kernels in the CPU interpreter)")
        check(x.dtype in TRITON_DTYPES, fn, f"backend='triton' supports float32, float16 and bfloat16, got {x.dtype}")
    return backend


def default_backend(x: Tensor) -> str:
    """``"auto"`` resolved for ``x`` (the backward helpers that the custom ops call without one)."""
    return choose_backend("", "auto", x)


def aggregate(backend: str, graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str = "sum",
              owned: bool = False) -> Tensor:
    """``out[i] = reduce_{e in row i} w_e x[col[e]]`` on ``graph`` with the chosen backend.

    ``reduce`` is ``"sum"``, ``"mean"`` (divide by the number of stored edges) or ``"max"``.
    ``weight`` of shape [E, H] with ``F % H == 0`` is multi-head: feature ``f`` is weighted by
    ``w[e, f // (F / H)]`` (``H = F``: per-feature weights).  Multi-head sums run in one
    kernel for every head; other per-feature cases take the reference.

    ``owned``: ``weight`` is a tensor the graph keeps and hands back on every call (a
    ``derived_values`` entry, such as its values permuted for the transpose), so a launch may
    be bound to it like to ``graph.edge_val``.

    Shapes:
        x: [M, F]; weight: [E], [E, H] or None -> [N, F] (``M = graph.num_src``).
    """
    return BACKEND_MODULES[backend].aggregate(graph, x, weight, reduce, owned)


def aggregate_transposed(backend: str, graph: Graph, x: Tensor, weight: Optional[Tensor],
                         reduce: str = "sum") -> Tensor:
    """``A'^T x``: ``out[j] = sum_{e: col[e] = j} w'_e x[row[e]]`` (via the cached transpose, or
    on a graph met for the first time by the Triton backend's push kernel).

    ``A' = A`` for ``reduce="sum"``, ``D^-1 A`` for ``"mean"`` (``w'_e = w_e / deg(row[e])``):
    the backward of ``aggregate``.  ``weight`` ([E], [E, H] or None) is in ``graph``'s edge
    order; it is permuted here.

    Shapes:
        x: [N, F]; weight: [E], [E, H] or None -> [M, F].
    """
    return BACKEND_MODULES[backend].aggregate_transposed(graph, x, weight, reduce)


def edge_values(backend: str, graph: Graph, a: Tensor, b: Tensor, op: str) -> Tensor:
    """Per-edge ``op(a[row[e]], b[col[e]])`` with the chosen backend (``dot`` -> [E], else [E, F])."""
    return BACKEND_MODULES[backend].edge_values(graph, a, b, op)


def spmm_weight_grad(backend: str, graph: Graph, grad_out: Tensor, x: Tensor, heads: int, reduce: str) -> Tensor:
    """Gradient of ``aggregate`` (sum or mean) with respect to its edge weights.

    ``dw_e = s_i <dY_i, X_j>`` for ``e: j -> i``, with ``s_i = 1`` (sum) or ``1 / deg_i`` (mean);
    multi-head (``heads = H > 0``, weights [E, H]): the dot product over each head's ``F / H``
    features.

    Shapes:
        grad_out: [N, F]; x: [N, F] of grad_out's dtype -> [E] (heads = 0) or [E, H].
    """
    impl = BACKEND_MODULES[backend]
    grad_w = impl.head_dots(graph, grad_out, x, heads) if heads else impl.edge_values(graph, grad_out, x, "dot")
    if reduce == "mean":
        grad_w = scaled(grad_w, mean_scale(graph, x.dtype).to(grad_w.dtype))
    return grad_w


def spmm_max_backward(graph: Graph, grad_out: Tensor, x: Tensor, weight: Optional[Tensor], out: Tensor,
                      backend: Optional[str] = None, arg: Optional[Tensor] = None, need_weight: bool = True):
    """Gradients of the feature-wise max aggregation ``out``: each ``dY[i, f]`` flows to the first
    edge attaining ``out[i, f]`` (none for rows without edges).

    With that edge ``e: j -> i``: ``dX[j, f] += w_e dY[i, f]`` and ``dw_e += X[j, f] dY[i, f]``.
    ``arg`` (those edges, ``E`` where none) is found by the backend unless the forward saved it.

    Shapes:
        grad_out, x, out: [N, F]; weight: [E] or None -> (grad_x [N, F], grad_w [E] or None).
    """
    if graph.num_edges == 0:
        return x.new_zeros(x.shape), (weight.new_zeros(weight.shape) if weight is not None else None)
    impl = BACKEND_MODULES[backend or default_backend(x)]
    return impl.max_backward(graph, grad_out, x, weight, out, arg, need_weight)


def edge_sum(graph: Graph, values: Tensor, by_source: bool, backend: Optional[str] = None) -> Tensor:
    """``out[i] = sum_{e: row[e] = i} v_e`` (by target), or over ``col[e] = i`` (``by_source``).

    Shapes:
        values: [E] or [E, F] -> [N] or [N, F] ([M] or [M, F] ``by_source``).
    """
    return BACKEND_MODULES[backend or default_backend(values)].edge_sum(graph, values, by_source)


def softmax_values(backend: str, graph: Graph, scores: Tensor) -> Tensor:
    """Edge softmax of ``scores`` ([E] or [E, H], graph order) over each target's edges."""
    return BACKEND_MODULES[backend].softmax(graph, scores)


def softmax_grad(backend: str, graph: Graph, out: Tensor, grad_out: Tensor) -> Tensor:
    """``ds_e = y_e (g_e - sum_{e' -> i} g_e' y_e')`` for the softmax output ``y = out``."""
    return BACKEND_MODULES[backend].softmax_grad(graph, out, grad_out)


def available_backends() -> list:
    """The backends this installation can run: the reference always, the CPU backend with Numba,
    Triton with a CUDA device (or its interpreter)."""
    backends = ["reference"]
    if numba_available():
        backends.append("cpu")
    if triton_available() and (torch.cuda.is_available() or interpreting()):
        backends.append("triton")
    return backends


def auto_backend(device_type: str) -> str:
    """What ``backend="auto"`` picks for floating-point tensors on a device of ``device_type``."""
    if device_type == "cpu":
        return "cpu" if numba_available() else "reference"
    return "triton" if triton_available() else "reference"


def runs_on(backend: str, device_type: str) -> bool:
    """Whether ``backend`` can run tensors on a device of ``device_type`` (``"auto"``: any)."""
    return {"triton": device_type == "cuda" or interpreting(), "cpu": device_type == "cpu"}.get(backend, True)


def capturable(backend: str) -> bool:
    """Whether ``backend``'s ops run without host syncs, so a training step using them can be
    captured as a CUDA graph (the reference's scatter formulations may sync)."""
    return backend != "reference"


def check_backend(fn: str, backend: str) -> None:
    """ValueError unless ``backend`` is one of ``BACKENDS``."""
    check(backend in BACKENDS, fn, f"backend must be one of {BACKENDS}, got {backend!r}")
