"""Aggregation of CBSR features (MaxK-GNN's forward SpGEMM and backward SSpMM).

``Y = A' X`` with ``X`` given as a :class:`~sparsegnn.formats.cbsr.CBSR` (``k`` entries per
row), ``A' = A`` (sum) or ``D^-1 A`` (mean), weights ``w``:

- forward (SpGEMM): ``Y[i, f] = sum_{e: j -> i} w_e X[j, f]``, where ``X[j, f]`` is nonzero
  only at ``f`` in ``index[j]``: dense ``[N, F]`` output;
- backward (SSpMM): ``dvalues[j, s] = (A'^T dY)[j, index[j, s]]``, the transposed product
  sampled at the kept positions only; ``dw_e = s_i <dY_i, X_j>`` (``s_i = 1`` or ``1/deg_i``).

Backends: ``"triton"`` runs the CBSR kernels where they pay (``forward_schedule``,
``backward_schedule`` give the rules; on a graph invested in, the tuner times the forward
rule's schedule against the other and keeps the faster, ``FORWARD_FAMILY``):
the forward in shared memory through CUDA (``kernels/cbsr_cuda.py``,
CuPy; fp32 values, F <= 256; deterministic), the backward as MaxK-GNN's outer product through
CUDA (each ``dY`` row read once, products reduced into ``dvalues`` with atomics: not
bit-reproducible).  Elsewhere (large k, bf16, no CuPy, deterministic mode, other backends)
both go through the dense product on our SpMM (exact; no bytes saved).  ``dw`` densifies ``X`` (only when the weights
need a gradient).

:func:`cbsr_forward` / :func:`cbsr_backward` hold the computation: the eager autograd.Function
here and the custom ops ``sparsegnn::spmm_cbsr`` / ``spmm_cbsr_backward`` (``_library``, what
``torch.compile`` traces) both call them.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..formats.cbsr import CBSR
from ..graph import Graph
from ..kernels import current_stream_key, triton_available
from ._dispatch import aggregate, aggregate_transposed, choose_backend, spmm_weight_grad
from ..tune.reuse import cuda_syncs_forbidden, invested as reuse_invested, policy as reuse_policy, use as reuse_use
from ..tune.store import stores_generation
from ._triton import SPMM_FAMILY, plan_of, _kernels
from torch.compiler import is_compiling as compiling  # dynamo tracing: the custom ops (``_library``) take over


def _cuda_kernels(values: Tensor, index: Tensor, grad: Optional[Tensor] = None) -> bool:
    """Whether the CUDA kernels of ``kernels/cbsr_cuda.py`` take these operands (fp32, uint8
    columns, CuPy and a GPU)."""
    from ..kernels import cbsr_cuda

    return (values.dtype == torch.float32 and index.dtype == torch.uint8 and values.is_cuda
            and (grad is None or grad.dtype == torch.float32) and cbsr_cuda.available())


#: ``dvalues`` up to this size stays in the H100's 50 MB L2 while the backward's atomics hit it.
_L2_RESIDENT_BYTES = 24 << 20


#: The row-per-warp CUDA kernels run while the heaviest row holds at most this many times the
#: edges a warp gets on average (at least 16): past it they wait on their hub's one warp.
_HUB_RATIO = 16


def _rows_balanced(graph: Graph) -> bool:
    """Whether no row outweighs the rest for a warp-per-row kernel (H100, F = 256, k = 32:
    wikipedia, max degree 3,546 = 88x a warp's share: SpGEMM 0.415 vs dense 0.123 ms; deezer,
    7.8x: 0.040 vs 0.169 ms; the Reddit stand-in ~2x: 6.1 vs 15.0 ms)."""
    from ..kernels import sm_count

    warps = sm_count(graph.rowptr.device) * 64
    return plan_of(graph).max_degree <= _HUB_RATIO * max(graph.num_edges / warps, 16.0)


def _cbsr_kernel_fits(values: Tensor, index: Tensor, num_cols: int, backend: str) -> bool:
    """Whether the SpGEMM is a candidate at all: the Triton backend, operands the CUDA kernel
    takes, and ``4 k <= F`` (past it the kernel loses everywhere measured: ``forward_schedule``)."""
    return backend == "triton" and 4 * values.shape[1] <= num_cols and _cuda_kernels(values, index)


def forward_schedule(values: Tensor, index: Tensor, num_cols: int, backend: str, graph: Optional[Graph] = None) -> str:
    """``"spgemm"`` (the CUDA shared-memory kernel) or ``"dense"`` (our SpMM of the densified
    features).  Reddit stand-in, F = 256, H100: SpGEMM 5.4 / 6.2 / 10.0 / 19.7 ms at k = 8 / 32 /
    64 / 128 against 15.0 ms dense, so the SpGEMM runs while ``4 k <= F``; Triton's atomic
    form (18.1 ms at k = 8) never beat the dense product (removed; ``docs/design/maxk.md``)."""
    fits = _cbsr_kernel_fits(values, index, num_cols, backend)
    return "spgemm" if fits and (graph is None or _rows_balanced(graph)) else "dense"   # None: no hub check


def backward_schedule(values: Tensor, index: Tensor, num_cols: int, grad: Tensor, backend: str,
                      graph: Optional[Graph] = None) -> str:
    """``"outer"`` (the CUDA outer product with atomics) or ``"dense"`` (``A'^T dY`` by our
    SpMM, then the kept entries gathered).  Reddit stand-in, F = 256, H100: outer 2.4 / 6.1 /
    16.1 / 37.0 ms at k = 8 / 32 / 64 / 128 against ~15 ms dense: the atomics run at ~600 G/s
    while ``dvalues`` ([M, k] fp32) stays in L2 and slow down past it (30 MB at k = 32, 60 MB
    at k = 64).  So: outer while ``8 k <= F``, or ``4 k <= F`` with ``dvalues`` L2-sized; dense
    under ``torch.use_deterministic_algorithms(True)`` (atomics add in no fixed order).  A
    Triton gather over the transpose (15.1 / 27.4 ms at k = 8 / 32) never beat the dense
    product there (removed; ``docs/design/maxk.md``)."""
    k = values.shape[1]
    if backend != "triton" or torch.are_deterministic_algorithms_enabled() or not _cuda_kernels(values, index, grad):
        return "dense"
    small = 4 * k <= num_cols and values.shape[0] * k * 4 <= _L2_RESIDENT_BYTES
    return "outer" if (8 * k <= num_cols or small) and (graph is None or _rows_balanced(graph)) else "dense"


#: The tuner's family of the forward's timed schedule choice: ``{"path": i}`` runs
#: ``FORWARD_SCHEDULES[i]`` (the rule's schedule is the first candidate).  Its dense schedule runs
#: the row kernel, so it carries that kernel's version and is made again when it changes (and its
#: own version moves when the dense schedule does: @3 densifies in one pass, a launch fewer).  The
#: backward keeps its rule: timed alone, its dense schedule (the transposed product, then a
#: gather) measured 205 us a call on wikipedia at k = 16 against 154 us for the outer product,
#: yet in the replayed step it runs in ~67 us against 150 us: picked by timing, the step went
#: from 1.51 to 1.77 ms (H200).
FORWARD_FAMILY = "cbsr_fwd@3+" + SPMM_FAMILY
FORWARD_SCHEDULES = ("spgemm", "dense")
_PATH_SPACE = {"path": (0, 1)}
#: A schedule other than the rule's is taken only when it times this much faster: two
#: schedules within noise of each other keep the rule's (its choice does not flip between runs).
_KEEP_RULE = 0.03


def _timed_forward_schedule(rule: str, graph: Graph, values: Tensor, num_cols: int, weight: Optional[Tensor],
                            reduce: str, run, with_self: bool = False) -> str:
    """The rule's forward schedule or the other, whichever the tuner times faster for this
    graph, ``k``, width and reduction (``decide``; GPU time: a MaxK model's step is replayed by
    default; ``warm``: in a step the operands were written by the kernel just before).  The
    stored decision names the schedule, so a class-mate whose rule differs reads it as meant.
    Where nothing can be decided (a graph not invested in, ``SPARSEGNN_INVEST=never``, a
    capture with no stored decision) the rule's schedule runs.

    The rule is fitted on the Reddit stand-in and the H100; whether the SpGEMM beats the dense
    product turns on the graph and the GPU (H200, k = 64 of 256: the dense product wins on
    artist, 1.6M edges, and on cora; the SpGEMM on deezer, ppi, PROTEINS), which a rule
    cannot see."""
    # the SpGEMM needs the graph's plan, built by the rule (``_rows_balanced``): a planned graph
    # counts as invested (``tune.reuse.use``), so the first MaxK aggregation decides here
    if not reuse_invested(graph) and reuse_policy() != "never":
        reuse_use(graph, num_cols, values.element_size())
    order = (rule, "dense" if rule == "spgemm" else "spgemm")
    detail = f"k{values.shape[1]}|{reduce}|w{int(weight is not None)}" + ("|self" if with_self else "")
    config = _kernels().decide(FORWARD_FAMILY, graph, detail, num_cols, values.dtype, values.device,
                               [{"path": FORWARD_SCHEDULES.index(s)} for s in order],
                               lambda cfg: run(FORWARD_SCHEDULES[cfg["path"]]),
                               space=_PATH_SPACE, ranked=False, keep_first=_KEEP_RULE, warm=True)
    return FORWARD_SCHEDULES[config["path"]]


def _kernel_weights(graph: Graph, weight: Optional[Tensor], reduce: str):
    """``(w, s)`` of the CUDA kernels: fp32 edge weights in the graph's CSR order (None for
    ones) and the per-row scale (``1 / deg`` for mean, else None), ``w'_e = w_e s_row(e)``."""
    w = None if weight is None else weight.float()
    return w, (graph.inv_degree(torch.float32) if reduce == "mean" else None)


