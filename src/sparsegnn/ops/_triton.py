"""The ``"triton"`` backend: graph-level computations on CUDA tensors with Triton kernels.

Each function takes a :class:`Graph` and tensors and computes what the matching function of
``_dispatch`` names, choosing among the kernels by what the graph has earned (``tune.reuse``):

- a graph met for the first time takes kernels that need nothing built per graph (the piece
  SpMM, the row-segment SDDMM), with configs from its sizes;
- a graph invested in takes the planned kernels at the tuner's config (``tune.decide``), or
  cuSPARSE where the exact sum times faster (``_with_vendor``), bound to the graph so that a
  repeat call skips the decision;
- small batches of small graphs take the one-program-per-graph kernels.

Nothing here syncs with the device once the graph's cached forms (transpose, plan, tuned
config) exist.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from .._streams import in_capture_warmup
from ..graph import Graph
from ..kernels import current_stream_key
from ..tune.reuse import calls as reuse_calls, count_investment, cuda_syncs_forbidden, invested, use
from ..tune.store import stores_generation
from . import _torch
from ._common import derived_values, spmm_detail, sum_heads, via_transpose


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
    """The graph's cached work partition, at the chunk length the heuristics pick for it.

    Built on the graph's first planned call, on the host (the row lengths are read back), so never
    inside a CUDA-graph capture: there a graph without a plan raises a RuntimeError that says how
    to warm up, where the read-back would otherwise fail the capture with a bare CUDA error."""
    plan = graph.cache.get("plan")
    if plan is None:
        chunk = _kernels().configs.spmm_chunk(graph.num_nodes, graph.num_edges)
        if (("row_plan", chunk) not in graph.cache and graph.device.type == "cuda"
                and torch.cuda.is_current_stream_capturing()):
            raise RuntimeError(_CAPTURE_WITHOUT_PLAN[bool(graph.volatile)])
        count_investment("plans")
        plan = graph.row_plan(chunk)
        graph.cache.put("plan", plan)
    return plan


_CAPTURE_WITHOUT_PLAN = {
    False: "sparsegnn: this graph's work plan is built on its first planned call (on the host), which cannot run "
           "inside a CUDA graph capture: run the same calls once before capturing, on a side stream as "
           "torch.cuda.graph's recipe does (MaxK layers on a small graph take a dense path on the default stream, "
           "which builds no plan)",
    True: "sparsegnn: a volatile graph (refilled in place between calls) keeps no work plan, and building one reads "
          "row lengths back to the host, which a CUDA graph capture forbids: capture calls on a graph that keeps "
          "its derived forms, or run these calls eagerly",
}


#: Batches whose graphs all have at most this many nodes take the one-program-per-graph kernels
#: (``kernels/spmm_batched.py``); larger graphs have enough rows to fill the planned kernels.
BATCHED_MAX_NODES = 128
#: ... and only batches of at most this many nodes in all (measured on the H100, see
#: ``docs/design/batched.md``): on larger
#: batches the tuned CSR kernels are faster, 4-11x on reddit-threads-10k (10k graphs, 237k
#: nodes: each program pads its graph to a power of two, 5.4x the real rows) and 1.2-3x on
#: ENZYMES (600 graphs, 19.6k nodes) at F >= 64; molecule batches of 4-14k nodes (the training
#: batches the kernels were built for) stay on them.
BATCHED_MAX_TOTAL_NODES = 16384


def _may_batch(graph: Graph) -> bool:
    """Whether ``graph`` may take the batched kernels (a batch small enough; ``_batched_applies``
    decides from its statistics): no check that needs them."""
    return graph.ptr is not None and graph.num_nodes <= BATCHED_MAX_TOTAL_NODES


def _batched_applies(stats) -> bool:
    """Whether a block-diagonal batch with ``batch_stats`` ``stats`` (small enough: ``_may_batch``)
    takes the batched kernels."""
    return stats is not None and bool(stats[2]) and stats[0] <= BATCHED_MAX_NODES


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
#: (``benchmarks/results/h100/real_spmm_fp32.md``, ``paper_spmm_fp32.md``) has 2.7M or more but one,
#: real Cora F = 32 (0.34M, a first-case timing artefact); smaller graphs keep their first call
#: free of cuSPARSE's library load (Cora GCN's first step is the one users feel most).
VENDOR_MIN_WORK = 1 << 21
#: The row kernels' decision family; the version moves when a config's meaning (and speed)
#: changes, so decisions stored by an older version are made again.  @2: the
#: grouped configs run heavier rows at their own ``num_warps`` in one launch; @3: they
#: combine long rows' pieces in that launch too (no second launch).
SPMM_FAMILY = "spmm@3"
#: Search space of the cuSPARSE-or-ours decision (``VENDOR_FAMILY``): 0 = our bound kernel, 1 = cuSPARSE.
VENDOR_SPACE = {"path": (0, 1)}
#: Its store name: it times the row kernel, so it carries the row kernels' version and is made
#: again when they change (as every family that times them: ``ops.tiles.TC_FAMILY``, AGNN's).
#: @2: timed as eager calls make them (host time counted).
VENDOR_FAMILY = "spmm_vendor@2+" + SPMM_FAMILY


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
    schedule 94 us; docs/design/spmm.md).  Timed as eager calls make them (``decide``'s
    ``eager``: the larger of GPU and host time): on a graph whose call is host-bound,
    ``torch.sparse.mm``'s host time (27-40 us on the H200's host, against ~10 us for our bound
    launch) is what a user waits for, so cuSPARSE must win there too."""
    csr = csr_of(graph, weight, x.dtype)
    vendor = lambda x: torch.sparse.mm(csr, x)  # noqa: E731
    config = _kernels().decide(VENDOR_FAMILY, graph, detail, x.shape[1], x.dtype, x.device,
                               [{"path": 0}, {"path": 1}], lambda cfg: (vendor if cfg["path"] else ours)(x),
                               space=VENDOR_SPACE, ranked=False, eager=True)
    return vendor if config["path"] else ours


