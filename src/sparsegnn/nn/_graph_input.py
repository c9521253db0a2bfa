"""Turning a layer's graph argument into the (transformed) Graph it aggregates over, cached.

Layers are called the PyG way, ``conv(x, edge_index)``, usually with the same ``edge_index``
tensor every step and from every layer of a model. Building a Graph (a sort, then e.g. GCN's
self loops and normalisation) and, worse, planning and tuning kernels for every new Graph
object would cost far more than the aggregation itself. So built graphs are cached:

* **An ``edge_index`` tensor** (with an optional ``edge_weight``) is looked up in one
  process-wide cache bounded in bytes and entries (``set_graph_cache_size``: 4 GiB and 4,096
  graphs by default; ``graph_cache_info`` gives its size, hits and misses), which evicts the
  least-hit graph, newest first, so that a working set visited in a cycle (an inductive epoch
  over more graphs than fit) keeps hitting instead of missing every time. The key is the
  *identity and version* of the inputs: ``(id(edge_index), edge_index._version, shape, dtype,
  device, num_nodes, num_src, edge_weight's (id, _version) or None, transform name)``
  (``num_src``: the source nodes of a bipartite graph, ``num_nodes`` when square; it is passed
  to ``Graph.from_edge_index`` in the build and in the router's probes). The entry holds
  weak references to the input tensors, and a hit requires ``ref() is tensor``: ids are
  reused after a tensor is freed. An in-place edit bumps ``_version``, so it misses and
  rebuilds; entries of freed or edited tensors are dropped on the next miss (and freed
  tensors' entries on the next call). The value is the *transformed* Graph, so every layer of
  a model called with the same ``edge_index`` shares one Graph object, and with it the
  transpose, kernel plans and tuned configs cached on it. Edits the version counter does not
  see (through ``tensor.data``, numpy or DLPack views) are not detected: call
  ``clear_graph_cache()`` after those.
* **An ``edge_weight`` that requires grad** must get gradients, so the Graph cannot hold
  values computed once. Then the key leaves the weight out; the entry caches the structure
  and a *routing* of input edges onto the transformed graph's edges (found once, by autograd,
  and checked), and each call recomputes the values from the weight: one ``index_add`` plus
  the transform's value step (GCN's normalisation). Each call's Graph is made by
  ``with_values`` from the previous one, so structural caches (plans, tuned configs) carry over.
* **A Graph** is used as is. Its transformed forms are cached on it, in ``graph.cache``'s
  ``"layer_transform"`` slot under the transform's name, checked against the identity and version of
  ``graph.edge_val`` (``Graph.with_values`` copies caches into graphs with other values).
* **PyG's other graph forms** go through the same cache: an ``EdgeIndex`` by its data tensor
  (its ``sparse_size`` gives the node counts); a torch sparse COO/CSR ``adj_t`` (``[N, M]``,
  ``adj_t[i, j]`` = weight of ``j -> i``) by the identity of the sparse tensor and the versions
  of all its parts, its values being the edge weights where the layer uses weights; a
  ``torch_sparse.SparseTensor`` by the identity of its ``col`` tensor.  Per-edge tensors of a
  sparse input are in its coalesced (row-major) order.
* ``cached=True`` on a layer keeps its meaning: the layer keeps the first graph forever.
* **Small graphs on a GPU are built on the host while the process is young**
  (``formats/_host.py``): the first ``HOST_CALLS`` builds of an ``edge_index`` of at most
  ``HOST_MAX_EDGES`` edges (weights without grad) are copied to the host, built and
  transformed there, and the Graph copied to its device once, with its target per edge and
  the transform's record (``LOOP_INFO``).  A build on the GPU runs ~15 small sorting and
  scanning kernels, each paying a one-off load in a fresh process; warm, the GPU is faster.
  Results are the same up to float rounding of the transform's values.

``graph_builds()`` counts builds (cache misses); ``clear_graph_cache()`` empties the cache.

**Under ``torch.compile``** none of this bookkeeping (ids, version counters, weak
references, building graphs on the host) can be traced, so a compiled layer only *reads*:

* a ``Graph`` argument: the identity transform uses it as is; any other transform takes the
  graph an earlier eager call built and cached in ``graph.cache`` (the version check of
  ``edge_val`` is skipped: re-run eagerly after editing the values in place). If none was
  built, a ``ValueError`` says to run the model once eagerly before compiling, or to call
  :func:`sparsegnn.nn.prepare` (one forward and backward on the graph, no ``.grad`` touched).
  Edge values that require grad with a value-using transform (GCN's normalisation of learnable
  weights) are rebuilt per call and cannot be compiled.
* ``cached=True``: the layer's cached graph, once an eager call has set it.
* an ``edge_index`` tensor: a ``ValueError``: under tracing it is a fake tensor, so its cache
  entry cannot be found; build a Graph once (``Graph.from_edge_index``) and pass that.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from typing import Callable, Dict, Hashable, List, Optional

import torch
from torch import Tensor

from .._checks import check, check_edge_values, check_same_device
from ..formats import csr as csr_fmt
from ..formats._host import small_on_gpu
from ..graph import Graph, attached_graph
from ..ops import structure as structure_ops
from ..ops._library import not_traceable_graph

__all__ = [
    "GraphTransform", "GraphInputMixin", "identity", "self_looped", "gcn_normalized", "gcn_transform",
    "pyg_self_looped_input", "pyg_self_looped_graph", "LoopInfo", "LOOP_INFO", "graph_kind", "graph_sizes", "edge_count",
    "graph_builds", "clear_graph_cache", "set_graph_cache_size", "graph_cache_info",
]


# ---------------------------------------------------------------------------- transforms
class GraphTransform:
    """A named graph transformation, split into a structural step and a value step.

    ``structure`` may reorder, drop and merge edges (summing their values) and add edges with a
    constant value, so that its output values are a *routing* of its input values: each input
    edge's value lands unchanged in at most one output edge, on top of a constant. ``values``
    keeps the structure and recomputes the values (e.g. a normalisation). The cache relies on
    the routing to recompute values cheaply when edge weights need gradients; it checks the
    routing once per graph and falls back to the whole transform per call if it does not hold.

    Args:
        name: key of the transform in the caches (unique per distinct transformation).
        structure: ``Graph -> Graph``; ``None`` for none.
        values: ``Graph -> Graph`` with the same structure; ``None`` for none.
        uses_values: ``False`` when the result ignores the input's edge values.
    """

    def __init__(self, name: str, structure: Optional[Callable[[Graph], Graph]] = None,
                 values: Optional[Callable[[Graph], Graph]] = None, uses_values: bool = True) -> None:
        self.name = name
        self.structure = structure
        self.values = values
        self.uses_values = uses_values

    @property
    def is_identity(self) -> bool:
        return self.structure is None and self.values is None

    def apply_structure(self, graph: Graph) -> Graph:
        return graph if self.structure is None else self.structure(graph)

    def apply_values(self, graph: Graph) -> Graph:
        return graph if self.values is None else self.values(graph)

    def __call__(self, graph: Graph) -> Graph:
        return self.apply_values(self.apply_structure(graph))

    def __repr__(self) -> str:
        return f"GraphTransform({self.name!r})"


#: The graph as given.
identity = GraphTransform("identity")
#: Self loops replaced by exactly one per node, without edge values (AGNN, GAT's fused path).  On a
#: bipartite graph nodes ``i < min(N, M)`` get the loop (PyG's convention).
self_looped = GraphTransform("self_looped", lambda g: g.with_values(None).add_self_loops(), uses_values=False)


def _normalize_sym(graph: Graph) -> Graph:
    return structure_ops.normalize(graph, "sym")


def _concat_graph(graph: Graph, target: Tensor, source: Tensor, values: Optional[Tensor]) -> Graph:
    """A square Graph of ``graph``'s size from COO parts (sorted stably into CSR)."""
    rowptr, col, perm = csr_fmt.coo_to_csr(target, source, graph.num_nodes)
    return Graph(rowptr, col, None if values is None else values[perm], graph.num_nodes, ptr=graph.ptr,
                 transient=graph.transient)


