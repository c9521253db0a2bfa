"""``NeighborSampler`` and ``sample_neighbors``: uniform multi-hop neighbour sampling of a Graph.

Semantics (PyG's ``NeighborLoader`` with pyg-lib, ``subgraph_type="directional"``): at hop
``h`` every node of the frontier (the seeds at hop 1, then the nodes first reached at hop
``h - 1``) keeps all its in-edges when its in-degree ``d <= fanouts[h]``, else a uniformly
random subset of exactly ``fanouts[h]`` distinct in-edges (distinct CSR positions: duplicate
edges are distinct candidates); ``-1`` keeps every in-edge.  With ``replace=True`` a node of
``d > 0`` draws ``fanouts[h]`` in-edges independently and uniformly (repeats possible, also
when ``d < fanouts[h]``).  Nodes reached again are not expanded again.  Local ids: the seeds
first (``0 .. B - 1``, in the given order), then each hop's new nodes in first-seen order, the
edges being visited hop by hop, target by target, by ascending CSR position.
"""
from __future__ import annotations

import numbers
import threading
import weakref
from typing import List, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from .._checks import INDEX_DTYPES, check
from ..graph import Graph
from ._core import SENTINEL, SampleOutput, sample_hops
from .batch import make_batch

EDGE_ORDERS = ("csr", "input")


# ---------------------------------------------------------------------------- validation
def check_fanouts(fn: str, fanouts) -> List[int]:
    """A non-empty sequence of ints, each ``>= 0`` or ``-1`` (all neighbours)."""
    check(isinstance(fanouts, Sequence) and not isinstance(fanouts, (str, bytes)), fn,
          f"fanouts must be a sequence of ints (one per hop), got {type(fanouts).__name__}")
    check(len(fanouts) > 0, fn, "fanouts must name at least one hop")
    out = []
    for hop, k in enumerate(fanouts):
        check(isinstance(k, numbers.Integral) and not isinstance(k, bool), fn,
              f"fanouts[{hop}] must be an int, got {k!r}")
        check(int(k) >= -1, fn, f"fanouts[{hop}] must be >= 0, or -1 for all neighbours, got {k}")
        out.append(int(k))
    return out


def check_graph(fn: str, graph) -> Graph:
    check(isinstance(graph, Graph), fn, f"graph must be a sparsegnn Graph, got {type(graph).__name__}")
    check(not graph.is_bipartite, fn,
          f"multi-hop sampling needs a square graph, got {graph.num_nodes} targets and {graph.num_src} sources")
    return graph


def check_generator(fn: str, generator: Optional[torch.Generator], device: torch.device) -> None:
    if generator is None:
        return
    check(isinstance(generator, torch.Generator), fn,
          f"generator must be a torch.Generator, got {type(generator).__name__}")
    gen_device = torch.device(generator.device)
    same = gen_device.type == device.type and (device.type == "cpu" or gen_device.index in (None, device.index))
    check(same, fn, f"generator is on {gen_device} but the graph is on {device}; "
                    f"make it with torch.Generator(device={str(device)!r})")


