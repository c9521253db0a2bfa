"""The ``"cpu"`` backend: graph-level computations on CPU tensors.

Each function takes a :class:`Graph` on the CPU and computes what the matching function of
``_dispatch`` computes, with the fastest implementation at hand for the case:

- Numba kernels (``kernels.cpu``): row-parallel over the CSR, one row's accumulator per
  thread, no atomics and no ``[E, F]`` temporaries; every op has one.
- ``torch.sparse.mm`` on the graph's CSR: MKL's SpMM for sums, ATen's ``reduce=`` kernels
  for the mean and the max.  Where such a candidate exists, the tuner (``tune.decide``)
  times both on the first call of a structural class and remembers the faster (keyed by
  the graph's signature, width, dtype and thread count; persisted like the GPU decisions).

float32 and float64 are computed natively; float16 / bfloat16 inputs in float32 (cast back).
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from ..graph import Graph
from ..kernels import cpu as kernels

#: Numba candidate / torch.sparse candidate (the config the tuner stores).
NUMBA, TORCH = {"impl": 0}, {"impl": 1}
SPACE = {"impl": (0, 1)}

# torch.sparse.mm on CSR is the candidate here by choice; its one-time "beta" notice is noise.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)


def _compute(x: Tensor) -> Tensor:
    return x if x.dtype in kernels.NATIVE_DTYPES else x.float()


def bounds_of(graph: Graph) -> Tensor:
    """The graph's row chunks for the current thread count (cached on the graph)."""
    threads = kernels.max_threads()
    key = ("cpu_bounds", threads)
    bounds = graph.cache.get(key)
    if bounds is None:
        bounds = graph.cache[key] = kernels.chunk_bounds(graph.rowptr, threads * kernels.CHUNKS_PER_THREAD)
    return bounds


def _torch_csr(graph: Graph, values: Optional[Tensor], dtype: torch.dtype, num_cols: int) -> Tensor:
    if values is None:
        values = graph.cache.get(("cpu_ones", dtype))
        if values is None:
            values = graph.cache[("cpu_ones", dtype)] = torch.ones(graph.num_edges, dtype=dtype)
    return torch.sparse_csr_tensor(graph.rowptr, graph.col, values.to(dtype), (graph.num_nodes, num_cols),
                                   check_invariants=False)


def _decide(graph: Graph, detail: str, x: Tensor, run) -> dict:
    from ..tune import decide

    detail = f"{detail}|t{kernels.max_threads()}"
    return decide("cpu_spmm", graph, detail, x.shape[1], x.dtype, x.device, [NUMBA, TORCH], run,
                  space=SPACE, ranked=False)


def aggregate(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, detail: str) -> Tensor:
    """``out[i] = reduce_e w_e x[col e]`` (sum, mean over stored edges, or max; ``weight``
    [E], [E, H] multi-head, or None).  ``detail`` names the variant in the tuner's key.

    Shapes:
        x: [M, F]; weight: [E], [E, H] or None -> [N, F].
    """
    xc = _compute(x)
    bounds = bounds_of(graph)
    if weight is not None and weight.dim() == 2:   # multi-head: Numba only
        out = kernels.spmm_sum(bounds, graph.rowptr, graph.col, weight, xc)
        return out.to(x.dtype)
    def numba_run():
        if reduce == "max":
            return kernels.spmm_max(bounds, graph.rowptr, graph.col, weight, xc)
        return kernels.spmm_sum(bounds, graph.rowptr, graph.col, weight, xc, mean=reduce == "mean")

    torch_reduce = {"sum": "sum", "mean": "mean", "max": "amax"}[reduce]
    if graph.num_edges == 0 or graph.num_nodes == 0:
        return numba_run().to(x.dtype)

    def torch_run():
        csr = _torch_csr(graph, weight, xc.dtype, xc.shape[0])
        if torch_reduce == "sum":
            return torch.sparse.mm(csr, xc)     # MKL
        return torch.sparse.mm(csr, xc, reduce=torch_reduce)

    config = _decide(graph, detail, xc, lambda cfg: (numba_run if cfg["impl"] == 0 else torch_run)())
    return (numba_run if config["impl"] == 0 else torch_run)().to(x.dtype)


def edge_values(graph: Graph, a: Tensor, b: Tensor, op: str, heads: int = 0) -> Tensor:
    """Per-edge ``op(a[row e], b[col e])``: ``dot`` -> [E] (per-head dots [E, H] with
    ``heads``), ``add`` / ``mul`` -> [E, F]; ``a``'s dtype."""
    ac = _compute(a)
    out = kernels.sddmm(bounds_of(graph), graph.rowptr, graph.col, ac, _compute(b).to(ac.dtype), op, heads)
    return out.to(a.dtype)


def max_arg(graph: Graph, x: Tensor, weight: Optional[Tensor], out: Tensor) -> Tensor:
    """First edge attaining each ``out[i, f]`` of the max aggregation (E where none).

    Messages are rounded to ``out``'s dtype before comparing (as the reference does), so
    half-precision results of any backend find their edges: those go through the reference.
    """
    if out.dtype not in kernels.NATIVE_DTYPES or out.dtype != x.dtype:
        from .reference import spmm_max_arg

        return spmm_max_arg(graph.row, graph.col, x, weight, out)
    return kernels.spmm_max_arg(bounds_of(graph), graph.rowptr, graph.col, weight, x, out)


def softmax(graph: Graph, scores: Tensor) -> Tensor:
    """Edge softmax over each target's edges. Shapes: scores [E] or [E, H] -> same."""
    return kernels.edge_softmax(bounds_of(graph), graph.rowptr, _compute(scores)).to(scores.dtype)


def softmax_grad(graph: Graph, out: Tensor, grad_out: Tensor) -> Tensor:
    """``ds_e = y_e (g_e - sum_{e' -> i} g_e' y_e')`` for the softmax output ``y = out``."""
    res = kernels.edge_softmax_backward(bounds_of(graph), graph.rowptr, _compute(out), _compute(grad_out))
    return res.to(out.dtype)


def edge_sum(graph: Graph, values: Tensor) -> Tensor:
    """``out[i] = sum_{e: row[e] = i} v_e``. Shapes: values [E] or [E, F] -> [N] or [N, F]."""
    return kernels.segment_sum(bounds_of(graph), graph.rowptr, _compute(values)).to(values.dtype)
