"""The MaxK nonlinearity (MaxK-GNN): keep the ``k`` largest entries of every row.

``maxk(x, k)[i] = {(f, x[i, f]) : f among the k largest entries of row i}`` as a
:class:`~sparsegnn.formats.cbsr.CBSR` (values ``[N, k]`` and columns ``[N, k]``, columns
increasing), or the dense ``[N, F]`` matrix with zeros elsewhere (``dense=True``).
Entries rank by their fp32 value (NaN and +inf as the largest float, -inf as the smallest,
``-0 == +0``); ties at the k-th value keep the lowest columns, so the choice is deterministic
and the same on every backend.  Backward: the gradient flows to the kept positions only,
``dx = scatter(index, d values)``.

:func:`layer_norm_maxk` is ``maxk(layer_norm(x), k)`` in one pass (the normalised matrix is never
written; its backward forms LayerNorm's input gradient from the ``k`` kept gradients a row).

Backends: ``"triton"`` (CUDA, fp32 / fp16 / bf16, rows up to ``kernels.maxk.MAX_FEATS`` wide: one read of ``x``
and ``k`` writes per row, as an element-wise op) and ``"reference"`` (a stable descending
sort; CPU and wider rows).  ``"auto"`` takes Triton where it runs.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .._checks import check
from .._streams import in_capture_warmup
from ..formats.cbsr import CBSR, index_dtype
from ..kernels import interpreting, triton_available
from ..tune.reuse import cuda_syncs_forbidden, investing_now
from torch.compiler import is_compiling as compiling  # dynamo tracing: the custom ops (``_library``) take over

BACKENDS = ("auto", "triton", "reference", "cpu")   # "cpu": CPU tensors select with the reference sort


def _reference_select(x: Tensor, k: int, idx_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Stable descending sort of the ranking values (module doc): ties keep column order."""
    big = torch.finfo(torch.float32).max
    rank = x.float().nan_to_num(nan=big, posinf=big, neginf=-big)
    top = torch.sort(rank, dim=1, descending=True, stable=True).indices[:, :k]
    index = top.sort(dim=1).values
    return x.gather(1, index), index.to(idx_dtype)


@functools.lru_cache(maxsize=None)
def _kernels():
    """``kernels.maxk``, imported on first use (only where Triton is installed) and kept: the
    per-call paths read it without an import statement's lookup."""
    from ..kernels import maxk as module

    return module


def _triton_runs(x: Tensor) -> bool:
    """Whether the Triton kernel takes ``x`` (imported only where Triton is installed)."""
    if not (triton_available() and (x.is_cuda or interpreting())):
        return False
    # fp64 would need 64-bit ranking values
    return x.shape[1] <= _kernels().MAX_FEATS and x.dtype in _TRITON_DTYPES


_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def resolve_backend(backend: str, x: Tensor) -> str:
    """The user's ``backend`` resolved for ``x`` (``"triton"`` or ``"reference"``), checked."""
    if backend not in BACKENDS:
        raise ValueError(f"maxk(): backend must be one of {BACKENDS}, got {backend!r}")
    runs = _triton_runs(x)
    if backend == "triton":
        check(runs, "maxk", f"backend='triton' needs Triton, a CUDA tensor (or TRITON_INTERPRET=1), float32 / "
                            f"float16 / bfloat16 and at most 4096 columns; got {x.device}, {x.dtype}, "
                            f"{x.shape[1]} columns")
        return "triton"
    if backend == "auto":
        return "triton" if runs and x.is_cuda else "reference"
    check(backend != "cpu" or x.device.type == "cpu", "maxk", f"backend='cpu' needs CPU tensors, got {x.device}")
    return "reference"


def select(x: Tensor, k: int, backend: str) -> Tuple[Tensor, Tensor]:
    """``(values, index)`` of the ``k`` largest entries of each row with a resolved ``backend``
    (the eager autograd.Function and the custom op ``sparsegnn::maxk`` both run this).

    Shapes:
        x: [N, F] -> values [N, k] of x's dtype, index [N, k] of ``index_dtype(F)``.
    """
    idx_dtype = index_dtype(x.shape[1])
    if backend == "triton":
        return _kernels().maxk_select(x, k, idx_dtype)
    return _reference_select(x, k, idx_dtype)


def scatter_kept(grad_values: Tensor, index: Tensor, num_cols: int) -> Tensor:
    """MaxK's backward ``dx = scatter(index, d values)``: zeros off the kept positions, in plain
    torch (the custom op's autograd formula, traced by torch.compile; the eager autograd.Function
    takes ``ops.cbsr.densify``, one pass on CUDA).

    Shapes:
        grad_values, index: [N, k] -> [N, num_cols].
    """
    return grad_values.new_zeros((grad_values.shape[0], num_cols)).scatter_(1, index.long(), grad_values)


class _MaxK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, k: int, backend: str):
        values, index = select(x.detach(), k, backend)
        ctx.save_for_backward(index)
        ctx.num_cols = x.shape[1]
        ctx.mark_non_differentiable(index)
        return values, index

    @staticmethod
    def backward(ctx, grad_values: Tensor, _grad_index):
        from .cbsr import densify       # one pass on CUDA (the custom op's formula keeps the traceable scatter)

        (index,) = ctx.saved_tensors
        return densify(grad_values.contiguous(), index, ctx.num_cols), None, None


