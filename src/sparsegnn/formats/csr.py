"""Destination-major CSR: pure tensor transformations, no kernels, no Graph.

A graph with ``N`` nodes and ``E`` edges ``j -> i`` is stored by target node:
``rowptr[i]:rowptr[i+1]`` are the positions of node ``i``'s incoming edges, ``col[e]``
is the source node of edge ``e``.  This is PyG's ``adj_t`` layout, so
``out = A @ x`` aggregates messages from sources into targets.

All index tensors are ``torch.int64``, but for the edge permutation of a graph built at scale
(``coo_to_csr(..., lean=True)``: ``int32``).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ._host import small_on_gpu


#: Edges from which ``coo_to_csr(..., lean=True)`` sorts in target ranges (``_coo_to_csr_in_ranges``).
LEAN_MIN_EDGES = 1 << 25
#: Edges per target range of the ranged sort: its temporaries (~70 bytes an edge) stay ~0.3 GB.
LEAN_RANGE_EDGES = 1 << 22
#: Edges up to which a CPU build runs in NumPy (``_coo_to_csr_numpy``).  Above it torch's
#: parallel sort wins (65k random keys: 0.67 ms against NumPy's merge sort's 5.5 ms).
NUMPY_SORT_MAX_EDGES = 1 << 15


def coo_to_csr(target: Tensor, source: Tensor, num_nodes: int,
               num_cols: Optional[int] = None, lean: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Sort edges by (target, source), stably, and build CSR.

    Args:
        target: target node of each edge.
        source: source node of each edge.
        num_nodes: number of target nodes ``N`` (rows of the CSR).
        num_cols: number of source nodes ``M`` (columns; default ``N``: a square graph).
        lean: from ``LEAN_MIN_EDGES`` edges, sort in ranges of targets of about
            ``LEAN_RANGE_EDGES`` edges each, and return ``perm`` as int32: the peak memory
            beyond the inputs is ~12 bytes an edge (the result) plus ~0.3 GB (H200, 134M
            edges: 0.92x the bytes of an int64 ``edge_index``), where one sort of every edge
            holds ~6 int64 arrays of ``E`` (3.0x).  The same result otherwise.  It reads sizes
            back to the host, so it is not taken inside a CUDA-graph capture or under a
            synchronisation debug mode.

    Returns:
        ``(rowptr, col, perm)`` where ``perm[k]`` is the position in the input of
        CSR edge ``k`` (so CSR edge values are ``values[perm]``).

    Shapes:
        target, source: [E]; rowptr: [N + 1]; col, perm: [E].
    """
    span = max(num_nodes if num_cols is None else num_cols, 1)
    if (lean and LEAN_MIN_EDGES <= target.numel() < (1 << 31)
            and not (target.is_cuda and (torch.cuda.is_current_stream_capturing()
                                         or torch.cuda.get_sync_debug_mode() != 0))):
        return _coo_to_csr_in_ranges(target, source, num_nodes, span)
    if target.device.type == "cpu" and 0 < target.numel() <= NUMPY_SORT_MAX_EDGES:
        built = _coo_to_csr_numpy(target, source, num_nodes, span)
        if built is not None:
            return built
    # 32-bit keys where they fit: the radix sort then makes half the passes
    key_dtype = torch.int32 if max(num_nodes, 1) * span < (1 << 31) else torch.int64
    key = target.to(key_dtype) * span + source.to(key_dtype)
    perm = torch.argsort(key, stable=True)
    del key
    col = source[perm].to(torch.int64)
    # row offsets by binary search in the sorted targets: no read-back of a count or maximum
    # (``bincount`` on a GPU reads its largest index back to the host)
    targets = target[perm]
    if targets.dtype not in (torch.int32, torch.int64):     # int8 / uint8 / int16 ids: offsets may exceed them
        targets = targets.to(torch.int64)
    rowptr = torch.searchsorted(targets, torch.arange(num_nodes + 1, dtype=targets.dtype, device=target.device))
    return rowptr, col, perm


