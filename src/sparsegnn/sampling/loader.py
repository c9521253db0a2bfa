"""``NeighborLoader``: mini-batches of seed nodes with their sampled neighbourhoods.

Like PyG's ``torch_geometric.loader.NeighborLoader`` (same arguments where they overlap, same
batch attributes), without pyg-lib or torch-sparse, sampling on the graph's device.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .._checks import INDEX_DTYPES, check
from ..graph import Graph
from ._prefetch import prefetched
from .batch import make_batch, pyg_data_class
from .sampler import NeighborSampler, check_fanouts, check_generator, check_node_tensors


def _from_pyg(fn: str, data) -> Tuple[Graph, Dict[str, Tensor], Dict[str, Tensor], Dict[str, Any]]:
    """The Graph of a PyG ``Data`` (with its ``edge_weight``) and its node, edge and other attributes."""
    check(getattr(data, "edge_index", None) is not None, fn, "the Data has no edge_index")
    edge_index = data.edge_index
    check(isinstance(edge_index, Tensor) and edge_index.dim() == 2 and edge_index.shape[0] == 2, fn,
          f"data.edge_index must be a [2, E] tensor, got {getattr(edge_index, 'shape', type(edge_index).__name__)}")
    weight = getattr(data, "edge_weight", None)
    if weight is not None and weight.dim() != 1:
        weight = None                                      # not a per-edge scalar: sliced, not aggregated
    graph = Graph.from_edge_index(edge_index, weight, int(data.num_nodes))
    nodes, edges, extra = {}, {}, {}
    for key, value in data.items():
        if key in ("edge_index", "num_nodes"):
            continue
        if isinstance(value, Tensor) and data.is_node_attr(key):
            nodes[key] = value
        elif isinstance(value, Tensor) and data.is_edge_attr(key):
            edges[key] = value
        else:
            extra[key] = value
    return graph, nodes, edges, extra


class NeighborLoader:
    """Iterate over mini-batches of seeds, each with its sampled multi-hop neighbourhood.

    Each batch is what :func:`sparsegnn.sampling.sample_neighbors` returns (a PyG ``Data`` or
    a :class:`MiniBatch`): ``edge_index``, ``n_id``, ``e_id``, ``batch_size``,
    ``num_sampled_nodes``, ``num_sampled_edges``, ``input_id``, ``num_nodes``, ``graph`` (the
    sub-graph as a sparsegnn Graph) and the node attributes sliced by ``n_id``.

    Args:
        data: a :class:`~sparsegnn.Graph` (node tensors given as ``x``, ``y``, ``node_attrs``),
            or a ``torch_geometric.data.Data`` with ``edge_index``: its Graph is built once
            (``loader.graph``, with ``data.edge_weight`` as edge values when it is ``[E]``), its
            node attributes are sliced by ``n_id``, its edge attributes by ``e_id``, and its
            other attributes copied into every batch.
        num_neighbors: fanout of each hop (``-1``: all in-edges).
        batch_size: seeds per batch.
        input_nodes: the seeds: ``None`` (every node), a bool mask ``[N]`` or distinct node ids.
        shuffle: visit the seeds in a new random order every epoch.
        drop_last: skip the last, smaller batch.
        x, y, node_attrs: per-node tensors (``[N, ...]``, any device) added to each batch;
            with a ``Data``, they override its attributes of the same name.
        generator: random source for shuffling and sampling, on the graph's device.
        replace: sample neighbours with replacement.
        prefetch: sample this many batches ahead in a background thread (on its own CUDA stream
            on the GPU), so that the sampler's host syncs do not stall the training loop; ``0``
            samples in the loop.  Batches and their random draws are the same either way.

    ``e_id`` order: with a Graph, positions in its CSR (``graph.col``); with a ``Data``,
    positions in ``data.edge_index`` (PyG's meaning).  ``input_id``: positions in
    ``input_nodes`` for an index tensor, node ids for a mask or ``None`` (as PyG).

    Devices: sampling runs where the graph is, and each batch (``batch.graph`` included) lives
    there: put the graph and the node tensors on the GPU before building the loader.  PyG's
    ``batch.to(device)`` moves ``batch.graph`` too (``Graph.to``), without its prebuilt transpose.

    Host syncs: 2 per hop and batch (the shuffle has none), in the producer thread with
    ``prefetch``.  The seeds are checked once, here.  One iteration at a time: the loader's
    sampler and generator are shared by its iterators.

    Raises:
        ValueError: bad fanouts or batch size, no input nodes, input nodes out of range or
            repeated, node tensors of the wrong length, a generator on another device.

    Example:
        >>> loader = NeighborLoader(graph, [15, 10], batch_size=1024, input_nodes=train_mask, x=x, y=y)
        >>> for batch in loader:
        ...     out = model(batch.x, batch.graph)[:batch.batch_size]
        ...     loss = F.cross_entropy(out, batch.y[:batch.batch_size])
    """

    def __init__(
        self,
        data,
        num_neighbors: Sequence[int] = (15, 10),
        batch_size: int = 1024,
        input_nodes: Optional[Tensor] = None,
        shuffle: bool = True,
        drop_last: bool = False,
        x: Optional[Tensor] = None,
        y: Optional[Tensor] = None,
        node_attrs: Optional[Mapping[str, Tensor]] = None,
        generator: Optional[torch.Generator] = None,
        replace: bool = False,
        prefetch: int = 0,
    ) -> None:
        fn = "NeighborLoader"
        data_cls = pyg_data_class()
        if isinstance(data, Graph):
            graph, nodes, edges, extra, edge_order = data, {}, {}, {}, "csr"
        elif data_cls is not None and isinstance(data, data_cls):
            graph, nodes, edges, extra = _from_pyg(fn, data)
            edge_order = "input"
        else:
            raise ValueError(f"{fn}(): data must be a sparsegnn Graph or a torch_geometric Data, "
                             f"got {type(data).__name__}")
        fanouts = check_fanouts(fn, num_neighbors)
        check(isinstance(replace, bool), fn, f"replace must be a bool, got {replace!r}")
        self.sampler = NeighborSampler(graph, fanouts, replace, edge_order)
        self.graph = graph
        self.data = data
        check(isinstance(batch_size, numbers.Integral) and not isinstance(batch_size, bool) and batch_size > 0,
              fn, f"batch_size must be a positive int, got {batch_size!r}")
        check(isinstance(shuffle, bool) and isinstance(drop_last, bool), fn, "shuffle and drop_last must be bools")
        check_generator(fn, generator, graph.device)
        nodes.update({k: v for k, v in {"x": x, "y": y, **(node_attrs or {})}.items() if v is not None})
        self.node_tensors = check_node_tensors(fn, nodes, graph.num_nodes)
        self.edge_tensors, self.extra = edges, extra
        self.input_nodes, self.input_id = self._input_nodes(fn, input_nodes)
        self.batch_size, self.shuffle, self.drop_last = int(batch_size), shuffle, drop_last
        check(isinstance(prefetch, numbers.Integral) and not isinstance(prefetch, bool) and prefetch >= 0, fn,
              f"prefetch must be an int >= 0, got {prefetch!r}")
        self.generator, self.prefetch = generator, int(prefetch)

    # ------------------------------------------------------------------ seeds
    def _input_nodes(self, fn: str, input_nodes) -> Tuple[Tensor, Optional[Tensor]]:
        """``(node ids, input ids or None)`` on the graph's device, checked once."""
        n, device = self.graph.num_nodes, self.graph.device
        if input_nodes is None:
            check(n > 0, fn, "the graph has no nodes to sample from")
            return torch.arange(n, device=device), None
        if not isinstance(input_nodes, Tensor):
            try:
                input_nodes = torch.as_tensor(input_nodes)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise ValueError(f"{fn}(): input_nodes must be a bool mask or a tensor of node ids") from exc
        check(input_nodes.dim() == 1, fn, f"input_nodes must be 1-D, got shape {tuple(input_nodes.shape)}")
        input_nodes = input_nodes.to(device)
        if input_nodes.dtype == torch.bool:
            check(input_nodes.numel() == n, fn, f"the input_nodes mask has {input_nodes.numel()} entries but the "
                                                f"graph has {n} nodes")
            nodes = torch.nonzero(input_nodes).squeeze(1)
            check(nodes.numel() > 0, fn, "the input_nodes mask selects no node")
            return nodes, None
        check(input_nodes.dtype in INDEX_DTYPES, fn, f"input_nodes must be a bool mask or integer ids, got "
                                                     f"{input_nodes.dtype}")
        check(input_nodes.numel() > 0, fn, "input_nodes is empty")
        nodes = input_nodes.to(torch.int64)
        low, high = torch.stack(list(torch.aminmax(nodes))).tolist()
        check(low >= 0 and high < n, fn, f"input_nodes must lie in [0, {n}), got values in [{low}, {high}]")
        check(torch.unique(nodes).numel() == nodes.numel(), fn, "input_nodes holds a node more than once")
        return nodes, torch.arange(nodes.numel(), device=device)

    @property
    def num_neighbors(self):
        return self.sampler.num_neighbors

    def __len__(self) -> int:
        count = self.input_nodes.numel()
        return count // self.batch_size if self.drop_last else math.ceil(count / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        if self.prefetch > 0:
            return self._prefetching()
        return self._batches()

    def _prefetching(self) -> Iterator[Any]:
        """The prefetched batches; one such iteration at a time (its thread shares the sampler's
        scratch array, whose GPU resets another thread's stream would not wait for)."""
        if getattr(self, "_prefetch_active", False):
            raise ValueError("NeighborLoader(): with prefetch, one iteration at a time: finish (or break out of) "
                             "the previous loop over this loader first")
        self._prefetch_active = True
        try:
            yield from prefetched(self._batches, self.graph.device, self.prefetch)
        finally:
            self._prefetch_active = False

    def _batches(self) -> Iterator[Any]:
        count = self.input_nodes.numel()
        device = self.graph.device
        if self.shuffle:
            order = torch.randperm(count, generator=self.generator, device=device)
        else:
            order = torch.arange(count, device=device)
        for b in range(len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]
            yield self._batch(index)

    def _batch(self, index: Tensor):
        """The batch whose seeds are ``input_nodes[index]`` (``index``: distinct positions, on the graph's device)."""
        seeds = self.input_nodes[index]
        input_id = seeds if self.input_id is None else self.input_id[index]
        out = self.sampler.sample(seeds, self.generator, validate=False)
        return make_batch(out, self.graph, edge_order=self.sampler.edge_order, node_tensors=self.node_tensors,
                          edge_tensors=self.edge_tensors, extra=self.extra, input_id=input_id)

    def __repr__(self) -> str:
        return (f"NeighborLoader(num_neighbors={self.num_neighbors}, batch_size={self.batch_size}, "
                f"seeds={self.input_nodes.numel()}, shuffle={self.shuffle}, graph={self.graph})")