class _Bound:
    """A CBSR aggregation resolved for one graph and call signature (``k``, width, reduce,
    weights or not, self term or not, dtypes, device, stream, deterministic mode): the forward's
    schedule with its operands prepared (the SpGEMM's plan tensors and kernel weights, or the
    dense product's bound launch, ``_triton.bound_launch``), and the backward's schedule once a
    backward has resolved it.  A repeat eager call runs these instead of deriving them again
    (``forward_schedule``'s checks, the timed decision's lookup, the weights, the dispatch of
    the dense product): on a small graph host time is most of a call (cora, F = 256, k = 32,
    H200 host: a forward 104 us on the full path, 72 us bound; with its backward 289 / 231 us).
    Kept in the graph's ``"cbsr_run"`` slot (``_binding`` gives key and stamp); the full path
    runs its schedule through a fresh one, so both run the same code."""

    __slots__ = ("num_cols", "weight", "reduce", "backend", "fused", "spgemm", "dense", "outer")

    def __init__(self, graph: Graph, schedule: str, values: Tensor, num_cols: int, weight: Optional[Tensor],
                 reduce: str, backend: str, with_self: bool) -> None:
        # the graph itself is not held (its cache holds this): what is needed of it, and the
        # graph passed to ``backward``
        self.num_cols, self.weight, self.reduce, self.backend = num_cols, weight, reduce, backend
        self.spgemm = self.dense = self.outer = None
        self.fused = False
        if schedule == "spgemm":
            from ..kernels import cbsr_cuda

            w, scale = _kernel_weights(graph, weight, reduce)
            self.fused = with_self and scale is None     # a mean's scale would weigh the self term
            plan, rowptr, n = plan_of(graph), graph.rowptr, graph.num_nodes
            self.spgemm = lambda v, i, eps: cbsr_cuda.spgemm_cbsr_cuda(  # noqa: E731
                rowptr, plan.rows_by_degree, plan.col32, w, v, i, n, num_cols, scale, eps)
        else:
            from ._triton import bound_launch

            # the launch for what ``densify`` gives: values' dtype (None until a call has bound one)
            self.dense = bound_launch(graph, values.new_empty((0, num_cols)), weight, reduce)

    def complete(self) -> bool:
        """Whether this form runs without the graph (a launch for its schedule), so it may be kept."""
        return self.spgemm is not None or self.dense is not None

    def forward(self, graph: Graph, values: Tensor, index: Tensor, self_eps: Optional[Tensor]) -> Tensor:
        """``cbsr_forward`` on this schedule: the SpGEMM (the self term inside it for a sum), or the
        densified features by the bound launch (by ``aggregate`` on ``graph`` where none is bound
        yet), the self term added after (``add_kept_``)."""
        if self.spgemm is not None:
            out = self.spgemm(values, index, self_eps if self.fused else None)
            if self_eps is None or self.fused:
                return out
        else:
            x = densify(values, index, self.num_cols)
            out = self.dense(x) if self.dense is not None else aggregate(self.backend, graph, x, self.weight,
                                                                         self.reduce)
            if self_eps is None:
                return out
        return add_kept_(out, values, index, self_eps)

    def backward(self, graph: Graph, grad_out: Tensor, values: Tensor, index: Tensor,
                 self_eps: Optional[Tensor], into: Optional[Tensor] = None) -> Tensor:
        """``dvalues`` of ``cbsr_forward`` (``cbsr_backward``'s), the schedule resolved once per
        gradient dtype and deterministic mode (read when the backward runs): the outer product's
        launch prepared, else the dense formula.  ``into`` (fp32, ``[M, k]``): add the gradient
        into it and return it (the outer product's atomics reduce into it directly)."""
        signature = (grad_out.dtype, torch.are_deterministic_algorithms_enabled())
        if self.outer is None or self.outer[0] != signature:
            self.outer = (signature, self._outer(graph, grad_out, values, index))
        run = self.outer[1]
        if run is not None:
            return run(grad_out, index, self_eps, into)
        out = _dense_grad_values(graph, grad_out, values, index, self.weight, self.reduce, self.backend, self_eps)
        return out if into is None else into.add_(out)

    def _outer(self, graph: Graph, grad_out: Tensor, values: Tensor, index: Tensor):
        if backward_schedule(values, index, self.num_cols, grad_out, self.backend, graph) != "outer":
            return None
        return _outer_launch(graph, self.weight, self.reduce, values.shape[0])


