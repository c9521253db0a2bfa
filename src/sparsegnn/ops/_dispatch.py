"""Backend choice shared by the ops, and the graph-level computations behind every op.

Each function here takes a :class:`Graph` and tensors and computes one forward or backward
quantity with the chosen backend.  The eager ``torch.autograd.Function`` classes
(``spmm.py``, ``sddmm.py``, ``softmax.py``) and the custom ops (``_library.py``) both call
them, so the eager and the compiled paths share one implementation.  Nothing here syncs
with the device once the graph's cached forms (transpose, plan, tuned config) exist.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from .._checks import check
from ..graph import Graph
from ..formats.csr import permute_edges
from ..kernels import interpreting, triton_available
from ..kernels.cpu import numba_available
from ..tune.reuse import count_investment, invested, use
from ..tune.store import stores_generation
from . import _cpu, reference

BACKENDS = ("auto", "reference", "triton", "cpu")
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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


class _Kernels:
    """The kernel modules, each imported on its first use: Triton is optional on CPU machines,
    and each ``@triton.jit`` reads its kernel's source when its module is imported (a first
    GCN step needs the SpMM kernels only; the SDDMM and batched modules cost ~20 ms each)."""

    _MODULES = {"configs": "configs", "spmm": "spmm_csr", "sddmm": "sddmm_csr", "batched": "spmm_batched",
                "pieces": "spmm_pieces"}

    def __getattr__(self, name: str):
        if name == "decide":
            from ..tune import decide as value
        elif name in self._MODULES:
            import importlib

            value = importlib.import_module(f"..kernels.{self._MODULES[name]}", __package__)
        else:
            raise AttributeError(name)
        setattr(self, name, value)          # later lookups find it without __getattr__
        return value


_KERNELS = _Kernels()


def _kernels() -> _Kernels:
    """The kernel modules (``configs``, ``spmm``, ``sddmm``, ``batched``, ``pieces``) and ``decide``."""
    return _KERNELS


def plan_of(graph: Graph):
    """The graph's cached work partition, at the chunk length the heuristics pick for it."""
    def build():
        count_investment("plans")
        return graph.row_plan(_kernels().configs.spmm_chunk(graph.num_nodes, graph.num_edges))
    return graph.cache.get("plan", None, build)


def spmm_detail(weight: Optional[Tensor], reduce: str) -> str:
    """The variant part of an SpMM decision key: reduce, edge values, heads."""
    heads = weight.shape[1] if weight is not None and weight.dim() == 2 else 0
    return f"{reduce}|val{int(weight is not None)}|h{heads}"


#: Batches whose graphs all have at most this many nodes take the one-program-per-graph kernels
#: (``kernels/spmm_batched.py``); larger graphs have enough rows to fill the planned kernels.
BATCHED_MAX_NODES = 128
#: ... and only batches of at most this many nodes in all.  Measured (H100,
#: ``scripts/time_batched_vs_csr.py``, ``benchmarks/h100/batched_vs_csr.json``): on larger
#: batches the tuned CSR kernels are faster, 4-11x on reddit-threads-10k (10k graphs, 237k
#: nodes: each program pads its graph to a power of two, 5.4x the real rows) and 1.2-3x on
#: ENZYMES (600 graphs, 19.6k nodes) at F >= 64; molecule batches of 4-14k nodes (the training
#: batches the kernels were built for) stay on them.
BATCHED_MAX_TOTAL_NODES = 16384


def _batched_applies(graph: Graph, stats) -> bool:
    """Whether ``graph`` (a block-diagonal batch with ``batch_stats`` ``stats``) takes the batched kernels."""
    return (stats is not None and bool(stats[2]) and stats[0] <= BATCHED_MAX_NODES
            and graph.num_nodes <= BATCHED_MAX_TOTAL_NODES)