def _loops_remaining(fill: float) -> Callable[[Graph], Graph]:
    """PyG's ``add_remaining_self_loops`` on an ``edge_index`` (GCNConv's ``gcn_norm``): every self
    loop is removed and each node gets one, weighing what its *last* self loop weighed (in the
    input's edge order; CSR keeps it, the sort being stable) or ``fill``.  Without edge values
    every edge weighs 1 and so does every loop: PyG ignores ``fill`` (``improved``) then."""
    def structure(graph: Graph) -> Graph:
        n, col = graph.num_nodes, graph.col
        if graph.edge_val is None and not graph.is_bipartite:      # no values to carry: no row per edge
            rowptr, new_col, _ = structure_ops.replace_self_loops(graph, lambda: graph.row)
            return Graph(rowptr, new_col, None, n, ptr=graph.ptr, transient=graph.transient)
        row = graph.row
        is_loop = row == col
        loop_val = None
        if graph.edge_val is not None:
            val = graph.edge_val
            position = torch.arange(graph.num_edges, device=graph.device)
            # each node's last loop (masked positions instead of row[is_loop]: no read-back)
            last = torch.full((n,), -1, dtype=torch.int64, device=graph.device)
            last = last.scatter_reduce(0, row, torch.where(is_loop, position, -1), "amax", include_self=True)
            last = torch.where(last < 0, graph.num_edges, last)                               # E: no loop
            loop_val = torch.cat([val, val.new_full((1,), float(fill))])[last]                # E -> fill
        if graph.is_bipartite:
            keep = ~is_loop
            loops = torch.arange(n, device=graph.device)
            values = None if loop_val is None else torch.cat([graph.edge_val[keep], loop_val])
            return _concat_graph(graph, torch.cat([row[keep], loops]), torch.cat([col[keep], loops]), values)
        # no sort: the kept edges in place, each node's loop at the end of its row
        rowptr, new_col, source = structure_ops.replace_self_loops(graph, lambda: row)
        values = None if loop_val is None else torch.cat([graph.edge_val, loop_val])[source]
        return Graph(rowptr, new_col, values, n, ptr=graph.ptr, transient=graph.transient)
    return structure


def _loops_added(fill: float) -> Callable[[Graph], Graph]:
    """PyG's ``add_self_loops`` on a torch sparse ``adj_t`` (``A + fill I``): existing loops stay."""
    def structure(graph: Graph) -> Graph:
        n = graph.num_nodes
        loops = torch.arange(n, device=graph.device)
        val = graph.edge_val
        if val is None:
            val = torch.ones(graph.num_edges, device=graph.device)
        values = torch.cat([val, val.new_full((n,), float(fill))])
        return _concat_graph(graph, torch.cat([graph.row, loops]), torch.cat([graph.col, loops]), values)
    return structure


def _loops_replaced(fill: float) -> Callable[[Graph], Graph]:
    """``torch_sparse.fill_diag`` on a ``SparseTensor``: every loop removed, one of weight ``fill`` added."""
    def structure(graph: Graph) -> Graph:
        n, row, col = graph.num_nodes, graph.row, graph.col
        keep = row != col
        loops = torch.arange(n, device=graph.device)
        val = graph.edge_val
        if val is None:
            val = torch.ones(graph.num_edges, device=graph.device)
        values = torch.cat([val[keep], val.new_full((n,), float(fill))])
        return _concat_graph(graph, torch.cat([row[keep], loops]), torch.cat([col[keep], loops]), values)
    return structure


