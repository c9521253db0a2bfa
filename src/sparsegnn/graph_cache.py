"""``GraphCache``: the forms derived from one :class:`~sparsegnn.Graph`, in named slots.

A Graph's structure (``rowptr``, ``col``) never changes after it is made, so whatever is
derived from the structure alone (its transpose, degrees, work plans, tile translation,
structural signature) stays valid for the Graph's life.  Forms derived from edge values too
(a cuSPARSE CSR tensor with the values, launches bound to them, values permuted for the
transpose) are valid only while the same value tensor, at the same version, comes back.

**The one invalidation rule.**  Every slot is declared in ``SLOTS`` as depending on the
structure only or on the edge values as well.  An entry of a values slot records the value
tensor it was built from (by identity), that tensor's ``_version`` (bumped by every in-place
update, such as an optimiser step on a learnable edge weight) and an optional ``stamp`` (for
example the decision stores' generation); a lookup that passes another tensor, version or stamp
rebuilds the entry in place (one entry per slot and key, so values that change every call
replace each other instead of piling up).  Graphs made with ``Graph.with_values`` start with a
copy of the structure entries and without the values entries; ``Graph.to`` starts empty.

A ``volatile`` graph (tensors refilled in place between calls, the static batch of a captured
step) keeps only the forms its owner supplies (``OWNER_SLOTS``, via ``Graph.set_derived`` and
``Graph.set_batch_stats``), which are never found stale (the owner refills them with the graph);
other lookups build and return without keeping.

Example:
    >>> g = Graph.from_edge_index(edge_index)
    >>> plan = g.cache.get("row_plan", 256, build=lambda: build_row_plan(g.rowptr, g.col, 256))
    >>> csr = g.cache.get("csr", torch.float32, build=make_csr, values=g.edge_val)
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Iterator, Optional, Tuple

from torch import Tensor

#: Every slot, with whether its entries depend on the edge values (True) or on the structure
#: only (False), and what it holds.
SLOTS: Dict[str, Tuple[bool, str]] = {
    # the graph's own derived forms (graph.py)
    "row": (False, "target node of every edge, [E]"),
    "in_degree": (False, "stored incoming edges per node, [N]"),
    "transpose": (False, "(rowptr_t, col_t, perm) of A^T"),
    "t": (True, "A^T as a Graph, carrying the permuted edge values"),
    "batch_stats": (False, "(largest graph's nodes, mean degree, block-diagonal) of a batch"),
    "row_plan": (False, "degree-aware row partition, keyed by chunk length"),
    "inverse_edge_perm": (False, "argsort of edge_perm"),
    "inv_degree": (False, "1 / max(deg, 1) per row, keyed by dtype"),
    "mean_scale": (False, "1 / deg(row[e]) per edge, keyed by dtype"),
    # the tuner's per-graph state (tune/)
    "signature": (False, "structural signature for decision keys"),
    "fingerprint": (False, "short hash of the structure for decision keys"),
    "stats": (False, "degree statistics the cost model reads"),
    "reuse": (False, "use counts of the investment rule (tune.reuse)"),
    # the ops' investments and bound launches (ops/)
    "plan": (False, "the row plan at the heuristics' chunk length"),
    "tiles": (False, "tensor-core tile translation, keyed by (window, block_k)"),
    "spmm_run": (True, "a bound SpMM launch, keyed by the call's variant, width, dtype and device"),
    "cbsr_run": (True, "a CBSR aggregation resolved for a call signature (ops.cbsr._Bound): schedules and launches"),
    "edge_values": (True, "a form of edge values (CSR tensor, permutation, batch tiles), keyed by its kind"),
    "call": (False, "the backend an eager call resolved to, keyed by the call's signature"),
    "cpu_bounds": (False, "the CPU backend's row chunks, keyed by thread count"),
    "cpu_csr_indices": (False, "int32 (rowptr, col) for torch's CPU CSR kernels"),
    "cpu_csr": (True, "a torch CPU CSR tensor with the values, keyed by (dtype, columns)"),
    "cpu_plan": (True, "the CPU backend's chosen runner bound to the values, keyed by the call's variant"),
    "cpu_runner": (True, "a prepared Numba SpMM for the values, keyed by kind, dtype, width and threads"),
    # the layers' per-graph state (nn/) and the sampler's (sampling/)
    "loop_info": (False, "where a layer's self loops sit in a graph it built"),
    "layer_transform": (False, "a transform of the graph for a layer, keyed by the transform's name"),
    "edge_source_graph": (False, "the graph whose sources are this graph's edges"),
    "trimmed": (False, "a sampled batch's per-layer graphs, keyed by the layer count"),
}
#: The slots a volatile graph's owner supplies (refilled with the graph); the only ones it keeps.
OWNER_SLOTS = ("row", "in_degree", "transpose", "t", "batch_stats")

_MISSING = object()


class _Entry:
    """A kept form: its value, and for a values slot what it was built from (``checked``).
    Entries an owner supplied are not checked: the owner refills them with the graph."""

    __slots__ = ("value", "values", "version", "stamp", "checked")

    def __init__(self, value, values: Optional[Tensor], stamp: Hashable, checked: bool) -> None:
        self.value = value
        self.values = values
        self.version = None if values is None else values._version
        self.stamp = stamp
        self.checked = checked


class GraphCache:
    """Named slots of forms derived from one Graph (see the module docstring for the rule)."""

    __slots__ = ("_entries", "_volatile")

    def __init__(self, volatile: bool = False) -> None:
        self._entries: Dict[Tuple[str, Hashable], _Entry] = {}
        self._volatile = volatile

    @staticmethod
    def _depends(slot: str) -> bool:
        """Whether ``slot`` depends on the edge values (ValueError for an undeclared slot)."""
        declared = SLOTS.get(slot)
        if declared is None:
            raise ValueError(f"GraphCache: unknown slot {slot!r}; slots: {', '.join(SLOTS)}")
        return declared[0]

    def get(self, slot: str, key: Hashable = None, build: Optional[Callable[[], Any]] = None, *,
            values: Optional[Tensor] = None, stamp: Hashable = None):
        """The entry of ``slot`` under ``key``; built with ``build()`` and kept when absent or
        stale (``values``/``stamp`` other than recorded, for values slots, unless an owner
        supplied it); None when absent or stale and no ``build`` is given."""
        entry = self._entries.get((slot, key))     # the hit path: one lookup, the checks it needs
        if entry is not None and (not entry.checked or (
                entry.values is values and entry.version == (None if values is None else values._version)
                and entry.stamp == stamp)):
            return entry.value
        depends = self._depends(slot)
        if build is None:
            return None
        value = build()
        if not self._volatile:                  # refilled in place between calls: build, never keep
            self._entries[(slot, key)] = _Entry(value, values if depends else None, stamp, depends)
        return value

    def peek(self, slot: str, key: Hashable = None):
        """The kept entry of ``slot`` under ``key`` whether or not it is stale (None if absent):
        for rebuilding a values entry from its previous form."""
        self._depends(slot)
        entry = self._entries.get((slot, key))
        return None if entry is None else entry.value

    def put(self, slot: str, value, key: Hashable = None, *, values: Optional[Tensor] = None,
            stamp: Hashable = None, owner: bool = False) -> None:
        """Keep ``value`` in ``slot`` under ``key`` (built from ``values``/``stamp`` for values
        slots).  Dropped on a volatile graph unless ``owner`` supplies one of ``OWNER_SLOTS``."""
        depends = self._depends(slot)
        if self._volatile and not (owner and slot in OWNER_SLOTS):
            return
        self._entries[(slot, key)] = _Entry(value, values if depends else None, stamp, depends and not owner)

    def __contains__(self, slot_key) -> bool:
        """``"slot" in cache`` or ``("slot", key) in cache``: whether an entry is kept (stale or not)."""
        if isinstance(slot_key, str):
            slot_key = (slot_key, None)
        return slot_key in self._entries

    def keys(self, slot: str) -> Iterator[Hashable]:
        """The keys kept in ``slot`` (the dtypes of ``"mean_scale"``, say)."""
        self._depends(slot)
        return iter([key for s, key in self._entries if s == slot])

    def entries(self) -> Iterator[Any]:
        """Every kept value (for moving a graph's tensors as a whole, e.g. pinning)."""
        return (entry.value for entry in self._entries.values())

    def structure_only(self, volatile: bool) -> "GraphCache":
        """A cache holding this one's structure entries (for a graph with the same structure and
        other edge values)."""
        out = GraphCache(volatile)
        out._entries = {k: e for k, e in self._entries.items() if not SLOTS[k[0]][0]}
        return out

    def __iter__(self) -> Iterator[Tuple[str, Hashable]]:
        """The ``(slot, key)`` of every kept entry."""
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        slots = sorted({slot for slot, _ in self._entries})
        return f"GraphCache({len(self._entries)} entries: {', '.join(slots)})"