def csr_of(graph: Graph, weight: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """``graph`` as a torch CSR tensor [N, M] of ``dtype`` with values ``weight`` (None = ones),
    for cuSPARSE; cached while the same tensor at the same version comes back."""
    def build():
        vals = torch.ones(graph.num_edges, dtype=dtype, device=graph.device) if weight is None else weight.detach().to(dtype)
        with warnings.catch_warnings():    # torch's one-time "CSR support is in beta" notice is not the user's concern
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(graph.rowptr, graph.col, vals, (graph.num_nodes, graph.num_src),
                                           check_invariants=False)   # a Graph's CSR is valid by construction
    return derived_values(graph, ("csr", dtype), weight, build)


#: The exact SpMM sum times cuSPARSE beside our bound kernel on graphs with at least this
#: much work (edges x features).  Every case where cuSPARSE beat us on the H100 suites
#: (``benchmarks/h100/real_spmm_fp32.md``, ``paper_spmm_fp32.md``) has 2.7M or more but one,
#: real Cora F = 32 (0.34M, a first-case timing artefact); smaller graphs keep their first call
#: free of cuSPARSE's library load (Cora GCN's first step is the one users feel most).
VENDOR_MIN_WORK = 1 << 21
#: The row kernels' decision family; the version moves when a config's meaning (and speed)
#: changes, so decisions stored by an older version are made again.  @2 (stop 36): the
#: grouped configs run heavier rows at their own ``num_warps`` in one launch.
SPMM_FAMILY = "spmm@2"
#: Search space of the cuSPARSE-or-ours decision (``VENDOR_FAMILY``): 0 = our bound kernel, 1 = cuSPARSE.
VENDOR_SPACE = {"path": (0, 1)}
#: Its store name: it times the row kernel, so it carries the row kernels' version and is made
#: again when they change (as every family that times them: ``ops.tiles.TC_FAMILY``, AGNN's).
VENDOR_FAMILY = "spmm_vendor+" + SPMM_FAMILY


def vendor_applies(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str) -> bool:
    """Whether the exact SpMM ``A x`` may run on cuSPARSE: a sum with no or one value per
    edge, fp32 features (cuSPARSE's bf16 CSR product rejects some structures), no duplicate
    edges beyond ``N M`` (rejected too), at least ``VENDOR_MIN_WORK`` edge-features, and not
    under ``torch.use_deterministic_algorithms(True)`` (our kernels are bit-reproducible;
    cuSPARSE's CSR SpMM algorithms other than ALG3 do not promise it)."""
    return (reduce == "sum" and x.dtype == torch.float32 and (weight is None or weight.dim() == 1)
            and 0 < graph.num_edges <= graph.num_nodes * graph.num_src
            and graph.num_edges * x.shape[1] >= VENDOR_MIN_WORK
            and not torch.are_deterministic_algorithms_enabled())


def _with_vendor(graph: Graph, x: Tensor, weight: Optional[Tensor], detail: str, ours):
    """``ours`` or cuSPARSE on the graph's cached CSR, whichever the tuner times faster for
    this graph, width and dtype (``VENDOR_FAMILY``, default ours): the fastest exact result,
    where a vendor kernel wins (wikipedia, 3.5k-edge hubs, F = 256: cuSPARSE 72 us, our best
    schedule 94 us; notes/spmm.md)."""
    csr = csr_of(graph, weight, x.dtype)
    vendor = lambda x: torch.sparse.mm(csr, x)  # noqa: E731
    config = _kernels().decide(VENDOR_FAMILY, graph, detail, x.shape[1], x.dtype, x.device,
                               [{"path": 0}, {"path": 1}], lambda cfg: (vendor if cfg["path"] else ours)(x),
                               space=VENDOR_SPACE, ranked=False)
    return vendor if config["path"] else ours


def _spmm_triton(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, owned: bool = False) -> Tensor:
    k = _kernels()
    multi_head = weight is not None and weight.dim() == 2
    small = graph.ptr is not None and not multi_head and graph.num_nodes <= BATCHED_MAX_TOTAL_NODES
    stats = graph.batch_stats() if small else None      # (its first call syncs: only where it can matter)
    if _batched_applies(graph, stats):  # a small batch of small graphs: one program each
        cfg = k.batched.batched_config(stats[0], x.shape[1], stats[1], reduce)
        tiles = None
        if cfg["DENSE"]:    # dense per-graph tiles of the effective weights, built once per weights' version
            tiles = derived_values(graph, ("batch_tiles", reduce, cfg["MAXN"]), weight, lambda: k.batched.batch_tiles(
                graph.ptr, graph.rowptr, graph.row, graph.col, weight, reduce, cfg["MAXN"]))
        return k.batched.spmm_batched(graph.ptr, graph.rowptr, graph.col, weight, x, cfg, reduce, tiles=tiles)
    if not use(graph, x.shape[1], x.element_size()):   # first contact: no plan, no tuning (tune.reuse)
        return first_contact_spmm(graph, x, weight, reduce)
    detail = spmm_detail(weight, reduce)

    plan = plan_of(graph)
    config = lambda: _planned_config(graph, plan, x, weight, reduce)  # noqa: E731

    def bound():
        """The tuner's config for this call, bound to the graph (``spmm_csr.bind_planned``): a
        repeat call skips ``decide`` and, for the one-launch configs, the specialisation of the
        graph's tensors (host time is most of a call on a small graph); or cuSPARSE where it
        times faster (``_with_vendor``)."""
        ours = k.spmm.bind_planned(graph.rowptr, plan, weight, reduce, config(), x)
        return _with_vendor(graph, x, weight, detail, ours) if vendor_applies(graph, x, weight, reduce) else ours

    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    if (weight is not None and weight is not graph.edge_val and not owned) or capturing:
        # values that may be new every call (attention weights), or a decision taken inside a
        # CUDA-graph capture (provisional: decide re-decides after it): not bound, as before
        return k.spmm.spmm_planned(graph.rowptr, plan, weight, x, reduce, config=config())
    # one entry per variant, width, dtype and device ("derived": not copied by with_values);
    # rebuilt for an in-place update of the graph's values or a new generation of decision
    # stores (tune.reset_stores), in place: no entry per generation
    # (an owned weight other than edge_val, such as the values permuted for a backward, has its
    # own entry: a caller alternating it with edge_val does not rebind on every call)
    # (deterministic mode in the key: it decides whether cuSPARSE may run, see vendor_applies)
    key = (detail, x.shape[1], x.dtype, x.device.index, torch.are_deterministic_algorithms_enabled(),
           owned and weight is not graph.edge_val)
    return graph.cache.get("spmm_run", key, bound, values=weight, stamp=stores_generation())(x)


def _first_contact_applies(graph: Graph, weight: Optional[Tensor], reduce: str) -> bool:
    """Whether the piece kernels serve this sum / mean: one value per edge (or none), and not
    under deterministic algorithms (a hub's pieces add atomically)."""
    return (reduce in ("sum", "mean") and (weight is None or weight.dim() == 1)
            and not torch.are_deterministic_algorithms_enabled())


def first_contact_spmm(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str) -> Tensor:
    """``A x`` on a graph not invested in (``tune.reuse``): the piece kernel
    (``kernels/spmm_pieces.py``: one launch, nothing built per graph, config from the sizes),
    or the unsplit row kernel for ``max``, multi-head weights and under deterministic
    algorithms (the pieces of a hub add atomically).  Nothing here reads back to the host."""
    k = _kernels()
    if not _first_contact_applies(graph, weight, reduce):
        return k.spmm.spmm_csr(graph.rowptr, graph.col, weight, x, reduce=reduce)
    cfg = k.pieces.first_contact_config(graph.num_nodes, graph.num_edges, x.shape[1])
    return k.pieces.spmm_pieces(graph.rowptr, graph.col, weight, x, cfg, reduce)


def _planned_config(graph: Graph, plan, x: Tensor, weight: Optional[Tensor], reduce: str) -> dict:
    """The tuner's row-kernel config (family ``SPMM_FAMILY``) for ``A x`` on ``graph``'s plan."""
    k = _kernels()
    multi_head = weight is not None and weight.dim() == 2
    run = lambda cfg: k.spmm.spmm_planned(graph.rowptr, plan, weight, x, reduce, config=cfg)  # noqa: E731
    candidates = lambda: k.configs.spmm_candidates(graph.num_nodes, graph.num_edges, x.shape[1],  # noqa: E731
                                                   x.element_size(), plan.max_degree, multi_head=multi_head)
    return k.decide(SPMM_FAMILY, graph, spmm_detail(weight, reduce), x.shape[1], x.dtype, x.device, candidates, run,
                    space=k.configs.SPMM_SPACE)


def sum_rows_into(graph: Graph, x: Tensor, weight: Optional[Tensor], out: Tensor,
                  src_scale: Optional[Tensor] = None) -> Tensor:
    """``out = A diag(src_scale) x`` by the CUDA-core row kernel with fp32 accumulation, written
    into ``out`` (any float dtype: fp16-packed features with an fp32 result, as ``ops.tiles``'s
    packed path needs), on the tuner's config for ``x``'s width and dtype; weights ``weight``
    (CSR order, [E]) or None; ``src_scale`` [M] or None (ones).

    Shapes:
        x: [M, F]; weight: [E] or None; out: [N, F] contiguous; src_scale: [M] or None -> out.
    """
    k = _kernels()
    if not invested(graph):
        return k.spmm.spmm_csr(graph.rowptr, graph.col, weight, x, out=out, src_scale=src_scale)
    plan = plan_of(graph)
    config = _planned_config(graph, plan, x, weight, "sum")
    return k.spmm.spmm_planned(graph.rowptr, plan, weight, x, "sum", config=config, out=out, src_scale=src_scale)


def edge_values(backend: str, graph: Graph, a: Tensor, b: Tensor, op: str) -> Tensor:
    """Per-edge ``op(a[row[e]], b[col[e]])`` with the chosen backend (``dot`` -> [E], else [E, F])."""
    if backend == "triton":
        k = _kernels()
        if not use(graph, a.shape[1], a.element_size()):   # first contact: one segment per row (tune.reuse)
            return k.sddmm.sddmm_rows(graph.rowptr, graph.col, a, b, op)
        plan = plan_of(graph)
        run = lambda cfg: k.sddmm.sddmm_csr(plan, a, b, op, config=cfg)  # noqa: E731
        candidates = lambda: k.configs.sddmm_candidates(graph.num_nodes, graph.num_edges, a.shape[1], op)  # noqa: E731
        # every candidate timed: the shipped cost model ranks SpMM schedules, not these
        config = k.decide("sddmm", graph, op, a.shape[1], a.dtype, a.device, candidates, run,
                          space=k.configs.SDDMM_SPACE, ranked=False)
        return run(config)
    if backend == "cpu":
        return _cpu.edge_values(graph, a, b, op)
    return reference.sddmm(graph.row, graph.col, a, b, op)


def aggregate(backend: str, graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str = "sum",
              owned: bool = False) -> Tensor:
    """``out[i] = reduce_{e in row i} w_e x[col[e]]`` on ``graph`` with the chosen backend.

    ``reduce`` is ``"sum"``, ``"mean"`` (divide by the number of stored edges) or ``"max"``.
    ``weight`` of shape [E, H] with ``F % H == 0`` is multi-head: feature ``f`` is weighted by
    ``w[e, f // (F / H)]`` (``H = F``: per-feature weights).  Multi-head sums run in one
    Triton launch for every head; other per-feature cases take the reference path.

    ``owned``: ``weight`` is a tensor the graph keeps and hands back on every call (a
    ``derived_values`` entry, such as its values permuted for the transpose), so the Triton
    launch may be bound to it like to ``graph.edge_val``.

    Shapes:
        x: [M, F]; weight: [E], [E, H] or None -> [N, F] (``M = graph.num_src``).
    """
    multi_head = weight is not None and weight.dim() == 2
    if backend == "cpu" and (not multi_head or (reduce == "sum" and x.shape[1] % weight.shape[1] == 0)):
        return _cpu.aggregate(graph, x, weight, reduce, spmm_detail(weight, reduce))
    if backend == "triton" and (not multi_head or (reduce == "sum" and x.shape[1] % weight.shape[1] == 0)):
        return _spmm_triton(graph, x, weight, reduce, owned)
    if multi_head and weight.shape[1] != x.shape[1]:
        weight = weight.repeat_interleave(x.shape[1] // weight.shape[1], dim=1)
    if reduce == "max":
        return reference.spmm_max(graph.row, graph.col, graph.num_nodes, x, weight)
    if reduce == "mean":
        weight = scaled(weight, mean_scale(graph, x.dtype))
    return reference.spmm_sum(graph.row, graph.col, graph.num_nodes, x, weight)


def mean_scale(graph: Graph, dtype: torch.dtype) -> Tensor:
    """Per-edge ``1 / deg(row)``, float64 for float64 inputs, float32 otherwise."""
    return graph.mean_scale(torch.float64 if dtype == torch.float64 else torch.float32)


def scaled(weight: Optional[Tensor], scale: Tensor) -> Tensor:
    """``w_e * s_e`` for per-edge ``scale`` [E] and ``weight`` [E], [E, H] or None (then ``scale``)."""
    if weight is None:
        return scale
    return weight * (scale if weight.dim() == 1 else scale.unsqueeze(1))


def derived_values(graph: Graph, slot: tuple, values: Optional[Tensor], build):
    """``build()``'s result for edge values ``values`` (or None), cached on the graph in
    ``slot`` while the same tensor at the same version comes back: an in-place update (a
    learnable edge weight stepped by the optimiser) bumps the version and rebuilds.  One entry
    per slot, so values that change every call replace each other instead of piling up."""
    return graph.cache.get("edge_values", slot, build, values=values)


def _permuted_own_values(graph: Graph, values: Tensor, perm: Tensor) -> Tensor:
    """``values[perm]`` for values the graph owns (its ``edge_val``, its cached ``1/deg``),
    permuted once per tensor and version (``derived_values``, one slot per owned tensor)."""
    return derived_values(graph, ("permuted", id(values)), values, lambda: permute_edges(values.detach(), perm))


def aggregate_transposed(backend: str, graph: Graph, x: Tensor, weight: Optional[Tensor],
                         reduce: str = "sum") -> Tensor:
    """``A'^T x``: ``out[j] = sum_{e: col[e] = j} w'_e x[row[e]]`` via the cached transpose.

    ``A' = A`` for ``reduce="sum"``, ``D^-1 A`` for ``"mean"`` (``w'_e = w_e / deg(row[e])``):
    the backward of ``aggregate``.  ``weight`` ([E], [E, H] or None) is in ``graph``'s edge
    order; it is permuted here.

    Shapes:
        x: [N, F]; weight: [E], [E, H] or None -> [M, F].
    """
    transposed, weight_t, owned = transposed_weights(graph, weight, reduce, x.dtype)
    return aggregate(backend, transposed, x, weight_t, owned=owned)


def transposed_weights(graph: Graph, weight: Optional[Tensor], reduce: str, dtype: torch.dtype):
    """``(graph.t(), w'^T, owned)``: the cached transpose, the effective weights ``w'`` (``w``, or
    ``w / deg(row)`` for ``"mean"``; None = ones) in the transpose's edge order, and whether
    ``w'^T`` is one the graph keeps (its own values or ``1/deg`` permuted once per version, or
    None): the same tensor on every call."""
    transposed = graph.t()
    perm = graph.transpose_parts()[2]
    if weight is None and reduce == "mean":
        return transposed, _permuted_own_values(graph, mean_scale(graph, dtype), perm), True
    if weight is not None and weight is graph.edge_val and reduce == "sum":
        return transposed, _permuted_own_values(graph, weight, perm), True
    if reduce == "mean":
        weight = scaled(weight, mean_scale(graph, dtype))
    return transposed, (weight.index_select(0, perm) if weight is not None else None), weight is None


def spmm_weight_grad(backend: str, graph: Graph, grad_out: Tensor, x: Tensor, heads: int, reduce: str) -> Tensor:
    """Gradient of ``aggregate`` (sum or mean) with respect to its edge weights.

    ``dw_e = s_i <dY_i, X_j>`` for ``e: j -> i``, with ``s_i = 1`` (sum) or ``1 / deg_i`` (mean);
    multi-head (``heads = H > 0``, weights [E, H]): the dot product over each head's ``F / H``
    features.

    Shapes:
        grad_out: [N, F]; x: [N, F] of grad_out's dtype -> [E] (heads = 0) or [E, H].
    """
    if heads and backend == "cpu":
        grad_w = _cpu.edge_values(graph, grad_out, x, "dot", heads)
    elif heads:
        prod = edge_values(backend, graph, grad_out, x, "mul")
        grad_w = prod.view(prod.shape[0], heads, prod.shape[1] // heads).sum(-1)
    else:
        grad_w = edge_values(backend, graph, grad_out, x, "dot")
    if reduce == "mean":
        grad_w = scaled(grad_w, mean_scale(graph, x.dtype).to(grad_w.dtype))
    return grad_w


def spmm_max_backward(graph: Graph, grad_out: Tensor, x: Tensor, weight: Optional[Tensor], out: Tensor,
                      backend: Optional[str] = None, arg: Optional[Tensor] = None, need_weight: bool = True):
    """Gradients of the feature-wise max aggregation ``out``: each ``dY[i, f]`` flows to the first
    edge attaining ``out[i, f]`` (none for rows without edges).

    With that edge ``e: j -> i``: ``dX[j, f] += w_e dY[i, f]`` and ``dw_e += X[j, f] dY[i, f]``.
    ``arg`` (those edges, ``E`` where none) is found here unless the forward saved it.  The CPU
    backend walks the transpose; elsewhere masks instead of boolean indexing (no
    data-dependent shapes, no host sync).

    Shapes:
        grad_out, x, out: [N, F]; weight: [E] or None -> (grad_x [N, F], grad_w [E] or None).
    """
    num_edges = graph.num_edges
    if num_edges == 0:
        return x.new_zeros(x.shape), (weight.new_zeros(weight.shape) if weight is not None else None)
    if (backend or default_backend(x)) == "cpu":
        if arg is None:
            arg = _cpu.max_arg(graph, x, weight, out)
        return _cpu.max_grads(graph, arg, x, weight, grad_out, need_weight)
    if arg is None:
        arg = reference.spmm_max_arg(graph.row, graph.col, x, weight, out)
    valid = arg < num_edges
    edge = arg.clamp(max=num_edges - 1)
    zero = grad_out.new_zeros(())
    grad = torch.where(valid, grad_out, zero)
    src = graph.col[edge]
    if weight is not None:
        grad_x_src = torch.where(valid, grad * weight[edge].to(grad.dtype), zero)
    else:
        grad_x_src = grad
    grad_x = x.new_zeros(x.shape).scatter_add_(0, src, grad_x_src.to(x.dtype))
    grad_w = None
    if weight is not None and need_weight:
        contrib = torch.where(valid, grad * x.gather(0, src).to(grad.dtype), zero).to(weight.dtype)
        grad_w = weight.new_zeros(weight.shape).index_add_(0, edge.flatten(), contrib.flatten())
    return grad_x, grad_w


def edge_sum(graph: Graph, values: Tensor, by_source: bool, backend: Optional[str] = None) -> Tensor:
    """``out[i] = sum_{e: row[e] = i} v_e`` (by target), or over ``col[e] = i`` (``by_source``).

    Shapes:
        values: [E] or [E, F] -> [N] or [N, F] ([M] or [M, F] ``by_source``).
    """
    if (backend or default_backend(values)) == "cpu":
        if by_source:
            return _cpu.edge_sum(graph.t(), values.index_select(0, graph.transpose_parts()[2]))
        return _cpu.edge_sum(graph, values)
    if by_source:
        return reference.segment_sum(graph.col, values, graph.num_src)
    return reference.segment_sum(graph.row, values, graph.num_nodes)


def softmax_values(backend: str, graph: Graph, scores: Tensor) -> Tensor:
    """Edge softmax of ``scores`` ([E] or [E, H], graph order) over each target's edges."""
    if backend == "triton":
        from ..kernels.edge_softmax import edge_softmax_fwd

        return edge_softmax_fwd(graph.rowptr, scores)
    if backend == "cpu":
        return _cpu.softmax(graph, scores)
    return reference.edge_softmax(graph.row, graph.num_nodes, scores)


def softmax_grad(backend: str, graph: Graph, out: Tensor, grad_out: Tensor) -> Tensor:
    """``ds_e = y_e (g_e - sum_{e' -> i} g_e' y_e')`` for the softmax output ``y = out``."""
    if backend == "triton":
        from ..kernels.edge_softmax import edge_softmax_bwd

        return edge_softmax_bwd(graph.rowptr, out, grad_out)
    if backend == "cpu":
        return _cpu.softmax_grad(graph, out, grad_out)
    weighted = grad_out * out
    row_sum = reference.segment_sum(graph.row, weighted, graph.num_nodes)
    return weighted - out * row_sum.index_select(0, graph.row)