#: GCN's ``D^-1/2 (A + I) D^-1/2`` as PyG computes it from an ``edge_index``: every self loop
#: removed and one added per node, weighing the node's last self loop's weight or 1, then the
#: symmetric normalisation (``D`` = weighted in-degree).
gcn_normalized = GraphTransform("gcn_normalized", _loops_remaining(1.0), _normalize_sym)

_GCN_TRANSFORMS: Dict[Hashable, GraphTransform] = {("remaining", 1.0): gcn_normalized}
_LOOPS = {"remaining": _loops_remaining, "added": _loops_added, "replaced": _loops_replaced}


def gcn_transform(loops: Optional[str] = "remaining", fill: float = 1.0) -> GraphTransform:
    """GCN's normalisation with self loops added the way PyG adds them for an input form.

    Args:
        loops: ``"remaining"`` (``edge_index`` and Graph inputs), ``"added"`` (torch sparse
            ``adj_t``: ``A + fill I``), ``"replaced"`` (``SparseTensor``) or ``None`` (no loops).
        fill: weight of an added loop (2 for ``improved=True``).
    """
    key = (loops, float(fill)) if loops is not None else (None, 0.0)
    transform = _GCN_TRANSFORMS.get(key)
    if transform is None:
        if loops is None:
            transform = GraphTransform("gcn_normalized:no_loops", None, _normalize_sym)
        elif loops in _LOOPS:
            transform = GraphTransform(f"gcn_normalized:{loops}:{float(fill)!r}", _LOOPS[loops](float(fill)),
                                       _normalize_sym)
        else:
            raise ValueError(f"gcn_transform(): loops must be 'remaining', 'added', 'replaced' or None, got {loops!r}")
        _GCN_TRANSFORMS[key] = transform
    return transform


#: Key in a transformed graph's ``cache`` of ``pyg_self_looped``'s ``LoopInfo``.
LOOP_INFO = "loop_info"


class LoopInfo:
    """How ``pyg_self_looped`` made its graph from the caller's edges, for per-edge tensors.

    Attributes:
        keep: ``[E]`` bool, in the caller's edge order: the edges that are no self loop.
        target: ``[E]`` int64, in the caller's edge order: each edge's target node.
        num_loops: the loops ``0 .. num_loops - 1`` appended after the kept edges.
        kept: ``[E_kept]`` int64 positions of ``keep`` (the mask as indices, found once: boolean
            indexing would sync the host on every call).
        into_loops: ``[E_in]`` int64 positions *among the kept edges* of those whose target gets
            a loop (``target < num_loops``), and ``into_target`` their targets.
    """

    __slots__ = ("keep", "target", "num_loops", "kept", "into_loops", "into_target")

    def __init__(self, keep: Tensor, target: Tensor, num_loops: int) -> None:
        self.keep, self.target, self.num_loops = keep, target, num_loops
        self.kept = keep.nonzero().flatten()
        kept_target = target.index_select(0, self.kept)
        self.into_loops = (kept_target < num_loops).nonzero().flatten()
        self.into_target = kept_target.index_select(0, self.into_loops)

    def to(self, device: torch.device) -> "LoopInfo":
        """The same record with its tensors on ``device``."""
        moved = LoopInfo.__new__(LoopInfo)
        for name in self.__slots__:
            value = getattr(self, name)
            setattr(moved, name, value.to(device) if isinstance(value, Tensor) else value)
        return moved


def _pyg_looped(input_order: bool) -> Callable[[Graph], Graph]:
    def structure(graph: Graph) -> Graph:
        source, target = graph.col, graph.row
        if input_order and graph.edge_perm is not None:
            source, target = graph.to_input_order(source), graph.to_input_order(target)
        num_loops = min(graph.num_nodes, graph.num_src)
        keep = source != target
        loops = torch.arange(num_loops, device=graph.device)
        edge_index = torch.stack([torch.cat([source[keep], loops]), torch.cat([target[keep], loops])])
        out = Graph.from_edge_index(edge_index, None, graph.num_nodes,
                                    num_src=graph.num_src if graph.is_bipartite else None)
        out.transient = graph.transient       # a sampled batch's looped graph is used once too
        out.cache.put(LOOP_INFO, LoopInfo(keep, target, num_loops))
        return out
    return structure


#: PyG's ``remove_self_loops`` + ``add_self_loops`` (GATConv, GATv2Conv) with the edge order PyG
#: gives the result: the caller's edges that are no loop, in the caller's order, then the loops
#: ``0 .. min(N, M) - 1``.  ``edge_perm`` of the result maps its CSR edges to that order, and its
#: ``cache[LOOP_INFO]`` says which caller edges were kept.  ``pyg_self_looped_input`` takes the
#: caller's order from ``edge_perm`` (graphs built from an ``edge_index`` or a sparse tensor);
#: ``pyg_self_looped_graph`` from the CSR (a Graph given by the caller).
pyg_self_looped_input = GraphTransform("pyg_self_looped:input", _pyg_looped(True), uses_values=False)
pyg_self_looped_graph = GraphTransform("pyg_self_looped:graph", _pyg_looped(False), uses_values=False)


