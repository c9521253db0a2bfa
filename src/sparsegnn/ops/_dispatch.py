"""Backend choice shared by the ops, and the one aggregation primitive they all reuse."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._checks import check
from ..graph import Graph
from ..kernels import interpreting, triton_available
from . import reference

BACKENDS = ("auto", "reference", "triton")
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def choose_backend(fn: str, backend: str, x: Tensor, triton_supported: Optional[str] = None) -> str:
    """Resolve ``backend`` for input ``x``.

    Args:
        fn: public op name, for error messages.
        backend: ``"auto"``, ``"reference"`` or ``"triton"``.
        x: the dense input that decides device and dtype.
        triton_supported: ``None`` when a Triton kernel exists for this call, else the reason
            why not (used in the error for an explicit ``backend="triton"``).

    ``"auto"`` picks Triton for CUDA tensors of a supported dtype, the reference otherwise.
    """
    if backend == "auto" and triton_supported is None and x.is_cuda and x.dtype in TRITON_DTYPES:  # the hot path
        return "triton" if triton_available() else "reference"
    if backend not in BACKENDS:
        raise ValueError(f"{fn}(): backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        usable = triton_supported is None and x.is_cuda and x.dtype in TRITON_DTYPES and triton_available()
        return "triton" if usable else "reference"
    if backend == "triton":
        check(triton_supported is None, fn, f"backend='triton' {triton_supported}")
        check(triton_available(), fn, "backend='triton' needs the triton package (pip install triton)")
        check(x.is_cuda or interpreting(), fn,
              "backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run kernels in the CPU interpreter)")
        check(x.dtype in TRITON_DTYPES, fn, f"backend='triton' supports float32, float16 and bfloat16, got {x.dtype}")
    return backend


_KERNELS = None


def _kernels():
    """Kernel modules, imported once on first use (Triton is optional on CPU machines)."""
    global _KERNELS
    if _KERNELS is None:
        from types import SimpleNamespace

        from ..kernels import configs, sddmm_csr, spmm_csr
        from ..tune import decide

        _KERNELS = SimpleNamespace(configs=configs, spmm=spmm_csr, sddmm=sddmm_csr, decide=decide)
    return _KERNELS


def plan_of(graph: Graph):
    """The graph's cached work partition, at the chunk length the heuristics pick for it."""
    plan = graph.cache.get("plan")
    if plan is None:
        chunk = _kernels().configs.spmm_chunk(graph.num_nodes, graph.num_edges)
        plan = graph.cache["plan"] = graph.row_plan(chunk)
    return plan


def spmm_detail(weight: Optional[Tensor], reduce: str) -> str:
    """The variant part of an SpMM decision key: reduce, edge values, heads."""
    heads = weight.shape[1] if weight is not None and weight.dim() == 2 else 0
    return f"{reduce}|val{int(weight is not None)}|h{heads}"


def _spmm_triton(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str) -> Tensor:
    k = _kernels()
    plan = plan_of(graph)
    run = lambda cfg: k.spmm.spmm_planned(graph.rowptr, plan, weight, x, reduce, config=cfg)  # noqa: E731
    multi_head = weight is not None and weight.dim() == 2
    candidates = lambda: k.configs.spmm_candidates(graph.num_nodes, graph.num_edges, x.shape[1],  # noqa: E731
                                                   x.element_size(), plan.max_degree, multi_head=multi_head)
    config = k.decide("spmm", graph, spmm_detail(weight, reduce), x.shape[1], x.dtype, x.device, candidates, run,
                      space=k.configs.SPMM_SPACE)
    return run(config)


def edge_values(backend: str, graph: Graph, a: Tensor, b: Tensor, op: str) -> Tensor:
    """Per-edge ``op(a[row[e]], b[col[e]])`` with the chosen backend (``dot`` -> [E], else [E, F])."""
    if backend == "triton":
        k = _kernels()
        plan = plan_of(graph)
        run = lambda cfg: k.sddmm.sddmm_csr(plan, a, b, op, config=cfg)  # noqa: E731
        candidates = lambda: k.configs.sddmm_candidates(graph.num_nodes, graph.num_edges, a.shape[1], op)  # noqa: E731
        config = k.decide("sddmm", graph, op, a.shape[1], a.dtype, a.device, candidates, run,
                          space=k.configs.SDDMM_SPACE)
        return run(config)
    return reference.sddmm(graph.row, graph.col, a, b, op)


def aggregate(backend: str, graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str = "sum") -> Tensor:
    """``out[i] = reduce_{e in row i} w_e x[col[e]]`` on ``graph`` with the chosen backend.

    ``reduce`` is ``"sum"``, ``"mean"`` (divide by the number of stored edges) or ``"max"``.
    ``weight`` of shape [E, H] with ``F % H == 0`` is multi-head: feature ``f`` is weighted by
    ``w[e, f // (F / H)]`` (``H = F``: per-feature weights).  Multi-head sums run in one
    Triton launch for every head; other per-feature cases take the reference path.

    Shapes:
        x: [N, F]; weight: [E], [E, H] or None -> [N, F].
    """
    multi_head = weight is not None and weight.dim() == 2
    if backend == "triton" and (not multi_head or (reduce == "sum" and x.shape[1] % weight.shape[1] == 0)):
        return _spmm_triton(graph, x, weight, reduce)
    if multi_head and weight.shape[1] != x.shape[1]:
        weight = weight.repeat_interleave(x.shape[1] // weight.shape[1], dim=1)
    if reduce == "max":
        return reference.spmm_max(graph.row, graph.col, graph.num_nodes, x, weight)
    if reduce == "mean":
        scale = mean_scale(graph, x.dtype)
        weight = scale if weight is None else weight * scale
    return reference.spmm_sum(graph.row, graph.col, graph.num_nodes, x, weight)


def mean_scale(graph: Graph, dtype: torch.dtype) -> Tensor:
    """Per-edge ``1 / deg(row)``, float64 for float64 inputs, float32 otherwise."""
    return graph.mean_scale(torch.float64 if dtype == torch.float64 else torch.float32)


def aggregate_transposed(backend: str, graph: Graph, x: Tensor, weight: Optional[Tensor]) -> Tensor:
    """``A^T x``: ``out[j] = sum_{e: col[e] = j} w_e x[row[e]]`` via the cached transpose.

    ``weight`` is in ``graph``'s edge order; it is permuted here.
    """
    transposed = graph.t()
    perm = graph.transpose_parts()[2]
    weight_t = weight.index_select(0, perm) if weight is not None else None
    return aggregate(backend, transposed, x, weight_t)