def _binding(graph: Graph, values: Tensor, index: Tensor, num_cols: int, weight: Optional[Tensor], reduce: str,
             backend: str, with_self: bool):
    """``(key, stamp)`` of this call's ``"cbsr_run"`` entry (``_Bound``), or None where none may
    be kept or used: another backend, a transient graph, a CUDA-graph capture or its warm-up
    (decisions there are provisional), weights other than the graph's own (a caller's tensor,
    likely new every call, as ``_triton`` binds no launch to them).  The stamp holds the
    decision stores' generation and the weights' address (the dense launch is bound to it);
    the cache checks their version."""
    device = values.get_device()                       # -1 on the host (the interpreter's launches)
    if backend != "triton" or graph.transient or (device >= 0 and cuda_syncs_forbidden()) or (
            device < 0 and not values.is_cpu) or (weight is not None and weight is not graph.edge_val):
        return None
    key = (values.shape[1], num_cols, reduce, weight is not None, with_self, values.dtype, index.dtype, device,
           current_stream_key(device), torch.are_deterministic_algorithms_enabled())
    return key, (stores_generation(), 0 if weight is None else weight.data_ptr())


def cbsr_forward(graph: Graph, values: Tensor, index: Tensor, num_cols: int, weight: Optional[Tensor], reduce: str,
                 backend: str, self_eps: Optional[Tensor] = None) -> Tensor:
    """``cbsr_forward_bound``'s result (see there), without the bound aggregation."""
    return cbsr_forward_bound(graph, values, index, num_cols, weight, reduce, backend, self_eps)[0]


