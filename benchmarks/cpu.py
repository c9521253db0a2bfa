"""CPU benchmark of the public ops, forward and backward, against torch.sparse and PyG's CPU paths.

``sparsegnn bench --device cpu``.  A case is op x graph x F x dtype; each op is measured
forward and backward separately (rows with ``direction`` ``"fwd"`` / ``"bwd"``):

- ``spmm``: sum, the graph's edge values as weights (gradient for ``x`` only);
- ``spmm-w``: sum with a learnable ``edge_weight`` [E] (gradients for ``x`` and the weights);
- ``spmm-mean``, ``spmm-max``: the graph's edge values as weights (gradient for ``x``);
- ``sddmm``: ``dot`` (gradients for both inputs);
- ``softmax``: ``edge_softmax`` of scores [E, 4], i.e. 4 heads.

Ours (:data:`OURS`) is the public op with ``backend="auto"``.  The baselines compute the same
thing, each in its fastest form: ``torch.sparse.mm`` (MKL CSR, sum only) and
``torch.sparse.mm(..., reduce=...)`` with the faster of int32 and int64 CSR indices, PyG's
gather / scatter, ``torch.sparse.sampled_addmm``, the gather SDDMM and PyG's ``softmax`` by
``index`` and by ``ptr``.  Every provider's output and gradients are checked against a float64
computation in plain PyTorch (:func:`oracle`); one above :data:`TOLERANCE` is flagged
(``ok=False``, a ``WRONG`` note) and is never the best baseline.

Timing: ``time.perf_counter`` around each call, the median of the repeats after a warm-up;
every provider of a case is timed a second time after all of them ran once, and the lower
median is kept (both in ``extra["ms_runs"]``), as the GPU harness does.  Forward calls record
the autograd graph (the inputs require gradients, as in training); a backward time is one
``torch.autograd.grad(out, inputs, grad, retain_graph=True)`` after one forward.  The first
call of each provider and direction is in ``extra["first_call_ms"]`` (ours may compile or tune
on it).  Runs on ``torch.get_num_threads()`` threads.
"""
from __future__ import annotations

import functools
import gc
import math
import os
import platform
import statistics
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

from sparsegnn import edge_softmax, sddmm, spmm
from sparsegnn.graph import Graph
from .harness import DTYPES, Row, _rel_err, bench_graph, compulsory_bytes, write_json

__all__ = ["OPS", "PROVIDERS", "CpuRow", "acceptance", "comparisons", "markdown", "plot", "run", "write_json"]

OURS = "sparsegnn"
OPS = ("spmm", "spmm-w", "spmm-mean", "spmm-max", "sddmm", "softmax")
DIRECTIONS = ("fwd", "bwd")
#: Heads of the ``softmax`` case: scores of shape [E, HEADS].
HEADS = 4
#: Largest relative error (Frobenius norm, vs float64) that passes, per dtype.
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}
#: Cases whose estimated working set (:func:`working_set_bytes`) exceeds this are skipped.
MEMORY_LIMIT_GB = 24.0
ACCEPT_EACH = 1.0
ACCEPT_GEOMEAN = 1.2
_REDUCE = {"spmm": "sum", "spmm-w": "sum", "spmm-mean": "mean", "spmm-max": "max"}
_TORCH_REDUCE = {"sum": "sum", "mean": "mean", "max": "amax"}
_DESCRIPTION = {
    "spmm": "sum, the graph's edge values as weights; backward: dx",
    "spmm-w": "sum with a learnable edge_weight [E]; backward: dx and dw",
    "spmm-mean": "mean, the graph's edge values as weights; backward: dx",
    "spmm-max": "max, the graph's edge values as weights; backward: dx",
    "sddmm": "dot of a[target] and b[source]; backward: da and db",
    "softmax": f"edge_softmax of scores [E, {HEADS}] ({HEADS} heads); backward: dscores",
}
#: What a provider may raise without stopping the run: the row gets the error as its note (a
#: compiled backend's own exception types included; KeyboardInterrupt still stops).
_ERRORS = (Exception,)


@dataclass
class CpuRow(Row):
    """A :class:`~benchmarks.harness.Row` of the CPU benchmark.

    ``direction``: ``"fwd"`` or ``"bwd"``; ``ok``: whether the output (fwd) or every gradient
    (bwd) is within :data:`TOLERANCE` of the float64 oracle (None when the provider did not run).
    """

    direction: str = "fwd"
    ok: Optional[bool] = None


@dataclass
class Case:
    """Tensors of one (op, graph, F, dtype) case.

    ``inputs``: the leaves that get gradients, by name (``x``; ``x, w``; ``a, b``; ``scores``),
    shared by every provider; ``grad_out``: the upstream gradient of every backward;
    ``ref_out`` / ``ref_grads``: the float64 oracle's output and input gradients;
    ``compared``: per input, the gradient entries the check compares where not all of them
    (``spmm-max``: the entries that feed a tied maximum are left out, see :func:`max_ties`).
    """

    op: str
    graph: Graph
    inputs: Dict[str, Tensor]
    grad_out: Tensor
    ref_out: Tensor
    ref_grads: Dict[str, Tensor]
    compared: Dict[str, Tensor] = field(default_factory=dict)

    @property
    def reduce(self) -> Optional[str]:
        return _REDUCE.get(self.op)

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.inputs.values())).dtype


#: A provider: builds, for one case, ``{variant: zero-argument call returning the op's output}``
#: (variant ``""`` when there is one form; the fastest correct variant is kept).
Builder = Callable[[Case], Dict[str, Callable[[], Tensor]]]


# ---------------------------------------------------------------------------- the oracle

