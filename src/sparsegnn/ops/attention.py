"""Fused graph attention: scores, edge softmax (attention dropout) and aggregation in one op.

``gat_attention`` (GAT) and ``agnn_attention`` (AGNN's cosine attention).

For target ``i``, head ``h`` and incoming edge ``e: j -> i``::

    alpha_e = softmax_{e -> i}( LeakyReLU(a_dst[i, h] + a_src[j, h]) )
    out[i, h, :] = sum_e dropout(alpha_e) * feat[j, h, :]

On CUDA this is one Triton launch forward and two backward (see ``kernels/attention.py``),
with nothing of size [E, H] kept for the backward; the reference path (the CPU's) gathers the
scores, applies ``reference.edge_softmax`` and sums with ``reference.spmm_sum``.  Attention dropout draws its mask from a
seed taken from the feature device's generator, so ``torch.manual_seed`` reproduces it and
CUDA-graph capture replays fresh masks; the masks differ between the two paths.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._checks import check, check_precision, check_same_device
from ..graph import Graph, as_graph
from ..tune.reuse import invested, use
from . import reference
from ._dispatch import aggregate, choose_backend
from ._library import compiling, graph_of, not_traceable_graph
from .tiles import TC_FAMILY


def _attention_kernels():
    from ..kernels import attention

    return attention


def _candidates(graph: Graph, op: str, heads: int, channels: int, tuned):
    """The configs ``decide`` chooses from: on a graph not invested in (which takes the first),
    the width's first-contact config (``kernels.attention.first_contact_config``); else
    ``tuned()``, the degree heuristic and its neighbours."""
    if not invested(graph):
        return [_attention_kernels().first_contact_config(op, heads, channels)]
    return tuned()


def _outputs(out32: Tensor, lse: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, lse, out32)`` from a kernel's fp32 output: ``out`` in the input ``dtype``, and the
    fp32 copy the backward needs for ``D_i = <g_i, out_i>`` (empty when ``out`` is that copy)."""
    if dtype == torch.float32:
        return out32, lse, out32.new_empty(0)
    return out32.to(dtype), lse, out32


def _fp32_out(out: Tensor, out32: Tensor) -> Tensor:
    """The fp32 output to save for the backward: ``out32``, or ``out`` itself for fp32 inputs."""
    return out if out32.numel() == 0 else out32