def _spmm_triton(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, owned: bool = False) -> Tensor:
    multi_head = weight is not None and weight.dim() == 2
    if not multi_head and _may_batch(graph):
        stats = graph.batch_stats()                 # (its first call syncs: only where it can matter)
        if _batched_applies(stats):  # a small batch of small graphs: one program each
            k = _kernels()
            cfg = k.batched.batched_config(stats[0], x.shape[1], stats[1], reduce)
            tiles = None
            if cfg["DENSE"]:    # dense per-graph tiles of the effective weights, built once per weights' version
                tiles = derived_values(graph, ("batch_tiles", reduce, cfg["MAXN"]), weight,
                                       lambda: k.batched.batch_tiles(graph.ptr, graph.rowptr, graph.row, graph.col,
                                                                     weight, reduce, cfg["MAXN"]))
            return k.batched.spmm_batched(graph.ptr, graph.rowptr, graph.col, weight, x, cfg, reduce, tiles=tiles)
    if not use(graph, x.shape[1], x.element_size()):   # first contact: no plan, no tuning (tune.reuse)
        return first_contact_spmm(graph, x, weight, reduce)
    device = x.get_device()                            # -1 on the host
    if (weight is not None and weight is not graph.edge_val and not owned) or (device >= 0 and cuda_syncs_forbidden()):
        # values that may be new every call (attention weights), or a decision taken inside a
        # CUDA-graph capture or its warm-up (provisional: decide re-decides after it): not bound
        plan = plan_of(graph)
        return _kernels().spmm.spmm_planned(graph.rowptr, plan, weight, x, reduce,
                                            config=_planned_config(graph, plan, x, weight, reduce))
    # one entry per variant, width, dtype and device ("derived": not copied by with_values);
    # rebuilt for an in-place update of the graph's values or a new generation of decision
    # stores (tune.reset_stores), in place: no entry per generation
    return graph.cache.get("spmm_run", _run_key(graph, x, weight, reduce, multi_head, device, owned),
                           lambda: _bound_spmm(graph, x, weight, reduce), values=weight,
                           stamp=_run_stamp(weight))(x)