def _spmm64(graph: Graph, x: Tensor, weight: Tensor, reduce: str) -> Tensor:
    row = graph.row
    msg = x.index_select(0, graph.col) * weight.unsqueeze(-1)
    zeros = x.new_zeros(graph.num_nodes, x.shape[1])
    if reduce == "max":
        return zeros.scatter_reduce(0, row.unsqueeze(-1).expand_as(msg), msg, "amax", include_self=False)
    out = zeros.index_add(0, row, msg)
    if reduce == "mean":
        out = out / graph.rowptr.diff().clamp(min=1).to(out.dtype).unsqueeze(-1)
    return out


def _softmax64(graph: Graph, scores: Tensor) -> Tensor:
    row = graph.row
    zeros = scores.new_zeros(graph.num_nodes, scores.shape[1])
    peak = zeros.scatter_reduce(0, row.unsqueeze(-1).expand_as(scores), scores.detach(), "amax", include_self=False)
    ex = (scores - peak.index_select(0, row)).exp()
    return ex / zeros.index_add(0, row, ex).index_select(0, row)


def oracle(op: str, graph: Graph, inputs: Mapping[str, Tensor], grad_out: Tensor) -> Tuple[Tensor, Dict[str, Tensor]]:
    """Output of ``op`` and the gradients of ``inputs`` (for upstream ``grad_out``) in float64,
    by gather / scatter in plain PyTorch, independent of the library's ops and of the baselines' forms.

    Shapes:
        as :func:`make_case`'s inputs; -> output [N, F] (spmm), [E] (sddmm), [E, H] (softmax).
    """
    leaves = {k: v.detach().double().requires_grad_() for k, v in inputs.items()}
    if op == "sddmm":
        out = (leaves["a"].index_select(0, graph.row) * leaves["b"].index_select(0, graph.col)).sum(-1)
    elif op == "softmax":
        out = _softmax64(graph, leaves["scores"])
    else:
        weight = leaves["w"] if "w" in leaves else graph.edge_val.double()
        out = _spmm64(graph, leaves["x"], weight, _REDUCE[op])
    grads = torch.autograd.grad(out, list(leaves.values()), grad_out.double())
    return out.detach(), dict(zip(leaves, grads))


def make_case(op: str, graph: Graph, num_feats: int, dtype: torch.dtype, seed: int = 0) -> Case:
    """Seeded inputs of ``op`` on ``graph`` (with edge values), in ``dtype``, and the float64 oracle's
    results for exactly those (rounded) inputs.

    Shapes:
        x, a, b: [N, F]; w: [E] (the graph's values, learnable); scores: [E, HEADS].
    """
    gen = torch.Generator().manual_seed(seed)
    n, e = graph.num_nodes, graph.num_edges
    if op == "sddmm":
        inputs = {"a": torch.randn(n, num_feats, generator=gen), "b": torch.randn(n, num_feats, generator=gen)}
        out_shape: Tuple[int, ...] = (e,)
    elif op == "softmax":
        inputs = {"scores": torch.randn(e, HEADS, generator=gen)}
        out_shape = (e, HEADS)
    else:
        inputs = {"x": torch.randn(n, num_feats, generator=gen)}
        if op == "spmm-w":
            inputs["w"] = graph.edge_val.clone()
        out_shape = (n, num_feats)
    inputs = {k: v.to(dtype) for k, v in inputs.items()}
    grad_out = torch.randn(out_shape, generator=gen).to(dtype)
    ref_out, ref_grads = oracle(op, graph, inputs, grad_out)
    compared = {"x": ~max_ties(graph, inputs["x"], graph.edge_val.to(dtype))} if op == "spmm-max" else {}
    leaves = {k: v.requires_grad_() for k, v in inputs.items()}
    return Case(op, graph, leaves, grad_out, ref_out, ref_grads, compared)


def max_ties(graph: Graph, x: Tensor, weight: Tensor) -> Tensor:
    """Entries of ``x`` whose gradient under ``reduce="max"`` is not unique: they feed an output
    ``(i, f)`` whose maximum message ``w_e x[j, f]``, rounded to ``x``'s dtype as every provider
    computes it, is attained by more than one edge.  There any split of the gradient between
    the tied edges is right (ours gives it to the first, ``amax`` splits it evenly), so the check
    leaves these entries out.  Rounding is monotonic: elsewhere the float64 argmax is the same.

    Shapes:
        x: [N, F]; weight: [E] -> bool [N, F].
    """
    row, col = graph.row, graph.col
    msg = x.index_select(0, col) * weight.unsqueeze(-1)
    peak = msg.new_zeros(graph.num_nodes, x.shape[1]).scatter_reduce(
        0, row.unsqueeze(-1).expand_as(msg), msg, "amax", include_self=False)
    at_peak = msg == peak.index_select(0, row)
    count = torch.zeros(graph.num_nodes, x.shape[1], dtype=torch.int32).index_add_(0, row, at_peak.int())
    tied = at_peak & (count.index_select(0, row) > 1)
    return torch.zeros(x.shape, dtype=torch.int32).index_add_(0, col, tied.int()) > 0


# ---------------------------------------------------------------------------- providers

def _ours(case: Case) -> Dict[str, Callable[[], Tensor]]:
    g, i = case.graph, case.inputs
    if case.op == "sddmm":
        return {"": lambda: sddmm(g, i["a"], i["b"], "dot")}
    if case.op == "softmax":
        return {"": lambda: edge_softmax(g, i["scores"])}
    if case.op == "spmm-w":
        return {"": lambda: spmm(g, i["x"], reduce="sum", edge_weight=i["w"])}
    reduce = case.reduce
    return {"": lambda: spmm(g, i["x"], reduce=reduce)}