def _gat_forward(graph: Graph, feat: Tensor, a_src: Tensor, a_dst: Tensor, slope: float, p_drop: float,
                 seed: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, lse, out32)`` of the fused kernel with the config the tuner decided for this graph.

    ``out32``: the fp32 output the backward needs for half inputs (empty for fp32 inputs,
    where ``out`` is that tensor).
    """
    from ..tune import decide

    k = _attention_kernels()
    n, heads, channels = feat.shape
    use(graph, heads * channels, feat.element_size())   # tuned once the graph's reuse repays it (tune.reuse)
    run = lambda cfg: k.gat_forward(graph.rowptr, graph.col, feat, a_src, a_dst, slope, p_drop, seed, cfg,  # noqa: E731
                                    torch.float32)
    candidates = lambda: _candidates(graph, "gat", heads, channels,  # noqa: E731
                                     lambda: k.gat_candidates(n, graph.num_edges, heads, channels))
    config = decide("gat", graph, f"h{heads}", heads * channels, feat.dtype, feat.device, candidates, run,
                    space=k.GAT_SPACE, ranked=False)
    return _outputs(*run(config), feat.dtype)


def _gat_backward(graph: Graph, grad: Tensor, feat: Tensor, a_src: Tensor, a_dst: Tensor, lse: Tensor,
                  out32: Tensor, seed: Optional[Tensor], slope: float, p_drop: float):
    """``(dfeat, da_src, da_dst)``, with a launch config tuned for the backward on its own (its
    pass over the transposed graph gathers other rows than the forward: on the Reddit stand-in
    at H = C = 8 the forward's best config is the backward's second worst, 19 vs 100 ms)."""
    from ..tune import decide

    k = _attention_kernels()
    n, heads, channels = feat.shape
    transpose = graph.transpose_parts()
    run = lambda cfg: k.gat_backward(graph.rowptr, transpose, feat, a_src, a_dst, lse, out32, grad,  # noqa: E731
                                     slope, p_drop, seed, cfg)
    candidates = lambda: _candidates(graph, "gat", heads, channels,  # noqa: E731
                                     lambda: k.gat_candidates(n, graph.num_edges, heads, channels))
    config = decide("gat_bwd", graph, f"h{heads}|drop{int(p_drop > 0)}", heads * channels, feat.dtype, feat.device,
                    candidates, run, space=k.GAT_SPACE, ranked=False)
    return run(config)


class _FusedGAT(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: Graph, feat: Tensor, a_src: Tensor, a_dst: Tensor, slope: float, p_drop: float,
                seed: Optional[Tensor]):
        out, lse, out32 = _gat_forward(graph, feat, a_src, a_dst, slope, p_drop, seed)
        ctx.graph, ctx.slope, ctx.p_drop = graph, slope, p_drop
        ctx.save_for_backward(feat, a_src, a_dst, lse, _fp32_out(out, out32), seed)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        feat, a_src, a_dst, lse, out32, seed = ctx.saved_tensors
        grads = _gat_backward(ctx.graph, grad, feat, a_src, a_dst, lse, out32, seed, ctx.slope, ctx.p_drop)
        return (None, *grads, None, None, None)


# The same two functions as custom ops, for torch.compile (see ``_library``: the graph is its key).
@torch.library.custom_op("sparsegnn::gat_attention", mutates_args=(),
                         schema="(Tensor feat, Tensor a_src, Tensor a_dst, Tensor? seed, int graph, float slope, "
                                "float p_drop) -> (Tensor, Tensor, Tensor)")
def _gat_op(feat, a_src, a_dst, seed, graph, slope, p_drop):
    g = graph_of(graph, "gat_attention", feat=feat, a_src=a_src, a_dst=a_dst)
    return _gat_forward(g, feat, a_src, a_dst, slope, p_drop, seed)


@_gat_op.register_fake
def _(feat, a_src, a_dst, seed, graph, slope, p_drop):
    g = graph_of(graph, "gat_attention", feat=feat, a_src=a_src, a_dst=a_dst)
    shape = (g.num_nodes,) + tuple(feat.shape[1:])
    lse = feat.new_empty(shape[:2], dtype=torch.float32)
    keep = feat.new_empty(shape if feat.dtype != torch.float32 else (0,), dtype=torch.float32)
    return feat.new_empty(shape), lse, keep


@torch.library.custom_op("sparsegnn::gat_attention_backward", mutates_args=(),
                         schema="(Tensor grad, Tensor feat, Tensor a_src, Tensor a_dst, Tensor lse, Tensor out32, "
                                "Tensor? seed, int graph, float slope, float p_drop) -> (Tensor, Tensor, Tensor)")
def _gat_backward_op(grad, feat, a_src, a_dst, lse, out32, seed, graph, slope, p_drop):
    g = graph_of(graph, "gat_attention", grad=grad, feat=feat)
    return _gat_backward(g, grad, feat, a_src, a_dst, lse, out32, seed, slope, p_drop)


@_gat_backward_op.register_fake
def _(grad, feat, a_src, a_dst, lse, out32, seed, graph, slope, p_drop):
    return feat.new_empty(feat.shape), a_src.new_empty(a_src.shape), a_dst.new_empty(a_dst.shape)


def _gat_setup(ctx, inputs, output) -> None:
    feat, a_src, a_dst, seed, graph, slope, p_drop = inputs
    out, lse, out32 = output
    ctx.graph, ctx.slope, ctx.p_drop = graph, slope, p_drop
    ctx.save_for_backward(feat, a_src, a_dst, lse, _fp32_out(out, out32), seed)


def _gat_op_backward(ctx, grad, _grad_lse, _grad_out32):
    feat, a_src, a_dst, lse, out32, seed = ctx.saved_tensors
    grads = torch.ops.sparsegnn.gat_attention_backward(grad.contiguous(), feat, a_src, a_dst, lse, out32, seed,
                                                       ctx.graph, ctx.slope, ctx.p_drop)
    return (*grads, None, None, None, None)


_gat_op.register_autograd(_gat_op_backward, setup_context=_gat_setup)


def _reference(graph: Graph, feat: Tensor, a_src: Tensor, a_dst: Tensor, slope: float, p_drop: float) -> Tensor:
    row, col = graph.row, graph.col
    scores = F.leaky_relu(a_dst.index_select(0, row) + a_src.index_select(0, col), slope)    # [E, H]
    alpha = reference.edge_softmax(row, graph.num_nodes, scores)
    if p_drop > 0:
        alpha = F.dropout(alpha, p_drop, training=True)
    m, heads, channels = feat.shape
    out = reference.spmm_sum(row, col, graph.num_nodes, feat.reshape(m, heads * channels),
                             alpha.repeat_interleave(channels, dim=1) if channels > 1 else alpha)
    return out.view(graph.num_nodes, heads, channels)


def _gat_cpu(graph: Graph, feat: Tensor, a_src: Tensor, a_dst: Tensor, slope: float, p_drop: float) -> Tensor:
    """GAT on the CPU backend: per-edge scores [E, H] (gathered, cheap), then the CPU kernels
    for the edge softmax, the dropout of the attention and the multi-head SpMM; autograd
    through each (the backward never forms [E, H * C])."""
    from .dropout import dropout
    from .softmax import edge_softmax
    from .spmm import spmm

    scores = F.leaky_relu(a_dst.index_select(0, graph.row) + a_src.index_select(0, graph.col), slope)    # [E, H]
    alpha = dropout(edge_softmax(graph, scores, backend="cpu"), p_drop)
    return spmm(graph, feat, edge_weight=alpha, backend="cpu")


def gat_attention(graph, feat: Tensor, alpha_src: Tensor, alpha_dst: Tensor, negative_slope: float = 0.2,
                  dropout: float = 0.0, backend: str = "auto") -> Tensor:
    """GAT's attention-weighted aggregation of every head, fused (see the module doc).

    Args:
        graph: a :class:`Graph` (self loops as the layer wants them; bipartite allowed), an
            ``edge_index`` or a torch sparse tensor.
        feat: projected source features ``W x``, ``[M, H, C]`` (``M = graph.num_src``).
        alpha_src, alpha_dst: per-node halves of the score, ``<a_src^h, W^h x_j>`` over the
            sources ``[M, H]`` and ``<a_dst^h, W^h x_i>`` over the targets ``[N, H]``.
        negative_slope: LeakyReLU's slope.
        dropout: attention dropout probability (pass 0 in evaluation).
        backend: ``"auto"`` (fused Triton kernel on CUDA, the CPU kernels on the CPU),
            ``"reference"``, ``"triton"`` or ``"cpu"``.

    Returns:
        ``[N, H, C]`` of ``feat``'s dtype (fp32 accumulation). Rows without incoming edges are 0.

    Shapes:
        feat: [M, H, C]; alpha_src: [M, H]; alpha_dst: [N, H] -> [N, H, C] (square: M = N).
    """
    fn = "gat_attention"
    check(isinstance(feat, Tensor) and feat.dim() == 3, fn,
          f"feat must be [N, heads, channels], got {getattr(feat, 'shape', type(feat).__name__)}")
    m, heads, _ = feat.shape
    if not isinstance(graph, Graph):
        if compiling():
            raise not_traceable_graph(fn, graph)
        graph, _ = as_graph(graph, fn, num_nodes=m)
    check(graph.num_src == m, fn, f"feat has {m} rows but the graph has {graph.num_src} "
          f"{'source nodes (bipartite)' if graph.is_bipartite else 'nodes'}")
    for name, t, rows in (("alpha_src", alpha_src, m), ("alpha_dst", alpha_dst, graph.num_nodes)):
        check(isinstance(t, Tensor) and tuple(t.shape) == (rows, heads), fn,
              f"{name} must have shape [{rows}, heads={heads}], got {getattr(t, 'shape', type(t).__name__)}")
        check(t.dtype == feat.dtype, fn, f"{name} must have feat's dtype {feat.dtype}, got {t.dtype}")
    check(0.0 <= dropout < 1.0, fn, f"dropout must be in [0, 1), got {dropout}")
    check_same_device(fn, graph=graph.rowptr, feat=feat, alpha_src=alpha_src, alpha_dst=alpha_dst)
    chosen = choose_backend(fn, backend, feat)
    if chosen == "cpu":
        return _gat_cpu(graph, feat, alpha_src, alpha_dst, negative_slope, dropout)
    if chosen != "triton":
        return _reference(graph, feat, alpha_src, alpha_dst, negative_slope, dropout)
    seed = None
    if dropout > 0.0:
        seed = torch.randint(0, 2**31 - 1, (1,), device=feat.device, dtype=torch.int64)
    slope, p_drop = float(negative_slope), float(dropout)
    if compiling():
        return torch.ops.sparsegnn.gat_attention(feat, alpha_src, alpha_dst, seed, graph.key, slope, p_drop)[0]
    if torch.is_grad_enabled() and (feat.requires_grad or alpha_src.requires_grad or alpha_dst.requires_grad):
        return _FusedGAT.apply(graph, feat, alpha_src, alpha_dst, slope, p_drop, seed)
    return _gat_forward(graph, feat, alpha_src, alpha_dst, slope, p_drop, seed)[0]


# ---------------------------------------------------------------------------- AGNN
def _agnn_forward(graph: Graph, q: Tensor, nrm: Tensor, beta: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, lse, out32)`` of the fused AGNN kernel (``out32`` as in ``_gat_forward``)."""
    from ..tune import decide

    k = _attention_kernels()
    use(graph, q.shape[1], q.element_size())   # tuned once the graph's reuse repays it (tune.reuse)
    run = lambda cfg: k.agnn_forward(graph.rowptr, graph.col, q, nrm, beta, cfg, torch.float32)  # noqa: E731
    candidates = lambda: _candidates(graph, "agnn", 1, q.shape[1],  # noqa: E731
                                     lambda: k.agnn_candidates(q.shape[0], graph.num_edges, q.shape[1]))
    config = decide("agnn", graph, "cos", q.shape[1], q.dtype, q.device, candidates, run,
                    space=k.GAT_SPACE, ranked=False)
    return _outputs(*run(config), q.dtype)