# ---------------------------------------------------------------------------- routing of values
class _Router:
    """Recomputes a transform's edge values from new input values without rebuilding the graph.

    Built from one probe pass: ``structure`` applied to zeros that require grad gives the
    constant part (``fill``) and, through one backward with the output positions as the
    gradient, the output edge each input edge lands in (``target``). A second pass with the
    values ``1..E`` (exact in float64) checks the routing; ``ok`` is False when it does not hold.
    """

    def __init__(self, make_base: Callable[[Optional[Tensor]], Graph], num_edges: int, device,
                 transform: GraphTransform) -> None:
        self.ok = False
        self.last: Optional[Graph] = None
        self._fill: Dict[torch.dtype, Tensor] = {}
        if torch.is_inference_mode_enabled():  # no autograd here: the caller rebuilds per call
            return
        probe = torch.zeros(num_edges, dtype=torch.float64, device=device, requires_grad=True)
        with torch.enable_grad():
            out = transform.apply_structure(make_base(probe))
            if out.edge_val is None:            # the transform drops values: nothing to route
                self.last = out
                return
            positions = torch.arange(1, out.num_edges + 1, dtype=torch.float64, device=device)
            grad = None
            if out.edge_val.requires_grad and num_edges > 0:
                (grad,) = torch.autograd.grad(out.edge_val, probe, positions, allow_unused=True)
        fill = out.edge_val.detach()
        if grad is None:
            grad = torch.zeros(num_edges, dtype=torch.float64, device=device)
        target = grad.round().to(torch.int64) - 1             # -1: the input edge was dropped
        self.last = out.with_values(None)
        if not bool(((grad == grad.round()) & (target < out.num_edges)).all()):
            return                                            # not a routing (e.g. normalised values)
        kept = target >= 0
        self.kept = None if bool(kept.all()) else kept.nonzero().flatten()
        self.target = target if self.kept is None else target[self.kept]
        self._fill[torch.float64] = fill
        check_vals = torch.arange(1, num_edges + 1, dtype=torch.float64, device=device)
        expected = transform.apply_structure(make_base(check_vals))
        self.ok = (expected.edge_val is not None and torch.equal(expected.rowptr, out.rowptr)
                   and torch.equal(expected.col, out.col) and torch.equal(expected.edge_val, self._route(check_vals)))

    def _route(self, values: Tensor) -> Tensor:
        fill = self._fill.get(values.dtype)
        if fill is None:
            fill = self._fill[values.dtype] = self._fill[torch.float64].to(values.dtype)
        source = values if self.kept is None else values.index_select(0, self.kept)
        return torch.index_add(fill, 0, self.target, source)

    def apply(self, values: Tensor, transform: GraphTransform) -> Graph:
        """The transformed graph with values computed (differentiably) from ``values``."""
        graph = transform.apply_values(self.last.with_values(self._route(values)))
        self.last = graph          # the next call's graph is made from it: structural caches carry over
        return graph


# ---------------------------------------------------------------------------- process-wide cache
class _Entry:
    """A cached build of one (inputs, transform): the Graph, or the router for grad weights,
    with its size in bytes, its hits and when it was inserted."""

    __slots__ = ("refs", "versions", "graph", "router", "nbytes", "hits", "order")

    def __init__(self, refs: List[weakref.ref], versions: List[int], graph: Optional[Graph],
                 router: Optional[_Router], nbytes: int, order: int) -> None:
        self.refs, self.versions, self.graph, self.router = refs, versions, graph, router
        self.nbytes, self.hits, self.order = nbytes, 0, order

    def matches(self, tensors: List[Tensor]) -> bool:
        return all(r() is t for r, t in zip(self.refs, tensors))

    def stale(self) -> bool:
        """An input was freed or edited in place since the build."""
        for ref, version in zip(self.refs, self.versions):
            tensor = ref()
            if tensor is None or _version_of(tensor) != version:
                return True
        return False


def _graph_bytes(graph: Optional[Graph], router: Optional[_Router]) -> int:
    """Bytes an entry holds: the graph's CSR, values and edge order, twice (its transpose and
    derived forms are about as large again, built on use)."""
    if graph is None and router is not None:
        graph = router.last
    if graph is None:
        return 0
    parts = (graph.rowptr, graph.col, graph.edge_val, graph.edge_perm)
    return 2 * sum(t.numel() * t.element_size() for t in parts if t is not None)


_LOCK = threading.Lock()
_CACHE: "Dict[Hashable, _Entry]" = {}
_FREED: List[Hashable] = []     # keys whose inputs were freed; appended by weakref callbacks
#: Bounds of the process-wide cache: bytes held (graphs of a working set: an inductive epoch's
#: graphs, a validation set) and entries.
_MAX_BYTES = 4 << 30
_MAX_ENTRIES = 4096
_STATS = {"builds": 0, "hits": 0, "misses": 0, "evictions": 0}
_INSERTED = itertools.count()


def graph_builds() -> int:
    """Number of graphs built by layers so far (cache misses), for tests and benchmarks."""
    return _STATS["builds"]


def clear_graph_cache() -> None:
    """Forget every graph built from an ``edge_index`` (graphs' own ``graph.cache`` is untouched)."""
    with _LOCK:
        _CACHE.clear()
        _FREED.clear()


def set_graph_cache_size(max_entries: Optional[int] = None, max_bytes: Optional[int] = None) -> int:
    """Bound the process-wide cache to ``max_entries`` graphs and ``max_bytes`` bytes (each
    left as it is when None; 0 disables the cache); returns the old entry bound.

    Default bounds: 4,096 graphs and 4 GiB (``graph_cache_info`` tells the bytes held).
    """
    global _MAX_ENTRIES, _MAX_BYTES
    fn = "set_graph_cache_size"
    if max_entries is not None:
        check(int(max_entries) >= 0, fn, f"max_entries must be >= 0, got {max_entries}")
    if max_bytes is not None:
        check(int(max_bytes) >= 0, fn, f"max_bytes must be >= 0, got {max_bytes}")
    with _LOCK:
        old = _MAX_ENTRIES
        _MAX_ENTRIES = _MAX_ENTRIES if max_entries is None else int(max_entries)
        _MAX_BYTES = _MAX_BYTES if max_bytes is None else int(max_bytes)
        _evict(None)
    return old