def _csr_indices(graph: Graph) -> Dict[str, Tuple[Tensor, Tensor]]:
    """``variant -> (rowptr, col)`` of both index widths torch's CSR kernels take."""
    return {"int64": (graph.rowptr, graph.col), "int32": (graph.rowptr.int(), graph.col.int())}


def _weights(case: Case) -> Tensor:
    """The edge weights of an spmm case: the learnable ``w`` or the graph's values."""
    return case.inputs["w"] if "w" in case.inputs else case.graph.edge_val.to(case.dtype)


def _sparse_mm(case: Case, with_reduce: bool) -> Dict[str, Callable[[], Tensor]]:
    """``torch.sparse.mm(csr, x)`` (MKL) or ``torch.sparse.mm(csr, x, reduce)``, one variant per index
    width.  With learnable weights the CSR is built inside the call, so their gradient reaches ``w``."""
    g, x = case.graph, case.inputs["x"]
    shape = (g.num_nodes, g.num_nodes)
    kwargs = {"reduce": _TORCH_REDUCE[case.reduce]} if with_reduce else {}
    w = case.inputs.get("w")
    variants = {}
    for name, (rowptr, col) in _csr_indices(g).items():
        if w is not None:
            variants[name] = lambda r=rowptr, c=col: torch.sparse.mm(torch.sparse_csr_tensor(r, c, w, shape), x, **kwargs)
        else:
            csr = torch.sparse_csr_tensor(rowptr, col, _weights(case), shape)
            variants[name] = lambda csr=csr: torch.sparse.mm(csr, x, **kwargs)
    return variants


def _pyg_scatter(case: Case) -> Dict[str, Callable[[], Tensor]]:
    """PyG's gather / scatter message passing: ``scatter(x[col] * w, row, reduce)``."""
    from torch_geometric.utils import scatter

    g, x, w, reduce = case.graph, case.inputs["x"], _weights(case), case.reduce
    row, col = g.row, g.col
    return {"": lambda: scatter(x.index_select(0, col) * w.unsqueeze(-1), row, 0, dim_size=g.num_nodes, reduce=reduce)}


def _sampled_addmm(case: Case) -> Dict[str, Callable[[], Tensor]]:
    """``torch.sparse.sampled_addmm(template, a, b^T, beta=0)`` on the CPU CSR, one variant per index width."""
    g, a, b = case.graph, case.inputs["a"], case.inputs["b"]
    zeros = torch.zeros(g.num_edges, dtype=a.dtype)
    variants = {}
    for name, (rowptr, col) in _csr_indices(g).items():
        template = torch.sparse_csr_tensor(rowptr, col, zeros, (g.num_nodes, g.num_nodes))
        variants[name] = lambda t=template: torch.sparse.sampled_addmm(t, a, b.t(), beta=0.0).values()
    return variants


def _gather_dot(case: Case) -> Dict[str, Callable[[], Tensor]]:
    g, a, b = case.graph, case.inputs["a"], case.inputs["b"]
    row, col = g.row, g.col
    return {"": lambda: (a.index_select(0, row) * b.index_select(0, col)).sum(-1)}


def _pyg_softmax(by: str) -> Builder:
    """PyG's ``softmax(src, index=row, num_nodes=N)`` (``by="index"``) or ``softmax(src, ptr=rowptr)``."""
    def build(case: Case) -> Dict[str, Callable[[], Tensor]]:
        from torch_geometric.utils import softmax

        g, s = case.graph, case.inputs["scores"]
        if by == "index":
            row = g.row
            return {"": lambda: softmax(s, index=row, num_nodes=g.num_nodes)}
        return {"": lambda: softmax(s, ptr=g.rowptr)}
    return build


#: torch's gradient for the values of a CSR operand of ``torch.sparse.mm`` (with or without
#: ``reduce``) goes through a dense [N, N] matrix: its time and memory grow with N^2, whatever the
#: edge count (15 s a call at 43k nodes; an allocation error at 145k).  spmm-w's backward of those
#: baselines is skipped, with a note, where that matrix would exceed this many GB.
DENSE_GRAD_LIMIT_GB = 1.0


def _dense_value_grad(case: Case) -> str:
    """The skip note of a torch.sparse.mm spmm-w backward whose dense [N, N] exceeds :data:`DENSE_GRAD_LIMIT_GB`."""
    gb = case.graph.num_nodes ** 2 * case.dtype.itemsize / 1e9
    if case.op != "spmm-w" or gb <= DENSE_GRAD_LIMIT_GB:
        return ""
    return (f"skipped: torch's gradient for CSR values goes through a dense [N, N] "
            f"({gb:.1f} GB > {DENSE_GRAD_LIMIT_GB:g} GB)")


_SPMM_BASELINES: Dict[str, Builder] = {
    "torch.sparse.mm": lambda case: _sparse_mm(case, with_reduce=False),
    "torch.sparse.mm-reduce": lambda case: _sparse_mm(case, with_reduce=True),
    "pyg-scatter": _pyg_scatter,
}
_REDUCE_BASELINES = {k: v for k, v in _SPMM_BASELINES.items() if k != "torch.sparse.mm"}  # sum only