def _agnn_backward(graph: Graph, grad: Tensor, q: Tensor, nrm: Tensor, beta: Tensor, lse: Tensor, out32: Tensor):
    dq, dnrm, dbeta, ds = _attention_kernels().agnn_backward(graph.transpose_parts(), q, nrm, beta, lse, out32, grad)
    dq += beta.float() * aggregate("triton", graph, q.float(), ds)     # row part, fp32: beta sum_e ds_e q_j
    return dq.to(q.dtype), dnrm.to(nrm.dtype), dbeta.sum().reshape(beta.shape).to(beta.dtype)


def _agnn_three_pass(graph: Graph, x: Tensor, q: Tensor, beta: Tensor, backend: str, precision: str) -> Tensor:
    """Exact scores and softmax, then the weighted sum at ``precision`` (public ops, autograd)."""
    from .sddmm import sddmm
    from .softmax import edge_softmax
    from .spmm import spmm

    alpha = edge_softmax(graph, beta.reshape(()) * sddmm(graph, q, q, "dot", backend=backend), backend=backend)
    return spmm(graph, x, edge_weight=alpha, backend=backend, precision=precision)


#: Store name of the ``"agnn_tc"`` decisions: path 1 sums through ``spmm(precision=)``, whose
#: own decision (``TC_FAMILY``, which carries the row kernels' version) it so depends on.
AGNN_TC_FAMILY = "agnn_tc+" + TC_FAMILY