def cbsr_forward_bound(graph: Graph, values: Tensor, index: Tensor, num_cols: int, weight: Optional[Tensor],
                       reduce: str, backend: str, self_eps: Optional[Tensor] = None) -> Tuple[Tensor, Optional[_Bound]]:
    """``Y = A' X`` for the CBSR ``X = (values, index, num_cols)`` on the ``forward_schedule``
    (the eager autograd.Function and the custom op ``sparsegnn::spmm_cbsr`` both run this);
    with ``self_eps`` GIN's ``Y = A' X + (1 + eps) X`` (square graph): inside the SpGEMM for a
    sum, else one pass over the kept entries after the aggregation (``add_kept_``).

    Returns ``(Y, bound)``: ``bound`` the call's resolved form (``_Bound``), found or made
    here, for its backward and the next call; None where none is kept (``_binding``; a graph
    not invested in, whose schedule is not decided yet).

    Shapes:
        values, index: [M, k]; weight: [E] or None; self_eps: [1] or None -> [N, num_cols].
    """
    binding = _binding(graph, values, index, num_cols, weight, reduce, backend, self_eps is not None)
    if binding is not None and BIND:
        bound = graph.cache.get("cbsr_run", binding[0], values=weight, stamp=binding[1])
        if bound is not None:
            reuse_use(graph, num_cols, values.element_size())      # counted as every call on the graph is
            return bound.forward(graph, values, index, self_eps), bound

    def run(schedule: str) -> Tensor:
        return _Bound(graph, schedule, values, num_cols, weight, reduce, backend,
                      self_eps is not None).forward(graph, values, index, self_eps)

    schedule = forward_schedule(values, index, num_cols, backend, graph)
    settled = True      # the schedule is the one every later call would take
    if _cbsr_kernel_fits(values, index, num_cols, backend):
        schedule = _timed_forward_schedule(schedule, graph, values, num_cols, weight, reduce, run,
                                           self_eps is not None)
        # decided by the tuner only on a graph invested in (else the rule's, untimed): a graph
        # invested by this call's own aggregation below decides on its next call
        settled = reuse_invested(graph)
    out = run(schedule)
    if binding is None or not BIND or not settled or not reuse_invested(graph):
        return out, None
    bound = _Bound(graph, schedule, values, num_cols, weight, reduce, backend, self_eps is not None)
    if not bound.complete():        # no dense launch to keep (``bound_launch`` found none)
        return out, None
    graph.cache.put("cbsr_run", bound, binding[0], values=weight, stamp=binding[1])
    return out, bound


#: Whether eager calls keep and reuse their resolved form (``_Bound``); off: every call takes
#: the full path (for measuring what the bound form saves).
BIND = True


