"""Batches of small graphs padded to a few fixed shapes, refilled in place: what a captured
training step (one CUDA graph per shape) needs.

A CUDA graph replays fixed kernels on fixed memory, but every mini-batch of molecules has its
own node and edge counts.  :class:`BatchPadding` rounds a batch up to a *shape*: ``N`` nodes
rounded up to a multiple of ``node_multiple`` (at least :data:`MIN_PAD_NODES` padding nodes),
``E`` edges to a multiple of ``edge_multiple``, ``batch_size`` graph slots plus a few padding
graphs, and the size class of its largest graph (the batched kernels' tile height; one class
for every batch with a graph above their limit).  A handful
of shapes covers an epoch; a :class:`StaticBatch` per shape holds the tensors, and ``fill``
copies each batch into them.

The padding changes no result for the real graphs:

* padding nodes come after the real ones, have zero features, and form their own small
  *padding graphs* (slots ``batch_size ..``), so pooling never mixes them with a real graph;
* padding edges are self loops on padding nodes (weight 0 where the graph has weights), spread
  evenly, so no real node receives a message from them and no row grows long;
* empty slots (a last batch with fewer graphs) have no nodes;
* ``node_weight`` (1 = real node) and ``graph_weight`` (1 = real graph) are what losses and
  statistics weigh with: :class:`sparsegnn.nn.PaddedBatchNorm1d` takes its batch statistics
  over the real nodes inside :func:`sparsegnn.nn.padded_nodes`, a per-graph loss weighs by
  ``graph_weight`` (a masked multi-task loss by the padded ``y_mask``, zero on padding).

The batch Graph is ``volatile`` (``Graph(volatile=True)``): its CSR, per-edge targets,
in-degrees, transpose and transposed graph are refilled with it, and nothing an op derives
from them is kept between calls.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .._checks import check
from ..graph import Graph
from .loader import GraphBatch, GraphDataset

__all__ = ["BatchPadding", "StaticBatch", "PaddedGraph", "pad_batch", "MIN_PAD_NODES", "PAD_GRAPH_NODES"]

#: Every padded batch has at least this many padding nodes (so padding edges spread over them).
MIN_PAD_NODES = 16
#: Padding nodes per padding graph at most (the smallest tile of the batched kernels).
PAD_GRAPH_NODES = 16
#: Largest graphs the batched SpMM kernels take (``ops._triton.BATCHED_MAX_NODES``, the same
#: number; a test checks): batches with a larger graph share one size class, :data:`LARGE_CLASS`.
BATCHED_LIMIT = 128
#: The size class of batches holding a graph of more than :data:`BATCHED_LIMIT` nodes (they take
#: the row kernels, whose cost does not depend on the graph sizes).
LARGE_CLASS = 1 << 30


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _pow2(value: float) -> int:
    """The next power of two >= ``value`` (1 for values <= 1)."""
    return 1 << max(int(value) - 1, 0).bit_length()


def _size_class(nodes: int) -> int:
    """The batched kernels' tile height for a largest graph of ``nodes`` (the next power of two
    >= max(nodes, 16)), or :data:`LARGE_CLASS` above :data:`BATCHED_LIMIT`."""
    if nodes > BATCHED_LIMIT:
        return LARGE_CLASS
    return max(16, 1 << max(nodes - 1, 0).bit_length())


class BatchPadding:
    """The fixed shapes batches of ``batch_size`` graphs are padded to.

    Args:
        batch_size: graphs per batch (a smaller last batch leaves slots empty).
        node_multiple: the padded node count is a multiple of this (>= 16).
        edge_multiple: the padded edge count is a multiple of this (>= 16).

    Shapes (``shape_of``): ``(N_pad, E_pad, slots, size class of the largest graph)`` with
    ``slots = batch_size + padding graphs``.

    ``for_dataset`` picks the multiples from the dataset's mean graph: about an eighth of a
    mean batch's nodes and edges (powers of two), so a batch is padded by ~6-12 % and an epoch
    of random batches falls into a few shapes.
    """

    def __init__(self, batch_size: int, node_multiple: int, edge_multiple: int) -> None:
        fn = "BatchPadding"
        check(isinstance(batch_size, int) and batch_size >= 1, fn, f"batch_size must be an int >= 1, got {batch_size!r}")
        check(isinstance(node_multiple, int) and node_multiple >= 16, fn,
              f"node_multiple must be an int >= 16, got {node_multiple!r}")
        check(isinstance(edge_multiple, int) and edge_multiple >= 16, fn,
              f"edge_multiple must be an int >= 16, got {edge_multiple!r}")
        self.batch_size, self.node_multiple, self.edge_multiple = batch_size, node_multiple, edge_multiple
        max_pad = node_multiple + MIN_PAD_NODES - 1
        self.pad_graphs = -(-max_pad // PAD_GRAPH_NODES)
        self.slots = batch_size + self.pad_graphs

    @classmethod
    def for_dataset(cls, dataset: GraphDataset, batch_size: int) -> "BatchPadding":
        """Multiples of about 1/8 of a mean batch of ``dataset`` (powers of two, >= 32)."""
        nodes = dataset.graph.num_nodes * batch_size / max(dataset.num_graphs, 1)
        edges = dataset.graph.num_edges * batch_size / max(dataset.num_graphs, 1)
        return cls(batch_size, max(32, _pow2(nodes / 8)), max(32, _pow2(edges / 8)))

    def shape_of(self, batch: GraphBatch) -> Tuple[int, int, int, int]:
        """``(N_pad, E_pad, slots, size class)`` of ``batch`` (host integers only, no sync)."""
        graph = batch.graph
        check(batch.node_weight is None, "BatchPadding.shape_of", "the batch is padded already")
        check(batch.num_graphs <= self.batch_size, "BatchPadding.shape_of",
              f"the batch holds {batch.num_graphs} graphs, more than batch_size={self.batch_size}")
        stats = graph.batch_stats()
        check(stats is not None and stats[2], "BatchPadding.shape_of",
              "needs a block-diagonal batch with ptr (a GraphLoader batch or collate())")
        num_nodes = _round_up(graph.num_nodes + MIN_PAD_NODES, self.node_multiple)
        return num_nodes, _round_up(max(graph.num_edges, 1), self.edge_multiple), self.slots, _size_class(stats[0])

    def static(self, shape: Tuple[int, int, int, int], like: GraphBatch) -> "StaticBatch":
        """The :class:`StaticBatch` of ``shape`` (what ``CapturedGraphSteps`` keeps per shape)."""
        return StaticBatch(shape, like, self.pad_graphs)

    def __repr__(self) -> str:
        return (f"BatchPadding(batch_size={self.batch_size}, node_multiple={self.node_multiple}, "
                f"edge_multiple={self.edge_multiple}, padding graphs={self.pad_graphs})")


class PaddedGraph:
    """A volatile :class:`Graph` of ``num_nodes`` targets, ``num_src`` sources (default: square)
    and ``num_edges`` edges (and its transpose, per-edge targets and in-degrees) that :meth:`fill`
    refills with a smaller graph, padded: the padding targets and sources come last, and padding
    edge ``k`` of ``q`` joins padding source ``m + k p_s // q`` to padding target ``n + k p_t // q``
    (weight 0; self loops on padding nodes when square), spread evenly.  Both coordinates grow
    with ``k``, so the padding block is its own transpose, in order.  The structure part shared
    by :class:`StaticBatch` and the sampled mini-batches of ``sampling.padding`` (one per layer
    for trimmed ones: bipartite).

    Shapes:
        graph: num_nodes x num_src, num_edges edges (``ptr`` when given).
    """

    def __init__(self, num_nodes: int, num_edges: int, like: Graph, device, ptr: Optional[Tensor] = None,
                 size_class: Optional[int] = None, num_src: Optional[int] = None) -> None:
        i64 = torch.int64
        new = lambda *size, dtype=i64: torch.zeros(*size, dtype=dtype, device=device)  # noqa: E731
        num_src = num_nodes if num_src is None else int(num_src)
        self.num_nodes, self.num_src, self.num_edges = num_nodes, num_src, num_edges
        self.rowptr, self.col, self.row, self.in_degree = new(num_nodes + 1), new(num_edges), new(num_edges), new(num_nodes)
        self.rowptr_t, self.col_t, self.perm = new(num_src + 1), new(num_edges), new(num_edges)
        self.edge_val = None if like.edge_val is None else new(num_edges, dtype=like.edge_val.dtype)
        self.edge_val_t = None if like.edge_val is None else new(num_edges, dtype=like.edge_val.dtype)
        self.nodes = torch.arange(max(num_nodes, num_src) + 1, dtype=i64, device=device)   # node ids, 0..E tails
        self._edges = torch.arange(num_edges + 1, dtype=i64, device=device)
        bipartite = {} if num_src == num_nodes else {"num_src": num_src}
        self.graph = Graph(self.rowptr, self.col, self.edge_val, num_nodes, ptr=ptr, volatile=True, **bipartite)
        transposed = Graph(self.rowptr_t, self.col_t, self.edge_val_t, num_src, ptr=ptr, volatile=True,
                           **({} if not bipartite else {"num_src": num_nodes}))
        if size_class is not None:      # the largest real graph is below the size class
            self.graph.set_batch_stats(size_class)
            transposed.set_batch_stats(size_class)
        self.graph.set_derived("row", self.row)
        self.graph.set_derived("in_degree", self.in_degree)
        self.graph.set_derived("transpose", (self.rowptr_t, self.col_t, self.perm))
        self.graph.set_derived("t", transposed)

    def fits(self, g: Graph) -> bool:
        """Whether ``g`` fits with :data:`MIN_PAD_NODES` padding targets and a padding source."""
        pad_src = self.num_src - g.num_src
        return (self.num_nodes - g.num_nodes >= MIN_PAD_NODES and g.num_edges <= self.num_edges
                and (pad_src >= MIN_PAD_NODES if self.num_src == self.num_nodes else pad_src >= 1))

    def fill(self, g: Graph) -> Tuple[int, int]:
        """Copy ``g`` (at most ``num_nodes - MIN_PAD_NODES`` targets, fewer sources than
        ``num_src``, ``num_edges`` edges) in, padded.  Returns ``(padding targets, padding
        edges)``.  Host integers only (no sync)."""
        fn = "PaddedGraph.fill"
        n, m, e = g.num_nodes, g.num_src, g.num_edges
        check(self.fits(g), fn,
              (f"a graph of {n} nodes and {e} edges does not fit {self.num_nodes} nodes and {self.num_edges} edges "
               f"(with {MIN_PAD_NODES} padding nodes)") if self.num_src == self.num_nodes else
              (f"a graph of {n} targets, {m} sources and {e} edges does not fit {self.num_nodes} targets, "
               f"{self.num_src} sources and {self.num_edges} edges (with {MIN_PAD_NODES} padding targets and a "
               "padding source)"))
        check((g.edge_val is None) == (self.edge_val is None), fn, "edge values present in one graph but not another")
        p, p_src, q = self.num_nodes - n, self.num_src - m, self.num_edges - e     # padding targets, sources, edges
        rowptr_t, col_t, perm = g.transpose_parts()
        # padding edge k: source m + k p_src // q -> target n + k p // q; rows grow by <= ceil(q / p)
        targets = self._edges[:q].mul(p).floor_divide_(max(q, 1)).add_(n)
        sources = targets if p_src == p and m == n else self._edges[:q].mul(p_src).floor_divide_(max(q, 1)).add_(m)
        for dst, src, count, pad in ((self.rowptr, g.rowptr, n, p), (self.rowptr_t, rowptr_t, m, p_src)):
            dst[:count + 1].copy_(src)
            dst[count + 1:].copy_(self.nodes[1:pad + 1].mul(q).add_(pad - 1).floor_divide_(pad).add_(e))  # padding rows
        for dst, src, pad in ((self.col, g.col, sources), (self.row, g.row, targets), (self.col_t, col_t, targets)):
            dst[:e].copy_(src)
            dst[e:].copy_(pad)
        self.perm[:e].copy_(perm)
        self.perm[e:].copy_(self._edges[e:self.num_edges])          # the padding block is its own transpose
        torch.sub(self.rowptr[1:], self.rowptr[:-1], out=self.in_degree)
        if self.edge_val is not None:
            self.edge_val[:e].copy_(g.edge_val)
            self.edge_val[e:].zero_()
            torch.index_select(self.edge_val, 0, self.perm, out=self.edge_val_t)
        return p, q


class StaticBatch:
    """Tensors of one padded shape, refilled in place by :meth:`fill` (the static inputs of a
    captured step).  ``batch`` is a :class:`GraphBatch` over them whose ``graph`` is volatile.

    Args:
        shape: ``(N_pad, E_pad, slots, size class)`` from :meth:`BatchPadding.shape_of`.
        like: a batch of the dataset (for feature width, label shape, dtypes, device, values).
        pad_graphs: padding graphs at the end of the slots (``BatchPadding.pad_graphs``).

    Shapes:
        x: [N_pad, F]; graph: N_pad nodes, E_pad edges, ptr [slots + 1]; y: [slots, ...];
        node_weight: [N_pad]; graph_weight: [slots].
    """

    def __init__(self, shape: Tuple[int, int, int, int], like: GraphBatch, pad_graphs: int) -> None:
        num_nodes, num_edges, slots, size_class = shape
        fn = "StaticBatch"
        check(pad_graphs >= 1 and slots > pad_graphs, fn, f"needs 1 <= pad_graphs < slots, got {pad_graphs}, {slots}")
        check(num_nodes >= MIN_PAD_NODES and num_edges >= 1, fn, f"shape {shape} is too small")
        self.shape, self.pad_graphs = tuple(shape), pad_graphs
        device, i64 = like.x.device, torch.int64
        new = lambda *size, dtype=i64: torch.zeros(*size, dtype=dtype, device=device)  # noqa: E731
        self.x = new(num_nodes, like.x.shape[1], dtype=like.x.dtype)
        self.y = new(slots, *like.y.shape[1:], dtype=like.y.dtype)
        self.y_mask = None if like.y_mask is None else new(slots, *like.y_mask.shape[1:], dtype=like.y_mask.dtype)
        self.ptr, self.index, self.batch_vector = new(slots + 1), new(slots), new(num_nodes)
        self.node_weight, self.graph_weight = new(num_nodes, dtype=torch.float32), new(slots, dtype=torch.float32)
        self._slots = torch.arange(1, slots + 1, dtype=i64, device=device)
        # a padding graph holds <= PAD_GRAPH_NODES nodes, below every size class
        self.padded = PaddedGraph(num_nodes, num_edges, like.graph, device, ptr=self.ptr, size_class=size_class)
        self.graph = self.padded.graph
        self.batch = GraphBatch(self.graph, self.x, self.y, self.y_mask, self.batch_vector, self.index,
                                self.node_weight, self.graph_weight)
        self.fills = 0

    def fill(self, batch: GraphBatch) -> GraphBatch:
        """Copy ``batch`` (a :class:`GraphLoader` batch of this shape) into the tensors, padded;
        returns :attr:`batch`.  Host integers only (no sync): about 30 small device ops."""
        g = batch.graph
        num_nodes, num_edges, slots, size_class = self.shape
        n, b = g.num_nodes, batch.num_graphs
        fn = "StaticBatch.fill"
        check(b <= slots - self.pad_graphs, fn, f"a batch of {b} graphs does not fit the shape {self.shape}")
        stats = g.batch_stats()
        check(stats is not None and stats[2] and stats[0] <= size_class, fn,
              f"the batch's largest graph exceeds the shape's size class {size_class}")
        p, _ = self.padded.fill(g)
        self.x[:n].copy_(batch.x)
        self.x[n:].zero_()
        # slots: b graphs, empty slots up to batch_size, then padding graphs splitting nodes n..N_pad
        real = slots - self.pad_graphs
        self.ptr[:b + 1].copy_(g.ptr)
        self.ptr[b + 1:real + 1].fill_(n)
        self.ptr[real + 1:].copy_(self._slots[:self.pad_graphs].mul(p).floor_divide_(self.pad_graphs).add_(n))
        torch.searchsorted(self.ptr, self.padded.nodes[:num_nodes], right=True, out=self.batch_vector)
        self.batch_vector.sub_(1)
        for dst, src in ((self.y, batch.y), (self.y_mask, batch.y_mask)):
            if dst is not None:
                dst[:b].copy_(src)
                dst[b:].zero_()
        self.index[:b].copy_(batch.index)
        self.index[b:].fill_(-1)
        self.node_weight[:n].fill_(1.0)
        self.node_weight[n:].zero_()
        self.graph_weight[:b].fill_(1.0)
        self.graph_weight[b:].zero_()
        self.fills += 1
        return self.batch

    def __repr__(self) -> str:
        n, e, slots, size_class = self.shape
        return f"StaticBatch(nodes={n}, edges={e}, slots={slots}, size class={size_class}, fills={self.fills})"


def pad_batch(batch: GraphBatch, padding: BatchPadding) -> GraphBatch:
    """``batch`` padded to its shape, in new tensors (what a captured step sees, run eagerly: tests)."""
    shape = padding.shape_of(batch)
    return padding.static(shape, batch).fill(batch)
