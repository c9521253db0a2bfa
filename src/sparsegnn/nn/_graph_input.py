"""Turning a layer's graph argument into the (transformed) Graph it aggregates over, cached.

Layers are called the PyG way, ``conv(x, edge_index)``, usually with the same ``edge_index``
tensor every step and from every layer of a model. Building a Graph (a sort, then e.g. GCN's
self loops and normalisation) and, worse, planning and tuning kernels for every new Graph
object would cost far more than the aggregation itself. So built graphs are cached:

* **An ``edge_index`` tensor** (with an optional ``edge_weight``) is looked up in one small
  process-wide LRU cache (``set_graph_cache_size``, 16 entries by default). The key is the
  *identity and version* of the inputs: ``(id(edge_index), edge_index._version, shape, dtype,
  device, num_nodes, edge_weight's (id, _version) or None, transform name)``. The entry holds
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
* **A Graph** is used as is. Its transformed forms are cached on it, in ``graph.cache`` under
  ``("sparsegnn.nn.transform", name)``, checked against the identity and version of
  ``graph.edge_val`` (``Graph.with_values`` copies caches into graphs with other values).
* ``cached=True`` on a layer keeps its meaning: the layer keeps the first graph forever.

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

import itertools
import threading
import weakref
from collections import OrderedDict
from typing import Callable, Dict, Hashable, List, Optional

import torch
from torch import Tensor

from .._checks import check, check_edge_values, check_same_device
from ..graph import Graph
from ..ops._library import not_traceable_graph

__all__ = [
    "GraphTransform", "GraphInputMixin", "identity", "self_looped", "gcn_normalized",
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
#: Self loops replaced by exactly one per node, without edge values (AGNN, GAT).
self_looped = GraphTransform("self_looped", lambda g: g.with_values(None).add_self_loops(), uses_values=False)
#: GCN's ``D^-1/2 (A + I) D^-1/2``: one self loop per node (existing ones keep their summed
#: weight, new ones weigh 1), then the symmetric normalisation.
gcn_normalized = GraphTransform("gcn_normalized", lambda g: g.add_self_loops(), lambda g: g.normalize("sym"))


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
    """A cached build of one (inputs, transform): the Graph, or the router for grad weights."""

    __slots__ = ("refs", "versions", "graph", "router")

    def __init__(self, refs: List[weakref.ref], versions: List[int], graph: Optional[Graph],
                 router: Optional[_Router]) -> None:
        self.refs, self.versions, self.graph, self.router = refs, versions, graph, router

    def matches(self, tensors: List[Tensor]) -> bool:
        return all(r() is t for r, t in zip(self.refs, tensors))

    def stale(self) -> bool:
        """An input was freed or edited in place since the build."""
        for ref, version in zip(self.refs, self.versions):
            tensor = ref()
            if tensor is None or tensor._version != version:
                return True
        return False


_LOCK = threading.Lock()
_CACHE: "OrderedDict[Hashable, _Entry]" = OrderedDict()
_FREED: List[Hashable] = []     # keys whose inputs were freed; appended by weakref callbacks
_MAX_ENTRIES = 16
_BUILDS = 0


def graph_builds() -> int:
    """Number of graphs built by layers so far (cache misses), for tests and benchmarks."""
    return _BUILDS


def clear_graph_cache() -> None:
    """Forget every graph built from an ``edge_index`` (graphs' own ``graph.cache`` is untouched)."""
    with _LOCK:
        _CACHE.clear()
        _FREED.clear()


def set_graph_cache_size(max_entries: int) -> int:
    """Bound the process-wide cache to ``max_entries`` graphs (0 disables it); returns the old bound."""
    global _MAX_ENTRIES
    check(int(max_entries) >= 0, "set_graph_cache_size", f"max_entries must be >= 0, got {max_entries}")
    with _LOCK:
        old, _MAX_ENTRIES = _MAX_ENTRIES, int(max_entries)
        while len(_CACHE) > _MAX_ENTRIES:
            _CACHE.popitem(last=False)
    return old


def graph_cache_info() -> Dict[str, int]:
    """``{"entries", "max_entries", "builds"}`` of the process-wide cache."""
    with _LOCK:
        _drop_freed()
        return {"entries": len(_CACHE), "max_entries": _MAX_ENTRIES, "builds": _BUILDS}


def _count_build() -> None:
    global _BUILDS
    with _LOCK:
        _BUILDS += 1


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
        if entry is None:
            return None
        if not entry.matches(tensors):          # an id reused by another tensor
            del _CACHE[key]
            return None
        _CACHE.move_to_end(key)
        return entry


def _insert(key: Hashable, tensors: List[Tensor], graph: Optional[Graph], router: Optional[_Router]) -> None:
    # The callback only records the key: it may run inside the garbage collector at any point.
    refs = [weakref.ref(t, lambda _ref, k=key: _FREED.append(k)) for t in tensors]
    entry = _Entry(refs, [t._version for t in tensors], graph, router)
    with _LOCK:
        _drop_freed()
        for old in [k for k, e in _CACHE.items() if e.stale()]:
            del _CACHE[old]
        if _MAX_ENTRIES == 0:
            return
        _CACHE[key] = entry
        _CACHE.move_to_end(key)
        while len(_CACHE) > _MAX_ENTRIES:
            _CACHE.popitem(last=False)


def _needs_grad(values: Optional[Tensor]) -> bool:
    return values is not None and values.requires_grad


def _trackable(*tensors: Optional[Tensor]) -> bool:
    """Whether in-place edits of these tensors are visible (inference tensors have no version counter)."""
    return not any(t is not None and t.is_inference() for t in tensors)


def graph_from_edge_index(edge_index: Tensor, edge_weight: Optional[Tensor], num_nodes: int,
                          transform: GraphTransform) -> Graph:
    """``transform(Graph.from_edge_index(edge_index, edge_weight, num_nodes))``, cached (see the module doc)."""
    if not transform.uses_values:
        edge_weight = None
    dynamic = _needs_grad(edge_weight)

    def make_base(values: Optional[Tensor]) -> Graph:
        return Graph.from_edge_index(edge_index, values, num_nodes)

    if not _trackable(edge_index, edge_weight):
        _count_build()
        return transform(make_base(edge_weight))
    if dynamic:  # the key leaves the weight out, so check it on every call (cheap: no sync)
        check_edge_values(edge_weight, edge_index.shape[1], "Graph.from_edge_index", "edge_weight", max_dim=1)
        check_same_device("Graph.from_edge_index", edge_index=edge_index, edge_weight=edge_weight)
    if edge_weight is None:
        weight_key, tensors = None, [edge_index]
    elif dynamic:
        weight_key, tensors = "requires_grad", [edge_index]
    else:
        weight_key, tensors = (id(edge_weight), edge_weight._version), [edge_index, edge_weight]
    key = (id(edge_index), edge_index._version, tuple(edge_index.shape), edge_index.dtype, edge_index.device,
           int(num_nodes), weight_key, transform.name)
    entry = _lookup(key, tensors)
    if entry is None:
        _count_build()
        if not dynamic:
            graph = transform(make_base(edge_weight))
            _insert(key, tensors, graph, None)
            return graph
        make_base(None)                         # validates the input before the probe passes
        router = _Router(make_base, edge_index.shape[1], edge_index.device, transform)
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
    key = ("sparsegnn.nn.transform", transform.name)
    entry = graph.cache.get(key)
    if not isinstance(entry, _GraphEntry) or entry.owner() is not graph:   # missing, or copied by with_values
        entry = graph.cache[key] = _GraphEntry(graph)
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
    entry = graph.cache.get(("sparsegnn.nn.transform", transform.name))
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


class GraphInputMixin:
    """Accepts ``Graph`` or ``edge_index`` (+ optional ``edge_weight``) and caches the built graph.

    Layers set ``self.cached`` and call ``self._graph(fn, graph, edge_weight, num_nodes, transform)``.
    Graphs built from an ``edge_index`` are shared process-wide (see the module doc). With
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
    ) -> Graph:
        if not isinstance(transform, GraphTransform):
            transform = _as_transform(transform)
        if self.cached and self._cached_graph is not None:
            if self._cached_graph.num_nodes != num_nodes:
                raise ValueError(f"{fn}(): cached graph has {self._cached_graph.num_nodes} nodes but x has {num_nodes} "
                                 "rows; call reset_cache() when the graph changes")
            return self._cached_graph
        if isinstance(graph, Graph):
            check(edge_weight is None, fn, "pass edge weights inside the Graph (edge_val), not as edge_weight")
            if graph.num_nodes != num_nodes:
                raise ValueError(f"{fn}(): x has {num_nodes} rows but the graph has {graph.num_nodes} nodes")
            if torch.compiler.is_compiling():
                result = compiled_transformed_graph(fn, graph, transform)
            else:
                result = transformed_graph(graph, transform)
        elif isinstance(graph, Tensor):
            if torch.compiler.is_compiling():
                raise not_traceable_graph(fn, graph)
            check(graph.dim() == 2 and graph.shape[0] == 2, fn,
                  f"edge_index must have shape [2, E], got {tuple(graph.shape)}")
            result = graph_from_edge_index(graph, edge_weight, num_nodes, transform)
        else:
            raise ValueError(f"{fn}(): graph must be a Graph or an edge_index tensor, got {type(graph).__name__}")
        if self.cached:
            self._cached_graph = result
        return result

    def reset_cache(self) -> None:
        """Forget the cached graph."""
        self._cached_graph = None


def as_float_tensor(x: Tensor, fn: str) -> None:
    """Node features must be a 2-D floating-point tensor (messages built only on failure)."""
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"{fn}(): x must be a 2-D tensor [num_nodes, features], got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if not x.is_floating_point():
        raise ValueError(f"{fn}(): x must be floating point, got {x.dtype}")
