"""Node partitions of one graph for full-graph training on ``P`` ranks.

Each node is *owned* by one rank; a rank computes the rows of the nodes it owns and keeps every
edge whose *target* it owns.  The sources of those edges that other ranks own are its *halo*:
per layer it receives their rows from their owners, and sends its own rows to the ranks whose
halos list them.  With ``A`` the global destination-major adjacency, rank ``r``'s local graph is
the block of rows ``A[nodes_r, :]`` restricted to its non-zero columns, renumbered

    ``A_r = A[nodes_r, cat(nodes_r, halo_r)]``   (``n_r x (n_r + h_r)``)

so that ``(A x)[nodes_r] = A_r @ cat(x[nodes_r], x[halo_r])``: the halo exchange fills the last
``h_r`` rows.  ``A_r = [A_inner | A_halo]`` splits at column ``n_r``; ``A_inner x[nodes_r]`` needs
no communication and can run while the exchange is in flight.

Partitioners (``partition_nodes``):

- ``metis``: ``pymetis`` k-way on the symmetrised graph without self loops (edge weight =
  number of directed edges between the two nodes, so the cut it minimises is the number of
  edges crossing ranks), vertex weight ``in-degree + 1`` (balancing the SpMM work of a rank).
- ``contiguous``: node ids cut into ``P`` ranges of about equal ``sum(in-degree + 1)``: no
  host round trip, good when the numbering already has locality (``Graph.reorder``).

Storage (``save_parts`` / ``load_part``): one ``part_{rank}.pt`` per rank (``torch.save`` of a
dict of plain tensors, ints and strings: loadable with ``weights_only=True``) with that rank's
rows of the node-level tensors, plus ``meta.json``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .._checks import check, check_index, check_tensor
from ..formats.csr import coo_to_csr, degrees, rowptr_to_row
from ..formats.reorder import metis_parts
from ..graph import Graph

__all__ = ["METHODS", "Part", "partition_nodes", "build_parts", "partition_graph", "save_parts", "load_part",
           "partition_stats"]

METHODS = ("auto", "metis", "contiguous")
#: Version of the ``part_{rank}.pt`` / ``meta.json`` layout.
FORMAT_VERSION = 1


def _offsets(counts: Tensor) -> Tensor:
    """Exclusive prefix sum with the total appended. Shapes: [K] -> [K + 1] int64."""
    out = counts.new_zeros(counts.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=out[1:])
    return out


def _column_range(graph: Graph, lo: int, hi: int) -> Graph:
    """The edges of ``graph`` with ``lo <= col < hi``, columns shifted by ``-lo`` (``N x (hi - lo)``)."""
    keep = (graph.col >= lo) & (graph.col < hi)
    rowptr = _offsets(torch.bincount(graph.row[keep], minlength=graph.num_nodes))
    vals = graph.edge_val[keep] if graph.edge_val is not None else None
    return Graph(rowptr, graph.col[keep] - lo, vals, graph.num_nodes, num_src=hi - lo)


@dataclass
class Part:
    """One rank's share of a graph partitioned into P parts.

    With ``n`` owned nodes and ``h`` halo nodes, ``graph`` is ``A[nodes, cat(nodes, halo)]``:
    ``spmm(graph, cat(x[nodes], x[halo])) = spmm(A, x)[nodes]``.

    Shapes:
        nodes: [n] int64 global ids (ascending); halo: [h] int64 global ids, grouped by owner
        rank (ascending), ids ascending inside a group; halo_ptr: [P + 1]; send_idx: [s] int64
        local row indices (into ``nodes``) grouped by destination rank; send_ptr: [P + 1];
        graph: n x (n + h) with every edge whose target is owned (columns sorted inside a row:
        the ``num_inner_edges`` owned sources of a row come before its halo sources).

    ``send_idx[send_ptr[r]:send_ptr[r + 1]]`` are, in order, the rows rank ``r`` lists in
    ``halo[halo_ptr[rank]:halo_ptr[rank + 1]]`` of its own Part: an ``all_to_all_single`` of
    ``x_local[send_idx]`` with split sizes ``diff(send_ptr)`` / ``diff(halo_ptr)`` delivers
    ``x[halo]``.  ``method`` names the partitioner (``None`` when the owners were given).
    """

    rank: int
    num_parts: int
    nodes: Tensor
    halo: Tensor
    halo_ptr: Tensor
    send_idx: Tensor
    send_ptr: Tensor
    graph: Graph
    num_inner_edges: int
    method: Optional[str] = None
    _split: Dict[str, Graph] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_nodes(self) -> int:
        """``n``: the owned nodes (the local graph's rows)."""
        return int(self.nodes.numel())

    @property
    def num_halo(self) -> int:
        """``h``: the remote source nodes received per exchange."""
        return int(self.halo.numel())

    def inner_graph(self) -> Graph:
        """``A_inner``: the edges with an owned source (``col < n``), ``n x n`` (cached)."""
        if "inner" not in self._split:
            self._split["inner"] = _column_range(self.graph, 0, self.num_nodes)
        return self._split["inner"]

    def halo_graph(self) -> Graph:
        """``A_halo``: the edges with a halo source, columns shifted by ``-n``, ``n x h`` (cached).

        ``spmm(graph, cat(x_in, x_halo)) = spmm(inner_graph(), x_in) + spmm(halo_graph(), x_halo)``.
        """
        if "halo" not in self._split:
            self._split["halo"] = _column_range(self.graph, self.num_nodes, self.graph.num_src)
        return self._split["halo"]

    def to(self, device) -> "Part":
        """A copy on ``device`` (index tensors and graph)."""
        move = lambda t: t.to(device)  # noqa: E731
        return Part(self.rank, self.num_parts, move(self.nodes), move(self.halo), move(self.halo_ptr),
                    move(self.send_idx), move(self.send_ptr), self.graph.to(device), self.num_inner_edges,
                    self.method)


# ---------------------------------------------------------------- partitioners
def _check_graph(graph: Graph, fn: str) -> None:
    check(isinstance(graph, Graph), fn, f"graph must be a sparsegnn Graph, got {type(graph).__name__}")
    check(not graph.is_bipartite, fn,
          f"needs a square graph (one node set to split), got {graph.num_nodes} targets and {graph.num_src} sources")


def _resolve_method(method: str, fn: str) -> str:
    check(method in METHODS, fn, f"method must be one of {METHODS}, got {method!r}")
    if method == "auto":
        try:
            import pymetis  # noqa: F401
        except ImportError:
            return "contiguous"
        return "metis"
    return method


def node_weights(graph: Graph) -> Tensor:
    """Work of each node as a target: ``in-degree + 1`` (its edges plus its row). Shapes: -> [N] int64."""
    return degrees(graph.rowptr) + 1


def symmetric_adjacency(graph: Graph) -> Tuple[Tensor, Tensor, Tensor]:
    """The undirected simple graph under ``graph`` for METIS: ``i ~ j`` (``i != j``) when an edge
    joins them in either direction, weighted by the number of such directed edges
    (``w_ij = #(i -> j) + #(j -> i)``, duplicates counted; self loops dropped).

    Shapes:
        -> rowptr [N + 1], col [2U] (both directions, sorted inside a row), weight [2U] int64.
    """
    n = graph.num_nodes
    row, col = graph.row, graph.col
    keep = row != col
    a, b = torch.cat([row[keep], col[keep]]), torch.cat([col[keep], row[keep]])
    pairs, weight = torch.unique(a * max(n, 1) + b, return_counts=True)   # sorted by (a, b)
    rowptr, adj, _ = coo_to_csr(pairs // max(n, 1), pairs % max(n, 1), n)
    return rowptr, adj, weight


def _metis_owner(graph: Graph, num_parts: int, seed: int) -> Tensor:
    try:
        import numpy as np
        import pymetis
    except ImportError as exc:
        raise ValueError("partition_nodes(): method='metis' needs pymetis (pip install pymetis); "
                         "or use method='contiguous'") from exc
    if num_parts == 1:
        return torch.zeros(graph.num_nodes, dtype=torch.int64, device=graph.device)
    rowptr, adj, weight = symmetric_adjacency(graph)
    dtype = pymetis.zero_copy_dtype() if hasattr(pymetis, "zero_copy_dtype") else np.int64
    xadj, adjncy = rowptr.cpu().numpy().astype(dtype), adj.cpu().numpy().astype(dtype)
    kwargs = dict(vweights=node_weights(graph).cpu().numpy().astype(dtype),
                  eweights=weight.cpu().numpy().astype(dtype), options=pymetis.Options(seed=int(seed)))
    membership = metis_parts(num_parts, xadj, adjncy, **kwargs)
    return torch.as_tensor(np.asarray(membership, dtype=np.int64), device=graph.device)


def _contiguous_owner(graph: Graph, num_parts: int) -> Tensor:
    """Cut ``0..N-1`` at the prefix weights closest to ``r W / P`` (``W = sum(in-degree + 1)``),
    every range non-empty.  Integer arithmetic: ``prefix * P`` against ``r * W``."""
    n, p = graph.num_nodes, num_parts
    prefix = _offsets(node_weights(graph))               # [N + 1]: weight of nodes before i
    target = torch.arange(1, p, device=prefix.device) * prefix[-1]
    scaled = prefix * p
    hi = torch.searchsorted(scaled, target)             # first boundary with prefix >= r W / P
    lo = (hi - 1).clamp(min=0)
    cut = torch.where(target - scaled[lo] < scaled[hi] - target, lo, hi)
    starts = torch.cat([cut.new_zeros(1), cut])          # [P] first node of each range
    rank = torch.arange(p, device=starts.device)
    slack = torch.cummax((starts - rank).clamp(0, n - p), 0).values   # starts strictly increasing,
    bounds = torch.cat([slack + rank, starts.new_tensor([n])])        # each range >= 1 node
    return rowptr_to_row(bounds, n)


def partition_nodes(graph: Graph, num_parts: int, method: str = "auto", seed: int = 0) -> Tensor:
    """Owner rank of every node.

    - ``"metis"``: ``pymetis`` k-way partition minimising the number of edges whose endpoints
      have different owners (the symmetrised graph, edge weight = directed edges between the
      pair), with vertex weights ``in-degree + 1`` balanced to METIS's default 3%.  ``seed`` is
      METIS's seed.  METIS may leave a part empty on tiny or edgeless graphs.
    - ``"contiguous"``: ``owner`` non-decreasing in the node id, range ``r`` cut where the
      prefix of ``sum(in-degree + 1)`` is closest to ``r W / P``; every range has >= 1 node, so
      ``max part weight <= W / P + max(in-degree + 1)`` unless that forces empty ranges.
      Deterministic (``seed`` unused).
    - ``"auto"``: ``"metis"`` when ``pymetis`` imports, else ``"contiguous"``.

    Shapes:
        graph: square, N nodes -> [N] int64 in ``[0, num_parts)``, on the graph's device.
    """
    fn = "partition_nodes"
    _check_graph(graph, fn)
    check(isinstance(num_parts, int) and not isinstance(num_parts, bool), fn,
          f"num_parts must be an int, got {type(num_parts).__name__}")
    check(num_parts >= 1, fn, f"num_parts must be >= 1, got {num_parts}")
    check(num_parts <= graph.num_nodes, fn, f"num_parts={num_parts} exceeds the graph's {graph.num_nodes} nodes")
    method = _resolve_method(method, fn)
    if method == "metis":
        return _metis_owner(graph, num_parts, seed)
    return _contiguous_owner(graph, num_parts)


# ---------------------------------------------------------------- parts
def _check_owner(graph: Graph, owner: Tensor, num_parts: Optional[int], fn: str) -> int:
    _check_graph(graph, fn)
    check_tensor(owner, fn, "owner")
    check(owner.dim() == 1 and owner.numel() == graph.num_nodes, fn,
          f"owner must have shape [{graph.num_nodes}] (one rank per node), got {tuple(owner.shape)}")
    if num_parts is None:
        check(owner.numel() > 0, fn, "num_parts is needed for a graph without nodes")
        check_index(owner, fn, "owner")
        return int(owner.max()) + 1
    check(int(num_parts) >= 1, fn, f"num_parts must be >= 1, got {num_parts}")
    check_index(owner, fn, "owner", upper=int(num_parts))
    return int(num_parts)


def build_parts(graph: Graph, owner: Tensor, *, num_parts: Optional[int] = None) -> List[Part]:
    """All ``P`` Parts of ``graph`` given the owner rank of every node (``P = num_parts``,
    default ``owner.max() + 1``; ranks that own no node get empty Parts).

    Vectorised over nodes and edges; the loop runs over the ``P`` parts only.  Node ``g`` has
    position ``pos[g]`` in the order (owner, id); rank ``r``'s halo is the sorted set of
    ``r * N + pos[j]`` over its remote edges ``j -> i``, which orders it by owner, then id.

    Shapes:
        graph: square, N nodes, E edges; owner: [N] integer -> P Parts whose local graphs hold
        the E edges between them.
    """
    fn = "build_parts"
    p = _check_owner(graph, owner, num_parts, fn)
    n_all, device = graph.num_nodes, graph.device
    owner = owner.to(device=device, dtype=torch.int64)
    order = torch.argsort(owner, stable=True)                 # position -> global id
    pos = torch.empty_like(order)
    pos[order] = torch.arange(n_all, device=device)
    node_ptr = _offsets(torch.bincount(owner, minlength=p))
    local = pos - node_ptr[owner]                             # index of each node in its owner's `nodes`

    row, col = graph.row, graph.col
    edge_rank = owner[row]
    remote = owner[col] != edge_rank
    # halo entries: unique (receiver, source) of the remote edges, sorted by receiver, source owner, id
    span = max(n_all, 1)
    halo_key, halo_of_edge = torch.unique(edge_rank[remote] * span + pos[col[remote]], return_inverse=True)
    halo_rank, halo_src = halo_key // span, order[halo_key % span]
    halo_start = _offsets(torch.bincount(halo_rank, minlength=p))
    num_owned = node_ptr[1:] - node_ptr[:-1]
    local_col = local[col]
    remote_rank = edge_rank[remote]
    local_col[remote] = num_owned[remote_rank] + halo_of_edge - halo_start[remote_rank]

    # traffic[q, r]: rows q sends to r; send lists = halo entries sorted by (sender, receiver), stably
    halo_owner = owner[halo_src]
    pair = halo_owner * p + halo_rank
    traffic = torch.bincount(pair, minlength=p * p).view(p, p)
    send_local = local[halo_src[torch.argsort(pair, stable=True)]]
    send_start = _offsets(traffic.sum(1))

    # edges grouped by target owner; inside a group, global CSR order = local row order
    eperm = torch.argsort(edge_rank, stable=True)
    edge_start = _offsets(torch.bincount(edge_rank, minlength=p))
    sizes = torch.stack([node_ptr, halo_start, edge_start, send_start]).tolist()   # one host sync
    parts = []
    for r in range(p):
        n0, n1 = sizes[0][r], sizes[0][r + 1]
        e = eperm[sizes[2][r]:sizes[2][r + 1]]
        n, h = n1 - n0, sizes[1][r + 1] - sizes[1][r]
        rowptr, lcol, perm = coo_to_csr(local[row[e]], local_col[e], n, num_cols=n + h)
        vals = graph.edge_val[e[perm]] if graph.edge_val is not None else None
        parts.append(Part(
            rank=r, num_parts=p,
            nodes=order[n0:n1],
            halo=halo_src[sizes[1][r]:sizes[1][r + 1]],
            halo_ptr=_offsets(traffic[:, r]),
            send_idx=send_local[sizes[3][r]:sizes[3][r + 1]],
            send_ptr=_offsets(traffic[r]),
            graph=Graph(rowptr, lcol, vals, n, num_src=n + h),
            num_inner_edges=int((lcol < n).sum()),
        ))
    return parts


def partition_graph(graph: Graph, num_parts: int, method: str = "auto", seed: int = 0) -> List[Part]:
    """``build_parts(graph, partition_nodes(graph, num_parts, method, seed))``; each Part's
    ``method`` records the partitioner used (``"auto"`` resolved)."""
    owner = partition_nodes(graph, num_parts, method, seed)
    resolved = _resolve_method(method, "partition_graph")
    parts = build_parts(graph, owner, num_parts=num_parts)
    for part in parts:
        part.method = resolved
    return parts


def partition_stats(parts: List[Part]) -> dict:
    """Sizes and quality of a partition.

    ``cut_edges``: edges whose source is remote (``sum_r (E_r - inner_r)``), ``cut_fraction``
    = cut / E; ``halo_sizes[r] = h_r`` (rows received per exchange; ``halo_nodes`` their sum:
    ``halo_nodes * F * bytes`` per layer and direction), ``replication`` = ``(N + sum h) / N``;
    ``edge_imbalance = max_r E_r / mean_r E_r`` (1 = perfect), ``node_imbalance`` likewise.
    """
    check(len(parts) > 0, "partition_stats", "parts is empty")
    nodes = [p.num_nodes for p in parts]
    edges = [p.graph.num_edges for p in parts]
    inner = [p.num_inner_edges for p in parts]
    halo = [p.num_halo for p in parts]
    num_nodes, num_edges = sum(nodes), sum(edges)
    cut = num_edges - sum(inner)
    imbalance = lambda xs: max(xs) * len(xs) / sum(xs) if sum(xs) else 1.0  # noqa: E731
    return {
        "num_parts": len(parts),
        "num_nodes": num_nodes,
        "num_edges": num_edges,
        "cut_edges": cut,
        "cut_fraction": cut / num_edges if num_edges else 0.0,
        "halo_nodes": sum(halo),
        "replication": (num_nodes + sum(halo)) / num_nodes if num_nodes else 1.0,
        "edge_imbalance": imbalance(edges),
        "node_imbalance": imbalance(nodes),
        "nodes": nodes,
        "edges": edges,
        "inner_edges": inner,
        "halo_sizes": halo,
        "send_sizes": [int(p.send_idx.numel()) for p in parts],
    }


# ---------------------------------------------------------------- storage
def _part_file(directory: Path, rank: int) -> Path:
    return directory / f"part_{rank}.pt"


def save_parts(parts: List[Part], directory, tensors: Optional[Dict[str, Tensor]] = None) -> None:
    """Write ``part_{rank}.pt`` for every rank and ``meta.json`` into ``directory`` (created).

    A rank's file is a dict of plain CPU tensors, ints and strings (no pickled objects): its
    Part's index tensors, local CSR (``rowptr``, ``col``, ``edge_val``, ``num_src``) and
    ``tensors[name][part.nodes]`` for every node-level tensor given (features, labels, masks).
    ``meta.json``: format version, ``num_parts``, ``num_nodes``, ``num_edges``, ``method``,
    ``cut_edges``, imbalance, per-part sizes, tensor names / shapes / dtypes.

    Shapes:
        tensors: name -> [N, ...] (N = all nodes); rank r's file holds [n_r, ...].
    """
    fn = "save_parts"
    check(len(parts) > 0, fn, "parts is empty")
    num_parts = parts[0].num_parts
    check(len(parts) == num_parts and [p.rank for p in parts] == list(range(num_parts)), fn,
          f"need all {num_parts} parts in rank order, got ranks {[p.rank for p in parts]}")
    stats = partition_stats(parts)
    tensors = dict(tensors or {})
    for name, t in tensors.items():
        check_tensor(t, fn, f"tensors[{name!r}]")
        check(t.dim() >= 1 and t.shape[0] == stats["num_nodes"], fn,
              f"tensors[{name!r}] must have one row per node ({stats['num_nodes']}), got shape {tuple(t.shape)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cpu = lambda t: t.detach().cpu()  # noqa: E731
    for part in parts:
        g = part.graph
        torch.save({
            "format_version": FORMAT_VERSION, "rank": part.rank, "num_parts": part.num_parts,
            "method": part.method, "num_inner_edges": part.num_inner_edges,
            "nodes": cpu(part.nodes), "halo": cpu(part.halo), "halo_ptr": cpu(part.halo_ptr),
            "send_idx": cpu(part.send_idx), "send_ptr": cpu(part.send_ptr),
            "rowptr": cpu(g.rowptr), "col": cpu(g.col), "num_src": g.num_src,
            "edge_val": None if g.edge_val is None else cpu(g.edge_val),
            "tensors": {name: cpu(t[part.nodes.to(t.device)]) for name, t in tensors.items()},
        }, _part_file(directory, part.rank))
    meta = {
        "format_version": FORMAT_VERSION,
        "num_parts": num_parts,
        "num_nodes": stats["num_nodes"],
        "num_edges": stats["num_edges"],
        "method": parts[0].method,
        "cut_edges": stats["cut_edges"],
        "cut_fraction": stats["cut_fraction"],
        "edge_imbalance": stats["edge_imbalance"],
        "weighted": parts[0].graph.edge_val is not None,
        "parts": [{"rank": r, "nodes": stats["nodes"][r], "halo": stats["halo_sizes"][r], "edges": stats["edges"][r],
                   "inner_edges": stats["inner_edges"][r], "send": stats["send_sizes"][r]} for r in range(num_parts)],
        "tensors": {name: {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
                    for name, t in tensors.items()},
    }
    (directory / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def load_part(directory, rank: int) -> Tuple[Part, Dict[str, Tensor]]:
    """Rank ``rank``'s Part and node-level tensors as :func:`save_parts` wrote them (reads
    ``meta.json`` and ``part_{rank}.pt`` only), on the CPU (``Part.to`` moves it).

    Shapes:
        -> Part with n nodes, h halo nodes; tensors: name -> [n, ...].
    """
    fn = "load_part"
    directory = Path(directory)
    meta_path = directory / "meta.json"
    check(meta_path.is_file(), fn, f"{str(meta_path)!r} not found (write it with save_parts)")
    meta = json.loads(meta_path.read_text())
    check(meta.get("format_version") == FORMAT_VERSION, fn,
          f"{str(meta_path)!r} has format version {meta.get('format_version')!r}, expected {FORMAT_VERSION}")
    num_parts = int(meta["num_parts"])
    check(isinstance(rank, int) and 0 <= rank < num_parts, fn, f"rank must be in [0, {num_parts}), got {rank!r}")
    path = _part_file(directory, rank)
    check(path.is_file(), fn, f"{str(path)!r} not found")
    d = torch.load(path, map_location="cpu", weights_only=True)
    n = int(d["nodes"].numel())
    graph = Graph(d["rowptr"], d["col"], d["edge_val"], n, num_src=int(d["num_src"]))
    part = Part(rank=int(d["rank"]), num_parts=int(d["num_parts"]), nodes=d["nodes"], halo=d["halo"],
                halo_ptr=d["halo_ptr"], send_idx=d["send_idx"], send_ptr=d["send_ptr"], graph=graph,
                num_inner_edges=int(d["num_inner_edges"]), method=d["method"])
    return part, dict(d["tensors"])