def _run_key(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, multi_head: bool, device: int,
             owned: bool) -> tuple:
    """The ``"spmm_run"`` key of a bound launch.  An owned weight other than ``edge_val`` (such
    as the values permuted for a backward) has its own entry: a caller alternating it with
    ``edge_val`` does not rebind on every call.  Deterministic mode is in the key (it decides
    whether cuSPARSE may run, see ``vendor_applies``), and the stream (a launch with pieces
    binds its stream's arrival counters)."""
    return (reduce, weight is not None, weight.shape[1] if multi_head else 0, x.shape[1], x.dtype, device,
            current_stream_key(device) if device >= 0 else 0, torch.are_deterministic_algorithms_enabled(),
            owned and weight is not graph.edge_val)


def _run_stamp(weight: Optional[Tensor]) -> tuple:
    """What a bound launch was made for beyond its key: the decision stores' generation, and
    the values' address (the launch is bound to it, and ``w.data = ...`` changes it without a
    new version)."""
    return (stores_generation(), 0 if weight is None else weight.data_ptr())


def bound_call(graph: Graph, x: Tensor, reduce: str, precision: str = "ieee",
               alias_of: Optional[int] = None) -> Optional[Tensor]:
    """``A x`` with the graph's own values by the launch an earlier call bound for this
    variant, width, dtype, device and stream (``_spmm_triton``'s ``"spmm_run"`` entry, still
    valid for the values and the decision stores); None where there is none, or the call
    needs more than the launch (a gradient, a capture, checks that fail): the caller then
    takes the full path.  An eager no-grad call on an invested graph goes from ``spmm`` to its
    launch without the layers between (their checks passed for this signature when the entry
    was made): host time is most of such a call on a small graph.  A transient graph, and a
    small one that may take the batched kernels, are not looked up (no entry to find).

    A reduced ``precision`` whose pick is the exact call runs the exact call's launch, kept
    under its own key so that finding it costs what the exact call's lookup does.
    ``alias_of``: the caller found the pick to be the exact call in this generation of the
    decision stores; the exact call's entry, if made in that generation, is kept under the
    precision's key and run.

    Shapes:
        x: [M, F] -> [N, F] (None when x is not [M, F]).
    """
    if graph.transient or x.dim() != 2 or x.shape[0] != graph.num_src or _may_batch(graph):
        return None
    weight = graph.edge_val
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)):
        return None
    device = x.get_device()                            # -1 on the host (and for meta tensors)
    if (device >= 0 and cuda_syncs_forbidden()) or (device < 0 and not x.is_cpu):
        return None
    key, stamp = _run_key(graph, x, weight, reduce, False, device, False), _run_stamp(weight)
    if alias_of is not None:
        run = graph.cache.get("spmm_run", key, values=weight, stamp=stamp) if stamp[0] == alias_of else None
        if run is not None:
            graph.cache.put("spmm_run", run, key + (precision,), values=weight, stamp=stamp)
    else:
        run = graph.cache.get("spmm_run", key if precision == "ieee" else key + (precision,), values=weight,
                              stamp=stamp)
    if run is None or not use(graph, x.shape[1], x.element_size()):
        return None
    return run(x)


def bound_launch(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str):
    """The launch ``_spmm_triton`` bound for ``A x`` with ``weight`` (None or the graph's own
    values) in an earlier call, still valid for the values and the decision stores, for a caller
    that resolves a call once and keeps the launch (``ops.cbsr``'s bound aggregation, stamped
    with the same generation and values); None where there is none (no such call yet, a graph
    not invested in, a batch the batched kernels may take, other values, a capture or its
    warm-up).  Nothing is decided or timed here: ``x`` gives only the signature.

    Shapes:
        x: [*, F] of the operand's dtype and device -> a callable ``[M, F] -> [N, F]``.
    """
    if (weight is not None and (weight is not graph.edge_val or weight.dim() != 1)) or graph.transient:
        return None
    device = x.get_device()                            # -1 on the host (the interpreter's launches)
    if _may_batch(graph) or (device >= 0 and cuda_syncs_forbidden()) or (device < 0 and not x.is_cpu):
        return None
    return graph.cache.get("spmm_run", _run_key(graph, x, weight, reduce, False, device, False),
                           values=weight, stamp=_run_stamp(weight))


