"""The sparse ops as PyTorch custom ops (``torch.library``): what ``torch.compile`` traces.

A :class:`~sparsegnn.Graph` is not a tensor, so the ops take it as its process-unique int
``key`` (``graph_by_key``).  To the compiler the graph is a constant (dynamo guards on the
key: another Graph recompiles), and its own tensors (CSR, transpose, plans, tuned configs)
never enter the traced program: the implementations read them at run time.  Every
implementation calls the functions of ``_dispatch.py`` (``maxk.py`` / ``cbsr.py`` for MaxK and
CBSR features) that the eager autograd.Functions call, so the eager and the compiled paths
compute the same thing the same way.

Schemas (namespace ``sparsegnn``; ``graph`` is a Graph's key; ``backend`` is the user's
``"auto"`` / ``"reference"`` / ``"triton"``, resolved per call on the op's inputs):

- ``spmm(Tensor x, Tensor? weight, int graph, str reduce, str backend) -> Tensor``:
  ``reduce_{e: j -> i} w_e x_j`` (sum, mean, max; weight [E], [E, H] multi-head or None).
- ``spmm_precise(Tensor x, Tensor? weight, int graph, str reduce, str precision, bool transposed, str backend) -> Tensor``:
  sum / mean (``transposed``: ``A'^T x``) at ``precision`` "tf32" / "bf16" on the tuned rows /
  tiles / cuSPARSE of ``ops.tiles``; exact where the backend is not Triton (as eager ``spmm``).
- ``spmm_transposed(Tensor x, Tensor? weight, int graph, str reduce, str backend) -> Tensor``:
  ``A'^T x`` with ``A' = A`` (sum) or ``D^-1 A`` (mean): spmm's input gradient, sddmm's ``db``.
- ``spmm_weight_grad(Tensor grad_out, Tensor x, int graph, int heads, str reduce, str backend) -> Tensor``:
  ``dw_e = s_i <dY_i, X_j>`` ([E], or [E, H] for ``heads = H > 0``).
- ``spmm_max_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor out, int graph) -> (Tensor, Tensor)``:
  ``(dX, dw)`` of the max reduce, each gradient to the first arg-max edge (``dw`` is ``[0]`` without weight).
- ``sddmm(Tensor a, Tensor b, int graph, str op, str backend) -> Tensor``: ``op(a_i, b_j)`` per edge.
- ``edge_sum(Tensor values, int graph, bool by_source) -> Tensor``: per-edge values summed
  into their target (or source) node: the backward of ``sddmm(op="add")``.
- ``edge_softmax(Tensor scores, int graph, str backend) -> Tensor`` and
  ``edge_softmax_backward(Tensor out, Tensor grad_out, int graph, str backend) -> Tensor``.
- ``maxk(Tensor x, int k, str backend) -> (Tensor values, Tensor index)``: the ``k`` largest
  entries of each row (``ops.maxk.select``): values ``[N, k]``, columns ``[N, k]`` of
  ``index_dtype(F)`` (not differentiable); backward ``dx = scatter(index, d values)`` in plain torch.
- ``spmm_cbsr(Tensor values, Tensor index, int num_cols, Tensor? weight, int graph, str reduce, str backend) -> Tensor``:
  ``A' X`` for the CBSR ``X`` (sum / mean; ``ops.cbsr.cbsr_forward``, its SpGEMM / dense schedule).
- ``spmm_cbsr_backward(Tensor grad_out, Tensor values, Tensor index, int num_cols, Tensor? weight, int graph, str reduce, str backend, bool need_values, bool need_weight) -> (Tensor, Tensor)``:
  ``(dvalues, dw)`` (``ops.cbsr.cbsr_backward``, its outer-product / dense schedule); ``[0]``
  for a gradient not needed.

- ``cbsr_linear(Tensor values, Tensor index, int num_cols, Tensor weight, Tensor? bias, str backend) -> Tensor``:
  ``X W^T + b`` for the CBSR ``X`` (``ops.cbsr.linear_forward``: the CUDA root kernel where
  ``root_schedule`` says it pays, else densified through cuBLAS).
- ``cbsr_linear_backward(Tensor grad_out, Tensor values, Tensor index, int num_cols, Tensor weight, str backend, bool need_values, bool need_weight, bool need_bias) -> (Tensor, Tensor, Tensor)``:
  ``(dvalues, dW, db)`` (``ops.cbsr.linear_backward``); ``[0]`` for a gradient not needed.

``spmm``, ``sddmm``, ``edge_softmax``, ``maxk``, ``spmm_cbsr`` and ``cbsr_linear`` have autograd formulas
(``register_autograd``) written with these ops (``maxk``'s with plain torch), so the compiled
backward is traced too; the backward ops themselves are not differentiable (as the eager
``once_differentiable`` backward).  Fake (meta)
implementations give shapes from the inputs and, for per-edge outputs, ``E`` from the graph.

Eager calls keep the lean autograd.Function path of ``spmm.py`` / ``sddmm.py`` /
``softmax.py`` / ``maxk.py`` / ``cbsr.py``; the public functions switch to these ops under
``torch.compiler.is_compiling()`` only (one check, about 0.1 us).  Host time per call,
measured on the CPU (graph of 8 nodes and 20 edges, F = 4, reference backend, torch 2.13,
best of 6 x 40 x 1000 calls), public function vs ``torch.ops.sparsegnn.*`` directly:
``spmm`` 23.6 vs 35.0 us without grad and 31.4 vs 56.3 us with grad, ``sddmm`` 26.3 vs
38.3 us, ``edge_softmax`` 30.0 vs 34.1 us (the dispatcher, the Python autograd wrapper and
the key lookup).  The public functions cost within 0.5 us of what they cost before the ops
existed (23.1, 31.4, 26.0, 29.9 us).  So the custom op is kept for compiled code.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._checks import check_same_device
from ..formats.cbsr import index_dtype
from ..graph import Graph, graph_by_key
from . import _dispatch as dispatch

#: Whether dynamo is tracing (then the public ops call the custom ops).
compiling = torch.compiler.is_compiling

_LIB = "sparsegnn"


def not_traceable_graph(fn: str, graph) -> ValueError:
    """The error for an ``edge_index`` (or sparse tensor) reaching an op under ``torch.compile``."""
    return ValueError(
        f"{fn}(): under torch.compile the graph must be a sparsegnn.Graph, got {type(graph).__name__}: building a "
        "Graph from an edge_index sorts and checks it on the host, which cannot be traced. Build it once outside "
        "the compiled code (graph = sparsegnn.Graph.from_edge_index(edge_index)) and pass the Graph")


def graph_of(key, fn: str, **tensors: Optional[Tensor]) -> Graph:
    """The Graph of ``key``, with the devices of ``tensors`` checked against it: the first line
    of every implementation and fake implementation here (and of any other op taking a graph).

    ``int(key)`` specialises a symbolic key (dynamo makes an int that changed between calls
    dynamic): the graph is a constant of the compiled code, guarded by its key.
    """
    graph = graph_by_key(int(key))
    device = graph.rowptr.device
    if any(t is not None and t.device != device for t in tensors.values()):
        check_same_device(fn, graph=graph.rowptr, **tensors)
    return graph


def _backend(fn: str, backend: str, x: Tensor) -> str:
    return dispatch.choose_backend(fn, backend, x)


def _fresh(out: Tensor) -> Tensor:
    """Outputs are contiguous (as their fake versions say)."""
    return out.contiguous()


# ---------------------------------------------------------------------------- spmm
@torch.library.custom_op(f"{_LIB}::spmm", mutates_args=(),
                         schema="(Tensor x, Tensor? weight, int graph, str reduce, str backend) -> Tensor")
def spmm_op(x: Tensor, weight: Optional[Tensor], graph: int, reduce: str, backend: str) -> Tensor:
    g = graph_of(graph, "spmm", x=x, weight=weight)
    return _fresh(dispatch.aggregate(_backend("spmm", backend, x), g, x, weight, reduce))


@spmm_op.register_fake
def _(x, weight, graph, reduce, backend):
    g = graph_of(graph, "spmm", x=x, weight=weight)
    _backend("spmm", backend, x)
    return x.new_empty((g.num_nodes, x.shape[1]))


@torch.library.custom_op(f"{_LIB}::spmm_transposed", mutates_args=(),
                         schema="(Tensor x, Tensor? weight, int graph, str reduce, str backend) -> Tensor")
def spmm_transposed_op(x: Tensor, weight: Optional[Tensor], graph: int, reduce: str, backend: str) -> Tensor:
    g = graph_of(graph, "spmm", x=x, weight=weight)
    return _fresh(dispatch.aggregate_transposed(_backend("spmm", backend, x), g, x, weight, reduce))


@spmm_transposed_op.register_fake
def _(x, weight, graph, reduce, backend):
    g = graph_of(graph, "spmm", x=x, weight=weight)
    return x.new_empty((g.num_src, x.shape[1]))


@torch.library.custom_op(f"{_LIB}::spmm_weight_grad", mutates_args=(),
                         schema="(Tensor grad_out, Tensor x, int graph, int heads, str reduce, str backend) -> Tensor")
def spmm_weight_grad_op(grad_out: Tensor, x: Tensor, graph: int, heads: int, reduce: str, backend: str) -> Tensor:
    g = graph_of(graph, "spmm", grad_out=grad_out, x=x)
    chosen = _backend("spmm", backend, grad_out)
    return _fresh(dispatch.spmm_weight_grad(chosen, g, grad_out, x, heads, reduce))


@spmm_weight_grad_op.register_fake
def _(grad_out, x, graph, heads, reduce, backend):
    g = graph_of(graph, "spmm", grad_out=grad_out, x=x)
    return grad_out.new_empty((g.num_edges, heads) if heads else (g.num_edges,))


@torch.library.custom_op(f"{_LIB}::spmm_max_backward", mutates_args=(),
                         schema="(Tensor grad_out, Tensor x, Tensor? weight, Tensor out, int graph) -> (Tensor, Tensor)")
def spmm_max_backward_op(grad_out: Tensor, x: Tensor, weight: Optional[Tensor], out: Tensor,
                         graph: int) -> Tuple[Tensor, Tensor]:
    g = graph_of(graph, "spmm", grad_out=grad_out, x=x, weight=weight)
    grad_x, grad_w = dispatch.spmm_max_backward(g, grad_out, x, weight, out)
    return _fresh(grad_x), (_fresh(grad_w) if grad_w is not None else x.new_empty(0))


@spmm_max_backward_op.register_fake
def _(grad_out, x, weight, out, graph):
    graph_of(graph, "spmm", grad_out=grad_out, x=x, weight=weight)
    return x.new_empty(x.shape), (weight.new_empty(weight.shape) if weight is not None else x.new_empty(0))


def _spmm_setup(ctx, inputs, output) -> None:
    x, weight, graph, reduce, backend = inputs
    ctx.graph, ctx.reduce, ctx.backend = graph, reduce, backend
    ctx.save_for_backward(x, weight, output if reduce == "max" else None)


def _spmm_backward(ctx, grad_out: Tensor):
    x, weight, out = ctx.saved_tensors
    ops = torch.ops.sparsegnn
    grad_out = grad_out.contiguous()
    want_x, want_w = ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1]
    grad_x = grad_w = None
    if ctx.reduce == "max":
        grad_x, grad_w = ops.spmm_max_backward(grad_out, x, weight, out, ctx.graph)
        return grad_x if want_x else None, grad_w if want_w else None, None, None, None
    if want_x:
        grad_x = ops.spmm_transposed(grad_out, weight, ctx.graph, ctx.reduce, ctx.backend)
    if want_w:
        heads = weight.shape[1] if weight.dim() == 2 else 0
        grad_w = ops.spmm_weight_grad(grad_out, x.to(grad_out.dtype), ctx.graph, heads, ctx.reduce, ctx.backend)
        grad_w = grad_w.to(weight.dtype)
    return grad_x, grad_w, None, None, None


spmm_op.register_autograd(_spmm_backward, setup_context=_spmm_setup)


@torch.library.custom_op(f"{_LIB}::spmm_precise", mutates_args=(),
                         schema="(Tensor x, Tensor? weight, int graph, str reduce, str precision, bool transposed, str backend) -> Tensor")
def spmm_precise_op(x: Tensor, weight: Optional[Tensor], graph: int, reduce: str, precision: str,
                    transposed: bool, backend: str) -> Tensor:
    from .tiles import precise_aggregate

    g = graph_of(graph, "spmm", x=x, weight=weight)
    chosen = _backend("spmm", backend, x)
    if chosen != "triton":       # eager spmm is exact off the Triton backend too
        run = dispatch.aggregate_transposed if transposed else dispatch.aggregate
        return _fresh(run(chosen, g, x, weight, reduce))
    return _fresh(precise_aggregate(g, x, weight, reduce, precision, transposed))


@spmm_precise_op.register_fake
def _(x, weight, graph, reduce, precision, transposed, backend):
    g = graph_of(graph, "spmm", x=x, weight=weight)
    return x.new_empty((g.num_src if transposed else g.num_nodes, x.shape[1]))


def _spmm_precise_setup(ctx, inputs, output) -> None:
    x, weight, ctx.graph, ctx.reduce, ctx.precision, ctx.transposed, ctx.backend = inputs
    ctx.save_for_backward(x, weight)


def _spmm_precise_backward(ctx, grad_out: Tensor):
    """``dX = A'^T dY`` at the same precision; ``dw_e = s_i <dY_i, X_j>`` exact (transposed:
    ``s_i <X_i, dY_j>``)."""
    x, weight = ctx.saved_tensors
    ops = torch.ops.sparsegnn
    grad_out = grad_out.contiguous()
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:
        grad_x = ops.spmm_precise(grad_out, weight, ctx.graph, ctx.reduce, ctx.precision, not ctx.transposed,
                                        ctx.backend)
    if weight is not None and ctx.needs_input_grad[1]:
        pair = (x.to(grad_out.dtype), grad_out) if ctx.transposed else (grad_out, x.to(grad_out.dtype))
        grad_w = ops.spmm_weight_grad(*pair, ctx.graph, 0, ctx.reduce, ctx.backend).to(weight.dtype)
    return grad_x, grad_w, None, None, None, None, None


spmm_precise_op.register_autograd(_spmm_precise_backward, setup_context=_spmm_precise_setup)


# ---------------------------------------------------------------------------- sddmm
@torch.library.custom_op(f"{_LIB}::sddmm", mutates_args=(),
                         schema="(Tensor a, Tensor b, int graph, str op, str backend) -> Tensor")
def sddmm_op(a: Tensor, b: Tensor, graph: int, op: str, backend: str) -> Tensor:
    g = graph_of(graph, "sddmm", a=a, b=b)
    return _fresh(dispatch.edge_values(_backend("sddmm", backend, a), g, a, b, op))


@sddmm_op.register_fake
def _(a, b, graph, op, backend):
    g = graph_of(graph, "sddmm", a=a, b=b)
    _backend("sddmm", backend, a)
    return a.new_empty((g.num_edges,) if op == "dot" else (g.num_edges, a.shape[1]))


@torch.library.custom_op(f"{_LIB}::edge_sum", mutates_args=(),
                         schema="(Tensor values, int graph, bool by_source) -> Tensor")
def edge_sum_op(values: Tensor, graph: int, by_source: bool) -> Tensor:
    return _fresh(dispatch.edge_sum(graph_of(graph, "sddmm", values=values), values, by_source))


@edge_sum_op.register_fake
def _(values, graph, by_source):
    g = graph_of(graph, "sddmm", values=values)
    return values.new_empty((g.num_src if by_source else g.num_nodes,) + tuple(values.shape[1:]))


def _sddmm_setup(ctx, inputs, output) -> None:
    a, b, graph, op, backend = inputs
    ctx.graph, ctx.op, ctx.backend = graph, op, backend
    ctx.save_for_backward(a, b)


def _sddmm_backward(ctx, grad_out: Tensor):
    a, b = ctx.saved_tensors
    ops = torch.ops.sparsegnn
    grad_out = grad_out.contiguous()
    grad_a = grad_b = None
    if ctx.op == "add":
        if ctx.needs_input_grad[0]:
            grad_a = ops.edge_sum(grad_out, ctx.graph, False)
        if ctx.needs_input_grad[1]:
            grad_b = ops.edge_sum(grad_out, ctx.graph, True)
    else:  # dot: edge weight g_e; mul: per-feature edge weight g_ef (multi-head with H = F)
        if ctx.needs_input_grad[0]:
            grad_a = ops.spmm(b, grad_out, ctx.graph, "sum", ctx.backend)
        if ctx.needs_input_grad[1]:
            grad_b = ops.spmm_transposed(a, grad_out, ctx.graph, "sum", ctx.backend)
    return grad_a, grad_b, None, None, None


sddmm_op.register_autograd(_sddmm_backward, setup_context=_sddmm_setup)


# ---------------------------------------------------------------------------- edge softmax
@torch.library.custom_op(f"{_LIB}::edge_softmax", mutates_args=(),
                         schema="(Tensor scores, int graph, str backend) -> Tensor")
def edge_softmax_op(scores: Tensor, graph: int, backend: str) -> Tensor:
    g = graph_of(graph, "edge_softmax", scores=scores)
    return _fresh(dispatch.softmax_values(_backend("edge_softmax", backend, scores), g, scores))


@edge_softmax_op.register_fake
def _(scores, graph, backend):
    graph_of(graph, "edge_softmax", scores=scores)
    _backend("edge_softmax", backend, scores)
    return scores.new_empty(scores.shape)


@torch.library.custom_op(f"{_LIB}::edge_softmax_backward", mutates_args=(),
                         schema="(Tensor out, Tensor grad_out, int graph, str backend) -> Tensor")
def edge_softmax_backward_op(out: Tensor, grad_out: Tensor, graph: int, backend: str) -> Tensor:
    g = graph_of(graph, "edge_softmax", out=out, grad_out=grad_out)
    return _fresh(dispatch.softmax_grad(_backend("edge_softmax", backend, out), g, out, grad_out))


@edge_softmax_backward_op.register_fake
def _(out, grad_out, graph, backend):
    graph_of(graph, "edge_softmax", out=out, grad_out=grad_out)
    return out.new_empty(out.shape)


def _softmax_setup(ctx, inputs, output) -> None:
    ctx.graph, ctx.backend = inputs[1], inputs[2]
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad_out: Tensor):
    (out,) = ctx.saved_tensors
    return torch.ops.sparsegnn.edge_softmax_backward(out, grad_out.contiguous(), ctx.graph, ctx.backend), None, None


edge_softmax_op.register_autograd(_softmax_backward, setup_context=_softmax_setup)


# ---------------------------------------------------------------------------- MaxK and CBSR features
@torch.library.custom_op(f"{_LIB}::maxk", mutates_args=(),
                         schema="(Tensor x, int k, str backend) -> (Tensor values, Tensor index)")
def maxk_op(x: Tensor, k: int, backend: str) -> Tuple[Tensor, Tensor]:
    from .maxk import resolve_backend, select

    values, index = select(x, k, resolve_backend(backend, x))
    return _fresh(values), _fresh(index)


@maxk_op.register_fake
def _(x, k, backend):
    from .maxk import resolve_backend

    resolve_backend(backend, x)
    return x.new_empty((x.shape[0], k)), x.new_empty((x.shape[0], k), dtype=index_dtype(x.shape[1]))


def _maxk_setup(ctx, inputs, output) -> None:
    ctx.num_cols = inputs[0].shape[1]
    ctx.save_for_backward(output[1])


def _maxk_backward(ctx, grad_values: Tensor, _grad_index):
    """``dx = scatter(index, d values)`` in plain torch (traced into the compiled backward)."""
    from .maxk import scatter_kept

    (index,) = ctx.saved_tensors
    return scatter_kept(grad_values, index, ctx.num_cols), None, None


maxk_op.register_autograd(_maxk_backward, setup_context=_maxk_setup)


@torch.library.custom_op(f"{_LIB}::layer_norm_maxk", mutates_args=(),
                         schema="(Tensor x, Tensor weight, Tensor bias, int k, float eps) -> "
                                "(Tensor values, Tensor index, Tensor center, Tensor rstd)")
def layer_norm_maxk_op(x: Tensor, weight: Tensor, bias: Tensor, k: int, eps: float
                       ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The fused LayerNorm + MaxK kernel (``kernels.maxk.layer_norm_maxk_select``; CUDA or the
    interpreter): ``ops.maxk.layer_norm_maxk`` calls it under torch.compile where the eager call fuses."""
    from ..kernels.maxk import layer_norm_maxk_select

    out = layer_norm_maxk_select(x.contiguous(), weight, bias, eps, k, index_dtype(x.shape[1]))
    return tuple(_fresh(t) for t in out)


