"""``Graph``: a sparse graph stored once, in destination-major CSR, with cached derived forms.

Row ``i`` of the CSR lists the incoming edges of target node ``i`` (PyG's ``adj_t``), so
``spmm(graph, x)[i] = sum_{j -> i} w_ji x_j``.

Edge order. Every edge-valued tensor the library takes or returns for a ``Graph`` (edge
weights, ``sddmm`` results, ``edge_softmax`` scores) is in the Graph's own CSR order. A
graph built by ``from_edge_index`` keeps ``edge_perm``: CSR edge ``k`` is edge
``edge_perm[k]`` of the caller's ``edge_index``.  ``to_graph_order`` / ``to_input_order``
move per-edge tensors between the two orders.  The ops also accept a raw ``edge_index``
directly; then per-edge inputs and outputs are in the caller's order.

Graph handle.  Every Graph gets a process-unique int ``key`` when it is made and is listed
(weakly) under it; ``graph_by_key(key)`` returns it while it lives.  The custom ops
(``ops/_library.py``) take a graph as this int, so ``torch.compile`` sees a constant and the
graph's own tensors (CSR, transpose, plans, tuned configs) stay out of the traced program.
Graphs made from a graph (``t()``, ``with_values``, ``to``, a copy, ...) are new Graphs with
keys of their own.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from ._checks import check, check_count, check_edge_values, check_index, check_same_device, check_tensor, index_size
from .formats import csr as csr_fmt
from .formats.plan import RowPlan, build_row_plan
from .graph_cache import OWNER_SLOTS, GraphCache

_NEXT_KEY = itertools.count()
#: Derived forms a caller may supply (``Graph.set_derived``; ``batch_stats`` has its own setter).
_DERIVED_KEYS = tuple(slot for slot in OWNER_SLOTS if slot != "batch_stats")
_GRAPHS: "weakref.WeakValueDictionary[int, Graph]" = weakref.WeakValueDictionary()


def graph_by_key(key: int) -> "Graph":
    """The live Graph whose ``key`` is ``key``.

    Raises:
        ValueError: the Graph was freed (compiled code holds keys, not the Graphs themselves).
    """
    graph = _GRAPHS.get(key)
    if graph is None:
        raise ValueError(f"sparsegnn: graph {key} was freed; compiled code and pending backward passes refer to a "
                         "Graph by its key only, so keep the Graph alive while they run")
    return graph


class Graph:
    """A graph with ``num_nodes`` nodes in destination-major CSR.

    A graph may be *bipartite* (rectangular): ``num_src`` source nodes ``M`` (the columns,
    what ``col`` indexes) and ``num_nodes`` target nodes ``N`` (the rows), as in the sampled
    blocks of mini-batch training.  Then ``spmm(graph, x)`` takes ``x`` of ``M`` rows and
    returns ``N`` rows; ``graph.t()`` is ``M x N``.  By default ``num_src == num_nodes``.

    Attributes:
        rowptr: ``[N + 1]`` int64 row offsets (row = target node).
        col: ``[E]`` int64 source node of each edge (``< M``).
        edge_val: ``[E]`` optional edge values (weights), in CSR order.
        num_nodes: ``N``, the target nodes (rows).
        num_src: ``M``, the source nodes (columns); ``N`` unless bipartite.
        num_edges: ``E``.
        transient: the graph serves one training step (a sampled mini-batch): the ops invest
            nothing per structure in it (no row plan, no signature, no tuning: plan-free kernels
            and heuristic configs).  Graphs made from it (transpose, self loops, new values)
            are transient too.
        volatile: the graph's tensors are refilled in place between calls (the static batch of
            a captured training step, ``datasets.loader.StaticBatch``): nothing derived from them
            may outlive a call.  Implies ``transient``.  Its ``cache`` holds only what its owner
            put there with ``set_derived`` (forms the owner refills with the graph); whatever an
            op caches on it is built for that call and not kept.
        key: process-unique int naming this Graph for the custom ops (``graph_by_key``).
        edge_perm: ``[E]`` int64 or ``None``: CSR edge ``k`` is input edge ``edge_perm[k]``
            (int32 from ``formats.csr.LEAN_MIN_EDGES`` edges, built by ``from_edge_index``).
        ptr: ``[B + 1]`` int64 or ``None``: node boundaries of batched graphs.

    Derived forms (the per-edge target ``row``, the transpose, degrees) are computed on first
    use and cached; transformations return new graphs and never modify this one.

    The constructor trusts its arguments (the library's own transforms build valid CSR and call
    it without a host sync); an out-of-range ``col`` there reads out of bounds in the kernels.
    Build graphs from user data with :meth:`from_edge_index`, :meth:`from_csr` or
    :meth:`from_torch_sparse`, which check indices, sizes and dtypes.

    Example:
        >>> ei = torch.tensor([[0, 1, 2], [1, 2, 0]])   # edges 0->1, 1->2, 2->0
        >>> g = Graph.from_edge_index(ei)
        >>> g.rowptr.tolist(), g.col.tolist()
        ([0, 1, 2, 3], [2, 0, 1])
    """

    def __init__(
        self,
        rowptr: Tensor,
        col: Tensor,
        edge_val: Optional[Tensor] = None,
        num_nodes: Optional[int] = None,
        *,
        edge_perm: Optional[Tensor] = None,
        ptr: Optional[Tensor] = None,
        num_src: Optional[int] = None,
        transient: bool = False,
        volatile: bool = False,
    ) -> None:
        self.rowptr = rowptr
        self.col = col
        self.edge_val = edge_val
        self.num_nodes = int(rowptr.numel() - 1 if num_nodes is None else num_nodes)
        self.num_src = self.num_nodes if num_src is None else int(num_src)
        self.volatile = bool(volatile)
        self.transient = bool(transient) or self.volatile
        self._num_edges = int(col.numel())   # a plain int: compiled code reads it without touching col
        self.edge_perm = edge_perm
        self.ptr = ptr
        self._cache = GraphCache(self.volatile)
        self._register()

    def _register(self) -> None:
        self.key = next(_NEXT_KEY)
        _GRAPHS[self.key] = self

    def __setstate__(self, state: dict) -> None:
        """Copies and unpickled graphs are new Graphs: they get a key of their own."""
        self.__dict__.update(state)
        self._register()

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_edge_index(
        cls,
        edge_index: Tensor,
        edge_weight: Optional[Tensor] = None,
        num_nodes: Optional[int] = None,
        *,
        num_src: Optional[int] = None,
    ) -> "Graph":
        """Build from a PyG-style ``edge_index`` (row 0 = source, row 1 = target).

        Duplicate edges and self loops are kept as given (see ``remove_duplicates``).

        Args:
            num_nodes: target nodes ``N`` (default: the largest index + 1; for a square graph,
                over both rows).
            num_src: source nodes ``M`` of a bipartite graph (``edge_index[0] < M``); by default
                the graph is square (``M = N``).  PyG's ``size=(M, N)``.

        Shapes:
            edge_index: [2, E] integer; edge_weight: [E]; -> Graph with E edges.
        """
        fn = "Graph.from_edge_index"
        check_tensor(edge_index, fn, "edge_index")
        check(edge_index.dim() == 2 and edge_index.shape[0] == 2, fn,
              f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
        if num_src is None:
            if num_nodes is None:   # one read-back gives the size and checks the lower bound
                num_nodes = check_count(index_size(edge_index, fn, "edge_index"), fn, "num_nodes")
            else:
                num_nodes = check_count(num_nodes, fn, "num_nodes")
                check_index(edge_index, fn, "edge_index", upper=int(num_nodes))
            num_src = num_nodes
        else:
            check_index(edge_index, fn, "edge_index")
            if num_nodes is None:
                num_nodes = int(edge_index[1].max()) + 1 if edge_index.numel() > 0 else 0
            num_nodes, num_src = check_count(num_nodes, fn, "num_nodes"), check_count(num_src, fn, "num_src")
            check_index(edge_index[0], fn, "edge_index[0] (sources)", upper=int(num_src))
            check_index(edge_index[1], fn, "edge_index[1] (targets)", upper=int(num_nodes))
        if edge_weight is not None:
            check_edge_values(edge_weight, edge_index.shape[1], fn, "edge_weight", max_dim=1)
            check_same_device(fn, edge_index=edge_index, edge_weight=edge_weight)
        source, target = edge_index[0], edge_index[1]
        rowptr, col, perm = csr_fmt.coo_to_csr(target, source, int(num_nodes), num_cols=int(num_src), lean=True)
        edge_val = edge_weight[perm] if edge_weight is not None else None
        return cls(rowptr, col, edge_val, int(num_nodes), edge_perm=perm, num_src=int(num_src))

    @classmethod
    def from_csr(
        cls,
        rowptr: Tensor,
        col: Tensor,
        edge_val: Optional[Tensor] = None,
        num_nodes: Optional[int] = None,
        *,
        num_src: Optional[int] = None,
    ) -> "Graph":
        """Build from destination-major CSR arrays (row = target). Columns within a row may be unsorted.

        ``num_src``: source nodes ``M`` of a bipartite graph (``col < M``; default ``N``).

        Shapes:
            rowptr: [N + 1]; col: [E]; edge_val: [E].
        """
        fn = "Graph.from_csr"
        check_tensor(rowptr, fn, "rowptr")
        check_tensor(col, fn, "col")
        check(rowptr.dim() == 1 and rowptr.numel() >= 1, fn, f"rowptr must be 1-D with N + 1 entries, got shape {tuple(rowptr.shape)}")
        check(col.dim() == 1, fn, f"col must be 1-D, got shape {tuple(col.shape)}")
        check_index(rowptr, fn, "rowptr")
        n = rowptr.numel() - 1
        check(num_nodes is None or check_count(num_nodes, fn, "num_nodes") == n, fn, f"num_nodes={num_nodes} but rowptr describes {n} rows")
        check(int(rowptr[0]) == 0 and int(rowptr[-1]) == col.numel(), fn,
              f"rowptr must start at 0 and end at len(col)={col.numel()}, got {int(rowptr[0])}..{int(rowptr[-1])}")
        check(bool((rowptr[1:] >= rowptr[:-1]).all()), fn, "rowptr must be non-decreasing")
        m = n if num_src is None else check_count(num_src, fn, "num_src")
        check_index(col, fn, "col", upper=m)
        check_same_device(fn, rowptr=rowptr, col=col, edge_val=edge_val)
        if edge_val is not None:
            check_edge_values(edge_val, col.numel(), fn, "edge_val", max_dim=1)
        rowptr = rowptr.to(torch.int64)
        col = col.to(torch.int64)
        return cls(rowptr, col, edge_val, n, num_src=m)

    @classmethod
    def from_torch_sparse(cls, adj: Tensor) -> "Graph":
        """Build from a ``torch.sparse`` COO or CSR tensor ``A`` with ``A[i, j]`` = weight of ``j -> i``
        (PyG's ``adj_t``); a rectangular ``[N, M]`` tensor gives a bipartite graph.

        An uncoalesced COO tensor is coalesced first (duplicate entries summed into one edge, as
        torch defines the matrix); the edges follow the coalesced (row-major) order, a CSR
        tensor's edges its own order.

        Shapes:
            adj: [N, M] sparse -> Graph with nnz(adj.coalesce()) edges (explicit zeros kept).
        """
        fn = "Graph.from_torch_sparse"
        check_tensor(adj, fn, "adj")
        check(adj.dim() == 2, fn, f"adj must be a 2-D sparse tensor, got shape {tuple(adj.shape)}")
        n, m = int(adj.shape[0]), int(adj.shape[1])
        if adj.layout == torch.sparse_csr:
            return cls.from_csr(adj.crow_indices(), adj.col_indices(), adj.values(), n, num_src=m)
        if adj.layout == torch.sparse_coo:
            adj = adj.coalesce()
            target, source = adj.indices()
            rowptr, col, perm = csr_fmt.coo_to_csr(target, source, n, num_cols=m)
            return cls(rowptr, col, adj.values()[perm], n, num_src=m)
        raise ValueError(f"{fn}(): adj must have layout sparse_coo or sparse_csr, got {adj.layout}")

    @classmethod
    def from_scipy(cls, matrix) -> "Graph":
        """Build from a square scipy sparse matrix ``A`` with ``A[i, j]`` = weight of ``j -> i``."""
        fn = "Graph.from_scipy"
        check(hasattr(matrix, "tocsr") and hasattr(matrix, "shape"), fn, f"expected a scipy sparse matrix, got {type(matrix).__name__}")
        check(matrix.shape[0] == matrix.shape[1], fn, f"matrix must be square, got shape {matrix.shape}")
        m = matrix.tocsr()
        m.sort_indices()
        return cls.from_csr(
            torch.from_numpy(m.indptr.astype("int64")),
            torch.from_numpy(m.indices.astype("int64")),
            torch.from_numpy(m.data.copy()),
            m.shape[0],
        )

    @classmethod
    def from_pyg(cls, data) -> "Graph":
        """Build from a PyG ``Data``-like object (``edge_index``, optional ``edge_weight``, ``num_nodes``)."""
        check(hasattr(data, "edge_index"), "Graph.from_pyg", "object has no edge_index")
        weight = getattr(data, "edge_weight", None)
        return cls.from_edge_index(data.edge_index, weight, getattr(data, "num_nodes", None))

    @staticmethod
    def batch(graphs: Sequence["Graph"]) -> "Graph":
        """Block-diagonal union of ``graphs``; ``ptr[b]:ptr[b+1]`` are graph ``b``'s nodes.

        Edge values are kept when every graph has them; ``edge_perm`` is dropped.

        Shapes:
            B graphs with N_b nodes, E_b edges -> N = sum N_b nodes, E = sum E_b edges, ptr [B + 1].
        """
        fn = "Graph.batch"
        graphs = list(graphs)
        check(len(graphs) > 0, fn, "needs at least one graph")
        check(all(isinstance(g, Graph) for g in graphs), fn, "every element must be a Graph")
        check(all(g.num_src == g.num_nodes for g in graphs), fn, "bipartite graphs cannot be batched")
        device = graphs[0].rowptr.device
        check(all(g.rowptr.device == device for g in graphs), fn, "all graphs must be on one device")
        node_counts = torch.tensor([g.num_nodes for g in graphs], dtype=torch.int64)
        edge_counts = torch.tensor([g.num_edges for g in graphs], dtype=torch.int64)
        node_offsets = torch.cat([node_counts.new_zeros(1), node_counts.cumsum(0)])
        edge_offsets = torch.cat([edge_counts.new_zeros(1), edge_counts.cumsum(0)])
        rowptr = torch.cat([graphs[0].rowptr[:1]] + [g.rowptr[1:] + int(edge_offsets[b]) for b, g in enumerate(graphs)])
        col = torch.cat([g.col + int(node_offsets[b]) for b, g in enumerate(graphs)])
        values = None
        if all(g.edge_val is not None for g in graphs):
            values = torch.cat([g.edge_val for g in graphs])
        return Graph(rowptr, col, values, int(node_offsets[-1]), ptr=node_offsets.to(device))

    # ------------------------------------------------------------------ properties
    @property
    def num_edges(self) -> int:
        return self._num_edges

    @property
    def device(self) -> torch.device:
        return self.rowptr.device

    @property
    def is_bipartite(self) -> bool:
        """Whether sources and targets are counted apart (``num_src != num_nodes``)."""
        return self.num_src != self.num_nodes

    @property
    def shape(self):
        """``(N, M)``: the adjacency ``A`` (rows = targets, columns = sources)."""
        return (self.num_nodes, self.num_src)

    def __repr__(self) -> str:
        vals = "" if self.edge_val is None else f", edge_val={self.edge_val.dtype}"
        batch = "" if self.ptr is None else f", graphs={self.ptr.numel() - 1}"
        src = f", num_src={self.num_src}" if self.is_bipartite else ""
        return f"Graph(num_nodes={self.num_nodes}{src}, num_edges={self.num_edges}{vals}{batch}, device={self.device})"

    @property
    def cache(self) -> GraphCache:
        """The forms derived from this graph (transpose, plans, tiles, bound launches), in the
        named slots of a :class:`~sparsegnn.graph_cache.GraphCache`: the one place that holds
        them, with one invalidation rule.  Graphs made with ``with_values`` start with a
        copy of its structure entries; ``to`` starts empty; a ``volatile`` graph keeps only what
        its owner supplies."""
        return self._cache

    def _cached(self, slot: str, build, key=None):
        return self._cache.get(slot, key, build)

    def set_derived(self, key: str, value) -> None:
        """Supply a derived form (``"row"``, ``"in_degree"``, ``"transpose"``, ``"t"``) that the
        caller computed, instead of having it built on first use.  On a ``volatile`` graph these
        are the only cached forms: the owner refills them whenever it refills the graph.
        Trusted, not checked."""
        check(key in _DERIVED_KEYS, "Graph.set_derived", f"key must be one of {_DERIVED_KEYS}, got {key!r}")
        self._cache.put(key, value, values=self.edge_val if key == "t" else None, owner=True)

    @property
    def row(self) -> Tensor:
        """Target node of every edge, ``[E]`` int64 (cached)."""
        return self._cached("row", lambda: csr_fmt.rowptr_to_row(self.rowptr, self.num_edges))

    def in_degree(self) -> Tensor:
        """Number of stored incoming edges per node, ``[N]`` int64 (duplicates counted)."""
        return self._cached("in_degree", lambda: csr_fmt.degrees(self.rowptr))

    def transpose_parts(self):
        """``(rowptr_t, col_t, perm)`` of ``A^T`` (cached): edge ``k`` of ``A^T`` is edge ``perm[k]`` of ``A``."""
        return self._cached("transpose", lambda: csr_fmt.transpose_csr(self.rowptr, self.col, self.num_src))

    def t(self) -> "Graph":
        """The reversed graph ``A^T`` as a Graph (cached, ``M x N``), with ``edge_val`` permuted."""
        def build():
            rowptr_t, col_t, perm = self.transpose_parts()
            vals = csr_fmt.permute_edges(self.edge_val, perm) if self.edge_val is not None else None
            previous = self._cache.peek("t")
            if previous is not None:             # values updated in place: same structure, its plans kept
                return previous.with_values(vals)
            g = Graph(rowptr_t, col_t, vals, self.num_src, num_src=self.num_nodes, transient=self.transient,
                      ptr=self.ptr)             # a block-diagonal batch transposes block by block
            stats = self._cache.get("batch_stats")
            if stats is not None:                # same blocks, same sizes, same E / N: no second sync
                g._cache.put("batch_stats", stats, owner=True)
            return g
        return self._cache.get("t", None, build, values=self.edge_val)

    def set_batch_stats(self, max_nodes: int) -> None:
        """Declare this batch block-diagonal (every edge inside its graph of ``ptr``) with at
        most ``max_nodes`` nodes per graph, as a loader that built it knows on the host:
        ``batch_stats`` then skips its check and the host sync it costs.  Trusted, not checked."""
        self._cache.put("batch_stats", (int(max_nodes), self.num_edges / max(self.num_nodes, 1), True), owner=True)

    def batch_stats(self) -> Optional[Tuple[int, float, bool]]:
        """``(largest graph's nodes, mean degree, every edge inside its graph)`` of a batch
        (``ptr`` set; None otherwise), computed once (one host sync) and cached.

        Shapes:
            ptr: [B + 1] -> three Python scalars.
        """
        if self.ptr is None:
            return None

        def build():
            sizes = self.ptr[1:] - self.ptr[:-1]
            if sizes.numel() == 0 or int(self.ptr[-1]) != self.num_nodes or self.num_src != self.num_nodes:
                return (int(sizes.max()) if sizes.numel() else 0, 0.0, False)
            graph_of_row = torch.repeat_interleave(torch.arange(sizes.numel(), device=sizes.device), sizes)
            graph_of_edge = graph_of_row[self.row] if self.num_edges else graph_of_row[:0]
            inside = ((self.col >= self.ptr[graph_of_edge]) & (self.col < self.ptr[graph_of_edge + 1])).all()
            return (int(sizes.max()), self.num_edges / max(self.num_nodes, 1), bool(inside))
        return self._cached("batch_stats", build)

    def row_plan(self, chunk: int) -> RowPlan:
        """Degree-aware work partition of the CSR rows at ``chunk`` edges (cached per chunk)."""
        return self._cached("row_plan", lambda: build_row_plan(self.rowptr, self.col, chunk), chunk)

    def batch_vector(self) -> Tensor:
        """Graph id of every node, ``[N]`` int64 (all zeros when not batched)."""
        if self.ptr is None:
            return torch.zeros(self.num_nodes, dtype=torch.int64, device=self.device)
        return csr_fmt.rowptr_to_row(self.ptr.to(self.device), self.num_nodes)

    # ------------------------------------------------------------------ edge order
    def to_graph_order(self, values: Tensor) -> Tensor:
        """Permute a per-edge tensor from the caller's ``edge_index`` order into CSR order."""
        check(self.edge_perm is not None, "Graph.to_graph_order", "this graph has no input edge order (built from CSR or transformed)")
        check(values.shape[0] == self.num_edges, "Graph.to_graph_order", f"values has {values.shape[0]} entries, graph has {self.num_edges} edges")
        return values.index_select(0, self.edge_perm)

    def to_input_order(self, values: Tensor) -> Tensor:
        """Permute a per-edge tensor from CSR order back into the caller's ``edge_index`` order."""
        check(self.edge_perm is not None, "Graph.to_input_order", "this graph has no input edge order (built from CSR or transformed)")
        check(values.shape[0] == self.num_edges, "Graph.to_input_order", f"values has {values.shape[0]} entries, graph has {self.num_edges} edges")
        inverse = self._cached("inverse_edge_perm", lambda: torch.argsort(self.edge_perm))
        return values.index_select(0, inverse)

    def inv_degree(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """Per-row ``1 / max(deg, 1)``, ``[N]`` (cached per dtype): a mean's scale, once per row."""
        return self._cached("inv_degree", lambda: self.in_degree().to(dtype).clamp(min=1.0).reciprocal(), dtype)

    def mean_scale(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """Per-edge ``1 / deg(row[e])`` (cached per dtype): turns a sum aggregation into a mean."""
        return self._cached("mean_scale", lambda: self.inv_degree(dtype)[self.row], dtype)

    # ------------------------------------------------------------------ conversions
    def edge_index(self) -> Tensor:
        """``[2, E]`` edge_index (source, target) in CSR order."""
        return torch.stack([self.col, self.row])

    def to_torch_sparse_csr(self, dtype: Optional[torch.dtype] = None) -> Tensor:
        """``torch.sparse_csr`` tensor ``A`` with ``A[i, j]`` = value of edge ``j -> i`` (1 without values)."""
        values = self.edge_val
        if values is None:
            values = torch.ones(self.num_edges, dtype=dtype or torch.float32, device=self.device)
        elif dtype is not None:
            values = values.to(dtype)
        return torch.sparse_csr_tensor(self.rowptr, self.col, values, (self.num_nodes, self.num_src))

    def to_dense(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """Dense ``[N, M]`` adjacency (duplicates summed). For tests and tiny graphs."""
        dense = torch.zeros(self.num_nodes, self.num_src, dtype=dtype, device=self.device)
        values = self.edge_val.to(dtype) if self.edge_val is not None else torch.ones(self.num_edges, dtype=dtype, device=self.device)
        return dense.index_put_((self.row, self.col), values, accumulate=True)

    def to(self, device, non_blocking: bool = False) -> "Graph":
        """Copy to ``device`` (caches are rebuilt there on demand).  Takes PyG's ``non_blocking``
        too, so a PyG ``Data`` holding a Graph (a sampled batch's ``graph``) moves it in ``.to()``."""
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Graph(move(self.rowptr), move(self.col), move(self.edge_val), self.num_nodes,
                     edge_perm=move(self.edge_perm), ptr=move(self.ptr), num_src=self.num_src, transient=self.transient,
                     volatile=self.volatile)

    def with_values(self, edge_val: Optional[Tensor]) -> "Graph":
        """Same structure (sharing caches of the structure) with other edge values."""
        if edge_val is not None:
            check_edge_values(edge_val, self.num_edges, "Graph.with_values", "edge_val", max_dim=1)
            check(edge_val.device == self.rowptr.device, "Graph.with_values",
                  f"edge_val must be on the graph's device ({self.rowptr.device}), got {edge_val.device}")
        g = Graph(self.rowptr, self.col, edge_val, self.num_nodes, edge_perm=self.edge_perm, ptr=self.ptr,
                  num_src=self.num_src, transient=self.transient, volatile=self.volatile)
        g._cache = self._cache.structure_only(g.volatile)   # without what depends on the values
        return g

    # ------------------------------------------------------------------ transformations
    def add_self_loops(self, fill_value: float = 1.0) -> "Graph":
        """Every node gets exactly one self loop (existing ones merged, keeping their summed value;
        PyG's ``add_remaining_self_loops`` keeps the last one's instead: ``nn.GCNConv`` follows PyG).

        Bipartite graphs: nodes ``i < min(N, M)`` get the loop ``i -> i`` (PyG's convention).
        """
        rowptr, col, vals = csr_fmt.add_self_loops_csr(self.rowptr, self.col, self.edge_val, fill_value,
                                                       num_loops=min(self.num_nodes, self.num_src),
                                                       num_cols=self.num_src)
        return Graph(rowptr, col, vals, self.num_nodes, ptr=self.ptr, num_src=self.num_src, transient=self.transient)

    def remove_self_loops(self) -> "Graph":
        """Drop every edge ``i -> i``."""
        keep = self.row != self.col
        counts = torch.bincount(self.row[keep], minlength=self.num_nodes)
        rowptr = counts.new_zeros(self.num_nodes + 1)
        torch.cumsum(counts, 0, out=rowptr[1:])
        vals = self.edge_val[keep] if self.edge_val is not None else None
        return Graph(rowptr, self.col[keep], vals, self.num_nodes, ptr=self.ptr, num_src=self.num_src,
                     transient=self.transient)

    def remove_duplicates(self, reduce: str = "sum") -> "Graph":
        """Merge repeated edges; values combined by ``reduce`` in {"sum", "mean", "max", "min"}."""
        check(reduce in ("sum", "mean", "max", "min"), "Graph.remove_duplicates", f"reduce must be sum, mean, max or min, got {reduce!r}")
        # Columns within a row must be sorted for grouping; from_csr may hold unsorted rows.
        target, source = self.row, self.col
        rowptr, col, perm = csr_fmt.coo_to_csr(target, source, self.num_nodes, num_cols=self.num_src)
        vals = self.edge_val[perm] if self.edge_val is not None else None
        rowptr, col, vals = csr_fmt.merge_duplicates(rowptr, col, vals, reduce)
        return Graph(rowptr, col, vals, self.num_nodes, ptr=self.ptr, num_src=self.num_src, transient=self.transient)

    def reorder(self, method: str = "rcm"):
        """Renumber the nodes for locality: ``(graph, perm)``, new node ``i`` = old node ``perm[i]``.

        ``method``: ``"rcm"`` (reverse Cuthill-McKee, scipy), ``"degree"`` or ``"lpa"``
        (label-propagation communities on the device); see ``formats.reorder``.  Edge values
        follow their edges; ``edge_perm`` still maps to the caller's original edge order.
        Node tensors follow with ``t[perm]``, results go back with ``out[inverse]``
        (``inverse[perm] = arange(N)``).

        Shapes:
            -> (Graph with the same N and E, perm [N] int64).
        """
        from .formats import reorder as reorder_fmt

        check(not self.is_bipartite, "Graph.reorder", "needs a square graph (one node set to renumber)")
        check(self.ptr is None, "Graph.reorder", "a batch of graphs keeps its graphs' node ranges; reorder each graph")
        perm = reorder_fmt.order(self.rowptr, self.col, method)
        rowptr, col, edge_perm = reorder_fmt.permute_csr(self.rowptr, self.col, perm)
        vals = self.edge_val[edge_perm] if self.edge_val is not None else None
        input_perm = self.edge_perm[edge_perm] if self.edge_perm is not None else None
        return Graph(rowptr, col, vals, self.num_nodes, edge_perm=input_perm, transient=self.transient), perm

    def normalize(self, mode: str = "sym") -> "Graph":
        """Normalised edge values: ``"sym"`` = D^-1/2 A D^-1/2, ``"row"`` = D^-1 A (D = weighted in-degree).

        ``graph.add_self_loops().normalize("sym")`` is GCN's ``D^-1/2 (A + I) D^-1/2``.
        """
        check(mode in ("sym", "row"), "Graph.normalize", f"mode must be 'sym' or 'row', got {mode!r}")
        check(mode == "row" or not self.is_bipartite, "Graph.normalize",
              f"mode='sym' needs a square graph (one degree per node), got {self.num_nodes} targets and "
              f"{self.num_src} sources; use mode='row'")
        vals = csr_fmt.normalize_values(self.rowptr, self.col, self.edge_val, mode, torch.float32)
        return self.with_values(vals)


def attach_graph(edge_index: Tensor, graph: Graph) -> None:
    """Record ``graph`` as the Graph of ``edge_index``, whose edge order is ``graph``'s CSR order
    (a sampled batch: ``batch.edge_index`` and ``batch.graph``).  Layers given this very tensor
    (unchanged since: its version is checked) then use ``graph`` instead of sorting it again.

    Shapes:
        edge_index: [2, E] in ``graph``'s CSR order.
    """
    edge_index._sparsegnn_graph = (graph, edge_index._version)


def attached_graph(edge_index: Tensor, num_nodes: int, num_src: int) -> Optional[Graph]:
    """The Graph :func:`attach_graph` recorded for ``edge_index`` if the tensor is unchanged and the
    sizes match, else None."""
    entry = getattr(edge_index, "_sparsegnn_graph", None)
    if entry is None or entry[1] != edge_index._version:
        return None
    graph = entry[0]
    return graph if graph.num_nodes == num_nodes and graph.num_src == num_src else None


def as_graph(obj, fn: str, num_nodes: Optional[int] = None, per_edge: bool = False):
    """Coerce ``obj`` (Graph, ``edge_index`` [2, E], or torch sparse tensor) into a Graph.

    ``per_edge``: the caller passes or returns per-edge tensors.  Those follow a sparse
    tensor's own entry order, which is the Graph's for CSR and coalesced COO tensors; an
    uncoalesced COO tensor (its duplicates summed into one edge, torch's meaning of the matrix)
    is refused then rather than misaligned.

    Returns:
        ``(graph, input_order)``: ``input_order`` is True when per-edge tensors are in the
        caller's ``edge_index`` order and must be permuted in and out.
    """
    if isinstance(obj, Graph):
        check(num_nodes is None or num_nodes == obj.num_nodes, fn, f"num_nodes={num_nodes} but the Graph has {obj.num_nodes}")
        return obj, False
    if isinstance(obj, Tensor) and obj.layout in (torch.sparse_coo, torch.sparse_csr):
        check(not per_edge or obj.layout == torch.sparse_csr or obj.is_coalesced(), fn,
              "the sparse COO tensor is not coalesced, so its entries do not match the graph's edges "
              "(duplicates are summed into one edge); per-edge values follow the order of adj.coalesce(): "
              "coalesce it first")
        return Graph.from_torch_sparse(obj), False
    if isinstance(obj, Tensor):
        check(obj.dim() == 2 and obj.shape[0] == 2, fn, f"edge_index must have shape [2, E], got {tuple(obj.shape)}")
        check(obj.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8), fn,
              f"edge_index must have an integer dtype, got {obj.dtype}")
        return Graph.from_edge_index(obj, None, num_nodes), True   # checks the indices against num_nodes
    raise ValueError(f"{fn}(): graph must be a Graph, an edge_index tensor or a torch sparse tensor, got {type(obj).__name__}")