#: op -> provider -> builder; ours first.
PROVIDERS: Dict[str, Dict[str, Builder]] = {
    "spmm": {OURS: _ours, **_SPMM_BASELINES},
    "spmm-w": {OURS: _ours, **_SPMM_BASELINES},
    "spmm-mean": {OURS: _ours, **_REDUCE_BASELINES},
    "spmm-max": {OURS: _ours, **_REDUCE_BASELINES},
    "sddmm": {OURS: _ours, "torch.sparse.sampled_addmm": _sampled_addmm, "gather": _gather_dot},
    "softmax": {OURS: _ours, "pyg-softmax-index": _pyg_softmax("index"), "pyg-softmax-ptr": _pyg_softmax("ptr")},
}
#: provider -> function of the case giving a note when its backward is not run ("" to run it).
SKIP_BACKWARD: Dict[str, Callable[[Case], str]] = {
    "torch.sparse.mm": _dense_value_grad, "torch.sparse.mm-reduce": _dense_value_grad,
}


# ---------------------------------------------------------------------------- timing

def _time_ms(fn: Callable[[], object], budget_s: float, warmup: int = 1, min_reps: int = 5,
             max_reps: int = 2000) -> float:
    """Median milliseconds of ``fn()`` over repeats, after ``warmup`` calls: at least ``min_reps``
    and then until ``budget_s`` seconds have passed (at most ``max_reps``).  The garbage collector
    is off while timing (as in ``timeit``)."""
    for _ in range(warmup):
        fn()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        times: List[float] = []
        deadline = time.perf_counter() + budget_s
        while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() < deadline):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    finally:
        if was_enabled:
            gc.enable()
    return 1e3 * statistics.median(times)


def _timed_call(direction: str, fn: Callable[[], Tensor], case: Case) -> Callable[[], object]:
    """What one timing calls: ``fn`` itself (fwd), or the input gradients of one retained forward (bwd)."""
    if direction == "fwd":
        return fn
    out, inputs = fn(), tuple(case.inputs.values())
    return lambda: torch.autograd.grad(out, inputs, case.grad_out, retain_graph=True)


def _error_vs_oracle(direction: str, result, case: Case) -> float:
    """Relative error of the output (fwd) or the worst input gradient (bwd) vs the float64 oracle."""
    if direction == "fwd":
        return _rel_err(result.detach(), case.ref_out)
    errs = []
    for name, grad in zip(case.inputs, result):
        grad, ref = grad.detach(), case.ref_grads[name]
        if name in case.compared:
            grad, ref = grad[case.compared[name]], ref[case.compared[name]]
        errs.append(_rel_err(grad, ref))
    return max(errs)


def _measure_variant(call: Callable[[], object], direction: str, case: Case, budget_s: float) -> Dict[str, float]:
    start = time.perf_counter()
    result = call()
    first_ms = 1e3 * (time.perf_counter() - start)
    err = _error_vs_oracle(direction, result, case)
    del result
    return {"first_call_ms": first_ms, "rel_err": err, "ms": _time_ms(call, budget_s)}


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def _measure_provider(row: CpuRow, variants: Dict[str, Callable[[], Tensor]], case: Case, tol: float,
                      budget_s: float) -> Optional[Callable[[], object]]:
    """Measure every variant of a provider in ``row.direction`` and fill ``row`` with the fastest
    correct one (the fastest of all, flagged, if none is correct).

    Returns the kept variant's call (for the second pass), None if no variant ran.
    """
    results, calls, errors = {}, {}, {}
    for variant, fn in variants.items():
        try:
            calls[variant] = _timed_call(row.direction, fn, case)
            results[variant] = _measure_variant(calls[variant], row.direction, case, budget_s)
        except _ERRORS as exc:
            errors[variant] = _short(exc)
            calls.pop(variant, None)
    if len(variants) > 1:
        row.extra["variants"] = {v: results.get(v, {"error": errors.get(v)}) for v in variants}
    if not results:
        prefix = "no gradient: " if row.direction == "bwd" else "error: "
        row.note = prefix + "; ".join(f"{v} {e}".strip() for v, e in errors.items())
        return None
    passing = {v: r for v, r in results.items() if r["rel_err"] < tol}
    pool = passing or results
    best = min(pool, key=lambda v: pool[v]["ms"])
    row.ms, row.rel_err, row.ok = pool[best]["ms"], pool[best]["rel_err"], best in passing
    row.extra["first_call_ms"] = pool[best]["first_call_ms"]
    if len(variants) > 1:
        row.extra["variant"] = best
    if not row.ok:
        row.note = f"WRONG: rel_err {row.rel_err:.1e} >= {tol:.0e} vs float64"
    return calls[best]


def _second_pass(timed: List[Tuple[CpuRow, Callable[[], object]]], budget_s: float) -> None:
    """Time every provider of a case again, after all of them ran once, and keep the lower median."""
    for row, call in timed:
        try:
            again = _time_ms(call, budget_s)
        except _ERRORS:
            continue
        row.extra["ms_runs"] = [row.ms, again]
        row.ms = min(row.ms, again)


def _run_case(name: str, case: Case, num_feats: int, dtype_name: str, providers: Mapping[str, Builder],
              budget_s: float) -> List[CpuRow]:
    """Rows of one case: every provider forward and backward, then the second timing pass."""
    g, tol = case.graph, TOLERANCE[dtype_name]
    rows: List[CpuRow] = []
    timed = []
    for provider, build in providers.items():
        fresh = [CpuRow(case.op, name, g.num_nodes, g.num_edges, num_feats, dtype_name, provider, direction=d)
                 for d in DIRECTIONS]
        try:
            variants = build(case)
        except ImportError as exc:
            rows += [_noted(row, f"unavailable: {exc.name or exc}") for row in fresh]
            continue
        except _ERRORS as exc:
            rows += [_noted(row, f"error: {_short(exc)}") for row in fresh]
            continue
        for row in fresh:
            rows.append(row)
            skip = SKIP_BACKWARD.get(provider, lambda case: "")(case) if row.direction == "bwd" else ""
            if skip:
                row.note = skip
                continue
            call = _measure_provider(row, variants, case, tol, budget_s)
            if call is not None:
                timed.append((row, call))
            if row.direction == "bwd" and case.compared:
                row.extra["grad_entries_left_out"] = sum(int((~m).sum()) for m in case.compared.values())
    _second_pass(timed, budget_s)
    for row in rows:
        if row.ms and row.direction == "fwd" and case.op != "softmax":
            row.gbps = compulsory_bytes(case.op, g.num_nodes, g.num_edges, num_feats, case.dtype.itemsize) / (row.ms * 1e6)
    return rows