def graph_cache_info() -> Dict[str, int]:
    """The process-wide cache: ``entries``, ``bytes`` held, the bounds ``max_entries`` and
    ``max_bytes``, and since the process started ``builds`` (graphs built by layers),
    ``hits``, ``misses`` and ``evictions``."""
    with _LOCK:
        _drop_freed()
        return {"entries": len(_CACHE), "bytes": sum(e.nbytes for e in _CACHE.values()),
                "max_entries": _MAX_ENTRIES, "max_bytes": _MAX_BYTES, **_STATS}


def _count_build() -> None:
    with _LOCK:
        _STATS["builds"] += 1


def _drop_freed() -> None:
    """Drop entries whose input tensors were freed (call with the lock held)."""
    while _FREED:
        key = _FREED.pop()
        entry = _CACHE.get(key)
        if entry is not None and any(r() is None for r in entry.refs):
            del _CACHE[key]


def _lookup(key: Hashable, tensors: List[Tensor]) -> Optional[_Entry]:
    with _LOCK:
        _drop_freed()
        entry = _CACHE.get(key)
        if entry is not None and not entry.matches(tensors):          # an id reused by another tensor
            del _CACHE[key]
            entry = None
        if entry is None:
            _STATS["misses"] += 1
            return None
        entry.hits += 1
        _STATS["hits"] += 1
        return entry


def _evict(keep: Optional[Hashable]) -> None:
    """Evict until both bounds hold (lock held), never ``keep`` (the entry just inserted).

    The victim is the entry with the fewest hits, the newest of those first.  A working set
    larger than the bounds, visited in a cycle (an epoch over more graphs than fit), then keeps
    the graphs that were resident first and lets the others take turns in the last places: a
    hit for every resident graph each cycle, where least-recently-used eviction hits none.
    """
    used = sum(e.nbytes for e in _CACHE.values())
    while _CACHE and (len(_CACHE) > _MAX_ENTRIES or used > _MAX_BYTES):
        candidates = [(e.hits, -e.order, k) for k, e in _CACHE.items() if k != keep]
        if not candidates:
            if _MAX_ENTRIES == 0 or _MAX_BYTES == 0 or _CACHE[keep].nbytes > _MAX_BYTES:
                del _CACHE[keep]      # a cache turned off, or one graph larger than all of it
            break
        victim = min(candidates)[2]
        used -= _CACHE.pop(victim).nbytes
        _STATS["evictions"] += 1


def _insert(key: Hashable, tensors: List[Tensor], graph: Optional[Graph], router: Optional[_Router]) -> None:
    # The callback only records the key: it may run inside the garbage collector at any point.
    refs = [weakref.ref(t, lambda _ref, k=key: _FREED.append(k)) for t in tensors]
    entry = _Entry(refs, [_version_of(t) for t in tensors], graph, router, _graph_bytes(graph, router),
                   next(_INSERTED))
    with _LOCK:
        _drop_freed()
        for old in [k for k, e in _CACHE.items() if e.stale()]:
            del _CACHE[old]
        if _MAX_ENTRIES == 0 or _MAX_BYTES == 0:
            return
        _CACHE[key] = entry
        _evict(key)


_COLLECTOR: Optional[List[Graph]] = None


@contextlib.contextmanager
def collect_graphs(into: List[Graph]):
    """Append every Graph a layer's ``_graph`` returns inside the block to ``into`` (a CUDA-graph
    recording keeps them alive: the cache above may drop them while a replay still reads them)."""
    global _COLLECTOR
    previous, _COLLECTOR = _COLLECTOR, into
    try:
        yield into
    finally:
        _COLLECTOR = previous


def _collected(graph: Graph) -> Graph:
    if _COLLECTOR is not None:
        _COLLECTOR.append(graph)
    return graph


def _needs_grad(values: Optional[Tensor]) -> bool:
    return values is not None and values.requires_grad


def _trackable(*tensors: Optional[Tensor]) -> bool:
    """Whether in-place edits of these tensors are visible (inference tensors have no version counter)."""
    return not any(t is not None and t.is_inference() for t in tensors)


def _version_of(tensor: Tensor) -> int:
    """A counter that grows with every in-place edit of ``tensor`` (a sparse tensor: of any of its parts)."""
    if tensor.layout == torch.sparse_coo:
        return tensor._version + tensor._indices()._version + tensor._values()._version
    if tensor.layout == torch.sparse_csr:
        return (tensor._version + tensor.crow_indices()._version + tensor.col_indices()._version
                + tensor.values()._version)
    return tensor._version


def _built_on_host(graph: Graph, device: torch.device) -> Graph:
    """``graph``, built on the host, copied to ``device`` with its target per edge and what the
    transform recorded (``LOOP_INFO``); the forms derived later (transpose, plan, statistics)
    follow ``formats/_host.py``'s rule."""
    moved = graph.to(device)
    moved.set_derived("row", graph.row.to(device))
    info = graph.cache.get(LOOP_INFO)
    if info is not None:
        moved.cache.put(LOOP_INFO, info.to(device))
    return moved


