"""Turning a layer's graph argument into the (transformed) Graph it aggregates over."""
from __future__ import annotations

from typing import Callable, Optional

from torch import Tensor

from .._checks import check
from ..graph import Graph


class GraphInputMixin:
    """Accepts ``Graph`` or ``edge_index`` (+ optional ``edge_weight``) and caches when asked.

    Layers set ``self.cached`` and call ``self._graph(graph, edge_weight, num_nodes, transform)``.
    With ``cached=True`` the transformed graph of the first call is reused for every later call
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
        transform: Callable[[Graph], Graph],
    ) -> Graph:
        if self.cached and self._cached_graph is not None:
            check(self._cached_graph.num_nodes == num_nodes, fn,
                  f"cached graph has {self._cached_graph.num_nodes} nodes but x has {num_nodes} rows; "
                  "call reset_cache() when the graph changes")
            return self._cached_graph
        if isinstance(graph, Graph):
            check(edge_weight is None, fn, "pass edge weights inside the Graph (edge_val), not as edge_weight")
            check(graph.num_nodes == num_nodes, fn, f"x has {num_nodes} rows but the graph has {graph.num_nodes} nodes")
            base = graph
        elif isinstance(graph, Tensor):
            base = Graph.from_edge_index(graph, edge_weight, num_nodes)
        else:
            raise ValueError(f"{fn}(): graph must be a Graph or an edge_index tensor, got {type(graph).__name__}")
        result = transform(base)
        if self.cached:
            self._cached_graph = result
        return result

    def reset_cache(self) -> None:
        """Forget the cached graph."""
        self._cached_graph = None


def identity(graph: Graph) -> Graph:
    return graph


def self_looped(graph: Graph) -> Graph:
    """Self loops replaced by exactly one per node, without edge values (AGNN, GAT)."""
    return graph.with_values(None).add_self_loops()


def as_float_tensor(x: Tensor, fn: str) -> None:
    check(isinstance(x, Tensor) and x.dim() == 2, fn, f"x must be a 2-D tensor [num_nodes, features], got {getattr(x, 'shape', type(x).__name__)}")
    check(x.is_floating_point(), fn, f"x must be floating point, got {x.dtype}")

