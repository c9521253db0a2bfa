"""Turning a :class:`SampleOutput` into a PyG-compatible mini-batch.

With ``torch_geometric`` importable the batch is a ``torch_geometric.data.Data``; without it,
a :class:`MiniBatch` with the same attributes.  Either way it carries ``graph``, the sampled
sub-graph as a :class:`~sparsegnn.Graph` (its CSR is built without a sort: the sampled edges
come grouped by target), so sparsegnn layers skip the ``edge_index -> Graph`` build.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

import torch
from torch import Tensor

from ..graph import Graph, attach_graph
from ._core import SampleOutput, _arange


class MiniBatch:
    """A sampled mini-batch when ``torch_geometric`` is not importable: a bag of attributes.

    Holds the same attributes as the ``Data`` it stands in for (see
    :func:`sparsegnn.sampling.sample_neighbors`): ``edge_index``, ``n_id``, ``e_id``,
    ``batch_size``, ``num_sampled_nodes``, ``num_sampled_edges``, ``input_id``, ``num_nodes``,
    ``graph`` and the sliced node (and edge) attributes such as ``x`` and ``y``.
    """

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)

    def keys(self) -> Tuple[str, ...]:
        return tuple(self.__dict__)

    def __contains__(self, key: str) -> bool:
        return key in self.__dict__

    def __getitem__(self, key: str) -> Any:
        return self.__dict__[key]

    def __iter__(self) -> Iterator[Tuple[str, Any]]:
        return iter(self.__dict__.items())

    def items(self) -> Iterator[Tuple[str, Any]]:
        return iter(self.__dict__.items())

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    def to(self, device, non_blocking: bool = False) -> "MiniBatch":
        """A copy with every tensor (and the Graph) on ``device``."""
        moved = {}
        for key, value in self.__dict__.items():
            if isinstance(value, Tensor):
                value = value.to(device, non_blocking=non_blocking)
            elif isinstance(value, Graph):
                value = value.to(device)
            moved[key] = value
        return MiniBatch(**moved)

    def __repr__(self) -> str:
        def show(value: Any) -> str:
            if isinstance(value, Tensor):
                return str(list(value.shape))
            return repr(value)
        return "MiniBatch(" + ", ".join(f"{k}={show(v)}" for k, v in self.__dict__.items()) + ")"


def pyg_data_class():
    """``torch_geometric.data.Data``, or ``None`` when PyG is not importable (checked on every call)."""
    try:
        import torch_geometric  # noqa: F401  (checked first: a None entry in sys.modules means "not importable")
        from torch_geometric.data import Data
    except ImportError:
        return None
    return Data


def _take(value: Tensor, index: Tensor) -> Tensor:
    return value.index_select(0, index.to(value.device))


def _transpose(out: SampleOutput) -> Tuple[Tensor, Tensor, Tensor]:
    """``(rowptr_t, col_t, perm)`` of the sampled sub-graph's transpose without a host sync: a
    stable sort of the sources (the edges are target-major, so within a source they stay in
    target order, as ``formats.csr.transpose_csr`` orders them) and a ``searchsorted`` for the
    row offsets (``bincount`` on CUDA syncs).

    Shapes:
        out.src, out.dst: [E_s] -> rowptr_t: [N_s + 1], col_t: [E_s], perm: [E_s].
    """
    sources, perm = torch.sort(out.src, stable=True)
    rowptr_t = torch.searchsorted(sources, _arange(out.n_id.numel() + 1, sources.device))
    return rowptr_t, out.dst[perm], perm


def make_batch(
    out: SampleOutput,
    graph: Graph,
    *,
    edge_order: str = "csr",
    node_tensors: Optional[Mapping[str, Tensor]] = None,
    edge_tensors: Optional[Mapping[str, Tensor]] = None,
    extra: Optional[Mapping[str, Any]] = None,
    input_id: Optional[Tensor] = None,
):
    """Assemble the mini-batch of one sample of ``graph``.

    Args:
        out: what :meth:`NeighborSampler.sample` returned.
        graph: the graph it was sampled from.
        edge_order: ``"csr"``: ``e_id`` are positions in ``graph``'s CSR; ``"input"``: positions
            in the ``edge_index`` ``graph`` was built from (``graph.edge_perm[csr position]``,
            PyG's ``e_id``).
        node_tensors: per-node tensors of ``graph`` (``[N, ...]``), sliced by ``n_id``.
        edge_tensors: per-edge tensors in ``edge_order``'s order (``[E, ...]``), sliced by ``e_id``.
        extra: attributes copied as they are (a PyG ``Data``'s graph-level attributes).
        input_id: the batch's ``input_id`` (default ``arange(batch_size)``).

    Returns:
        ``torch_geometric.data.Data`` when PyG is importable, else :class:`MiniBatch`.
    """
    n_id, csr_eid = out.n_id, out.e_id
    e_id = csr_eid if edge_order == "csr" else graph.edge_perm.index_select(0, csr_eid).long()   # int32 at scale
    edge_val = graph.edge_val.index_select(0, csr_eid) if graph.edge_val is not None else None
    # one step: no plans, no tuning; CSR order = edge_index order (identity edge_perm)
    sub = Graph(out.rowptr, out.src, edge_val, n_id.numel(), transient=True,
                edge_perm=torch.arange(out.src.numel(), device=out.src.device))
    # What the backward of an aggregation needs, built here (in the prefetch thread when there is
    # one) rather than inside the training step: the transpose's sort and its host sync, 1/deg.
    sub.set_derived("row", out.dst)
    sub.set_derived("transpose", _transpose(out))
    sub.mean_scale(torch.float32)
    edge_index = torch.stack([out.src, out.dst])
    attach_graph(edge_index, sub)     # layers given batch.edge_index use sub (no sort, no plan)
    batch_size = out.num_sampled_nodes[0]
    attrs: Dict[str, Any] = dict(extra or {})
    for key, value in (node_tensors or {}).items():
        attrs[key] = _take(value, n_id)
    for key, value in (edge_tensors or {}).items():
        attrs[key] = _take(value, e_id)
    if edge_val is not None and "edge_weight" not in attrs:
        attrs["edge_weight"] = edge_val
    attrs.update(
        edge_index=edge_index,
        n_id=n_id,
        e_id=e_id,
        num_nodes=n_id.numel(),
        batch_size=batch_size,
        num_sampled_nodes=list(out.num_sampled_nodes),
        num_sampled_edges=list(out.num_sampled_edges),
        input_id=input_id if input_id is not None else torch.arange(batch_size, device=n_id.device),
        graph=sub,
    )
    data_cls = pyg_data_class()
    return MiniBatch(**attrs) if data_cls is None else data_cls(**attrs)