def _cached_build(source: Tensor, shape_key: tuple, make_base: Callable[[Optional[Tensor]], Graph],
                  edge_weight: Optional[Tensor], num_edges: int, transform: GraphTransform,
                  weight_in_source: bool = False,
                  host_build: Optional[Callable[[Optional[Tensor]], Graph]] = None) -> Graph:
    """``transform(make_base(edge_weight))``, cached by the identity and version of ``source`` (the
    caller's graph tensor) and of ``edge_weight`` (see the module doc).  ``weight_in_source``: the
    weight is part of ``source`` (a sparse tensor's values), whose version covers it.
    ``host_build``: builds the same, on the host where ``formats/_host.py`` routes it (used for
    cached builds of weights without grad)."""
    dynamic = _needs_grad(edge_weight)
    if not _trackable(source, edge_weight):
        _count_build()
        return transform(make_base(edge_weight))
    if dynamic:  # the key leaves the weight out, so check it on every call (cheap: no sync)
        check_edge_values(edge_weight, num_edges, "Graph.from_edge_index", "edge_weight", max_dim=1)
        check_same_device("Graph.from_edge_index", edge_index=source, edge_weight=edge_weight)
    if edge_weight is None:
        weight_key, tensors = None, [source]
    elif weight_in_source and not dynamic:
        weight_key, tensors = "in_source", [source]
    elif dynamic:
        weight_key, tensors = "requires_grad", [source]
    else:
        weight_key, tensors = (id(edge_weight), _version_of(edge_weight)), [source, edge_weight]
    key = (id(source), _version_of(source), shape_key, weight_key, transform.name)
    entry = _lookup(key, tensors)
    if entry is None:
        _count_build()
        if not dynamic:
            graph = host_build(edge_weight) if host_build is not None else transform(make_base(edge_weight))
            _insert(key, tensors, graph, None)
            return graph
        make_base(None)                         # validates the input before the probe passes
        router = _Router(make_base, num_edges, source.device, transform)
        if router.last is None:                 # no probe possible (inference mode): do not cache
            return transform(make_base(edge_weight))
        _insert(key, tensors, None, router)
        if not router.ok:
            return transform(make_base(edge_weight))
        return router.apply(edge_weight, transform)
    if entry.graph is not None:
        return entry.graph
    if not entry.router.ok:                     # the routing does not hold: the whole transform per call
        _count_build()
        return transform(make_base(edge_weight))
    return entry.router.apply(edge_weight, transform)


def graph_from_edge_index(edge_index: Tensor, edge_weight: Optional[Tensor], num_nodes: int,
                          transform: GraphTransform, num_src: Optional[int] = None) -> Graph:
    """``transform(Graph.from_edge_index(edge_index, edge_weight, num_nodes, num_src=num_src))``, cached
    (see the module doc).  ``num_src`` (source nodes of a bipartite graph) is part of the key."""
    if not transform.uses_values:
        edge_weight = None
    num_nodes = int(num_nodes)
    src = None if num_src is None or int(num_src) == num_nodes else int(num_src)

    attached = attached_graph(edge_index, num_nodes, num_nodes if src is None else src)

    def make_base(values: Optional[Tensor]) -> Graph:
        if attached is not None:   # a sampled batch's edge_index: its Graph exists, in this edge order
            return attached.with_values(values)
        return Graph.from_edge_index(edge_index, values, num_nodes, num_src=src)

    def host_build(values: Optional[Tensor]) -> Graph:
        if attached is not None or edge_index.dim() != 2 or not small_on_gpu(
                edge_index, edge_index.shape[-1], "layer_graph", max(num_nodes, src or 0)):
            return transform(make_base(values))
        if values is not None:
            check_same_device("Graph.from_edge_index", edge_index=edge_index, edge_weight=values)
        base = Graph.from_edge_index(edge_index.cpu(), None if values is None else values.cpu(), num_nodes,
                                     num_src=src)
        return _built_on_host(transform(base), edge_index.device)

    shape_key = (tuple(edge_index.shape), edge_index.dtype, edge_index.device, num_nodes,
                 num_nodes if src is None else src)
    return _cached_build(edge_index, shape_key, make_base, edge_weight, edge_index.shape[1], transform,
                         host_build=host_build)


def graph_from_torch_sparse(adj: Tensor, transform: GraphTransform, use_values: bool = True,
                            fn: str = "Graph.from_torch_sparse") -> Graph:
    """``transform`` of the Graph of a torch sparse ``adj_t`` (``adj[i, j]`` = weight of ``j -> i``,
    ``[N, M]``), cached by the identity and version of ``adj``.  The caller's edge order (of
    per-edge tensors, ``edge_perm``) is the coalesced COO order, or the CSR order.

    Args:
        use_values: aggregate with ``adj``'s values (PyG does in GCNConv, SAGEConv, GINConv);
            otherwise only its structure counts (GATConv, AGNNConv).
        fn: the caller's name, for errors.
    """
    check(adj.dim() == 2, fn, f"adj_t must be a 2-D sparse tensor [N, M], got shape {tuple(adj.shape)} (hybrid "
          "sparse tensors with edge features are not supported: pass edge_index and edge_attr)")
    layout = adj.layout
    check(layout in (torch.sparse_coo, torch.sparse_csr), fn,
          f"adj_t must have layout sparse_coo or sparse_csr, got {layout}; convert it with .to_sparse_csr()")
    data = adj if layout == torch.sparse_csr or adj.is_coalesced() else adj.coalesce()
    num_nodes, num_src = int(adj.shape[0]), int(adj.shape[1])
    weight = data.values() if use_values and transform.uses_values else None

    def make_base(values: Optional[Tensor]) -> Graph:
        if layout == torch.sparse_coo:
            target, source = data.indices()
        else:
            source = data.col_indices()
            target = csr_fmt.rowptr_to_row(data.crow_indices().to(torch.int64), source.numel())
        edge_index = torch.stack([source.to(torch.int64), target.to(torch.int64)])
        return Graph.from_edge_index(edge_index, values, num_nodes,
                                     num_src=None if num_src == num_nodes else num_src)

    shape_key = ("torch_sparse", layout, tuple(adj.shape), adj.device, int(data._nnz()))
    return _cached_build(adj, shape_key, make_base, weight, int(data._nnz()), transform, weight_in_source=True)