def _noted(row: CpuRow, note: str) -> CpuRow:
    row.note = note
    return row


# ---------------------------------------------------------------------------- running

def working_set_bytes(num_nodes: int, num_edges: int, num_feats: int) -> int:
    """Rough peak bytes of one case, the float64 oracle included: the structure, its transpose and
    the CSR copies (~80 B/edge), a dozen [N, F] float64 tensors, and the [E, F] gathers of the
    gather / scatter providers and of the oracle with their gradients (fp32 and fp64)."""
    return 80 * num_edges + 96 * num_nodes * num_feats + 48 * num_edges * max(num_feats, HEADS)


_WARM = {"done": False}


def _warm_up_cpu(seconds: float = 0.5) -> None:
    """Start the intra-op thread pool and MKL before the first case, so that the first provider's
    first call does not pay for it (torch ops only: ours' first call is measured as it is).
    Once per process: the pool stays up."""
    if _WARM["done"]:
        return
    _WARM["done"] = True
    a = torch.randn(512, 64)
    idx = torch.arange(512)
    csr = torch.sparse_csr_tensor(torch.arange(513), idx.flip(0), torch.ones(512), (512, 512))
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.sparse.mm(csr, a)
        (a.t() @ a).sum()
        a.index_add(0, idx, a)


def canary_ms(calls: int = 20) -> float:
    """Median ms of a fixed torch-only workload (a CSR product with ``reduce`` and an ``index_add``
    on 256 rows): a few microseconds in a healthy process.  The harness takes it before the first
    graph and after each: a jump means something in the process (e.g. a second OpenMP runtime
    spinning its threads) slows every later call, the baselines' included."""
    x = torch.randn(256, 8)
    idx = torch.arange(256)
    csr = torch.sparse_csr_tensor(torch.arange(257), idx.flip(0), torch.ones(256), (256, 256))
    return _time_ms(lambda: (torch.sparse.mm(csr, x, reduce="sum"), x.index_add(0, idx, x)), budget_s=0.0,
                    warmup=2, min_reps=calls)


#: Canary slowdown (worst / first, and over 0.1 ms) above which the report warns that the timings are not trustworthy.
CANARY_ALARM = 3.0


def _check_args(ops: List[str], dims: List[int], dtypes: List[str], providers: Mapping[str, Mapping],
                budget_s: float) -> None:
    unknown = [op for op in ops if op not in providers]
    if unknown:
        raise ValueError(f"bench(): unknown ops {unknown} for --device cpu; known: {', '.join(providers)}")
    bad_dims = [d for d in dims if not isinstance(d, int) or d < 1]
    if bad_dims:
        raise ValueError(f"bench(): feature widths must be positive integers, got {bad_dims}")
    bad_dtypes = [d for d in dtypes if d not in TOLERANCE]
    if bad_dtypes:
        raise ValueError(f"bench(): unknown dtypes {bad_dtypes}; known: {', '.join(TOLERANCE)}")
    if not budget_s > 0:
        raise ValueError(f"bench(): the timing budget must be > 0 seconds, got {budget_s}")
    if not ops or not dims or not dtypes:
        raise ValueError("bench(): needs at least one op, one feature width and one dtype")


def _provider_table(wanted: Optional[Iterable[str]],
                    extra: Optional[Mapping[str, Mapping[str, Builder]]]) -> Dict[str, Dict[str, Builder]]:
    """``op -> {provider: builder}``: :data:`PROVIDERS` plus ``extra``, restricted to ``wanted``."""
    table = {op: dict(builders) for op, builders in PROVIDERS.items()}
    for op, builders in (extra or {}).items():
        table.setdefault(op, {}).update(builders)
    wanted = set(wanted) if wanted else None
    if wanted:
        known = {p for builders in table.values() for p in builders}
        if wanted - known:
            raise ValueError(f"bench(): unknown providers {sorted(wanted - known)}; known: {', '.join(sorted(known))}")
        table = {op: {p: b for p, b in builders.items() if p in wanted} for op, builders in table.items()}
    return table


def _with_weights(structure: Graph, seed: int) -> Graph:
    """The structure with seeded edge values in [0.5, 1.5) (as the GPU harness)."""
    gen = torch.Generator().manual_seed(seed)
    return structure.with_values(torch.rand(structure.num_edges, generator=gen) + 0.5)


def _skipped_rows(name: str, graph: Graph, num_feats: int, ops: List[str], dtypes: List[str], note: str) -> List[CpuRow]:
    return [CpuRow(op, name, graph.num_nodes, graph.num_edges, num_feats, d, OURS, note=note, direction=direction)
            for op in ops for d in dtypes for direction in DIRECTIONS]