def _bound_spmm(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str):
    """The tuner's config for ``A x`` (``weight``: the graph's own or owned values), bound to the
    graph (``spmm_csr.bind_planned``): a repeat call skips ``decide`` and the specialisation
    of the graph's tensors (host time is most of a call on a small graph); or cuSPARSE where
    it times faster (``_with_vendor``)."""
    plan = plan_of(graph)
    ours = _kernels().spmm.bind_planned(graph.rowptr, plan, weight, reduce,
                                        _planned_config(graph, plan, x, weight, reduce), x)
    if vendor_applies(graph, x, weight, reduce):
        return _with_vendor(graph, x, weight, spmm_detail(weight, reduce), ours)
    return ours


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


def _planned_config(graph: Graph, plan, x: Tensor, weight: Optional[Tensor], reduce: str,
                    out: Optional[Tensor] = None, src_scale: Optional[Tensor] = None) -> dict:
    """The tuner's row-kernel config (family ``SPMM_FAMILY``) for ``A x`` on ``graph``'s plan;
    with ``out`` of another dtype than ``x`` (and ``src_scale``) timed as that call runs, and
    decided apart: a config's speed depends on the result's dtype (the Reddit stand-in, bf16
    features, F = 256: 6.8 ms with a bf16 result, 8.8 ms with an fp32 one)."""
    k = _kernels()
    multi_head = weight is not None and weight.dim() == 2
    run = lambda cfg: k.spmm.spmm_planned(graph.rowptr, plan, weight, x, reduce, config=cfg,  # noqa: E731
                                          out=out, src_scale=src_scale)
    candidates = lambda: k.configs.spmm_candidates(graph.num_nodes, graph.num_edges, x.shape[1],  # noqa: E731
                                                   x.element_size(), plan.max_degree, multi_head=multi_head)
    detail = spmm_detail(weight, reduce)
    if out is not None and out.dtype != x.dtype:
        detail += f"/out:{str(out.dtype).replace('torch.', '')}"
    if src_scale is not None:
        detail += "/scaled"
    return k.decide(SPMM_FAMILY, graph, detail, x.shape[1], x.dtype, x.device, candidates, run,
                    space=k.configs.SPMM_SPACE)


def sum_rows_into(graph: Graph, x: Tensor, weight: Optional[Tensor], out: Tensor,
                  src_scale: Optional[Tensor] = None) -> Tensor:
    """``out = A diag(src_scale) x`` by the CUDA-core row kernel with fp32 accumulation, written
    into ``out`` (any float dtype: fp16-packed features with an fp32 result, as ``ops.tiles``'s
    packed path needs), on the tuner's config for ``x``'s width and dtype, the result's dtype
    and the scaling (``_planned_config``); weights ``weight``
    (CSR order, [E]) or None; ``src_scale`` [M] or None (ones).

    Shapes:
        x: [M, F]; weight: [E] or None; out: [N, F] contiguous; src_scale: [M] or None -> out.
    """
    k = _kernels()
    if not invested(graph):
        return k.spmm.spmm_csr(graph.rowptr, graph.col, weight, x, out=out, src_scale=src_scale)
    plan = plan_of(graph)
    config = _planned_config(graph, plan, x, weight, "sum", out, src_scale)
    return k.spmm.spmm_planned(graph.rowptr, plan, weight, x, "sum", config=config, out=out, src_scale=src_scale)


def edge_values(graph: Graph, a: Tensor, b: Tensor, op: str) -> Tensor:
    """Per-edge ``op(a[row[e]], b[col[e]])`` (``dot`` -> [E], else [E, F]): the row-segment kernel
    on first contact, else the planned kernel at the tuner's config."""
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