def graph_from_sparse_tensor(adj, transform: GraphTransform, use_values: bool = True) -> Graph:
    """The same for a ``torch_sparse.SparseTensor`` ``adj_t`` (edge order: its row-major COO order).

    Cached by the identity and version of its ``col`` tensor.  Without values every edge weighs 1.
    """
    row, col, value = adj.coo()
    num_nodes, num_src = (int(s) for s in adj.sparse_sizes())
    weight = value if use_values and transform.uses_values else None

    def make_base(values: Optional[Tensor]) -> Graph:
        return Graph.from_edge_index(torch.stack([col, row]), values, num_nodes,
                                     num_src=None if num_src == num_nodes else num_src)

    shape_key = ("SparseTensor", (num_nodes, num_src), col.device, col.numel())
    return _cached_build(col, shape_key, make_base, weight, col.numel(), transform)


# ---------------------------------------------------------------------------- Graph inputs
class _GraphEntry:
    """A transform's result cached on the input Graph (``graph.cache``).

    ``owner_key`` names the graph it was built for as ``owner`` does (``with_values`` copies
    caches into other graphs), in a form compiled code can compare.
    """

    __slots__ = ("owner", "owner_key", "values", "version", "graph", "router")

    def __init__(self, owner: Graph) -> None:
        self.owner = weakref.ref(owner)
        self.owner_key = owner.key
        self.values: Optional[Tensor] = None
        self.version = -1
        self.graph: Optional[Graph] = None
        self.router: Optional[_Router] = None


def transformed_graph(graph: Graph, transform: GraphTransform) -> Graph:
    """``transform(graph)``, cached in ``graph.cache`` (see the module doc)."""
    if transform.is_identity:
        return graph
    values = graph.edge_val if transform.uses_values else None
    entry = graph.cache.get("layer_transform", transform.name)
    if not isinstance(entry, _GraphEntry) or entry.owner() is not graph:   # missing, or copied by with_values
        entry = _GraphEntry(graph)
        graph.cache.put("layer_transform", entry, transform.name)
    if _needs_grad(values):
        if entry.router is None:
            _count_build()
            entry.router = _Router(graph.with_values, graph.num_edges, graph.device, transform)
            if entry.router.last is None:       # no probe possible (inference mode): try again next call
                entry.router = None
                return transform(graph)
        if not entry.router.ok:                 # the routing does not hold: the whole transform per call
            _count_build()
            return transform(graph)
        return entry.router.apply(values, transform)
    version = -1 if values is None else values._version
    if entry.graph is None or entry.values is not values or entry.version != version:
        _count_build()
        entry.graph, entry.values, entry.version = transform(graph), values, version
    return entry.graph


def compiled_transformed_graph(fn: str, graph: Graph, transform: GraphTransform) -> Graph:
    """``transform(graph)`` as an earlier eager call cached it: what compiled code can trace.

    Raises:
        ValueError: nothing was built for this graph yet, or the values need grad (see the module doc).
    """
    if transform.is_identity:
        return graph
    if transform.uses_values and _needs_grad(graph.edge_val):
        raise ValueError(
            f"{fn}(): under torch.compile, the graph's edge_val must not require grad with the "
            f"{transform.name!r} transform: its values are recomputed on the host every call. Detach them, or "
            "run this layer eagerly")
    entry = graph.cache.get("layer_transform", transform.name)
    if not isinstance(entry, _GraphEntry) or entry.owner_key != graph.key or entry.graph is None:
        raise ValueError(
            f"{fn}(): the {transform.name!r} form of this Graph is not built yet, and building it cannot be traced "
            "by torch.compile; run the model once eagerly on this Graph before calling the compiled model, "
            "e.g. sparsegnn.nn.prepare(model, x, graph)")
    return entry.graph


# ---------------------------------------------------------------------------- the layers' mixin
_WRAPPED: "weakref.WeakKeyDictionary[Callable, GraphTransform]" = weakref.WeakKeyDictionary()
_WRAP_COUNT = itertools.count()


def _as_transform(fn: Callable[[Graph], Graph]) -> GraphTransform:
    """A plain ``Graph -> Graph`` function as a GraphTransform of a name unique to it (all of it
    structural; if its values are no routing, grad edge weights rebuild per call)."""
    wrapped = _WRAPPED.get(fn)
    if wrapped is None:
        name = f"{getattr(fn, '__qualname__', type(fn).__name__)}#{next(_WRAP_COUNT)}"
        wrapped = _WRAPPED[fn] = GraphTransform(name, fn)
    return wrapped


def _is_edge_index_class(obj) -> bool:
    """PyG's ``torch_geometric.EdgeIndex`` (a Tensor subclass), without importing PyG."""
    return isinstance(obj, Tensor) and type(obj).__name__ == "EdgeIndex" and hasattr(obj, "as_tensor")


def _is_sparse_tensor_class(obj) -> bool:
    """``torch_sparse.SparseTensor``, without importing torch_sparse."""
    return (type(obj).__name__ == "SparseTensor" and hasattr(obj, "coo") and hasattr(obj, "sparse_sizes")
            and not isinstance(obj, Tensor))


def graph_kind(graph) -> str:
    """The form of a layer's graph argument.

    Returns:
        ``"graph"`` (a :class:`Graph`), ``"edge_index"`` (``[2, E]``, row 0 = source),
        ``"edge_index_class"`` (PyG's ``EdgeIndex``), ``"torch_sparse"`` (a torch sparse
        ``adj_t``), ``"sparse_tensor"`` (``torch_sparse.SparseTensor``) or ``"unknown"``.
    """
    if isinstance(graph, Graph):
        return "graph"
    if isinstance(graph, Tensor):
        if graph.layout != torch.strided:
            return "torch_sparse"
        return "edge_index_class" if _is_edge_index_class(graph) else "edge_index"
    if _is_sparse_tensor_class(graph):
        return "sparse_tensor"
    return "unknown"