def cbsr_backward(graph: Graph, grad_out: Tensor, values: Tensor, index: Tensor, num_cols: int,
                  weight: Optional[Tensor], reduce: str, backend: str, need_values: bool,
                  need_weight: bool, self_eps: Optional[Tensor] = None, bound: Optional[_Bound] = None,
                  into: Optional[Tensor] = None) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``(dvalues, dw)`` of :func:`cbsr_forward` for the upstream gradient ``dY`` (module doc):
    ``dvalues[j, s] = (A'^T dY)[j, index[j, s]]`` on the ``backward_schedule`` (with
    ``self_eps``: ``+ (1 + eps) dY[j, index[j, s]]``, in the same kernel), ``dw_e =
    s_i <dY_i, X_j>``; None for a gradient not asked for (``need_values`` / ``need_weight``;
    ``dw`` also without weight).  ``bound``: the forward's resolved form (``_Bound``), whose
    backward schedule is resolved once.  ``into``: a contiguous fp32 ``[M, k]`` tensor
    ``dvalues`` is added into and returned as (the outer product reduces into it directly).

    Shapes:
        grad_out: [N, num_cols] contiguous; values, index: [M, k]; weight: [E] or None;
        self_eps: [1] or None -> dvalues [M, k] of values' dtype, dw [E] of weight's dtype.
    """
    grad_values = grad_weight = None
    if need_values and bound is not None:
        grad_values = bound.backward(graph, grad_out, values, index, self_eps, into)
    elif need_values and backward_schedule(values, index, num_cols, grad_out, backend, graph) == "outer":
        grad_values = _outer_launch(graph, weight, reduce, values.shape[0])(grad_out, index, self_eps, into)
    elif need_values:
        grad_values = _dense_grad_values(graph, grad_out, values, index, weight, reduce, backend, self_eps)
        grad_values = grad_values if into is None else into.add_(grad_values)
    if weight is not None and need_weight:
        x = densify(values, index, num_cols)
        grad_weight = spmm_weight_grad(backend, graph, grad_out, x.to(grad_out.dtype), 0, reduce).to(weight.dtype)
    return grad_values, grad_weight


def _outer_launch(graph: Graph, weight: Optional[Tensor], reduce: str, num_src: int):
    """``run(grad_out, index, self_eps, into=None) -> dvalues`` by the CUDA outer product
    (``"outer"`` schedule; reduced into ``into`` where given), its graph operands and kernel
    weights resolved now; a mean's self term is added after it (the kernel's scale would weigh
    it by ``1 / deg``)."""
    from ..kernels import cbsr_cuda

    w, scale = _kernel_weights(graph, weight, reduce)
    plan, rowptr = plan_of(graph), graph.rowptr     # not the graph: a bound form keeps this (``_Bound``)

    def run(grad_out: Tensor, index: Tensor, self_eps: Optional[Tensor], into: Optional[Tensor] = None) -> Tensor:
        fused = self_eps is not None and scale is None
        grad_values = cbsr_cuda.sspmm_cbsr_cuda(rowptr, plan.rows_by_degree, plan.col32, w, grad_out, index,
                                                num_src, scale, self_eps if fused else None, out=into)
        if self_eps is not None and not fused:
            grad_values += gather_kept(grad_out, index, grad_values.dtype) * (1 + self_eps.to(grad_values.dtype))
        return grad_values
    return run


def _dense_grad_values(graph: Graph, grad_out: Tensor, values: Tensor, index: Tensor, weight: Optional[Tensor],
                       reduce: str, backend: str, self_eps: Optional[Tensor]) -> Tensor:
    """``dvalues`` by the dense formula: ``A'^T dY`` by our SpMM, sampled at the kept entries
    (with ``self_eps``, ``+ (1 + eps) dY`` sampled in the same pass)."""
    dense = aggregate_transposed(backend, graph, grad_out, weight, reduce)
    return gather_kept(dense, index, values.dtype, also=None if self_eps is None else grad_out, eps=self_eps)


class _CBSRSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: Graph, values: Tensor, index: Tensor, num_cols: int, weight: Optional[Tensor],
                reduce: str, backend: str, self_eps: Optional[Tensor]) -> Tensor:
        ctx.graph, ctx.reduce, ctx.backend = graph, reduce, backend
        ctx.save_for_backward(values, index, weight, self_eps)
        ctx.num_cols = num_cols
        out, ctx.bound = cbsr_forward_bound(graph, values, index, num_cols, weight, reduce, backend, self_eps)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        values, index, weight, self_eps = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_values, grad_weight = cbsr_backward(ctx.graph, grad_out, values, index, ctx.num_cols, weight,
                                                 ctx.reduce, ctx.backend, ctx.needs_input_grad[1],
                                                 ctx.needs_input_grad[4], self_eps, ctx.bound)
        grad_eps = None
        if self_eps is not None and ctx.needs_input_grad[7]:    # d eps = sum_{i, s} values[i, s] dY[i, index[i, s]]
            wide = torch.promote_types(torch.promote_types(grad_out.dtype, values.dtype), torch.float32)
            kept = gather_kept(grad_out, index, wide)
            grad_eps = (kept * values.to(wide)).sum().reshape(self_eps.shape).to(self_eps.dtype)
        return None, grad_values, None, None, grad_weight, None, None, grad_eps


def spmm_cbsr(graph: Graph, x: CBSR, weight: Optional[Tensor], reduce: str, backend: str,
              self_eps: Optional[Tensor] = None) -> Tensor:
    """``A' x`` for CBSR features (module doc); with ``self_eps`` GIN's ``A' x + (1 + eps) x``
    (a square graph); differentiable in ``x.values``, ``weight`` and ``self_eps``.

    Shapes:
        x: CBSR of [M, F] (k per row); weight: [E] or None; self_eps: [1] or None -> [N, F].
    """
    return _CBSRSpMM.apply(graph, x.values, x.index, x.num_cols, weight, reduce, backend, self_eps)


def densify(values: Tensor, index: Tensor, num_cols: int) -> Tensor:
    """The dense ``[N, num_cols]`` matrix of a CBSR, not differentiable (for backward formulas):
    one pass of the CUDA kernel for fp32 / uint8 CUDA tensors, else ``CBSR.to_dense``.

    Shapes:
        values, index: [N, k] -> [N, num_cols].
    """
    if not compiling() and _cuda_kernels(values, index):
        from ..kernels import cbsr_cuda

        return cbsr_cuda.densify_cuda(values, index, num_cols)
    return CBSR(values, index, num_cols).to_dense()


#: Result dtypes whose self-term sums the Triton passes form (in fp32); float64 stays with torch (exact).
_TRITON_SUMS = (torch.float32, torch.float16, torch.bfloat16)


def gather_kept(dense: Tensor, index: Tensor, dtype: torch.dtype, also: Optional[Tensor] = None,
                eps: Optional[Tensor] = None) -> Tensor:
    """``dense`` at the kept columns of a CBSR, in ``dtype``: ``out[i, s] = dense[i, index[i, s]]``
    (the backward formulas' sampling; with ``also`` and ``eps``, GIN's self term: ``+ (1 + eps)
    also[i, index[i, s]]``), one Triton pass on CUDA (``kernels.maxk.gather_kept``: the columns
    read as stored, no int64 copy; a cast only where the dtypes differ; the self term's sum in
    fp32, so float64 takes torch), else ``torch.gather``.

    Shapes:
        dense, also: [N, F]; index: [N, k]; eps: [1] -> [N, k].
    """
    if (not compiling() and dense.is_cuda and dense.dim() == 2 and triton_available()
            and (also is None or dense.dtype in _TRITON_SUMS)):
        from ..kernels.maxk import gather_kept as gather_kernel

        return gather_kernel(dense, index, dtype, also, eps)
    cols = index.long()
    out = dense.gather(1, cols)
    if also is not None:
        out = out + (1 + eps) * also.gather(1, cols)
    return out.to(dtype)


def add_kept_(out: Tensor, values: Tensor, index: Tensor, eps: Tensor) -> Tensor:
    """GIN's self term from a CBSR, in place: ``out[i, index[i, s]] += (1 + eps) values[i, s]``;
    one Triton pass on CUDA for fp32 / fp16 / bf16 ``out`` (``kernels.maxk.add_kept_``, fp32 sums),
    else ``scatter_add_`` (float64 exact).  Returns ``out``.

    Shapes:
        out: [N, F]; values, index: [N, k]; eps: [1] -> out.
    """
    if not compiling() and out.is_cuda and out.dim() == 2 and triton_available() and out.dtype in _TRITON_SUMS:
        from ..kernels.maxk import add_kept_ as add_kernel

        return add_kernel(out, values, index, eps)
    return out.scatter_add_(1, index.long(), (values * (1 + eps)).to(out.dtype))


def root_schedule(values: Tensor, index: Tensor, weight: Tensor, backend: str) -> str:
    """``"cuda"`` (``kernels/cbsr_cuda.py: cbsr_root*``: ``k`` multiply-adds per output from a
    shared-memory tile of ``W^T``) or ``"dense"`` (``X.to_dense() W^T`` by cuBLAS).  The CUDA
    form pays while ``4 k <= F_in`` (it reads a 512-byte tile row per kept entry from shared
    memory; the dense GEMM does ``F_in`` multiply-adds per output at the SIMT fp32 rate);
    fp32, ``F_out % 4 == 0``; dense under ``torch.use_deterministic_algorithms(True)`` when more
    than two column tiles would add into one entry of the gradient."""
    from ..kernels import cbsr_cuda

    f_out, f_in = weight.shape
    if backend != "triton" or not _cuda_kernels(values, index) or weight.dtype != torch.float32:
        return "dense"
    if f_out % 4 or 4 * values.shape[1] > f_in or f_in > 256:
        return "dense"
    tiles = (f_out + cbsr_cuda.ROOT_TILE - 1) // cbsr_cuda.ROOT_TILE
    if tiles > 2 and torch.are_deterministic_algorithms_enabled():
        return "dense"
    return "cuda"


def linear_forward(values: Tensor, index: Tensor, num_cols: int, weight: Tensor, bias: Optional[Tensor],
                   backend: str) -> Tensor:
    """``X W^T + b`` for the CBSR ``X`` on the ``root_schedule`` of the resolved ``backend``: the
    CUDA kernel, or the densified ``X`` through cuBLAS (what the custom op ``sparsegnn::cbsr_linear``
    runs; not differentiable itself).

    Shapes:
        values, index: [N, k]; weight: [F_out, num_cols]; bias: [F_out] or None -> [N, F_out].
    """
    cuda = root_schedule(values, index, weight, backend) == "cuda"
    return _root_forward(values, index, num_cols, weight, bias, cuda)[0]


def _root_forward(values: Tensor, index: Tensor, num_cols: int, weight: Tensor, bias: Optional[Tensor],
                  cuda: bool) -> Tuple[Tensor, Tensor]:
    """``(X W^T + b, W^T)`` by the CUDA root kernel (``cuda``; ``W^T`` made contiguous for it) or
    by cuBLAS on the densified ``X`` (``W^T`` a view); ``W^T`` is what ``linear_backward`` takes.
    Not differentiable (the operands are read detached).

    Shapes:
        values, index: [N, k]; weight: [F_out, num_cols]; bias: [F_out] or None -> [N, F_out], [num_cols, F_out].
    """
    weight_t, b = weight.detach().t(), None if bias is None else bias.detach()
    if cuda:
        from ..kernels import cbsr_cuda

        weight_t = weight_t.contiguous()
        return cbsr_cuda.cbsr_root_cuda(values.detach(), index, weight_t, b), weight_t
    return torch.nn.functional.linear(densify(values.detach(), index, num_cols), weight.detach(), b), weight_t


def linear_backward(grad_out: Tensor, values: Tensor, index: Tensor, num_cols: int, weight_t: Tensor, cuda: bool,
                    need_values: bool, need_weight: bool,
                    need_bias: bool) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """``(dvalues, dW, db)`` of ``X W^T + b`` (None where not needed): ``dvalues = (dY W)`` at the
    kept entries (the CUDA kernel with ``cuda``, which also sums ``db`` from the same read of
    ``dY``; else cuBLAS and a gather), ``dW = dY^T X``, ``db = sum_i dY_i``.

    Shapes:
        grad_out: [N, F_out]; values, index: [N, k]; weight_t: [num_cols, F_out] (= W^T) ->
        [N, k], [F_out, num_cols], [F_out].
    """
    grad_out = grad_out.contiguous()
    grad_values = grad_weight = grad_bias = None
    if need_values and cuda:
        from ..kernels import cbsr_cuda

        grad_values, grad_bias = cbsr_cuda.cbsr_root_grad_cuda(grad_out, index, weight_t.contiguous(),
                                                               bias_grad=need_bias)
    elif need_values:
        grad_values = gather_kept(grad_out.mm(weight_t.t()), index, values.dtype)
    if need_weight:
        grad_weight = grad_out.t().mm(densify(values, index, num_cols))
    if need_bias and grad_bias is None:
        grad_bias = grad_out.sum(0)
    return grad_values, grad_weight, grad_bias


class _CBSRLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: Tensor, index: Tensor, num_cols: int, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        out, weight_t = _root_forward(values, index, num_cols, weight, bias, True)
        ctx.save_for_backward(values, index, weight_t)
        ctx.num_cols, ctx.has_bias = num_cols, bias is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        values, index, weight_t = ctx.saved_tensors
        grad_values, grad_weight, grad_bias = linear_backward(
            grad_out, values, index, ctx.num_cols, weight_t, True, ctx.needs_input_grad[0], ctx.needs_input_grad[3],
            ctx.has_bias and ctx.needs_input_grad[4])
        return grad_values, None, None, grad_weight, grad_bias


def cbsr_linear(x: CBSR, weight: Tensor, bias: Optional[Tensor] = None, backend: str = "auto") -> Tensor:
    r"""The linear map of CBSR features, :math:`X W^\top + b` with :math:`X` = ``x.to_dense()``:
    ``out[i, o] = b[o] + sum_s values[i, s] W[o, index[i, s]]``, ``k`` multiply-adds per output
    instead of ``F_in`` (MaxK's sparsity in a root / self term).  Differentiable in ``values``
    (``dvalues[i, s] = (dY W)[i, index[i, s]]``, sampled), ``weight`` (``dY^T X``) and ``bias``.

    Backends: ``"triton"`` (``"auto"`` on CUDA) takes the CUDA kernels where ``root_schedule``
    says they pay; otherwise the dense ``F.linear(x.to_dense(), W, b)``.  Under ``torch.compile``
    the custom op ``sparsegnn::cbsr_linear`` makes the same choice at run time.

    Shapes:
        x: CBSR of [N, F_in] (k per row); weight: [F_out, F_in]; bias: [F_out] or None -> [N, F_out].
    """
    fn = "cbsr_linear"
    if not isinstance(x, CBSR):
        raise ValueError(f"{fn}(): x must be a CBSR, got {type(x).__name__}")
    if not (isinstance(weight, Tensor) and weight.dim() == 2 and weight.shape[1] == x.num_cols):
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"{fn}(): weight must be [F_out, {x.num_cols}], got {got}")
    if bias is not None and not (isinstance(bias, Tensor) and tuple(bias.shape) == (weight.shape[0],)):
        raise ValueError(f"{fn}(): bias must be [{weight.shape[0]}], got {tuple(getattr(bias, 'shape', ()))}")
    if compiling():
        return torch.ops.sparsegnn.cbsr_linear(x.values, x.index, x.num_cols, weight, bias, backend)
    chosen = choose_backend(fn, backend, x.values)
    if root_schedule(x.values, x.index, weight, chosen) == "cuda":
        return _CBSRLinear.apply(x.values, x.index, x.num_cols, weight, bias)
    return torch.nn.functional.linear(x.to_dense(), weight, bias)



class _SAGECBSR(torch.autograd.Function):
    """``A' X W_l^T + X W_r^T + b`` for CBSR ``X`` as one autograd node (see :func:`sage_cbsr`)."""

    @staticmethod
    def forward(ctx, graph: Graph, values: Tensor, index: Tensor, num_cols: int, reduce: str, backend: str,
                weight_l: Tensor, bias: Optional[Tensor], weight_r: Tensor) -> Tensor:
        agg, bound = cbsr_forward_bound(graph, values, index, num_cols, graph.edge_val, reduce, backend)
        cuda = root_schedule(values, index, weight_r, backend) == "cuda"
        out, weight_rt = _root_forward(values, index, num_cols, weight_r, bias, cuda)
        out.addmm_(agg, weight_l.detach().t())
        # the edge values saved too: an in-place change before the backward raises, as it does
        # for the composition this node replaces
        ctx.save_for_backward(values, index, agg, weight_l, weight_rt, graph.edge_val)
        ctx.graph, ctx.bound, ctx.num_cols, ctx.reduce, ctx.backend = graph, bound, num_cols, reduce, backend
        ctx.cuda, ctx.has_bias = cuda, bias is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        values, index, agg, weight_l, weight_rt, edge_val = ctx.saved_tensors
        need_values, need_l, need_r = ctx.needs_input_grad[1], ctx.needs_input_grad[6], ctx.needs_input_grad[8]
        grad_out = grad_out.contiguous()
        # the root term's gradients (on CUDA: dvalues written, not added, and the bias's sum in the
        # same launch), then the aggregation's dvalues added into them
        grad_values, grad_r, grad_bias = linear_backward(grad_out, values, index, ctx.num_cols, weight_rt, ctx.cuda,
                                                         need_values, need_r, ctx.has_bias and ctx.needs_input_grad[7])
        if need_values:
            grad_agg = grad_out.mm(weight_l.detach())
            # fp32: the outer product's atomics reduce straight into grad_values (no second tensor, no add)
            into = grad_values if grad_values.dtype == torch.float32 and grad_values.is_contiguous() else None
            agg_values = cbsr_backward(ctx.graph, grad_agg, values, index, ctx.num_cols, edge_val, ctx.reduce,
                                       ctx.backend, True, False, bound=ctx.bound, into=into)[0]
            grad_values = agg_values if into is not None else grad_values + agg_values
        grad_l = grad_out.t().mm(agg) if need_l else None
        return None, grad_values, None, None, None, None, grad_l, grad_bias, grad_r