@layer_norm_maxk_op.register_fake
def _(x, weight, bias, k, eps):
    n = x.shape[0]
    return (x.new_empty((n, k)), x.new_empty((n, k), dtype=index_dtype(x.shape[1])),
            x.new_empty((n,), dtype=torch.float32), x.new_empty((n,), dtype=torch.float32))


@torch.library.custom_op(f"{_LIB}::layer_norm_maxk_backward", mutates_args=(),
                         schema="(Tensor grad_values, Tensor index, Tensor x, Tensor weight, Tensor center, Tensor rstd) "
                                "-> (Tensor dx, Tensor dweight, Tensor dbias)")
def layer_norm_maxk_backward_op(grad_values: Tensor, index: Tensor, x: Tensor, weight: Tensor, center: Tensor,
                                rstd: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    from ..kernels.maxk import layer_norm_maxk_backward

    return tuple(_fresh(t) for t in layer_norm_maxk_backward(grad_values, index, x, weight, center, rstd))


@layer_norm_maxk_backward_op.register_fake
def _(grad_values, index, x, weight, center, rstd):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(weight), torch.empty_like(weight)


def _layer_norm_maxk_setup(ctx, inputs, output) -> None:
    x, weight = inputs[0], inputs[1]
    ctx.mark_non_differentiable(output[1], output[2], output[3])     # columns, center, rstd: saved for the backward
    ctx.save_for_backward(x, weight, output[1], output[2], output[3])


def _layer_norm_maxk_backward(ctx, grad_values: Tensor, _grad_index, _grad_center, _grad_rstd):
    x, weight, index, center, rstd = ctx.saved_tensors
    dx, dw, db = torch.ops.sparsegnn.layer_norm_maxk_backward(grad_values.contiguous(), index, x, weight, center, rstd)
    return dx, dw, db, None, None


layer_norm_maxk_op.register_autograd(_layer_norm_maxk_backward, setup_context=_layer_norm_maxk_setup)


@torch.library.custom_op(f"{_LIB}::spmm_cbsr", mutates_args=(),
                         schema="(Tensor values, Tensor index, int num_cols, Tensor? weight, int graph, str reduce, str backend) -> Tensor")
def spmm_cbsr_op(values: Tensor, index: Tensor, num_cols: int, weight: Optional[Tensor], graph: int, reduce: str,
                 backend: str) -> Tensor:
    from .cbsr import cbsr_forward

    g = graph_of(graph, "spmm", values=values, index=index, weight=weight)
    return _fresh(cbsr_forward(g, values, index, num_cols, weight, reduce, _backend("spmm", backend, values)))


@spmm_cbsr_op.register_fake
def _(values, index, num_cols, weight, graph, reduce, backend):
    g = graph_of(graph, "spmm", values=values, index=index, weight=weight)
    _backend("spmm", backend, values)
    return values.new_empty((g.num_nodes, num_cols))


@torch.library.custom_op(f"{_LIB}::spmm_cbsr_backward", mutates_args=(),
                         schema="(Tensor grad_out, Tensor values, Tensor index, int num_cols, Tensor? weight, int graph, "
                                "str reduce, str backend, bool need_values, bool need_weight) -> (Tensor, Tensor)")
def spmm_cbsr_backward_op(grad_out: Tensor, values: Tensor, index: Tensor, num_cols: int, weight: Optional[Tensor],
                          graph: int, reduce: str, backend: str, need_values: bool,
                          need_weight: bool) -> Tuple[Tensor, Tensor]:
    from .cbsr import cbsr_backward

    g = graph_of(graph, "spmm", grad_out=grad_out, values=values, index=index, weight=weight)
    chosen = _backend("spmm", backend, values)
    grad_values, grad_weight = cbsr_backward(g, grad_out.contiguous(), values, index, num_cols, weight, reduce, chosen,
                                             need_values, need_weight)
    return (_fresh(grad_values) if grad_values is not None else values.new_empty(0),
            _fresh(grad_weight) if grad_weight is not None else values.new_empty(0))


@spmm_cbsr_backward_op.register_fake
def _(grad_out, values, index, num_cols, weight, graph, reduce, backend, need_values, need_weight):
    graph_of(graph, "spmm", grad_out=grad_out, values=values, index=index, weight=weight)
    grad_values = values.new_empty(values.shape) if need_values else values.new_empty(0)
    grad_weight = weight.new_empty(weight.shape) if need_weight and weight is not None else values.new_empty(0)
    return grad_values, grad_weight


def _spmm_cbsr_setup(ctx, inputs, output) -> None:
    values, index, ctx.num_cols, weight, ctx.graph, ctx.reduce, ctx.backend = inputs
    ctx.save_for_backward(values, index, weight)


def _spmm_cbsr_backward(ctx, grad_out: Tensor):
    values, index, weight = ctx.saved_tensors
    want_values, want_weight = ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[3]
    grad_values, grad_weight = torch.ops.sparsegnn.spmm_cbsr_backward(
        grad_out.contiguous(), values, index, ctx.num_cols, weight, ctx.graph, ctx.reduce, ctx.backend, want_values,
        want_weight)
    return (grad_values if want_values else None, None, None, grad_weight if want_weight else None, None, None, None)


spmm_cbsr_op.register_autograd(_spmm_cbsr_backward, setup_context=_spmm_cbsr_setup)


# ---------------------------------------------------------------------------- cbsr_linear
@torch.library.custom_op(f"{_LIB}::cbsr_linear", mutates_args=(),
                         schema="(Tensor values, Tensor index, int num_cols, Tensor weight, Tensor? bias, str backend) "
                                "-> Tensor")
def cbsr_linear_op(values: Tensor, index: Tensor, num_cols: int, weight: Tensor, bias: Optional[Tensor],
                   backend: str) -> Tensor:
    from .cbsr import linear_forward

    return _fresh(linear_forward(values, index, num_cols, weight, bias, _backend("cbsr_linear", backend, values)))


@cbsr_linear_op.register_fake
def _(values, index, num_cols, weight, bias, backend):
    _backend("cbsr_linear", backend, values)
    return values.new_empty((values.shape[0], weight.shape[0]))


@torch.library.custom_op(f"{_LIB}::cbsr_linear_backward", mutates_args=(),
                         schema="(Tensor grad_out, Tensor values, Tensor index, int num_cols, Tensor weight, str backend, "
                                "bool need_values, bool need_weight, bool need_bias) -> (Tensor, Tensor, Tensor)")
def cbsr_linear_backward_op(grad_out: Tensor, values: Tensor, index: Tensor, num_cols: int, weight: Tensor,
                            backend: str, need_values: bool, need_weight: bool,
                            need_bias: bool) -> Tuple[Tensor, Tensor, Tensor]:
    from .cbsr import linear_backward, root_schedule

    cuda = root_schedule(values, index, weight, _backend("cbsr_linear", backend, values)) == "cuda"
    grads = linear_backward(grad_out, values, index, num_cols, weight.t(), cuda, need_values, need_weight, need_bias)
    return tuple(_fresh(g) if g is not None else values.new_empty(0) for g in grads)


@cbsr_linear_backward_op.register_fake
def _(grad_out, values, index, num_cols, weight, backend, need_values, need_weight, need_bias):
    _backend("cbsr_linear", backend, values)
    return (values.new_empty(values.shape) if need_values else values.new_empty(0),
            weight.new_empty(weight.shape) if need_weight else values.new_empty(0),
            weight.new_empty((weight.shape[0],)) if need_bias else values.new_empty(0))


def _cbsr_linear_setup(ctx, inputs, output) -> None:
    values, index, ctx.num_cols, weight, bias, ctx.backend = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(values, index, weight)


def _cbsr_linear_backward(ctx, grad_out: Tensor):
    values, index, weight = ctx.saved_tensors
    need = (ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.has_bias and ctx.needs_input_grad[4])
    grads = torch.ops.sparsegnn.cbsr_linear_backward(grad_out.contiguous(), values, index, ctx.num_cols, weight,
                                                     ctx.backend, *need)
    grad_values, grad_weight, grad_bias = (g if wanted else None for g, wanted in zip(grads, need))
    return grad_values, None, None, grad_weight, grad_bias, None


cbsr_linear_op.register_autograd(_cbsr_linear_backward, setup_context=_cbsr_linear_setup)


__all__ = ["compiling", "not_traceable_graph", "graph_of", "spmm_op", "spmm_transposed_op", "spmm_weight_grad_op",
           "spmm_max_backward_op", "sddmm_op", "edge_sum_op", "edge_softmax_op", "edge_softmax_backward_op", "maxk_op",
           "layer_norm_maxk_op", "layer_norm_maxk_backward_op",
           "spmm_cbsr_op", "spmm_cbsr_backward_op", "cbsr_linear_op", "cbsr_linear_backward_op"]