def graph_sizes(graph, kind: Optional[str] = None):
    """``(num_src, num_dst)`` that the graph argument itself fixes (``None`` where it does not).

    A Graph, a sparse ``adj_t`` ``[N, M]`` and an ``EdgeIndex`` with a ``sparse_size`` know
    them (an ``EdgeIndex``'s rows are sources); an ``edge_index`` does not.
    """
    kind = graph_kind(graph) if kind is None else kind
    if kind == "graph":
        return graph.num_src, graph.num_nodes
    if kind == "torch_sparse":
        return (int(graph.shape[1]), int(graph.shape[0])) if graph.dim() >= 2 else (None, None)
    if kind == "edge_index_class":
        rows, cols = graph.sparse_size()
        return rows, cols
    if kind == "sparse_tensor":
        rows, cols = graph.sparse_sizes()
        return int(cols), int(rows)
    return None, None


def edge_count(graph) -> int:
    """Edges of a layer's graph argument as given (before a layer's transform adds loops), read
    without building its Graph; -1 for a form this does not know."""
    if isinstance(graph, Graph):
        return graph.num_edges
    if isinstance(graph, Tensor):
        if graph.layout != torch.strided:
            return int(graph._nnz())
        return int(graph.shape[-1]) if graph.dim() == 2 else 0
    nnz = getattr(graph, "nnz", None)       # a SparseTensor
    return int(nnz()) if callable(nnz) else -1


class GraphInputMixin:
    """Accepts every graph form of PyG's layers and caches the Graph built from it.

    Forms: a :class:`Graph`; an ``edge_index`` ``[2, E]`` (row 0 = source, row 1 = target; with an
    optional ``edge_weight``); PyG's ``EdgeIndex``; a torch sparse COO or CSR ``adj_t``
    (``adj_t[i, j]`` = weight of ``j -> i``, ``[N, M]``); a ``torch_sparse.SparseTensor`` ``adj_t``.

    Layers set ``self.cached`` and call ``self._graph(fn, graph, edge_weight, num_nodes, transform,
    num_src=...)``. Graphs built from a tensor are shared process-wide (see the module doc). With
    ``cached=True`` the transformed graph of the first call is reused for every later call
    (transductive training on one graph, like PyG's ``cached=True``).
    """

    cached: bool = False
    _cached_graph: Optional[Graph] = None

    def _graph(
        self,
        fn: str,
        graph,
        edge_weight: Optional[Tensor],
        num_nodes: int,
        transform: GraphTransform,
        num_src: Optional[int] = None,
        sparse_values: bool = True,
    ) -> Graph:
        """The transformed Graph of ``graph`` with ``num_nodes`` targets and ``num_src`` sources.

        Args:
            edge_weight: per-edge weights of an ``edge_index`` (caller's order); ignored for
                sparse inputs, whose values are the weights (as PyG does).
            num_src: source nodes of a bipartite graph (default: ``num_nodes``).
            sparse_values: aggregate with a sparse input's values (PyG does for a torch sparse
                tensor, and drops a ``SparseTensor``'s in SAGEConv and GINConv).
        """
        if not isinstance(transform, GraphTransform):
            transform = _as_transform(transform)
        num_src = num_nodes if num_src is None else int(num_src)
        if self.cached and self._cached_graph is not None:
            cached = self._cached_graph
            if cached.num_nodes != num_nodes or cached.num_src != num_src:
                raise ValueError(f"{fn}(): the cached graph has {cached.num_nodes} target and {cached.num_src} source "
                                 f"nodes but x has {num_nodes} and {num_src} rows; call reset_cache() when the graph "
                                 "changes")
            return _collected(cached)
        kind = graph_kind(graph)
        if kind != "graph" and torch.compiler.is_compiling():
            raise not_traceable_graph(fn, graph)
        if kind == "graph":
            check(edge_weight is None, fn, "pass edge weights inside the Graph (edge_val), not as edge_weight")
            if graph.num_nodes != num_nodes or graph.num_src != num_src:
                what = (f"{graph.num_nodes} nodes" if not graph.is_bipartite
                        else f"{graph.num_nodes} target and {graph.num_src} source nodes")
                rows = f"{num_nodes} rows" if num_src == num_nodes else f"{num_src} source and {num_nodes} target rows"
                raise ValueError(f"{fn}(): x has {rows} but the graph has {what}")
            if torch.compiler.is_compiling():
                result = compiled_transformed_graph(fn, graph, transform)
            else:
                result = transformed_graph(graph, transform)
        elif kind in ("edge_index", "edge_index_class"):
            edge_index = graph.as_tensor() if kind == "edge_index_class" else graph
            check(edge_index.dim() == 2 and edge_index.shape[0] == 2, fn,
                  f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
            result = graph_from_edge_index(edge_index, edge_weight, num_nodes, transform, num_src=num_src)
        elif kind in ("torch_sparse", "sparse_tensor"):
            src, dst = graph_sizes(graph, kind)
            if (src, dst) != (num_src, num_nodes):
                raise ValueError(f"{fn}(): the sparse adj_t has shape [{dst}, {src}] ([targets, sources]) but x has "
                                 f"{num_nodes} target and {num_src} source rows")
            if kind == "torch_sparse":
                result = graph_from_torch_sparse(graph, transform, use_values=sparse_values, fn=fn)
            else:
                result = graph_from_sparse_tensor(graph, transform, use_values=sparse_values)
        else:
            raise ValueError(f"{fn}(): the graph must be a sparsegnn.Graph, an edge_index [2, E], a PyG EdgeIndex, a "
                             f"torch sparse adj_t or a torch_sparse.SparseTensor, got {type(graph).__name__}")
        if self.cached:
            self._cached_graph = result
        return _collected(result)

    def reset_cache(self) -> None:
        """Forget the cached graph."""
        self._cached_graph = None