def aggregate(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str = "sum", owned: bool = False) -> Tensor:
    """``out[i] = reduce_{e in row i} w_e x[col[e]]`` (see ``_dispatch.aggregate``): the batched,
    first-contact or planned kernels; per-feature weights other than multi-head sums take the
    reference."""
    if weight is not None and weight.dim() == 2 and not (reduce == "sum" and x.shape[1] % weight.shape[1] == 0):
        return _torch.aggregate(graph, x, weight, reduce)
    return _spmm_triton(graph, x, weight, reduce, owned)


def aggregate_transposed(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str = "sum") -> Tensor:
    """``A'^T x`` (see ``_dispatch.aggregate_transposed``): on a graph met for the first time
    whose transpose is not built, every edge pushes its contribution to its source atomically
    (``spmm_pieces.spmm_pieces_transposed``: no sort, one launch); else the cached transpose's
    kernels.  A push counts as a call on the graph (``tune.reuse.use``)."""
    if _pushes(graph, x, weight, reduce) and not use(graph, x.shape[1], x.element_size()):
        return _kernels().pieces.spmm_pieces_transposed(graph.rowptr, graph.col, weight, x, graph.num_src, reduce)
    return via_transpose(aggregate, graph, x, weight, reduce)


#: Calls on a graph (forward and backward, ``tune.reuse.calls``) below which its backward may
#: push instead of building the transpose: a DataLoader batch makes a few (a 3-layer GIN
#: step: 5); a graph reused for a run builds its transpose soon after.
PUSH_CALLS = 16
#: Edge-features (``E * F``) up to which a backward may push: there both it and the transpose's
#: kernel are launch-bound, and the transpose's sort (~12 launches) is what a push saves; on
#: larger graphs the atomics cost more per call than the transpose's kernel (H200, GCN on
#: deezer, 213k edges: epochs 1.70 ms pushing every backward, 1.47 ms on the transpose; a
#: replay that had recorded the push: 1.59 against 1.09 ms).
PUSH_MAX_WORK = 1 << 21


def _pushes(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str) -> bool:
    """Whether ``aggregate_transposed`` pushes: a sum or mean with one value per edge (or none)
    on a graph of at most ``PUSH_MAX_WORK`` edge-features, not invested in, met fewer than
    ``PUSH_CALLS`` times, whose transpose is not cached, without ``ptr`` (batches of graphs
    keep their own kernels); not under deterministic algorithms (the pushes add atomically),
    nor while a CUDA graph is captured or warmed up for (``_streams.capture_warmup``: what is
    recorded is replayed for good, so it takes the transpose, built before the capture)."""
    return (graph.num_edges * x.shape[1] <= PUSH_MAX_WORK and _first_contact_applies(graph, weight, reduce)
            and graph.ptr is None and not invested(graph) and "transpose" not in graph.cache
            and reuse_calls(graph) < PUSH_CALLS and not in_capture_warmup()
            and not (x.is_cuda and torch.cuda.is_current_stream_capturing()))


def head_dots(graph: Graph, grad_out: Tensor, x: Tensor, heads: int) -> Tensor:
    """Per-edge, per-head ``<dY_i, X_j>`` over each head's ``F / H`` features: [E, H]."""
    return sum_heads(edge_values(graph, grad_out, x, "mul"), heads)


def softmax(graph: Graph, scores: Tensor) -> Tensor:
    """Edge softmax of ``scores`` ([E] or [E, H]) over each target's edges, one program per row."""
    from ..kernels.edge_softmax import edge_softmax_fwd

    return edge_softmax_fwd(graph.rowptr, scores)


def softmax_grad(graph: Graph, out: Tensor, grad_out: Tensor) -> Tensor:
    """``ds_e = y_e (g_e - sum_{e' -> i} g_e' y_e')`` for the softmax output ``y = out``."""
    from ..kernels.edge_softmax import edge_softmax_bwd

    return edge_softmax_bwd(graph.rowptr, out, grad_out)


#: Sums over edges and the max aggregation's backward: the torch formulation serves CUDA too.
edge_sum = _torch.edge_sum
max_backward = _torch.max_backward