def _agnn_path(graph: Graph, x: Tensor, q: Tensor, nrm: Tensor, beta: Tensor, precision: str) -> int:
    """The ``"agnn_tc"`` decision: 0 = fused exact kernel, 1 = three passes with the sum at
    ``precision``; timed once (forward, no grad) per graph structure, width and dtype.  Stored
    under the tensor-core family's name too (path 1 runs its pick), so it is made again when the
    kernels it chose among change."""
    from ..tune import decide

    def run(config):
        with torch.no_grad():
            if config["path"] == 0:
                return _agnn_forward(graph, q.detach(), nrm.detach().to(x.dtype), beta.detach().reshape(1))[0]
            return _agnn_three_pass(graph, x.detach(), q.detach(), beta.detach(), "triton", precision)

    config = decide(AGNN_TC_FAMILY, graph, precision, x.shape[1], x.dtype, x.device, [{"path": 0}, {"path": 1}], run,
                    space={"path": (0, 1)}, ranked=False, warm=True)   # one call two ways, as the precision choice
    return config["path"]


class _FusedAGNN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: Graph, q: Tensor, nrm: Tensor, beta: Tensor):
        out, lse, out32 = _agnn_forward(graph, q, nrm, beta)
        ctx.graph = graph
        ctx.save_for_backward(q, nrm, beta, lse, _fp32_out(out, out32))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        return (None, *_agnn_backward(ctx.graph, grad, *ctx.saved_tensors))


