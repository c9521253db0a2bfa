"""The ``"cpu"`` backend: graph-level computations on CPU tensors.

Each function takes a :class:`Graph` on the CPU and computes what the matching function of
``_dispatch`` names, with the fastest implementation at hand for the case:

- Numba kernels (``kernels.cpu``): row-parallel over the CSR, one row's accumulator per
  thread, no atomics and no ``[E, F]`` temporaries; every op has one.
- ``torch.sparse.mm`` on the graph's CSR: MKL's SpMM for sums, ATen's ``reduce=`` kernels
  for the mean and the max (and, as a third candidate, for sums: it beats MKL on graphs of
  short rows at F = 64).  Where such candidates exist, the tuner (``tune.decide``)
  times them on the first call of a structural class and remembers the fastest (keyed by
  the graph's signature, width, dtype and thread count; persisted like the GPU decisions).

float32 and float64 are computed natively; float16 / bfloat16 inputs in float32 (cast back).

Per-call cost on small graphs is mostly Python: the tuner's answer is memoised on the graph
(``_decide``) and the Numba SpMMs run through a runner prepared once per graph, weights, dtype,
width and thread count (``_numba_runner``); a call through ``aggregate`` costs the kernel and
about 3 us (Cora F=16: 14 us, of which the kernel 10; ``torch.sparse.mm`` 15-16 us).
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from ..graph import Graph
from ..kernels import cpu as kernels
from ..tune.store import stores_generation
from . import _torch
from ._common import spmm_detail, via_transpose

#: Numba / torch.sparse.mm (MKL for sums) / torch.sparse.mm(reduce=) candidates (the config
#: the tuner stores).  Mean and max have one torch kernel (ATen's reduce), so two candidates.
NUMBA, TORCH, TORCH_REDUCE = {"impl": 0}, {"impl": 1}, {"impl": 2}
SPACE = {"impl": (0, 1, 2)}
#: The tuner's op name for these decisions; a new suffix when the candidates' kernels change, so
#: decisions persisted against the old ones are not reused (v2: the exact-width Numba kernel,
#: Cora F = 16 9.7 us against 15.5, which turned MKL's 17 us from a win into a loss).
DECISION_OP = "cpu_spmm.v2"

# torch.sparse.mm on CSR is the candidate here by choice; its one-time "beta" notice is noise.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)


def _compute(x: Tensor) -> Tensor:
    return x if x.dtype in kernels.NATIVE_DTYPES else x.float()


def bounds_of(graph: Graph) -> Tensor:
    """The graph's row chunks for the current thread count (cached on the graph)."""
    threads = kernels.max_threads()
    return graph.cache.get("cpu_bounds", threads,
                           lambda: kernels.chunk_bounds(graph.rowptr, threads * kernels.CHUNKS_PER_THREAD))


def _csr_indices(graph: Graph):
    """``(rowptr, col)`` for torch's CSR kernels: int32 copies (cached on the graph) where the
    edge count allows; MKL's int32 SpMM is about 10 us faster per call than its int64 one (Cora)."""
    def build():
        small = graph.num_edges < 2 ** 31 - 1 and max(graph.num_nodes, graph.num_src) < 2 ** 31 - 1
        return (graph.rowptr.int(), graph.col.int()) if small else (graph.rowptr, graph.col)
    return graph.cache.get("cpu_csr_indices", None, build)


def _torch_csr(graph: Graph, values: Optional[Tensor], dtype: torch.dtype, num_cols: int) -> Tensor:
    """The graph as a torch CSR tensor with ``values`` (ones for None).  For values the graph
    owns (None, its ``edge_val``) the tensor is cached, rebuilt after an in-place update."""
    def build():
        vals = torch.ones(graph.num_edges, dtype=dtype) if values is None else values.detach().to(dtype)
        rowptr, col = _csr_indices(graph)
        return torch.sparse_csr_tensor(rowptr, col, vals, (graph.num_nodes, num_cols), check_invariants=False)
    if values is None or values is graph.edge_val:
        return graph.cache.get("cpu_csr", (dtype, num_cols), build, values=values)
    return build()


def _decide(graph: Graph, detail: str, x: Tensor, reduce: str, run) -> dict:
    """``tune.decide`` over the candidates for this graph, variant, width, dtype and thread count."""
    from ..tune import decide

    threads = kernels.max_threads()
    candidates = [NUMBA, TORCH, TORCH_REDUCE] if reduce == "sum" else [NUMBA, TORCH]
    return decide(DECISION_OP, graph, f"{detail}|t{threads}", x.shape[1], x.dtype, x.device, candidates, run,
                  space=SPACE, ranked=False)