def maxk(x: Tensor, k: int, *, dense: bool = False, backend: str = "auto") -> Union[CBSR, Tensor]:
    """The ``k`` largest entries of each row of ``x`` (module doc), differentiable in ``x``.

    Args:
        x: [N, F] floating tensor.
        k: entries kept per row, ``1 <= k <= F``.
        dense: return the ``[N, F]`` matrix with zeros off the kept entries instead of a CBSR.
        backend: ``"auto"``, ``"triton"``, ``"reference"`` or ``"cpu"`` (CPU tensors: the reference sort).

    Shapes:
        x: [N, F] -> CBSR with values / index [N, k] (or dense [N, F]).
    """
    # messages built on failure only: a shape in an f-string breaks a torch.compile graph with dynamic shapes
    if not (isinstance(x, Tensor) and x.dim() == 2):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"maxk(): x must be a 2-D tensor [N, F], got {got}")
    if not x.is_floating_point():
        raise ValueError(f"maxk(): x must be a floating tensor, got {x.dtype}")
    if not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= x.shape[1]):
        raise ValueError(f"maxk(): k must be an int in [1, F = {x.shape[1]}], got {k!r}")
    if compiling():     # the custom op sparsegnn::maxk (``_library``), which resolves the backend per call
        check(backend in BACKENDS, "maxk", f"backend must be one of {BACKENDS}, got {backend!r}")
        values, index = torch.ops.sparsegnn.maxk(x, k, backend)
    else:
        resolved = resolve_backend(backend, x)
        if dense and resolved == "triton":
            return dense_select(x, k)
        values, index = _MaxK.apply(x, k, resolved)
    out = CBSR(values, index, int(x.shape[1]))
    return out.to_dense() if dense else out


#: Largest ``rows x width`` and ``edges x width`` of a MaxK layer's features that an eager call
#: aggregates densely (``aggregates_dense``).  H200, hidden 256, eager training steps (their
#: ReLU twins at 2.1-2.7 ms, host-bound): cora, citeseer, lastfm, twitch, ENZYMES, pubmed
#: (<= 19.7k nodes) and wikipedia (11.6k nodes, 342k edges) ran the CBSR path at 0.69x-0.89x the
#: twin; deezer (28.3k nodes) at 1.35x-1.55x and PROTEINS_full (43.5k) at 0.98x-1.67x.
DENSE_EAGER_ELEMENTS = 6 << 20
DENSE_EAGER_EDGE_ELEMENTS = 128 << 20


def aggregates_dense(x: Tensor, num_edges: int, backend: str = "auto") -> bool:
    """Whether a MaxK layer should aggregate ``maxk(x, k, dense=True)`` with the plain layer's dense
    ops instead of the CBSR kernels: an eager call on the default stream (not under
    ``torch.compile``, no capture warm-up of this library, no ``tune.reuse.investing`` block) on
    CUDA with the Triton backend, whose features and graph are small (``DENSE_EAGER_*``; a
    negative ``num_edges``: unknown, not small).  There the step is bound by host time, not by
    the GPU work the CBSR saves, and each CBSR call costs more host time than the dense op it
    replaces; the dense form costs what the ReLU layer does plus one selection pass.

    A CUDA-graph capture records the CBSR kernels (a replayed step costs its GPU work, which they
    cut), and their first contact (work plan, module loads, schedule decisions) cannot run inside
    one: its warm-up must run them.  Warm-up steps on a side stream (PyTorch's capture recipe,
    ``make_graphed_callables``) take them, as do this library's replays and captured steps.

    Shapes:
        x: [N, F] (the features MaxK selects from); ``num_edges`` of the graph aggregated.
    """
    if compiling() or not x.is_cuda or x.dim() != 2:
        return False
    width = x.shape[1]
    if (num_edges < 0 or x.shape[0] * width > DENSE_EAGER_ELEMENTS
            or num_edges * width > DENSE_EAGER_EDGE_ELEMENTS or backend not in ("auto", "triton")
            or not _triton_runs(x)):
        return False
    if cuda_syncs_forbidden() or in_capture_warmup() or investing_now():
        return False
    return torch._C._cuda_getCurrentStream(x.get_device())[0] == 0


def dense_select(x: Tensor, k: int) -> Tensor:
    """``maxk(x, k, dense=True)`` on the Triton kernel, for an ``x`` the caller has checked (2-D,
    ``1 <= k <= F``, a dtype and width the kernel takes, not under ``torch.compile``): one pass
    writes where ``x`` is kept (``kernels.maxk.maxk_keep_mask``), then ``torch.where(kept, x, 0)``,
    a native op whose backward is one native op.  For eager calls whose host time counts (a MaxK
    layer on its dense path): none of ``maxk``'s checks again.

    Shapes:
        x: [N, F] -> [N, F].
    """
    return torch.where(_kernels().maxk_keep_mask(x.detach(), k), x, 0.0)