def _coo_to_csr_numpy(target: Tensor, source: Tensor, num_nodes: int, span: int
                      ) -> Optional[Tuple[Tensor, Tensor, Tensor]]:
    """``coo_to_csr`` of a small graph on the host in NumPy (``NUMPY_SORT_MAX_EDGES``): the same
    stable sort by ``(target, source)``, and the row offsets from the row counts.  The sort: keys
    nearly in order already (at most one descent in 64: a PyG PROTEINS batch of 18.8k edges)
    take NumPy's merge sort, which takes the runs as they come (15 us; torch's argsort 198 us);
    any other order, with ids below 2^16, two passes of its radix sort (10.6k random edges:
    123 us against 601 merging, 576 in torch).  torch's CPU gathers and searchsorted also
    cost more per call at this size.  None for a target outside ``[0, num_nodes)`` (the
    general path)."""
    import numpy as np

    t, s = target.numpy(), source.numpy()
    if t.min() < 0 or t.max() >= num_nodes:
        return None
    key_dtype = np.int32 if max(num_nodes, 1) * span < (1 << 31) else np.int64
    key = t.astype(key_dtype) * key_dtype(span) + s.astype(key_dtype)
    if span <= (1 << 16) and num_nodes <= (1 << 16) and np.count_nonzero(key[1:] < key[:-1]) * 64 > key.size:
        # two stable passes of NumPy's radix sort (16-bit keys): by source, then by target
        perm = s.astype(np.uint16).argsort(kind="stable")
        perm = perm[t[perm].astype(np.uint16).argsort(kind="stable")]
    else:   # nearly in order already (or wide ids): the merge sort takes the runs as they come
        perm = key.argsort(kind="stable")
    rowptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(t, minlength=num_nodes), out=rowptr[1:])
    return (torch.from_numpy(rowptr), torch.from_numpy(s[perm].astype(np.int64)),
            torch.from_numpy(perm.astype(np.int64, copy=False)))