def _plan(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, detail: str):
    """``run(x) -> out`` for this call's graph, weights, variant, width, dtype and thread count:
    the tuner's choice (``_decide``) bound to what it runs (the prepared Numba runner, or the
    cached torch CSR), memoised on the graph.  A repeat call costs one dict lookup and three
    identity checks (weights, their version, the decision stores' generation) instead of
    ``decide``'s key formatting and the runner lookup (~3 us, a third of a Cora F = 16 SpMM).
    ``tune.reset_stores`` or other / updated weights rebuild it; transient graphs never keep it."""
    key = (detail, reduce, x.shape[1], x.dtype, kernels.max_threads())
    generation = stores_generation()
    run = graph.cache.get("cpu_plan", key, values=weight, stamp=generation)
    if run is not None:
        return run
    config = _decide(graph, detail, x, reduce, lambda cfg: _IMPLS[cfg["impl"]](graph, x, weight, reduce))
    impl = _IMPLS[config["impl"]]
    if impl is _numba_aggregate and _fast(graph, x, weight):
        runner = _numba_runner(graph, x, weight, reduce)
        run = lambda x: runner(x.contiguous())  # noqa: E731
    else:
        run = lambda x: impl(graph, x, weight, reduce)  # noqa: E731
    if not graph.transient:
        graph.cache.put("cpu_plan", run, key, values=weight, stamp=generation)
    return run


#: What ``_numba_runner`` prepares, by kind: the kernel runner and its flag (mean / with_arg).
_RUNNERS = {"sum": ("spmm_sum_runner", False), "mean": ("spmm_sum_runner", True),
            "max": ("spmm_max_runner", False), "max_arg": ("spmm_max_runner", True)}


def _numba_runner(graph: Graph, x: Tensor, weight: Optional[Tensor], kind: str):
    """The prepared Numba SpMM (``kernels.spmm_sum_runner`` / ``spmm_max_runner``, ``kind`` a key
    of ``_RUNNERS``) for this graph, weights (None or [E]), dtype, width and thread count, cached
    on the graph: rebuilt for other weights or after an in-place update of the same ones."""
    maker, flag = _RUNNERS[kind]
    return graph.cache.get("cpu_runner", (kind, x.dtype, x.shape[1], kernels.max_threads()), lambda: getattr(
        kernels, maker)(bounds_of(graph), graph.rowptr, graph.col, weight, x.dtype, x.shape[1], flag), values=weight)


def _fast(graph: Graph, x: Tensor, weight: Optional[Tensor]) -> bool:
    """Whether ``_numba_runner`` serves this call: a graph used more than once (not transient)
    with rows, edges and features, weights None or [E]."""
    return (not graph.transient and x.shape[1] > 0 and graph.num_edges > 0 and graph.num_nodes > 0
            and (weight is None or weight.dim() == 1))


def _numba_aggregate(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str) -> Tensor:
    if _fast(graph, x, weight):
        return _numba_runner(graph, x, weight, reduce)(x.contiguous())
    bounds = bounds_of(graph)
    if reduce == "max":
        return kernels.spmm_max(bounds, graph.rowptr, graph.col, weight, x)
    return kernels.spmm_sum(bounds, graph.rowptr, graph.col, weight, x, mean=reduce == "mean")


def _torch_aggregate(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str) -> Tensor:
    csr = _torch_csr(graph, weight, x.dtype, x.shape[0])
    if reduce == "sum":
        return torch.sparse.mm(csr, x)     # MKL
    return torch.sparse.mm(csr, x, reduce="amax" if reduce == "max" else reduce)


def _torch_reduce_aggregate(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str) -> Tensor:
    """ATen's row-parallel CSR kernel (``reduce=``) for every reduction, sums included."""
    csr = _torch_csr(graph, weight, x.dtype, x.shape[0])
    return torch.sparse.mm(csr, x, reduce="amax" if reduce == "max" else reduce)


_IMPLS = (_numba_aggregate, _torch_aggregate, _torch_reduce_aggregate)   # indexed by the config's "impl"


def aggregate(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str = "sum", owned: bool = False) -> Tensor:
    """``out[i] = reduce_{e in row i} w_e x[col[e]]`` (see ``_dispatch.aggregate``): the Numba or
    torch.sparse kernels; per-feature weights other than multi-head sums take the reference.

    Shapes:
        x: [M, F]; weight: [E], [E, H] or None -> [N, F].
    """
    if weight is not None and weight.dim() == 2 and not (reduce == "sum" and x.shape[1] % weight.shape[1] == 0):
        return _torch.aggregate(graph, x, weight, reduce)
    return aggregate_variant(graph, x, weight, reduce, spmm_detail(weight, reduce))


def aggregate_transposed(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str = "sum") -> Tensor:
    """``A'^T x`` (see ``_dispatch.aggregate_transposed``) on the cached transpose."""
    return via_transpose(aggregate, graph, x, weight, reduce)


def aggregate_variant(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, detail: str) -> Tensor:
    """``out[i] = reduce_e w_e x[col e]`` (sum, mean over stored edges, or max; ``weight``
    [E], [E, H] multi-head, or None).  ``detail`` names the variant in the tuner's key.

    Shapes:
        x: [M, F]; weight: [E], [E, H] or None -> [N, F].
    """
    xc = _compute(x)
    if (weight is not None and weight.dim() == 2) or graph.num_edges == 0 or graph.num_nodes == 0:
        out = _numba_aggregate(graph, xc, weight, reduce)     # multi-head, empty: Numba only
    else:
        out = _plan(graph, xc, weight, reduce, detail)(xc)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def edge_values(graph: Graph, a: Tensor, b: Tensor, op: str, heads: int = 0) -> Tensor:
    """Per-edge ``op(a[row e], b[col e])``: ``dot`` -> [E] (per-head dots [E, H] with
    ``heads``), ``add`` / ``mul`` -> [E, F]; ``a``'s dtype."""
    ac = _compute(a)
    out = kernels.sddmm(bounds_of(graph), graph.rowptr, graph.col, ac, _compute(b).to(ac.dtype), op, heads)
    return out.to(a.dtype)