def run(graphs: Iterable[str], ops: Iterable[str] = OPS, dims: Iterable[int] = (16, 64),
        dtypes: Iterable[str] = ("float32",), providers: Optional[Iterable[str]] = None, seed: int = 0,
        progress: bool = True, data_dir=None, real: bool = True, budget_s: float = 0.2,
        memory_limit_gb: float = MEMORY_LIMIT_GB, loader: Optional[Callable[[str], Graph]] = None,
        extra_providers: Optional[Mapping[str, Mapping[str, Builder]]] = None,
        health: Optional[Dict[str, float]] = None) -> List[CpuRow]:
    """Run every (op, graph, F, dtype) case with every applicable provider, forward and backward, on CPU.

    Args:
        graphs: graph names, loaded one at a time by ``loader`` (default: ``harness.bench_graph`` on
            CPU: the real suite with ``real``, else the synthetic stand-ins).
        ops: items of :data:`OPS`.
        providers: a subset of provider names (default: all).
        budget_s: seconds of repeats per timing (each timing runs at least 5 calls).
        memory_limit_gb: cases whose :func:`working_set_bytes` exceed it are skipped with a note.
        extra_providers: ``op -> {name: builder}`` added to :data:`PROVIDERS` (tests inject a broken one).
        health: a dict to fill with :func:`canary_ms` readings: ``"start"``, then one per graph
            (after its cases); :func:`markdown` reads them from ``meta["canary_ms"]``.

    Returns:
        :class:`CpuRow` per case, provider and direction.
    """
    graphs, ops, dims, dtypes = list(graphs), list(ops), list(dims), list(dtypes)
    table = _provider_table(providers, extra_providers)
    _check_args(ops, dims, dtypes, table, budget_s)
    if loader is None:
        loader = functools.partial(bench_graph, seed=seed, device="cpu", data_dir=data_dir, real=real)
    with warnings.catch_warnings():  # torch's once-per-process notes on CSR tensors
        warnings.filterwarnings("ignore", message=".*(Sparse CSR tensor support is in beta|Sparse invariant checks)")
        return _run_all(graphs, ops, dims, dtypes, table, loader, seed, progress, budget_s, memory_limit_gb,
                        {} if health is None else health)


def _run_all(graphs: List[str], ops: List[str], dims: List[int], dtypes: List[str], table: Dict[str, Dict[str, Builder]],
             loader: Callable[[str], Graph], seed: int, progress: bool, budget_s: float,
             memory_limit_gb: float, health: Dict[str, float]) -> List[CpuRow]:
    from tqdm.auto import tqdm

    rows: List[CpuRow] = []
    bar = tqdm(total=len(graphs) * len(dims) * len(ops) * len(dtypes), disable=not progress, desc="bench cpu")
    _warm_up_cpu()
    health["start"] = canary_ms()
    for name in graphs:
        graph = _with_weights(loader(name), seed)
        for num_feats in dims:
            need = working_set_bytes(graph.num_nodes, graph.num_edges, num_feats)
            if need > memory_limit_gb * 1e9:
                note = f"skipped: needs ~{need / 1e9:.0f} GB, over the {memory_limit_gb:g} GB limit"
                rows += _skipped_rows(name, graph, num_feats, ops, dtypes, note)
                bar.update(len(ops) * len(dtypes))
                continue
            for op in ops:
                for dtype_name in dtypes:
                    case = make_case(op, graph, num_feats, DTYPES[dtype_name], seed)
                    rows += _run_case(name, case, num_feats, dtype_name, table[op], budget_s)
                    del case
                    bar.update(1)
        del graph
        health[name] = canary_ms()
    bar.close()
    return rows


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: Environment variables that change how CPU code threads, recorded with a run.
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME",
               "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER")


def meta(**more) -> Dict:
    """Run metadata: CPU, core and thread counts, torch / PyG versions, date, the load average
    now (1, 5, 15 min: other processes on the cores slow the timings), the threading environment
    variables that are set, plus ``more``."""
    import datetime

    try:
        import torch_geometric

        pyg = torch_geometric.__version__
    except ImportError:
        pyg = None
    return {"device": f"cpu: {cpu_name()}", "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "torch_geometric": pyg, "mkl": torch.backends.mkl.is_available(),
            "date": datetime.date.today().isoformat(), "load_avg_after": list(os.getloadavg()),
            "env": {k: v for k, v in os.environ.items() if k in _THREAD_ENV}, **more}


# ---------------------------------------------------------------------------- report

@dataclass
class Comparison:
    """Ours vs the fastest correct baseline in one (op, direction, graph, F, dtype) case."""

    ours_ms: Optional[float]
    ours_ok: bool
    ours_first_ms: Optional[float]
    ours_rel_err: Optional[float]
    best_ms: Optional[float]
    best_name: Optional[str]
    nodes: int
    nnz: int

    @property
    def speedup(self) -> Optional[float]:
        """Best baseline ms / ours ms; None unless ours ran and passed the check and a baseline ran."""
        if self.ours_ms and self.ours_ok and self.best_ms:
            return self.best_ms / self.ours_ms
        return None


def comparisons(rows: List[dict]) -> Dict[Tuple[str, str, str, int, str], Comparison]:
    """``(op, direction, graph, F, dtype) -> Comparison`` from JSON rows (dicts).  Only baselines that
    ran and passed the correctness check compete for the best, and only those that give gradients:
    a forward that records no autograd graph (its backward noted "no gradient") is not the same
    work as ours, in either direction."""
    by_case = defaultdict(list)
    for r in rows:
        by_case[(r["op"], r["direction"], r["graph"], r["F"], r["dtype"])].append(r)
    gradless = {(r["op"], r["graph"], r["F"], r["dtype"], r["provider"]) for r in rows
                if r["direction"] == "bwd" and (r.get("note") or "").startswith("no gradient")}
    out = {}
    for key, case_rows in by_case.items():
        ours = next((r for r in case_rows if r["provider"] == OURS), None)
        base = [r for r in case_rows if r["provider"] != OURS and r["ms"] and r["ok"]
                and (key[0], key[2], key[3], key[4], r["provider"]) not in gradless]
        best = min(base, key=lambda r: r["ms"]) if base else None
        out[key] = Comparison(
            ours_ms=ours["ms"] if ours else None, ours_ok=bool(ours and ours["ok"]),
            ours_first_ms=(ours or {}).get("extra", {}).get("first_call_ms"),
            ours_rel_err=ours["rel_err"] if ours else None,
            best_ms=best["ms"] if best else None, best_name=best["provider"] if best else None,
            nodes=case_rows[0]["nodes"], nnz=case_rows[0]["nnz"])
    return out