def _coo_to_csr_in_ranges(target: Tensor, source: Tensor, num_nodes: int, span: int
                          ) -> Tuple[Tensor, Tensor, Tensor]:
    """``coo_to_csr`` one range of targets at a time (``lean``): the row counts give ``rowptr``
    and ranges of about ``LEAN_RANGE_EDGES`` edges; each range's edges (found by a mask, in
    input order) are sorted stably by (target, source) into their slice of ``col`` and
    ``perm`` (int32).  Stable within a range and ranges in target order: the same CSR as one
    sort of every edge."""
    device, num_edges = target.device, target.numel()
    counts = torch.bincount(target, minlength=num_nodes)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=rowptr[1:])
    del counts
    ranges = -(-num_edges // LEAN_RANGE_EDGES)
    marks = torch.linspace(0, num_edges, ranges + 1, device=device).round().to(torch.int64)
    bounds = torch.searchsorted(rowptr, marks).clamp_(max=num_nodes)
    bounds[0], bounds[-1] = 0, num_nodes
    bounds = torch.unique_consecutive(bounds)
    starts = rowptr[bounds].tolist()
    bounds = bounds.tolist()                                   # one read-back for every range
    col = torch.empty(num_edges, dtype=torch.int64, device=device)
    perm = torch.empty(num_edges, dtype=torch.int32, device=device)
    for lo, hi, start, end in zip(bounds[:-1], bounds[1:], starts[:-1], starts[1:]):
        if end == start:
            continue
        inside = target >= lo
        inside &= target < hi
        index = inside.nonzero().squeeze(1)                    # input order
        del inside
        key = (target[index].to(torch.int64) - lo) * span + source[index]
        index = index[torch.argsort(key, stable=True)]
        del key
        col[start:end] = source[index]
        perm[start:end] = index
    return rowptr, col, perm


def rowptr_to_row(rowptr: Tensor, num_edges: Optional[int] = None) -> Tensor:
    """Expand ``rowptr`` into the target node of every edge.

    Shapes:
        rowptr: [N + 1] -> row: [E].
    """
    num_rows = rowptr.numel() - 1
    counts = rowptr[1:] - rowptr[:-1]
    return torch.repeat_interleave(
        torch.arange(num_rows, device=rowptr.device), counts, output_size=num_edges
    )


def degrees(rowptr: Tensor) -> Tensor:
    """Number of stored edges per row (in-degree, duplicates counted). Shapes: [N + 1] -> [N]."""
    return rowptr[1:] - rowptr[:-1]


def transpose_csr(rowptr: Tensor, col: Tensor, num_cols: int) -> Tuple[Tensor, Tensor, Tensor]:
    """CSR of ``A^T`` (i.e. CSC of ``A``), with the permutation into ``A``'s edge order.

    Args:
        num_cols: columns of ``A`` (its source nodes ``M``), the rows of ``A^T``.

    Returns:
        ``(rowptr_t, col_t, perm)``: edge ``k`` of the transpose is edge ``perm[k]`` of ``A``,
        ``col_t[k]`` is its target in ``A``.  Within a row of the transpose, edges keep
        ``A``'s order (the sort is stable), so results are deterministic.

    Shapes:
        rowptr: [N + 1]; col: [E] -> rowptr_t: [M + 1], col_t: [E], perm: [E].
    """
    if small_on_gpu(col, col.numel(), "transpose", max(rowptr.numel() - 1, num_cols)):   # formats/_host.py
        return tuple(t.to(col.device) for t in transpose_csr(rowptr.cpu(), col.cpu(), num_cols))
    row = rowptr_to_row(rowptr, col.numel())
    return coo_to_csr(col, row, num_cols, num_cols=rowptr.numel() - 1)


def permute_edges(values: Tensor, perm: Tensor) -> Tensor:
    """``values[perm]`` along the edge dimension (0), on the host for a small graph while the
    device's kernels are cold (``formats/_host.py``: the first ``index_select`` of a process
    loads its module, ~15 ms; the host permutes 10k edges in microseconds).  Differentiable.

    Shapes:
        values: [E, ...]; perm: [E'] -> [E', ...].
    """
    if small_on_gpu(perm, perm.numel(), "permute", values.shape[0]):
        return values.cpu().index_select(0, perm.cpu()).to(values.device)
    return values.index_select(0, perm)


def duplicate_groups(rowptr: Tensor, col: Tensor) -> Tuple[Tensor, Tensor]:
    """Group identical ``(row, col)`` pairs of a sorted CSR.

    Returns:
        ``(group, is_first)``: ``group[e]`` is the index of the unique edge that edge ``e``
        merges into, ``is_first[e]`` marks the first edge of each group.

    Shapes:
        rowptr: [N + 1], col: [E] -> group: [E], is_first: [E] (bool).
    """
    row = rowptr_to_row(rowptr, col.numel())
    is_first = torch.ones_like(col, dtype=torch.bool)
    if col.numel() > 1:
        is_first[1:] = (row[1:] != row[:-1]) | (col[1:] != col[:-1])
    group = torch.cumsum(is_first.to(torch.int64), 0) - 1
    return group, is_first


def merge_duplicates(
    rowptr: Tensor, col: Tensor, edge_val: Optional[Tensor], reduce: str = "sum"
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Merge repeated ``(row, col)`` pairs, combining their values with ``reduce``.

    ``reduce`` is one of ``"sum"``, ``"mean"``, ``"max"``, ``"min"``.  Without values,
    duplicates are simply dropped.

    Shapes:
        rowptr: [N + 1], col: [E], edge_val: [E] or None -> rowptr', col', edge_val': [E'].
    """
    num_nodes = rowptr.numel() - 1
    group, is_first = duplicate_groups(rowptr, col)
    row = rowptr_to_row(rowptr, col.numel())
    new_col = col[is_first]
    new_row = row[is_first]
    counts = torch.bincount(new_row, minlength=num_nodes)
    new_rowptr = counts.new_zeros(num_nodes + 1)
    torch.cumsum(counts, 0, out=new_rowptr[1:])
    new_val = None
    if edge_val is not None:
        num_unique = new_col.numel()
        torch_reduce = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}[reduce]
        new_val = edge_val.new_zeros((num_unique,) + tuple(edge_val.shape[1:]))
        index = group.view((-1,) + (1,) * (edge_val.dim() - 1)).expand_as(edge_val)
        new_val = new_val.scatter_reduce(0, index, edge_val, torch_reduce, include_self=False)
    return new_rowptr, new_col, new_val


def replace_self_loops(rowptr: Tensor, col: Tensor, row: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """A square CSR with every self loop removed and one added per node, at the end of its row,
    without a sort and with one read-back (the number of loops removed sizes the result).

    Returns:
        ``(rowptr', col', source)``: ``source[k]`` is the input edge that output edge ``k`` is
        (``< E``), or ``E + i`` for the loop added to node ``i``; so per-edge values follow with
        ``cat([values, loop_values])[source]``.  Kept edges keep their order within a row.

    Shapes:
        rowptr: [N + 1], col, row: [E] (``row`` = target of every edge) -> [N + 1], [E'], [E'].
    """
    num_nodes, num_edges, device = rowptr.numel() - 1, col.numel(), col.device
    is_loop = row == col
    loops_before = torch.zeros(num_edges + 1, dtype=torch.int64, device=device)   # loops among edges < e
    torch.cumsum(is_loop, 0, out=loops_before[1:])
    removed = loops_before[rowptr[1:]] - loops_before[rowptr[:-1]]                  # loops per row
    new_rowptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(rowptr[1:] - rowptr[:-1] - removed + 1, 0, out=new_rowptr[1:])
    total = num_edges - int(loops_before[-1]) + num_nodes
    edge = torch.arange(num_edges, device=device)
    rank = edge - rowptr[row] - (loops_before[:-1] - loops_before[rowptr[row]])  # among the row's kept edges
    # every slot written once: kept edges to their place, removed loops past the end (dropped)
    target = torch.where(is_loop, total + loops_before[:-1], new_rowptr[row] + rank)
    nodes = torch.arange(num_nodes, device=device)
    source = torch.empty(num_edges + num_nodes, dtype=torch.int64, device=device)
    source[torch.cat([target, new_rowptr[1:] - 1])] = torch.cat([edge, num_edges + nodes])
    source = source[:total]
    new_col = torch.cat([col.to(torch.int64), nodes])[source]
    return new_rowptr, new_col, source


def add_self_loops_csr(
    rowptr: Tensor, col: Tensor, edge_val: Optional[Tensor], fill_value: float = 1.0,
    num_loops: Optional[int] = None, num_cols: Optional[int] = None,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Give nodes ``0 .. num_loops - 1`` exactly one self loop each (PyG's ``add_remaining_self_loops``).

    Existing self loops of those nodes are merged into one; with values, a node's existing self
    loops keep the sum of their values, and new ones get ``fill_value``.  ``num_loops``
    defaults to every row; a rectangular (bipartite) graph of ``num_cols`` source nodes passes
    ``min(N, M)``, PyG's convention.  Self loops of other rows are left as they are.

    Shapes:
        rowptr: [N + 1], col: [E], edge_val: [E] or None -> rowptr', col', edge_val'.
    """
    num_nodes = rowptr.numel() - 1
    num_loops = num_nodes if num_loops is None else int(num_loops)
    device = rowptr.device
    row = rowptr_to_row(rowptr, col.numel())
    is_loop = (row == col) & (row < num_loops)
    keep = ~is_loop
    loop_nodes = torch.arange(num_loops, device=device)
    new_target = torch.cat([row[keep], loop_nodes])
    new_source = torch.cat([col[keep], loop_nodes])
    new_val = None
    if edge_val is not None:
        loop_val = edge_val.new_full((num_loops,), float(fill_value))
        has_loop = torch.zeros(num_loops, dtype=torch.bool, device=device)
        has_loop[row[is_loop]] = True
        summed = edge_val.new_zeros(num_loops).index_add_(0, row[is_loop], edge_val[is_loop])
        loop_val = torch.where(has_loop, summed, loop_val)
        new_val = torch.cat([edge_val[keep], loop_val])
    new_rowptr, new_col, perm = coo_to_csr(new_target, new_source, num_nodes, num_cols=num_cols)
    if new_val is not None:
        new_val = new_val[perm]
    return new_rowptr, new_col, new_val


def normalize_values(
    rowptr: Tensor, col: Tensor, edge_val: Optional[Tensor], mode: str, dtype: torch.dtype
) -> Tensor:
    """Normalised edge values of a CSR graph.

    With ``d_i = sum_{e in row i} w_e`` (weighted in-degree):

    - ``"sym"``: ``w'_e = d_i^{-1/2} w_e d_j^{-1/2}`` (GCN; with self loops this is
      ``D^{-1/2} (A + I) D^{-1/2}``),
    - ``"row"``: ``w'_e = w_e / d_i`` (mean aggregation).

    Zero degrees give zero weights instead of infinities.

    Shapes:
        rowptr: [N + 1], col: [E], edge_val: [E] or None -> [E].
    """
    num_nodes = rowptr.numel() - 1
    weight = edge_val if edge_val is not None else torch.ones(col.numel(), dtype=dtype, device=col.device)
    row = rowptr_to_row(rowptr, col.numel())
    deg = weight.new_zeros(num_nodes).index_add_(0, row, weight)
    if mode == "sym":
        inv_sqrt = deg.pow(-0.5)
        inv_sqrt = torch.where(torch.isinf(inv_sqrt), torch.zeros_like(inv_sqrt), inv_sqrt)
        return inv_sqrt[row] * weight * inv_sqrt[col]
    if mode == "row":
        inv = deg.reciprocal()
        inv = torch.where(torch.isinf(inv), torch.zeros_like(inv), inv)
        return weight * inv[row]
    raise ValueError(f"normalize(): mode must be 'sym' or 'row', got {mode!r}")