def as_seed_tensor(fn: str, seeds, num_nodes: int, device: torch.device, name: str = "seeds") -> Tensor:
    """``seeds`` as a 1-D int64 tensor on ``device``, checked non-empty and in ``[0, num_nodes)``."""
    if not isinstance(seeds, Tensor):
        try:
            seeds = torch.as_tensor(seeds, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{fn}(): {name} must be a 1-D tensor of node ids, got {type(seeds).__name__}") from exc
    check(seeds.dim() == 1, fn, f"{name} must be 1-D, got shape {tuple(seeds.shape)}")
    check(seeds.dtype in INDEX_DTYPES, fn, f"{name} must have an integer dtype, got {seeds.dtype}")
    check(seeds.numel() > 0, fn, f"{name} is empty: give at least one seed node")
    seeds = seeds.to(device=device, dtype=torch.int64)
    low, high = torch.stack(list(torch.aminmax(seeds))).tolist()
    check(low >= 0 and high < num_nodes, fn,
          f"{name} must lie in [0, {num_nodes}), got values in [{low}, {high}]")
    return seeds


def check_node_tensors(fn: str, tensors: Mapping[str, Optional[Tensor]], num_nodes: int) -> dict:
    """The non-None entries, each a tensor with ``num_nodes`` rows."""
    out = {}
    for key, value in tensors.items():
        if value is None:
            continue
        check(isinstance(value, Tensor), fn, f"node attribute {key!r} must be a tensor, got {type(value).__name__}")
        check(value.dim() >= 1 and value.shape[0] == num_nodes, fn,
              f"node attribute {key!r} has {value.shape[0] if value.dim() else 0} rows but the graph has "
              f"{num_nodes} nodes")
        out[key] = value
    return out


# ---------------------------------------------------------------------------- the sampler
class NeighborSampler:
    """Uniform multi-hop neighbour sampler of one :class:`~sparsegnn.Graph` (see the module doc).

    Keeps a scratch array of one int64 per node on the graph's device (for relabelling, reset
    after each sample), so each sample costs ``O(k log k)`` per frontier node whatever its degree
    (``O(d log d)`` for a node of degree ``d`` only when ``k > 64``, see ``_core``), with a fixed
    number of kernel launches per hop.  Not safe to call from two threads at once; make one
    sampler per thread.

    Args:
        graph: a square Graph (destination-major CSR: row ``i`` = in-edges of ``i``).
        num_neighbors: fanout of each hop (``-1``: all in-edges).
        replace: sample with replacement.
        edge_order: order of the returned ``e_id``: ``"csr"`` (positions in ``graph.col``) or
            ``"input"`` (positions in the ``edge_index`` the graph was built from; needs
            ``graph.edge_perm``).
    """

    def __init__(self, graph: Graph, num_neighbors: Sequence[int], replace: bool = False,
                 edge_order: str = "csr") -> None:
        fn = "NeighborSampler"
        self.graph = check_graph(fn, graph)
        self.num_neighbors = check_fanouts(fn, num_neighbors)
        check(isinstance(replace, bool), fn, f"replace must be a bool, got {replace!r}")
        check(edge_order in EDGE_ORDERS, fn, f"edge_order must be one of {EDGE_ORDERS}, got {edge_order!r}")
        check(edge_order == "csr" or graph.edge_perm is not None, fn,
              "edge_order='input' needs a graph built by Graph.from_edge_index (it has no edge_perm)")
        self.replace, self.edge_order = replace, edge_order
        self._slot: Optional[Tensor] = None

    @property
    def device(self) -> torch.device:
        return self.graph.device

    def _scratch(self) -> Tensor:
        if self._slot is None:
            self._slot = torch.full((self.graph.num_nodes,), SENTINEL, dtype=torch.int64, device=self.device)
        return self._slot

    def sample(self, seeds: Tensor, generator: Optional[torch.Generator] = None, *,
               validate: bool = True) -> SampleOutput:
        """Sample around ``seeds``.

        Args:
            seeds: distinct node ids ``[B]``.
            generator: random source on the graph's device (default: torch's default one).
            validate: check ``seeds`` (1-D, non-empty, in range: one host sync; distinct: folded
                into the first hop's sync) and ``generator``.  Skip it only for seeds known
                valid (int64, on the graph's device, distinct, in range).

        Returns:
            :class:`SampleOutput`, ``e_id`` in CSR order whatever ``edge_order``
            (:func:`~sparsegnn.sampling.batch.make_batch` applies ``edge_order``).

        Host syncs: 2 per hop (+1 with ``validate``).
        """
        fn = "NeighborSampler.sample"
        if validate:
            seeds = as_seed_tensor(fn, seeds, self.graph.num_nodes, self.graph.device)
            check_generator(fn, generator, self.graph.device)
        return self._run(fn, seeds, generator, check_unique=validate)

    def _run(self, fn: str, seeds: Tensor, generator: Optional[torch.Generator], check_unique: bool) -> SampleOutput:
        try:
            return sample_hops(self.graph.rowptr, self.graph.col, seeds, self.num_neighbors, self.replace,
                               generator, self._scratch(), check_unique=check_unique)
        except ValueError as exc:
            raise ValueError(f"{fn}(): {exc}") from None

    def sample_batch(self, seeds: Tensor, generator: Optional[torch.Generator] = None, *,
                     x: Optional[Tensor] = None, y: Optional[Tensor] = None,
                     node_attrs: Optional[Mapping[str, Tensor]] = None, input_id: Optional[Tensor] = None):
        """:meth:`sample`, then the mini-batch of :func:`sample_neighbors` (same attributes)."""
        tensors = check_node_tensors("NeighborSampler.sample_batch", {"x": x, "y": y, **(node_attrs or {})},
                                     self.graph.num_nodes)
        out = self.sample(seeds, generator)
        return make_batch(out, self.graph, edge_order=self.edge_order, node_tensors=tensors, input_id=input_id)

    def __repr__(self) -> str:
        return (f"NeighborSampler(num_neighbors={self.num_neighbors}, replace={self.replace}, "
                f"edge_order={self.edge_order!r}, graph={self.graph})")


# The scratch array of sample_neighbors, one per graph while the graph lives (taken out while in use,
# so two threads sampling one graph never share one).
_SCRATCH: "weakref.WeakKeyDictionary[Graph, Tensor]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def sample_neighbors(
    graph: Graph,
    seeds: Union[Tensor, Sequence[int]],
    fanouts: Sequence[int],
    replace: bool = False,
    generator: Optional[torch.Generator] = None,
    *,
    x: Optional[Tensor] = None,
    y: Optional[Tensor] = None,
    node_attrs: Optional[Mapping[str, Tensor]] = None,
    input_id: Optional[Tensor] = None,
    edge_order: str = "csr",
):
    r"""Sample a mini-batch around ``seeds``: uniform neighbours, hop by hop, on the graph's device.

    At hop :math:`h` each frontier node :math:`v` of in-degree :math:`d_v` keeps
    :math:`\min(d_v, k_h)` of its in-edges, a uniformly random subset of that size
    (:math:`P(e \text{ kept}) = k_h / d_v`, :math:`P(e, e' \text{ kept}) = k_h (k_h - 1) / (d_v (d_v - 1))`);
    ``k_h = -1`` keeps all; ``replace=True`` draws :math:`k_h` in-edges i.i.d. uniform.
    Relabelling: seeds first, then each hop's new nodes in first-seen order (PyG's), so
    ``model(batch)[:batch.batch_size]`` is the seeds' output.

    Args:
        graph: square Graph; row ``i`` of its CSR lists the in-edges of ``i``.
        seeds: ``B`` distinct node ids (any device; moved to the graph's).
        fanouts: in-edges per node at each hop (``-1``: all).
        replace: sample with replacement.
        generator: random source on the graph's device.
        x, y, node_attrs: per-node tensors ``[N, ...]`` (any device) sliced by ``n_id`` into
            the batch under their names.
        input_id: stored as ``batch.input_id`` (default ``arange(B)``).
        edge_order: ``"csr"`` (default): ``e_id`` are positions in ``graph``'s CSR (index
            ``graph.col`` / ``graph.edge_val``); ``"input"``: positions in the ``edge_index``
            the graph was built from (``graph.edge_perm[csr_position]``, PyG's meaning).

    Returns:
        ``torch_geometric.data.Data`` if PyG is importable, else :class:`MiniBatch`, with
        ``edge_index`` ``[2, E_s]`` (local ids; row 0 source, row 1 target; grouped by target,
        targets ascending: the CSR order of ``graph``), ``n_id`` ``[N_s]``, ``e_id`` ``[E_s]``,
        ``batch_size`` ``B``, ``num_sampled_nodes`` (``len(fanouts) + 1`` ints),
        ``num_sampled_edges`` (``len(fanouts)`` ints), ``input_id``, ``num_nodes`` ``N_s``,
        ``graph`` (the sub-graph as a :class:`~sparsegnn.Graph`, ``N_s`` nodes, its CSR order =
        ``edge_index`` order, ``edge_val`` sliced when ``graph`` has values), ``edge_weight``
        (when ``graph`` has values), and ``x``, ``y``, ``node_attrs`` sliced.

    Host syncs: 1 to check the seeds, then 2 per hop.  Memory: a scratch int64 per graph node,
    kept (per graph) for later calls.

    Raises:
        ValueError: bad fanouts, empty / repeated / out-of-range seeds, node tensors whose
            length is not ``N``, a generator on another device, a bipartite graph.

    Shapes:
        seeds: [B] -> edge_index: [2, E_s], n_id: [N_s], e_id: [E_s], x: [N_s, F].
    """
    fn = "sample_neighbors"
    graph = check_graph(fn, graph)
    fanouts = check_fanouts(fn, fanouts)
    check(isinstance(replace, bool), fn, f"replace must be a bool, got {replace!r}")
    check(edge_order in EDGE_ORDERS, fn, f"edge_order must be one of {EDGE_ORDERS}, got {edge_order!r}")
    check(edge_order == "csr" or graph.edge_perm is not None, fn,
          "edge_order='input' needs a graph built by Graph.from_edge_index (it has no edge_perm)")
    check_generator(fn, generator, graph.device)
    tensors = check_node_tensors(fn, {"x": x, "y": y, **(node_attrs or {})}, graph.num_nodes)
    seeds = as_seed_tensor(fn, seeds, graph.num_nodes, graph.device)
    sampler = NeighborSampler(graph, fanouts, replace, edge_order)
    with _LOCK:
        sampler._slot = _SCRATCH.pop(graph, None)
    try:
        out = sampler._run(fn, seeds, generator, check_unique=True)
    finally:
        with _LOCK:
            _SCRATCH[graph] = sampler._scratch()        # left clean by sample_hops, also on errors
    return make_batch(out, graph, edge_order=edge_order, node_tensors=tensors, input_id=input_id)