def _geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _where(key: tuple, with_op: bool = False) -> str:
    op, direction, graph, num_feats, dtype = key
    return (f"{op} {direction}, " if with_op else "") + f"{graph}, F={num_feats}" + ("" if dtype == "float32" else f", {dtype}")


def _summary(comps: Dict[tuple, Comparison], with_op: bool = False) -> str:
    """``geomean G.GGx over N cases, worst W.WWx (where)`` of the cases with a speedup."""
    sp = {k: c.speedup for k, c in comps.items() if c.speedup}
    if not sp:
        return "no case with both ours and a baseline"
    worst = min(sp, key=sp.get)
    return (f"geomean {_geomean(list(sp.values())):.2f}x over {len(sp)} cases, "
            f"worst {sp[worst]:.2f}x ({_where(worst, with_op)})")


def _ms_cell(c: Comparison, rows_note: str) -> str:
    if c.ours_ms is None:
        return rows_note or "-"
    return f"{c.ours_ms:.3f}" + ("" if c.ours_ok else " WRONG")


def _op_table(op: str, comps: Dict[tuple, Comparison], notes: Dict[tuple, str]) -> List[str]:
    """One line per graph x F (x dtype): ours, best baseline and speedup, fwd then bwd."""
    lines = [f"## {op}", "", _DESCRIPTION.get(op, ""), "",
             ("| graph | nodes | nnz | F | dtype | fwd ms | fwd best baseline ms | fwd speedup | bwd ms | "
              "bwd best baseline ms | bwd speedup | ours 1st call ms fwd / bwd | ours rel_err fwd / bwd |"),
             "|" + "---|" * 13]
    nnz = {k[2:]: c.nnz for k, c in comps.items() if k[0] == op}
    for graph, num_feats, dtype in sorted(nnz, key=lambda k: (nnz[k], k)):
        cells, firsts, errs = [], [], []
        for direction in DIRECTIONS:
            key = (op, direction, graph, num_feats, dtype)
            c = comps.get(key)
            if c is None:
                cells += ["-", "-", "-"]
                firsts.append("-")
                errs.append("-")
                continue
            best = f"{c.best_ms:.3f} ({c.best_name})" if c.best_ms else "-"
            cells += [_ms_cell(c, notes.get(key, "")), best, f"{c.speedup:.2f}x" if c.speedup else "-"]
            firsts.append(f"{c.ours_first_ms:.1f}" if c.ours_first_ms is not None else "-")
            errs.append(f"{c.ours_rel_err:.1e}" if c.ours_rel_err is not None else "-")
        c = comps.get((op, "fwd", graph, num_feats, dtype)) or comps[(op, "bwd", graph, num_feats, dtype)]
        lines.append(f"| {graph} | {c.nodes:,} | {c.nnz:,} | {num_feats} | {dtype} | " + " | ".join(cells)
                     + f" | {' / '.join(firsts)} | {' / '.join(errs)} |")
    lines.append("")
    for direction in DIRECTIONS:
        lines.append(f"- {direction}: {_summary({k: c for k, c in comps.items() if k[0] == op and k[1] == direction})}")
    lines.append(f"- fwd and bwd: {_summary({k: c for k, c in comps.items() if k[0] == op})}")
    lines.append("")
    return lines


def _flagged(rows: List[dict]) -> List[str]:
    """One line per (provider, op, direction, note) of the rows without a checked time or with a
    wrong result (errors, missing gradients, unavailable providers, skips), with the cases it hit."""
    cases = defaultdict(list)
    for r in rows:
        if r["note"]:
            note = r["note"].split(": rel_err")[0] if r["note"].startswith("WRONG") else r["note"]
            cases[(r["provider"], r["op"], r["direction"], note)].append(f"{r['graph']} F={r['F']}")
    lines = []
    for (provider, op, direction, note), where in cases.items():
        shown = ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4 else "")
        lines.append(f"- {provider} {op} {direction}: {note} ({len(where)} cases: {shown})")
    return lines


def acceptance(rows: List[dict]) -> List[str]:
    """The two acceptance lines: every case >= 1.0x the fastest correct baseline; overall geomean >= 1.2x.

    A case where ours did not run or failed the correctness check fails the first line; cases
    without any baseline (e.g. PyG not installed for softmax) are left out and counted."""
    comps = comparisons(rows)
    compared = {k: c for k, c in comps.items() if c.best_ms}
    sp = {k: c.speedup for k, c in compared.items() if c.speedup}
    broken = [k for k, c in compared.items() if not c.speedup]
    below = [k for k, s in sp.items() if s < ACCEPT_EACH]
    first_ok = bool(compared) and not broken and not below
    detail = f"{len(below)} of {len(compared)} cases below {ACCEPT_EACH:.1f}x"
    if broken:
        detail += f", {len(broken)} where ours failed the check or did not run (e.g. {_where(broken[0], True)})"
    if sp:
        worst = min(sp, key=sp.get)
        detail += f"; worst {sp[worst]:.2f}x ({_where(worst, True)})"
    no_base = len(comps) - len(compared)
    if no_base:
        detail += f"; {no_base} cases without a baseline left out"
    geo = _geomean(list(sp.values()))
    return [
        (f"- [{'PASS' if first_ok else 'FAIL'}] every op fwd and bwd >= {ACCEPT_EACH:.1f}x the faster baseline "
         f"(torch.sparse.mm where it applies, and PyG's CPU path): {detail}"),
        f"- [{'PASS' if sp and not broken and geo >= ACCEPT_GEOMEAN else 'FAIL'}] geomean >= {ACCEPT_GEOMEAN:.1f}x: "
        + (f"{geo:.2f}x over {len(sp)} cases" if sp else "no case compared"),
    ]