@torch.library.custom_op("sparsegnn::agnn_attention", mutates_args=(),
                         schema="(Tensor q, Tensor nrm, Tensor beta, int graph) -> (Tensor, Tensor, Tensor)")
def _agnn_op(q, nrm, beta, graph):
    return _agnn_forward(graph_of(graph, "agnn_attention", q=q, nrm=nrm, beta=beta), q, nrm, beta)


@_agnn_op.register_fake
def _(q, nrm, beta, graph):
    graph_of(graph, "agnn_attention", q=q, nrm=nrm, beta=beta)
    keep = q.new_empty(q.shape if q.dtype != torch.float32 else (0,), dtype=torch.float32)
    return q.new_empty(q.shape), q.new_empty(q.shape[:1], dtype=torch.float32), keep


@torch.library.custom_op("sparsegnn::agnn_attention_backward", mutates_args=(),
                         schema="(Tensor grad, Tensor q, Tensor nrm, Tensor beta, Tensor lse, Tensor out32, int graph)"
                                " -> (Tensor, Tensor, Tensor)")
def _agnn_backward_op(grad, q, nrm, beta, lse, out32, graph):
    return _agnn_backward(graph_of(graph, "agnn_attention", grad=grad, q=q), grad, q, nrm, beta, lse, out32)


@_agnn_backward_op.register_fake
def _(grad, q, nrm, beta, lse, out32, graph):
    return q.new_empty(q.shape), nrm.new_empty(nrm.shape), beta.new_empty(beta.shape)


def _agnn_setup(ctx, inputs, output) -> None:
    q, nrm, beta, graph = inputs
    out, lse, out32 = output
    ctx.graph = graph
    ctx.save_for_backward(q, nrm, beta, lse, _fp32_out(out, out32))


def _agnn_op_backward(ctx, grad, _grad_lse, _grad_out32):
    q, nrm, beta, lse, out32 = ctx.saved_tensors
    grads = torch.ops.sparsegnn.agnn_attention_backward(grad.contiguous(), q, nrm, beta, lse, out32, ctx.graph)
    return (*grads, None)