def max_with_arg(graph: Graph, x: Tensor, weight: Optional[Tensor]):
    """The max aggregation and, for float32 / float64, the first edge attaining each output
    (``E`` for rows without edges) from the same pass: what the backward needs, saved by the
    forward.  Half types: ``(out, None)`` (their arg is found on the rounded output later).

    Shapes:
        x: [M, F]; weight: [E] or None -> (out [N, F], arg [N, F] int64 or None).
    """
    if x.dtype not in kernels.NATIVE_DTYPES:
        return _numba_aggregate(graph, _compute(x), weight, "max").to(x.dtype), None
    if _fast(graph, x, weight):
        return _numba_runner(graph, x, weight, "max_arg")(x.contiguous())
    return kernels.spmm_max(bounds_of(graph), graph.rowptr, graph.col, weight, x, with_arg=True)


def max_arg(graph: Graph, x: Tensor, weight: Optional[Tensor], out: Tensor) -> Tensor:
    """First edge attaining each ``out[i, f]`` of the max aggregation (E where none).

    Messages are rounded to ``out``'s dtype before comparing (as the reference does), so
    half-precision results of any backend find their edges: those go through the reference.
    """
    if out.dtype not in kernels.NATIVE_DTYPES or out.dtype != x.dtype:
        from .reference import spmm_max_arg

        return spmm_max_arg(graph.row, graph.col, x, weight, out)
    return kernels.spmm_max_arg(bounds_of(graph), graph.rowptr, graph.col, weight, x, out)


def max_grads(graph: Graph, arg: Tensor, x: Tensor, weight: Optional[Tensor], grad_out: Tensor,
              need_weight: bool):
    """Gradients of the max aggregation from its arg-max edges ``arg``: ``dX`` over the
    transpose (a masked SpMM: row-parallel, no atomics) and, if ``need_weight``, ``dw`` over
    the graph.

    Shapes:
        arg, grad_out: [N, F]; x: [M, F]; weight: [E] or None -> (dX [M, F], dw [E] or None).
    """
    g = _compute(grad_out)
    transposed = graph.t()
    perm = graph.transpose_parts()[2]
    grad_x = kernels.spmm_max_grad(bounds_of(transposed), transposed.rowptr, transposed.col, perm, weight, arg, g)
    grad_w = None
    if need_weight and weight is not None:
        grad_w = kernels.spmm_max_weight_grad(bounds_of(graph), graph.rowptr, graph.col, arg, _compute(x), g)
        grad_w = grad_w.to(weight.dtype)
    return grad_x.to(x.dtype), grad_w


def softmax(graph: Graph, scores: Tensor) -> Tensor:
    """Edge softmax over each target's edges. Shapes: scores [E] or [E, H] -> same."""
    return kernels.edge_softmax(bounds_of(graph), graph.rowptr, _compute(scores)).to(scores.dtype)


def softmax_grad(graph: Graph, out: Tensor, grad_out: Tensor) -> Tensor:
    """``ds_e = y_e (g_e - sum_{e' -> i} g_e' y_e')`` for the softmax output ``y = out``."""
    res = kernels.edge_softmax_backward(bounds_of(graph), graph.rowptr, _compute(out), _compute(grad_out))
    return res.to(out.dtype)


def edge_sum(graph: Graph, values: Tensor, by_source: bool = False) -> Tensor:
    """``out[i] = sum_{e: row[e] = i} v_e`` (by target), or over ``col[e] = i`` (``by_source``:
    the same row-parallel sum over the transpose).

    Shapes:
        values: [E] or [E, F] -> [N] or [N, F] ([M] or [M, F] ``by_source``).
    """
    if by_source:
        graph, values = graph.t(), values.index_select(0, graph.transpose_parts()[2])
    return kernels.segment_sum(bounds_of(graph), graph.rowptr, _compute(values)).to(values.dtype)


def head_dots(graph: Graph, grad_out: Tensor, x: Tensor, heads: int) -> Tensor:
    """Per-edge, per-head ``<dY_i, X_j>`` over each head's ``F / H`` features: [E, H]."""
    return edge_values(graph, grad_out, x, "dot", heads)


def max_backward(graph: Graph, grad_out: Tensor, x: Tensor, weight: Optional[Tensor], out: Tensor,
                 arg: Optional[Tensor], need_weight: bool):
    """Gradients of the max aggregation from its arg-max edges (``arg``, found here unless the
    forward saved them): ``max_grads``."""
    if arg is None:
        arg = max_arg(graph, x, weight, out)
    return max_grads(graph, arg, x, weight, grad_out, need_weight)