def _canary_lines(readings: Optional[Dict[str, float]]) -> List[str]:
    """The canary's first and worst reading, and a warning when it slowed over :data:`CANARY_ALARM` x."""
    if not readings or "start" not in readings:
        return []
    start = readings["start"]
    worst = max(readings, key=readings.get)
    line = (f"Canary (a fixed torch-only op, `canary_ms`): {start:.4f} ms before the first graph, "
            f"{readings[worst]:.4f} ms at worst ({worst}).")
    if readings[worst] > CANARY_ALARM * start and readings[worst] - start > 0.1:
        line = (f"**Warning: the process slowed down during the run: {line}  Every call after that point, the "
                "baselines' included, paid for it (e.g. a second OpenMP runtime spinning its threads), so the "
                "times and speedups below are not trustworthy.**")
    return [line, ""]


def _load(avg) -> str:
    return f"{avg[0]:.2f}" if avg else "?"


def markdown(rows: List[dict], meta: dict) -> str:
    """Report of the JSON rows: a table per op, per-op and overall geomeans, flagged rows, and the
    acceptance lines last."""
    comps = comparisons(rows)
    notes = {(r["op"], r["direction"], r["graph"], r["F"], r["dtype"]): r["note"] for r in rows if r["provider"] == OURS}
    lines = [f"# CPU benchmarks: {meta.get('device', '?')}", "",
             (f"{meta.get('threads', '?')} threads; torch {meta.get('torch')}, torch_geometric "
              f"{meta.get('torch_geometric')}, {meta.get('date')}.  Median ms of `time.perf_counter` per call after a "
              "warm-up, the lower of two passes; forward with the autograd graph recorded, backward = one "
              "`torch.autograd.grad(out, inputs, grad, retain_graph=True)`.  Best baseline = the fastest that passed "
              "the float64 check (rel_err < 1e-5 in fp32); speedup = best baseline ms / ours ms."), ""]
    if "load_avg_before" in meta or "load_avg_after" in meta:
        lines += [f"{meta.get('cores', '?')} cores; load average (1 min) before / after the run: "
                  f"{_load(meta.get('load_avg_before'))} / {_load(meta.get('load_avg_after'))}"
                  + (f"; {meta['wall_s'] / 60:.1f} min wall" if meta.get("wall_s") else "") + ".", ""]
    ops = [op for op in OPS if any(k[0] == op for k in comps)] + sorted({k[0] for k in comps} - set(OPS))
    for op in ops:
        lines += _op_table(op, comps, notes)
    lines += ["## Summary", "", "| op | fwd | bwd |", "|---|---|---|"]
    for op in ops:
        cells = [_summary({k: c for k, c in comps.items() if k[0] == op and k[1] == d}) for d in DIRECTIONS]
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    lines += ["", f"**Overall: {_summary(comps, with_op=True)}** (op x direction x graph x F).", ""]
    flagged = _flagged(rows)
    if flagged:
        lines += ["## Notes", "", *flagged, ""]
    lines += ["## Acceptance", "", *_canary_lines(meta.get("canary_ms")), *acceptance(rows), ""]
    return "\n".join(lines)


def plot(rows: List[dict], path) -> bool:
    """Speedup of ours over the fastest correct baseline, one panel per op, bars per graph for each
    (direction, F); log scale, lines at 1.0x and 1.2x.  Needs matplotlib; False if nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = {k: c for k, c in comparisons(rows).items() if c.speedup}
    ops = [op for op in OPS if any(k[0] == op for k in comps)] + sorted({k[0] for k in comps} - set(OPS))
    if not ops:
        return False
    fig, axes = plt.subplots(len(ops), 1, figsize=(13, 3.2 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        keys = [k for k in comps if k[0] == op]
        graphs = sorted({k[2] for k in keys}, key=lambda g: next(comps[k].nnz for k in keys if k[2] == g))
        series = sorted({(k[1], k[3], k[4]) for k in keys}, key=lambda s: (DIRECTIONS.index(s[0]), s[1], s[2]))
        width = 0.8 / len(series)
        for i, (direction, num_feats, dtype) in enumerate(series):
            vals = [getattr(comps.get((op, direction, g, num_feats, dtype)), "speedup", None) or 0.0 for g in graphs]
            label = f"{direction} F={num_feats}" + ("" if dtype == "float32" else f" {dtype}")
            ax.bar([j + i * width for j in range(len(graphs))], vals, width, label=label)
        ax.set_yscale("log")
        ax.axhline(ACCEPT_EACH, color="black", linewidth=0.8)
        ax.axhline(ACCEPT_GEOMEAN, color="gray", linewidth=0.8, linestyle="--")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(graphs))])
        ax.set_xticklabels(graphs, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("speedup vs best baseline")
        ax.set_title(f"{op}: {_DESCRIPTION.get(op, '')}", fontsize=9)
        ax.legend(fontsize=7, ncol=len(series))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