_agnn_op.register_autograd(_agnn_op_backward, setup_context=_agnn_setup)


def agnn_attention(graph, x: Tensor, beta: Tensor, backend: str = "auto", precision: str = "ieee") -> Tensor:
    """AGNN propagation, fused: ``out_i = sum_{j -> i} softmax_i(beta cos(x_i, x_j)) x_j``.

    ``cos`` uses unit rows ``x / max(|x|, 1e-12)`` (``F.normalize``).  On CUDA: one Triton
    launch forward; backward one pass over the transposed graph plus one SpMM.

    Args:
        graph: a :class:`Graph` (self loops as the layer wants them), an ``edge_index`` or a
            square torch sparse tensor.
        x: node features ``[N, F]``.
        beta: the temperature, a one-element tensor (learnable or not).
        backend: ``"auto"`` (fused Triton kernels on CUDA, the CPU kernels on the CPU),
            ``"reference"``, ``"triton"`` or ``"cpu"``.
        precision: ``"ieee"`` (default: exact, fused), ``"tf32"`` or ``"bf16"``: allows, on
            the Triton backend, exact scores and softmax (row-wise SDDMM, edge softmax) and the
            weighted sum through ``spmm(..., precision=)`` (tensor-core tiles where its tuner
            finds them faster): three passes instead of the fused one.  The tuner (family
            ``"agnn_tc"``) times both forwards once per graph, width and dtype and keeps the
            faster; the fused exact kernel wins on most graphs (the passes it saves outweigh the
            tensor cores at AGNN's widths).  Under ``torch.compile`` the three-pass form is traced.

    Shapes:
        x: [N, F]; beta: [1] -> [N, F].
    """
    fn = "agnn_attention"
    check(isinstance(x, Tensor) and x.dim() == 2, fn,
          f"x must be [N, features], got {getattr(x, 'shape', type(x).__name__)}")
    check(isinstance(beta, Tensor) and beta.numel() == 1, fn,
          f"beta must be a one-element tensor, got {getattr(beta, 'shape', type(beta).__name__)}")
    if not isinstance(graph, Graph):
        if compiling():
            raise not_traceable_graph(fn, graph)
        graph, _ = as_graph(graph, fn, num_nodes=x.shape[0])
    check(not graph.is_bipartite, fn, f"needs a square graph (scores compare x_i with x_j of one feature set), "
          f"got {graph.num_nodes} targets and {graph.num_src} sources")
    check(graph.num_nodes == x.shape[0], fn, f"x has {x.shape[0]} rows but the graph has {graph.num_nodes} nodes")
    check_same_device(fn, graph=graph.rowptr, x=x, beta=beta)
    nrm = x.norm(dim=-1).clamp_min(1e-12)
    q = x / nrm[:, None]
    chosen = choose_backend(fn, backend, x)
    check_precision(fn, precision)
    if chosen == "triton" and precision != "ieee" and (compiling() or _agnn_path(graph, x, q, nrm, beta, precision)):
        return _agnn_three_pass(graph, x, q, beta, backend, precision)
    if chosen == "cpu":
        from .sddmm import sddmm
        from .softmax import edge_softmax
        from .spmm import spmm

        alpha = edge_softmax(graph, beta.reshape(()) * sddmm(graph, q, q, "dot", backend="cpu"), backend="cpu")
        return spmm(graph, x, edge_weight=alpha, backend="cpu")
    if chosen != "triton":
        scores = beta * (q.index_select(0, graph.row) * q.index_select(0, graph.col)).sum(-1)
        alpha = reference.edge_softmax(graph.row, graph.num_nodes, scores)
        return reference.spmm_sum(graph.row, graph.col, graph.num_nodes, x, alpha)
    if compiling():
        return torch.ops.sparsegnn.agnn_attention(q, nrm.to(x.dtype), beta.reshape(1), graph.key)[0]
    return _FusedAGNN.apply(graph, q, nrm.to(x.dtype), beta.reshape(1))
