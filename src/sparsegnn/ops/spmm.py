"""Sparse-dense matrix product (neighbour aggregation) with autograd.

``spmm(graph, x, reduce)[i] = reduce_{e: j -> i} w_e * x_j``

- ``sum``:  ``sum_e w_e x_j``
- ``mean``: ``(1 / deg_i) sum_e w_e x_j`` with ``deg_i`` the number of stored incoming edges
- ``max``:  feature-wise ``max_e w_e x_j``

Rows without incoming edges give zeros for every reduce.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch._C import _are_functorch_transforms_active
from torch._C._functorch import is_functorch_wrapped_tensor as _wrapped
from torch.autograd.function import once_differentiable

from .._checks import check, check_edge_values, check_node_features, check_precision, check_same_device
from ..formats.cbsr import CBSR
from ..graph import Graph, as_graph
from ..tune.reuse import invested, syncs_forbidden
from ..tune.store import stores_generation
from . import _cpu
from ._dispatch import BACKENDS, aggregate, aggregate_transposed, choose_backend, spmm_max_backward, spmm_weight_grad
from ._triton import aggregate as _triton_aggregate, bound_call as _bound_call
from ._library import compiling, not_traceable_graph

REDUCES = ("sum", "mean", "max")


def _precise_pick(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, precision: str) -> dict:
    from .tiles import precise_pick

    return precise_pick(graph, x, weight, reduce, precision)


def _tensor_core_spmm(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, precision: str,
                      config: Optional[dict] = None) -> Tensor:
    """Sum / mean at ``precision`` (``ops.tiles.spmm_precise``: the tuner's reduced pick;
    ``config``: the forward's, made already); mean as weights ``w / deg``."""
    from ._common import mean_weights
    from .tiles import spmm_precise

    if reduce == "mean":
        weight = mean_weights(graph, weight)
    return spmm_precise(graph, x, weight, precision, config)


class _SpMMLinear(torch.autograd.Function):
    """``Y = A X`` (sum) or ``Y = D^-1 A X`` (mean) with ``A_ij = w_e``.

    Backward: ``dX = A'^T dY`` on the cached transpose (``A'`` = the effective, scaled weights),
    ``dw_e = s_i <dY_i, X_j>`` with ``s_i = 1`` (sum) or ``1 / deg_i`` (mean).
    """

    @staticmethod
    def forward(ctx, graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, backend: str) -> Tensor:
        ctx.graph, ctx.reduce, ctx.backend = graph, reduce, backend
        ctx.save_for_backward(x, weight)
        return aggregate(backend, graph, x, weight, reduce)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        x, weight = ctx.saved_tensors
        graph, reduce, backend = ctx.graph, ctx.reduce, ctx.backend
        grad_x = grad_w = None
        grad_out = grad_out.contiguous()
        if ctx.needs_input_grad[1]:
            grad_x = aggregate_transposed(backend, graph, grad_out, weight, reduce)
        if weight is not None and ctx.needs_input_grad[2]:
            heads = weight.shape[1] if weight.dim() == 2 else 0
            grad_w = spmm_weight_grad(backend, graph, grad_out, x.to(grad_out.dtype), heads, reduce).to(weight.dtype)
        return None, grad_x, grad_w, None, None


class _SpMMMax(torch.autograd.Function):
    """Feature-wise max; the gradient flows to the first edge attaining each maximum (on the CPU
    backend the forward saves those edges; elsewhere the backward finds them)."""

    @staticmethod
    def forward(ctx, graph: Graph, x: Tensor, weight: Optional[Tensor], backend: str) -> Tensor:
        arg = None
        if backend == "cpu":
            out, arg = _cpu.max_with_arg(graph, x, weight)
        else:
            out = aggregate(backend, graph, x, weight, reduce="max")
        ctx.graph, ctx.backend, ctx.arg = graph, backend, arg
        ctx.save_for_backward(x, weight, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        x, weight, out = ctx.saved_tensors
        grad_x, grad_w = spmm_max_backward(ctx.graph, grad_out, x, weight, out, ctx.backend, arg=ctx.arg,
                                           need_weight=ctx.needs_input_grad[2])
        return (None, grad_x if ctx.needs_input_grad[1] else None,
                grad_w if ctx.needs_input_grad[2] else None, None)


#: ``spmm_detail(weight, reduce)`` for [E] or no values (the hot path's keys).
_OWN_DETAIL = {(reduce, with_values): f"{reduce}|val{int(with_values)}|h0" for reduce in ("sum", "mean")
               for with_values in (False, True)}


def _call_key(reduce: str, backend: str, precision: str, x: Tensor, weight: Optional[Tensor]):
    """The signature of a call whose checks depend on nothing else: reduce, backend, precision,
    the features' dtype / dims / rows / device, and an explicit weight's dtype, length and device
    (None: the graph's own values); at a reduced precision also the feature width."""
    w = None if weight is None else (weight.dtype, weight.shape[0], weight.device)
    if precision != "ieee":     # a precision's pick is made per feature width
        return (reduce, backend, precision, x.dtype, x.dim(), x.shape[0], x.device, w, x.shape[-1])
    return (reduce, backend, precision, x.dtype, x.dim(), x.shape[0], x.device, w)


def _aggregate(backend: str, graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str) -> Tensor:
    if backend == "triton":     # the hot path: ``_dispatch.aggregate`` without its module lookup
        return _triton_aggregate(graph, x, weight, reduce)
    if backend == "cpu":
        return _cpu.aggregate_variant(graph, x, weight, reduce, _OWN_DETAIL[reduce, weight is not None])
    return aggregate(backend, graph, x, weight, reduce)


def _memoised_linear(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, backend: str) -> Tensor:
    """``spmm(graph, x, reduce, edge_weight=weight)`` (sum or mean; ``weight`` [E] in graph order,
    or None for the graph's values) for a signature whose checks passed before (``spmm``
    memoises it on the graph with the backend they chose): the autograd node only when a
    gradient is needed.  CPU, Cora F = 16 with a gradient for x: 24.0 -> 19.5 us."""
    if weight is None:
        weight = graph.edge_val
    if torch.is_grad_enabled():
        lean = not (_are_functorch_transforms_active() or _wrapped(x) or (weight is not None and _wrapped(weight)))
        if weight is not None and weight.requires_grad:
            return (_LINEAR_APPLY if lean else _SpMMLinear.apply)(graph, x, weight, reduce, backend)
        if x.requires_grad:
            return (_X_APPLY if lean else _SpMMX.apply)(x, weight, graph, reduce, backend)
    return _aggregate(backend, graph, x, weight, reduce)


class _SpMMX(torch.autograd.Function):
    """``_SpMMLinear`` for the memoised path when only ``x`` needs a gradient: fewer inputs, one
    context attribute (``(graph, reduce, backend, weight, weight's version)``: 0.3 us less than
    four attributes and ``save_for_backward``).  The values are not a saved tensor, so the
    backward checks their version itself: an in-place change of them before the backward
    raises as autograd's own check does.  Backward: ``dX = A'^T dY``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Optional[Tensor], graph: Graph, reduce: str, backend: str) -> Tensor:
        ctx.state = (graph, reduce, backend, weight, None if weight is None else weight._version)
        return _aggregate(backend, graph, x, weight, reduce)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        graph, reduce, backend, weight, version = ctx.state
        if weight is not None and weight._version != version:
            raise RuntimeError(
                "spmm(): one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: the edge values [{weight.shape[0]}] are at version {weight._version}; expected version "
                f"{version} instead")
        grad_x = aggregate_transposed(backend, graph, grad_out.contiguous(), weight, reduce)
        return grad_x, None, None, None, None


# ``Function.apply`` without its Python layer (default-argument binding, functorch's dead-wrapper
# unwrapping), for calls with no functorch transform active and no functorch-wrapped tensor,
# where that layer does nothing: the C++ ``_FunctionBase.apply``.  CPU, Cora F = 16: 15.2 -> 13.6 us.
_X_APPLY = super(torch.autograd.Function, _SpMMX).apply
_LINEAR_APPLY = super(torch.autograd.Function, _SpMMLinear).apply


def _weight_in_graph_order(graph: Graph, edge_weight: Optional[Tensor], input_order: bool, fn: str,
                           max_dim: int) -> Optional[Tensor]:
    """The caller's ``edge_weight`` checked and in ``graph``'s edge order (``input_order``: it
    came in the caller's ``edge_index`` order), else the graph's own values."""
    if edge_weight is None:
        return graph.edge_val
    check_edge_values(edge_weight, graph.num_edges, fn, "edge_weight", max_dim=max_dim)
    return graph.to_graph_order(edge_weight) if input_order else edge_weight


def _spmm_of_cbsr(graph, x: CBSR, reduce: str, edge_weight: Optional[Tensor], backend: str, precision: str,
                  self_eps: Optional[Tensor] = None) -> Tensor:
    """``spmm`` of CBSR features: sum / mean, exact (``ops.cbsr``; the custom op
    ``sparsegnn::spmm_cbsr`` under torch.compile); ``self_eps``: ``+ (1 + eps) x`` (``gin_aggregate``)."""
    from .cbsr import spmm_cbsr

    fn = "spmm"
    check(reduce in ("sum", "mean"), fn, f"CBSR features support reduce='sum' or 'mean', got {reduce!r}")
    check(precision == "ieee", fn, f"CBSR features are aggregated exactly (precision='ieee'), got {precision!r}")
    if isinstance(graph, Graph):
        input_order = False
    else:
        if compiling():
            raise not_traceable_graph(fn, graph)
        graph, input_order = as_graph(graph, fn, num_nodes=x.shape[0], per_edge=edge_weight is not None)
    if x.shape[0] != graph.num_src:     # the message on failure only (a symbolic shape cannot be formatted)
        raise ValueError(f"{fn}(): x has {x.shape[0]} rows, the graph {graph.num_src} source nodes")
    if self_eps is not None and (x.shape[0] != graph.num_nodes or self_eps.numel() != 1):
        raise ValueError(f"{fn}(): the self term (1 + eps) x needs one row of x per target node ({graph.num_nodes}, "
                         f"got {x.shape[0]}) and a one-element eps (got {tuple(self_eps.shape)})")
    edge_weight = _weight_in_graph_order(graph, edge_weight, input_order, fn, max_dim=1)
    if compiling():  # the custom op: graph tensors stay out of the traced program (devices checked there)
        check(backend in BACKENDS, fn, f"backend must be one of {BACKENDS}, got {backend!r}")
        out = torch.ops.sparsegnn.spmm_cbsr(x.values, x.index, x.num_cols, edge_weight, graph.key, reduce, backend)
        if self_eps is None:
            return out
        return out.scatter_add(1, x.long_index(), (x.values * (1 + self_eps)).to(out.dtype))
    check_same_device(fn, graph=graph.rowptr, x=x.values, edge_weight=edge_weight, eps=self_eps)
    return spmm_cbsr(graph, x, edge_weight, reduce, choose_backend(fn, backend, x.values), self_eps)


def gin_aggregate(graph, x, eps: Tensor, backend: str = "auto") -> Tensor:
    r"""GIN's aggregation :math:`(1 + \epsilon) x_i + \sum_{j \to i} w_{ji} x_j` (the graph's own
    edge values, or ones).  For CBSR features (MaxK) the self term is added inside the
    aggregation: in the CUDA SpGEMM's accumulator and the outer-product backward, else one pass
    over the kept entries, where ``spmm(...).scatter_add_(1, index.long(), (1 + eps) values)``
    takes three launches forward and three back (the int64 columns, the product, the scatter;
    their gathers and a sum of two gradients).  ``eps`` may need a gradient.

    Shapes:
        x: [N, F] or CBSR of [N, F]; eps: [1] -> [N, F].
    """
    if isinstance(x, CBSR):
        return _spmm_of_cbsr(graph, x, "sum", None, backend, "ieee", self_eps=eps)
    return spmm(graph, x, reduce="sum", backend=backend) + (1 + eps) * x


def spmm(
    graph,
    x: Tensor,
    reduce: str = "sum",
    edge_weight: Optional[Tensor] = None,
    backend: str = "auto",
    precision: str = "ieee",
) -> Tensor:
    """Aggregate neighbour features: ``out[i] = reduce_{j -> i} w_ji * x[j]``.

    Args:
        graph: a :class:`Graph`, a PyG ``edge_index`` ([2, E], row 0 = source) or a square
            torch sparse tensor (``A[i, j]`` = weight of ``j -> i``).
        x: node features: a tensor, or a :class:`~sparsegnn.CBSR` (``k`` kept entries per row, as
            :func:`~sparsegnn.maxk` returns: MaxK-GNN's SpGEMM, gradients to the kept entries).
        reduce: ``"sum"``, ``"mean"`` or ``"max"``.
        edge_weight: per-edge weights overriding the graph's ``edge_val`` (Graph order for a
            Graph, the caller's order for an ``edge_index``). Differentiable.  ``[E, H]`` with
            ``x`` of shape ``[N, H, C]`` (or ``[N, H * C]``) weights each head separately, all
            heads in one kernel launch (GAT).
        backend: ``"auto"`` (Triton on CUDA, reference elsewhere), ``"reference"``, ``"triton"``.
        precision: ``"ieee"`` (default: exact fp32 arithmetic), ``"tf32"`` or ``"bf16"``: a
            permission, never a penalty.  A sum or mean with the Triton backend on a graph
            invested in (``tune.reuse``) runs on the fastest of the exact call and the kernels
            at that precision (``ops.tiles.spmm_precise``), timed as eager calls make them:
            tensor cores over the graph's condensed tiles, the row kernel on features packed to
            fp16 with a scale per row (11 significant bits, as tf32, for entries above 2^-29 of
            their row's largest magnitude; an error of at most 2^-40 of it below:
            ``kernels/pack.py``) or, ``"bf16"``, rounded to bfloat16 (half the bytes gathered).  A reduced kernel must beat the exact call by 10 %.  Elsewhere (a graph
            met too few times, CPU, max, multi-head) the result is exact.

    Returns:
        Aggregated features of ``x``'s dtype (fp32 accumulation for half types).

    Shapes:
        x: [N, F]; edge_weight: [E] -> [N, F].  Multi-head: x [N, H, C]; edge_weight [E, H] -> [N, H, C].

    Example:
        >>> ei = torch.tensor([[0, 1], [2, 2]])             # 0->2, 1->2
        >>> spmm(ei, torch.tensor([[1.0], [2.0], [5.0]])).tolist()
        [[0.0], [0.0], [3.0]]
    """
    fn = "spmm"
    given = edge_weight
    if (given is None and isinstance(graph, Graph) and isinstance(x, Tensor)
            and (backend == "triton" or (backend == "auto" and x.is_cuda)) and not compiling()):
        out = _bound_call(graph, x, reduce, precision)   # an eager no-grad call on an invested graph
        if out is not None:
            return out
    if isinstance(x, Tensor) and isinstance(graph, Graph) and (
            given is None or (isinstance(given, Tensor) and given.dim() == 1)):
        memo = graph.cache.get("call", _call_key(reduce, backend, precision, x, given))
        if memo is not None and not compiling():
            if memo.__class__ is str:
                return _memoised_linear(graph, x, given, reduce, memo)
            kind, value, generation = memo      # a precision's pick (else: decided again below)
            if kind == "until invested":
                if not invested(graph):
                    return _memoised_linear(graph, x, given, reduce, value)
            elif generation == stores_generation():
                if kind == "precise":
                    return _tensor_core_spmm(graph, x, graph.edge_val if given is None else given, reduce,
                                             precision, value)
                if given is None and value == "triton":   # the exact call's launch, under this precision's key
                    out = _bound_call(graph, x, reduce, precision, alias_of=generation)
                    if out is not None:
                        return out
                return _memoised_linear(graph, x, given, reduce, value)
    if isinstance(x, CBSR):
        return _spmm_of_cbsr(graph, x, reduce, edge_weight, backend, precision)
    if isinstance(x, Tensor) and x.dim() == 3:  # multi-head: x [N, H, C] with edge_weight [E, H]
        if edge_weight is None or edge_weight.dim() != 2 or edge_weight.shape[1] != x.shape[1]:
            raise ValueError(f"{fn}(): x of shape [N, H, C] needs edge_weight of shape [E, H={x.shape[1]}], got "
                             f"{None if edge_weight is None else tuple(edge_weight.shape)}")
        check(reduce == "sum", fn, "multi-head aggregation supports reduce='sum'")
        heads, channels = x.shape[1], x.shape[2]
        out = spmm(graph, x.reshape(x.shape[0], heads * channels), reduce, edge_weight, backend)
        return out.view(-1, heads, channels)
    if isinstance(graph, Graph):
        input_order = False
    else:
        if compiling():
            raise not_traceable_graph(fn, graph)
        check(isinstance(x, Tensor) and x.dim() == 2, fn,
              f"x must be a 2-D tensor [num_nodes, features], got {getattr(x, 'shape', type(x).__name__)}")
        graph, input_order = as_graph(graph, fn, num_nodes=x.shape[0], per_edge=edge_weight is not None)
    check_node_features(x, graph.num_src, fn, sources=graph.is_bipartite)
    if reduce not in REDUCES:
        raise ValueError(f"{fn}(): reduce must be one of {REDUCES}, got {reduce!r}")
    edge_weight = _weight_in_graph_order(graph, edge_weight, input_order, fn, max_dim=2)
    if edge_weight is not None and edge_weight.dim() == 2:
        if x.shape[1] % edge_weight.shape[1] != 0:
            raise ValueError(f"{fn}(): edge_weight [E, H] needs a feature width divisible by H, "
                             f"got F={x.shape[1]}, H={edge_weight.shape[1]}")
        if reduce == "max":
            raise ValueError(f"{fn}(): reduce='max' takes edge_weight of shape [E], got {tuple(edge_weight.shape)}")
    check_precision(fn, precision)
    reduced = precision != "ieee" and reduce in ("sum", "mean") and (edge_weight is None or edge_weight.dim() == 1)
    if compiling():  # the custom op: graph tensors stay out of the traced program (devices checked there)
        if backend not in BACKENDS:
            raise ValueError(f"{fn}(): backend must be one of {BACKENDS}, got {backend!r}")
        if reduced:
            return torch.ops.sparsegnn.spmm_precise(x, edge_weight, graph.key, reduce, precision, False, backend)
        return torch.ops.sparsegnn.spmm(x, edge_weight, graph.key, reduce, backend)
    check_same_device(fn, graph=graph.rowptr, x=x, edge_weight=edge_weight)
    chosen = choose_backend(fn, backend, x)
    # this call's checks hold for every call with the same signature: the next one skips them
    memoised = chosen in ("cpu", "triton") and input_order is False and reduce != "max" \
        and not graph.transient and (given is None or given.dim() == 1)
    memo = chosen
    if reduced and chosen == "triton":
        # a precision is a permission: the exact call until the graph is invested in (it counts
        # the graph's uses), then the tuner's pick among the exact call and the reduced kernels,
        # memoised with the decision stores' generation (a reset decides again); a pick made
        # during a CUDA-graph capture or its warm-up is provisional (nothing is timed there): not memoised
        if not invested(graph):
            memo = ("until invested", chosen, None)
        else:
            memoised = memoised and not (x.is_cuda and syncs_forbidden())
            config = _precise_pick(graph, x, edge_weight, reduce, precision)
            if config["path"] != 0:
                if memoised:
                    graph.cache.put("call", ("precise", config, stores_generation()),
                                    _call_key(reduce, backend, precision, x, given))
                return _tensor_core_spmm(graph, x, edge_weight, reduce, precision, config)
            memo = ("exact", chosen, stores_generation())
    if memoised:
        graph.cache.put("call", memo, _call_key(reduce, backend, precision, x, given))
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or (edge_weight is not None and edge_weight.requires_grad))
    if not needs_grad:  # no autograd node: less overhead per call (inference, small graphs)
        return aggregate(chosen, graph, x, edge_weight, reduce)
    if reduce == "max":
        return _SpMMMax.apply(graph, x, edge_weight, chosen)
    return _SpMMLinear.apply(graph, x, edge_weight, reduce, chosen)


def sage_cbsr(graph: Graph, x: CBSR, weight_l: Tensor, bias: Optional[Tensor], weight_r: Tensor, reduce: str,
              backend: str = "auto") -> Tensor:
    r"""GraphSAGE's map of CBSR features, :math:`Y = (A' X) W_l^\top + b + X W_r^\top` with
    :math:`X` = ``x.to_dense()`` and ``A'`` the graph's own values (``reduce``: ``"sum"`` or
    ``"mean"``): ``Y[i] = W_l sum_{j -> i} s_i w_ji X_j + b + sum_s values[i, s] W_r[:, index[i, s]]``
    (``s_i`` = 1, or ``1 / deg_i`` for a mean).  Differentiable in ``x.values``, ``weight_l``,
    ``bias`` and ``weight_r``.

    On a :class:`~sparsegnn.Graph` whose values need no gradient, outside ``torch.compile``, the
    aggregation (``spmm``'s CBSR schedules), the root term (``cbsr_linear``'s) and the GEMM are
    one autograd node: where its backward's schedules allow, the aggregation's ``dvalues`` are
    reduced into the root term's (the outer product's atomics add into them: no second gradient
    and no sum of the two), and the root's bias gradient comes from its kernel's launch.  Eager
    host time is most of a MaxK SAGE step on a small graph, and each node costs its Python and
    autograd bookkeeping.  Elsewhere: ``cbsr_linear(x, W_r, b).addmm_(spmm(graph, x), W_l^T)``,
    the same map.

    Shapes:
        x: CBSR of [N, F] (k per row; N = the graph's nodes, sources and targets); weight_l,
        weight_r: [F_out, F]; bias: [F_out] or None -> [N, F_out].
    """
    from .cbsr import _SAGECBSR, cbsr_linear

    values = x.values
    fused = (not compiling() and isinstance(graph, Graph) and reduce in ("sum", "mean")
             and values.dim() == 2 and values.shape[0] == graph.num_src == graph.num_nodes
             and (graph.edge_val is None or not graph.edge_val.requires_grad)
             and weight_l.shape == weight_r.shape == (weight_r.shape[0], x.num_cols)
             and weight_l.dtype == weight_r.dtype == values.dtype
             and (bias is None or (bias.dtype == values.dtype and tuple(bias.shape) == (weight_r.shape[0],)))
             and values.device == graph.rowptr.device == weight_l.device == weight_r.device
             and (bias is None or bias.device == values.device))
    if not fused:
        root = cbsr_linear(x, weight_r, bias, backend=backend)
        return root.addmm_(spmm(graph, x, reduce=reduce, backend=backend), weight_l.t())
    chosen = choose_backend("spmm", backend, values)
    return _SAGECBSR.apply(graph, values, x.index, x.num_cols, reduce, chosen, weight_l, bias, weight_r)
