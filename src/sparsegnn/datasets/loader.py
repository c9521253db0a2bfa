"""Many small graphs as concatenated tensors, and a loader of block-diagonal mini-batches.

A :class:`GraphDataset` keeps every graph of a graph-classification set in one block-diagonal
CSR (the graphs one after another, node offsets ``node_ptr``), with node features, per-graph
labels and, once, everything a batch's :class:`~sparsegnn.Graph` needs: each edge's source and
target *local to its graph*, the degrees, and the transpose.  A batch of graphs ``idx`` is then
a handful of gathers (:func:`collate`): its CSR is the graphs' CSR ranges concatenated with
node offsets added, its transpose likewise, so building it sorts nothing and checks nothing.

:class:`GraphLoader` shuffles with a ``torch.Generator`` and yields :class:`GraphBatch` es.  Per
epoch it collates all graphs once, in the epoch's order, where the dataset lives; each batch is
then a slice of that, re-based with one subtraction per index tensor (about ten small ops per
batch, no host sync).  When the dataset is on the CPU and the target device is CUDA the epoch's
collation is pinned and the slices are copied asynchronously, from a background thread
(``prefetch`` batches ahead).

>>> data = GraphDataset.from_molecules(load_molecules("tox21.csv"))           # doctest: +SKIP
>>> for batch in GraphLoader(data, batch_size=50, shuffle=True, device="cuda"):  # doctest: +SKIP
...     logits = model(batch.x, batch.graph)          # batch.graph.ptr: the molecules' node ranges
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor

from .._checks import check
from ..formats.csr import rowptr_to_row
from ..graph import Graph

__all__ = ["GraphDataset", "GraphBatch", "GraphLoader", "collate"]


@dataclass
class GraphBatch:
    """A mini-batch of ``B`` graphs.

    Attributes:
        graph: block-diagonal Graph of the batch (``graph.ptr`` = node offsets; its per-edge
            target ``row``, in-degrees and transpose are already in ``graph.cache``).
        x: node features; ``y``: labels of the graphs; ``y_mask``: which labels are known (or None).
        batch: graph id (0..B-1) of every node.
        index: the graphs' ids in the dataset (-1 for the slots of a padded batch that hold no graph).
        node_weight: padded batches (``StaticBatch``): 1 for real nodes, 0 for padding; None otherwise.
        graph_weight: padded batches: 1 for the slots holding a graph, 0 for the empty and
            padding slots (weigh per-graph losses with it); None otherwise.

    Shapes:
        graph: N nodes, E edges, ptr [B + 1]; x: [N, F]; y: [B, ...]; y_mask: like y; batch: [N]; index: [B];
        node_weight: [N]; graph_weight: [B].
    """

    graph: Graph
    x: Tensor
    y: Tensor
    y_mask: Optional[Tensor]
    batch: Tensor
    index: Tensor
    node_weight: Optional[Tensor] = None
    graph_weight: Optional[Tensor] = None

    @property
    def num_graphs(self) -> int:
        return self.index.numel()

    @property
    def ptr(self) -> Tensor:
        return self.graph.ptr

    def items(self):
        """``(name, value)`` pairs (what the prefetcher walks to find every tensor)."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)]

    def _map(self, fn) -> "GraphBatch":
        move = lambda t: None if t is None else fn(t)  # noqa: E731
        g = self.graph
        graph = Graph(move(g.rowptr), move(g.col), move(g.edge_val), g.num_nodes, ptr=move(g.ptr), transient=g.transient)
        for key in ("row", "in_degree"):
            if key in g.cache:
                graph.set_derived(key, move(g.cache.get(key)))
        if "transpose" in g.cache:
            graph.set_derived("transpose", tuple(move(t) for t in g.cache.get("transpose")))
        return GraphBatch(graph, move(self.x), move(self.y), move(self.y_mask), move(self.batch), move(self.index),
                          move(self.node_weight), move(self.graph_weight))

    def to(self, device, non_blocking: bool = False) -> "GraphBatch":
        """Every tensor (those cached on the graph included) on ``device``."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "GraphBatch":
        return self._map(lambda t: t.pin_memory())


class GraphDataset:
    """Graphs of a graph-level task, concatenated: one block-diagonal CSR, features, labels.

    Args:
        graph: block-diagonal Graph of all graphs with ``ptr`` (graph ``g`` = nodes
            ``ptr[g]:ptr[g+1]``; no edge between two graphs), e.g. ``load_molecules(...).graph``,
            ``load_tu_batch(...).graph`` or ``Graph.batch(graphs)``.  Its edge values (if any)
            travel with the edges.
        x: node features.
        y: per-graph labels (class ids, or ``[G, T]`` task targets).
        y_mask: which entries of ``y`` are known (multi-task sets with missing labels), or None.
        name: for messages and reports.

    Shapes:
        graph: N nodes, E edges, ptr [G + 1]; x: [N, F]; y: [G] or [G, T]; y_mask: like y.
    """

    def __init__(self, graph: Graph, x: Tensor, y: Tensor, y_mask: Optional[Tensor] = None, *, name: str = "") -> None:
        fn = "GraphDataset"
        check(isinstance(graph, Graph), fn, f"graph must be a Graph, got {type(graph).__name__}")
        check(graph.ptr is not None, fn, "graph must be a batch with ptr (Graph.batch, load_molecules, load_tu_batch)")
        check(not graph.is_bipartite, fn, "graph must be square")
        check(isinstance(x, Tensor) and x.dim() == 2 and x.shape[0] == graph.num_nodes, fn,
              f"x must be [{graph.num_nodes}, F], got {tuple(getattr(x, 'shape', ()))}")
        num_graphs = graph.ptr.numel() - 1
        check(isinstance(y, Tensor) and y.dim() >= 1 and y.shape[0] == num_graphs, fn,
              f"y must have one row per graph ({num_graphs}), got {tuple(getattr(y, 'shape', ()))}")
        check(y_mask is None or (isinstance(y_mask, Tensor) and y_mask.shape == y.shape), fn,
              f"y_mask must have y's shape {tuple(y.shape)}")
        device = graph.device
        self.name, self.graph, self.x, self.y, self.y_mask = name, graph, x.to(device), y.to(device), \
            None if y_mask is None else y_mask.to(device)
        self.node_ptr = graph.ptr.to(device=device, dtype=torch.int64)
        self.edge_ptr = graph.rowptr.index_select(0, self.node_ptr)
        self.degree = graph.rowptr[1:] - graph.rowptr[:-1]
        row, col = graph.row, graph.col
        owner = rowptr_to_row(self.edge_ptr, graph.num_edges)      # graph of every edge
        start = self.node_ptr.index_select(0, owner)
        check(bool(((row >= start) & (col >= start) & (col < self.node_ptr.index_select(0, owner + 1))).all()), fn,
              "graph is not block-diagonal: an edge joins two graphs")
        self.row_local, self.col_local = row - start, col - start
        rowptr_t, col_t, perm = graph.transpose_parts()          # same per-graph edge ranges as the graph's
        self.degree_t = rowptr_t[1:] - rowptr_t[:-1]
        self.col_t_local = col_t - start                         # edge k of A^T lies in graph owner[k] too
        self.perm_local = perm - self.edge_ptr.index_select(0, owner)
        self.edge_val = graph.edge_val
        counts = torch.stack([self.node_ptr.diff(), self.edge_ptr.diff()]).cpu()
        self._node_counts_cpu, self._edge_counts_cpu = counts[0], counts[1]

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_molecules(cls, molecules, name: str = "molecules") -> "GraphDataset":
        """From :func:`~sparsegnn.datasets.load_molecules`: ``y`` [G, T] float (NaN = unknown, set to 0)
        with ``y_mask``."""
        y = torch.nan_to_num(molecules.y, nan=0.0)
        return cls(molecules.graph, molecules.x, y, molecules.y_mask, name=name)

    @classmethod
    def from_samples(cls, samples: Sequence, name: str = "graphs") -> "GraphDataset":
        """From a list of :class:`~sparsegnn.datasets.GraphSample` (``load_tu``); ``y`` [G] int64."""
        check(len(samples) > 0, "GraphDataset.from_samples", "needs at least one sample")
        graph = Graph.batch([s.graph for s in samples])
        x = torch.cat([s.x for s in samples])
        return cls(graph, x, torch.tensor([int(s.y) for s in samples], dtype=torch.int64), name=name)

    @classmethod
    def from_tu(cls, path, node_attributes: bool = False) -> "GraphDataset":
        """A TU collection (zip or directory) read by :func:`~sparsegnn.datasets.load_tu_batch`; ``y`` [G] int64,
        the graph labels renumbered 0, 1, ... in sorted order (labels -1 / 1 become 0 / 1).

        ``node_attributes=False`` (default, as the GIN paper and PyG's ``TUDataset``): the node
        features are the one-hot node labels only (a constant 1 without labels); ``True``: the
        continuous attributes too, each column standardised over all nodes, then the labels.
        """
        from .real import load_tu_batch
        from .tu import tu_attribute_width

        data = load_tu_batch(path)
        width = tu_attribute_width(path)
        x = data.x
        if width and not node_attributes:
            x = x[:, width:] if x.shape[1] > width else torch.ones(x.shape[0], 1)
        elif width:
            attrs = x[:, :width]
            attrs = (attrs - attrs.mean(0)) / attrs.std(0).clamp(min=1e-6)
            x = torch.cat([attrs, x[:, width:]], dim=1)
        labels = torch.unique(data.graph_y, return_inverse=True)[1]
        return cls(data.graph, x.contiguous(), labels, name=data.name)

    # ------------------------------------------------------------------ properties, transforms
    @property
    def num_graphs(self) -> int:
        return self.node_ptr.numel() - 1

    @property
    def num_features(self) -> int:
        return self.x.shape[1]

    @property
    def device(self) -> torch.device:
        return self.graph.device

    def __len__(self) -> int:
        return self.num_graphs

    def __repr__(self) -> str:
        return (f"GraphDataset({self.name}: {self.num_graphs} graphs, {self.graph.num_nodes} nodes, "
                f"{self.graph.num_edges} edges, {self.num_features} features, y {tuple(self.y.shape)}, "
                f"device={self.device})")

    def to(self, device) -> "GraphDataset":
        """A copy on ``device`` (derived tensors rebuilt there)."""
        return GraphDataset(self.graph.to(device), self.x.to(device), self.y.to(device),
                            None if self.y_mask is None else self.y_mask.to(device), name=self.name)

    def gcn_normalized(self) -> "GraphDataset":
        r"""The dataset with GCN's graph in place of each graph, computed once for all graphs:
        self loops replaced by one per node and edge values
        :math:`\hat D^{-1/2} (A + I) \hat D^{-1/2}` (edge values as weights, loops weighing 1).
        Batches of it go to layers that do not normalise again (``GCNConv(normalize=False)``,
        ``ChemGCN(normalize=False)``)."""
        graph = self.graph.remove_self_loops().add_self_loops().normalize("sym")
        return GraphDataset(graph, self.x, self.y, self.y_mask, name=self.name)

    def labels(self) -> Tensor:
        """``y`` on the CPU (for splits)."""
        return self.y.cpu()


def _concat_ranges(starts: Tensor, counts: Tensor, total: int):
    """``(owner, positions)`` of the ranges ``starts[b] .. starts[b] + counts[b]`` laid end to end:
    ``owner[k]`` = the range of output ``k``, ``positions[k]`` its position in the source; and
    ``offsets`` [B + 1] of the ranges in the output.  No host sync (``total`` is given)."""
    device = starts.device
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=offsets[1:])
    owner = torch.repeat_interleave(torch.arange(counts.numel(), device=device), counts, output_size=total)
    positions = torch.arange(total, device=device) + (starts - offsets[:-1]).index_select(0, owner)
    return owner, positions, offsets


def collate(dataset: GraphDataset, index: Tensor, *, transient: bool = True) -> GraphBatch:
    """The batch of graphs ``index`` of ``dataset``, built on the dataset's device with gathers,
    cumulative sums and one ``repeat_interleave`` per level (no loop over the graphs, no sort, no
    host sync: the batch's node and edge totals come from CPU copies of the counts).

    The batch's CSR is graph ``index[b]``'s CSR rows and edges in turn, columns shifted by the
    batch's node offset of graph ``b``, so it equals ``Graph.batch`` of those graphs; its
    transpose (for backward passes), per-edge targets and in-degrees go into ``graph.cache``.

    Args:
        index: graph ids (any order, repeats allowed), CPU or the dataset's device.
        transient: mark the Graph as serving one step (``Graph.transient``: kernels plan and tune nothing on it).

    Shapes:
        index: [B] -> GraphBatch with N = sum of the graphs' nodes, E = sum of their edges.
    """
    check(isinstance(index, Tensor) and index.dim() == 1 and not index.is_floating_point(), "collate",
          f"index must be a 1-D integer tensor, got {getattr(index, 'shape', type(index).__name__)}")
    index_cpu = index.cpu().to(torch.int64)
    num_nodes = int(dataset._node_counts_cpu.index_select(0, index_cpu).sum())
    num_edges = int(dataset._edge_counts_cpu.index_select(0, index_cpu).sum())
    device = dataset.device
    if index.device == device:
        idx = index.to(torch.int64)
    else:   # one copy, from pinned memory on CUDA: a pageable copy would wait for the device's queue
        idx = (index_cpu.pin_memory() if device.type == "cuda" else index_cpu).to(device, non_blocking=True)
    node_start, edge_start = dataset.node_ptr.index_select(0, idx), dataset.edge_ptr.index_select(0, idx)
    node_count = dataset.node_ptr.index_select(0, idx + 1) - node_start
    edge_count = dataset.edge_ptr.index_select(0, idx + 1) - edge_start
    batch, nodes, ptr = _concat_ranges(node_start, node_count, num_nodes)
    edge_owner, edges, edge_offsets = _concat_ranges(edge_start, edge_count, num_edges)
    shift = ptr.index_select(0, edge_owner)
    degree = dataset.degree.index_select(0, nodes)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(degree, 0, out=rowptr[1:])
    rowptr_t = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(dataset.degree_t.index_select(0, nodes), 0, out=rowptr_t[1:])
    edge_val = None if dataset.edge_val is None else dataset.edge_val.index_select(0, edges)
    graph = Graph(rowptr, dataset.col_local.index_select(0, edges) + shift, edge_val, num_nodes, ptr=ptr,
                  transient=transient)
    graph.set_derived("row", dataset.row_local.index_select(0, edges) + shift)
    graph.set_derived("in_degree", degree)
    graph.set_derived("transpose", (rowptr_t, dataset.col_t_local.index_select(0, edges) + shift,
                                dataset.perm_local.index_select(0, edges) + edge_offsets.index_select(0, edge_owner)))
    # block-diagonal by construction, largest graph known on the host: the batched kernels need not sync
    graph.set_batch_stats(int(dataset._node_counts_cpu.index_select(0, index_cpu).max()) if index_cpu.numel() else 0)
    y_mask = None if dataset.y_mask is None else dataset.y_mask.index_select(0, idx)
    return GraphBatch(graph, dataset.x.index_select(0, nodes), dataset.y.index_select(0, idx), y_mask, batch, idx)


class GraphLoader:
    """Mini-batches of a :class:`GraphDataset` as block-diagonal graphs: each batch equals
    ``collate(dataset, batch.index)``, built as a slice of the epoch's one collation.

    Args:
        dataset: the graphs.
        batch_size: graphs per batch.
        index: the graph ids to visit (a split; default: all), int64.
        shuffle: a new order every epoch, drawn with ``generator`` (a CPU ``torch.Generator``;
            default: PyTorch's global generator).
        drop_last: drop the last batch when it has fewer than ``batch_size`` graphs.
        device: where batches go (default: the dataset's device).
        pin_memory: pin each CPU batch before the copy (default: when the dataset is on the CPU
            and ``device`` is CUDA).
        prefetch: batches prepared ahead in a background thread (default: 2 when the dataset is
            on the CPU and ``device`` is CUDA, else 0 = in the loop).
        transient: ``Graph.transient`` of the batch graphs (default True: used once each).
    """

    def __init__(self, dataset: GraphDataset, batch_size: int = 50, *, index: Optional[Tensor] = None,
                 shuffle: bool = False, drop_last: bool = False, generator: Optional[torch.Generator] = None,
                 device=None, pin_memory: Optional[bool] = None, prefetch: Optional[int] = None,
                 transient: bool = True) -> None:
        fn = "GraphLoader"
        check(isinstance(dataset, GraphDataset), fn, f"dataset must be a GraphDataset, got {type(dataset).__name__}")
        check(isinstance(batch_size, int) and batch_size >= 1, fn, f"batch_size must be an int >= 1, got {batch_size!r}")
        if index is None:
            index = torch.arange(dataset.num_graphs)
        check(isinstance(index, Tensor) and index.dim() == 1 and not index.is_floating_point(), fn,
              "index must be a 1-D integer tensor of graph ids")
        index = index.cpu().to(torch.int64)
        check(index.numel() == 0 or (int(index.min()) >= 0 and int(index.max()) < dataset.num_graphs), fn,
              f"index must hold graph ids in [0, {dataset.num_graphs})")
        self.dataset, self.batch_size, self.index = dataset, batch_size, index
        self.shuffle, self.drop_last, self.generator, self.transient = shuffle, drop_last, generator, transient
        self.device = torch.device(device) if device is not None else dataset.device
        host_to_cuda = dataset.device.type == "cpu" and self.device.type == "cuda"
        self.pin_memory = host_to_cuda if pin_memory is None else bool(pin_memory)
        self.prefetch = (2 if host_to_cuda else 0) if prefetch is None else int(prefetch)
        check(self.prefetch >= 0, fn, f"prefetch must be >= 0, got {prefetch}")

    def __len__(self) -> int:
        n = self.index.numel()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self) -> Tensor:
        order = self.index
        if self.shuffle:
            order = order[torch.randperm(order.numel(), generator=self.generator)]
        if self.drop_last:
            order = order[:order.numel() - order.numel() % self.batch_size]
        return order

    def _epoch(self) -> Iterator[GraphBatch]:
        """The epoch's graphs collated once, in their order (one :func:`collate`), then every batch
        as slices of it, moved to the target device (asynchronously from pinned memory) and
        re-based: a few ops per batch; the slice bounds come from CPU counts (no host sync)."""
        order = self._order()
        if order.numel() == 0:
            return
        whole = collate(self.dataset, order, transient=self.transient)
        if self.device != self.dataset.device and self.pin_memory:
            whole = whole.pin_memory()
        non_blocking = self.pin_memory
        move = lambda t: t.to(self.device, non_blocking=non_blocking)  # noqa: E731
        zero = torch.zeros(1, dtype=torch.int64)
        node_counts = self.dataset._node_counts_cpu.index_select(0, order)
        node_off = torch.cat([zero, node_counts.cumsum(0)]).tolist()
        edge_off = torch.cat([zero, self.dataset._edge_counts_cpu.index_select(0, order).cumsum(0)]).tolist()
        for b0 in range(0, order.numel(), self.batch_size):
            b1 = min(b0 + self.batch_size, order.numel())
            batch = _slice(whole, b0, b1, node_off[b0], node_off[b1], edge_off[b0], edge_off[b1], move)
            batch.graph.set_batch_stats(int(node_counts[b0:b1].max()))
            yield batch

    def __iter__(self) -> Iterator[GraphBatch]:
        if self.prefetch == 0:
            return self._epoch()
        from ..sampling._prefetch import prefetched

        return prefetched(self._epoch, self.device, self.prefetch)


def _slice(whole: GraphBatch, b0: int, b1: int, n0: int, n1: int, e0: int, e1: int, move) -> GraphBatch:
    """Graphs ``b0:b1`` of a collated batch (their nodes ``n0:n1``, edges ``e0:e1``) as a batch of
    their own on ``move``'s device: every index shifted back to start at 0."""
    g = whole.graph
    rowptr_t, col_t, perm = g.transpose_parts()
    edge_val = None if g.edge_val is None else move(g.edge_val[e0:e1])
    graph = Graph(move(g.rowptr[n0:n1 + 1]) - e0, move(g.col[e0:e1]) - n0, edge_val, n1 - n0,
                  ptr=move(g.ptr[b0:b1 + 1]) - n0, transient=g.transient)
    graph.set_derived("row", move(g.row[e0:e1]) - n0)
    graph.set_derived("in_degree", move(g.in_degree()[n0:n1]))
    graph.set_derived("transpose", (move(rowptr_t[n0:n1 + 1]) - e0, move(col_t[e0:e1]) - n0, move(perm[e0:e1]) - e0))
    y_mask = None if whole.y_mask is None else move(whole.y_mask[b0:b1])
    return GraphBatch(graph, move(whole.x[n0:n1]), move(whole.y[b0:b1]), y_mask, move(whole.batch[n0:n1]) - b0,
                      move(whole.index[b0:b1]))