#: Widest rows and largest ``k`` of the fused LayerNorm + MaxK kernels (register tiles of
#: ``F / 32 x next_pow2(k)`` per warp in the backward); wider ones run the two ops one after the other.
FUSED_MAX_FEATS, FUSED_MAX_K = 1024, 128


class _LayerNormMaxK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, k: int, eps: float):
        x = x.detach().contiguous()
        values, index, center, rstd = _kernels().layer_norm_maxk_select(
            x, weight.detach(), bias.detach(), eps, k, index_dtype(x.shape[1]))
        ctx.save_for_backward(x, weight, index, center, rstd)
        ctx.mark_non_differentiable(index)
        return values, index

    @staticmethod
    @torch.autograd.function.once_differentiable     # the kernels have no derivative: no double backward
    def backward(ctx, grad_values: Tensor, _grad_index):
        x, weight, index, center, rstd = ctx.saved_tensors
        dx, dw, db = _kernels().layer_norm_maxk_backward(grad_values, index, x, weight.detach(), center, rstd)
        return dx, dw, db, None, None


def _fused_runs(x: Tensor, k: int, weight, bias) -> bool:
    """Whether the fused Triton kernels take this call (else the two ops run one after the other, and
    ``F.layer_norm`` judges the parameters: it takes ``x``'s dtype, or fp32 with a half / bf16 ``x``)."""
    if weight is None or bias is None or not _triton_runs(x):
        return False
    dtypes_ok = weight.dtype == bias.dtype and (weight.dtype == x.dtype or weight.dtype == torch.float32)
    return (x.shape[1] <= FUSED_MAX_FEATS and k <= FUSED_MAX_K and dtypes_ok
            and weight.device == x.device and bias.device == x.device)


def layer_norm_maxk(x: Tensor, k: int, weight: Optional[Tensor], bias: Optional[Tensor], eps: float = 1e-5,
                    *, backend: str = "auto") -> CBSR:
    r"""MaxK of the LayerNorm of ``x``: ``maxk(F.layer_norm(x, (F,), weight, bias, eps), k)``, fused.

    :math:`y_i = (x_i - \mu_i) / \sqrt{\sigma_i^2 + \epsilon} \odot w + b` (biased variance over the
    row), then the ``k`` largest entries of each ``y_i`` (ranked in fp32, ties as :func:`maxk`).
    The fused kernel ranks the fp32 ``y``; the composition ranks LayerNorm's output in ``x``'s dtype,
    so with fp16 / bf16 inputs the two may keep different entries where the rounded values tie
    (both are the k largest of their ``y``).  The fused backward is once differentiable.  On
    CUDA the Triton kernel normalises each row in registers and selects from it, so ``y`` is never
    written or read back (MaxK-GNN's model applies MaxK to the LayerNorm output of every layer but
    the last); the backward turns the ``k`` gradients a row into LayerNorm's ``dx``, ``dw``, ``db``
    without a dense ``dy``.  Elsewhere (CPU, ``backend="reference"``, no affine parameters, rows
    wider than 1024 or ``k > 128``, under autocast) it is the two ops in sequence.  Under
    ``torch.compile`` the kernels run as the custom ops ``sparsegnn::layer_norm_maxk`` and
    ``sparsegnn::layer_norm_maxk_backward``.

    Args:
        x: [N, F] floating tensor (the pre-normalisation features).
        k: entries kept per row, ``1 <= k <= F``.
        weight, bias: LayerNorm's affine parameters [F] (or ``None``).
        eps: added to the variance.
        backend: ``"auto"``, ``"triton"`` (the selection on Triton; fused where the shape allows) or
            ``"reference"``.

    Shapes:
        x: [N, F]; weight, bias: [F] -> CBSR with values / index [N, k].
    """
    if not (isinstance(x, Tensor) and x.dim() == 2):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"layer_norm_maxk(): x must be a 2-D tensor [N, F], got {got}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (x.shape[1],):
            raise ValueError(f"layer_norm_maxk(): {name} must have shape [F] = [{x.shape[1]}], got {tuple(p.shape)}")
    if not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= x.shape[1]):
        raise ValueError(f"layer_norm_maxk(): k must be an int in [1, F = {x.shape[1]}], got {k!r}")
    check(x.is_floating_point(), "layer_norm_maxk", f"x must be a floating tensor, got {x.dtype}")
    # under autocast F.layer_norm runs in fp32 (its autocast rule), which the composition keeps
    if (not torch.is_autocast_enabled(x.device.type) and resolve_backend(backend, x) == "triton"
            and _fused_runs(x, k, weight, bias)):
        if compiling():     # the custom op sparsegnn::layer_norm_maxk (``_library``), with its backward op
            values, index, _, _ = torch.ops.sparsegnn.layer_norm_maxk(x, weight, bias, k, float(eps))
        else:
            values, index = _LayerNormMaxK.apply(x, weight, bias, k, float(eps))
        return CBSR(values, index, int(x.shape[1]))
    y = torch.nn.functional.layer_norm(x, (x.shape[1],), weight, bias, eps)
    return maxk(y, k, backend=backend)
