"""Halo exchange: the rows of remote neighbours, fetched once per layer, with their gradients sent back.

Rank ``r`` owns nodes ``part.nodes``; its edges read ``h`` halo rows owned by other ranks
(``part.halo``, grouped by owner).  Per layer, every rank sends the rows its neighbours need
(``part.send_idx``, grouped by destination) with one ``all_to_all_single`` and receives its halo
in the order of ``part.halo``.  The aggregation of the inner edges (source owned) runs while the
exchange is in flight; the halo edges are aggregated when it has landed:

.. math::
    Y = A_{\\text{inner}} H_{\\text{own}} + A_{\\text{halo}} H_{\\text{halo}}

Backward: :math:`dH_{\\text{own}} = A_{\\text{inner}}^T dY + \\text{scatter}(\\text{send}, dH_{\\text{halo}})`
where the halo's gradient :math:`A_{\\text{halo}}^T dY` goes back to its owners by the reverse
``all_to_all_single`` and is added into the rows they sent.

Works with any ``torch.distributed`` backend that has ``all_to_all_single`` (NCCL on GPUs, gloo
on CPUs).  Bytes per exchange: ``(sum of halo sizes) * F * element size`` over all ranks.
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from ..ops.spmm import spmm

__all__ = ["HaloExchange"]


class _Pending:
    """An exchange in flight: the receive buffer and the work handle to wait on."""

    __slots__ = ("recv", "work")

    def __init__(self, recv: Tensor, work) -> None:
        self.recv, self.work = recv, work


class _Start(torch.autograd.Function):
    """Forward: post the exchange (async) and return the receive buffer, filled once ``_Wait`` ran.
    Backward: send the halo's gradient back to its owners and add it into the rows they sent."""

    @staticmethod
    def forward(ctx, own: Tensor, ex: "HaloExchange", pending: List[_Pending]) -> Tensor:
        send = own.index_select(0, ex.send_idx).contiguous()
        recv = own.new_empty((ex.num_halo, own.shape[1]))
        work = dist.all_to_all_single(recv, send, ex.recv_counts, ex.send_counts, group=ex.group, async_op=True)
        pending.append(_Pending(recv, work))
        ctx.ex, ctx.rows = ex, own.shape[0]
        ex.bytes_sent += send.numel() * send.element_size()
        return recv

    @staticmethod
    def backward(ctx, grad_recv: Tensor):
        ex = ctx.ex
        grad_send = grad_recv.new_empty((ex.send_idx.numel(), grad_recv.shape[1]))
        dist.all_to_all_single(grad_send, grad_recv.contiguous(), ex.send_counts, ex.recv_counts, group=ex.group)
        ex.bytes_sent += grad_recv.numel() * grad_recv.element_size()
        grad_own = grad_recv.new_zeros((ctx.rows, grad_recv.shape[1])).index_add_(0, ex.send_idx, grad_send)
        return grad_own, None, None


class _Wait(torch.autograd.Function):
    """Forward: wait for the exchange ``_Start`` posted; the received rows pass through."""

    @staticmethod
    def forward(ctx, recv: Tensor, pending: List[_Pending]) -> Tensor:
        pending.pop().work.wait()
        return recv.view_as(recv)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class HaloExchange:
    """The exchange plan of one rank's :class:`~sparsegnn.distributed.partition.Part` and the
    aggregation over its local graph with the exchange overlapped.

    Args:
        part: this rank's part (its ``graph``, ``send_idx`` / ``send_ptr``, ``halo_ptr``).
        device: where the features live (the part's index tensors are moved there).
        group: the process group (default: the world).

    Attributes:
        bytes_sent: bytes this rank has sent so far (forward rows and backward gradients).

    Shapes:
        own: [n, F] rows of the owned nodes -> aggregate: [n, F].
    """

    def __init__(self, part, device, group=None) -> None:
        self.part, self.group = part, group
        self.send_idx = part.send_idx.to(device)
        self.send_counts = part.send_ptr.diff().tolist()
        self.recv_counts = part.halo_ptr.diff().tolist()
        self.num_halo = int(part.halo.numel())
        self.inner = part.inner_graph().to(device)
        self.halo = part.halo_graph().to(device) if self.num_halo else None
        self.bytes_sent = 0
        # a world of one rank, or a part with nothing to send or receive, still joins every
        # collective: all ranks call all_to_all_single together, whatever their counts
        self.world = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1

    def fetch(self, own: Tensor, pending: List[_Pending]) -> Tensor:
        """Post the exchange of ``own``'s rows; the returned halo rows are valid after ``wait``."""
        return _Start.apply(own, self, pending)

    def aggregate(self, own: Tensor, reduce: str = "sum", weight_values: bool = True) -> Tensor:
        """``A [own; halo]`` over the local graph, the inner edges while the halo is in flight.

        ``reduce``: ``"sum"`` (edge values as weights when ``weight_values`` and the graph has them)
        or ``"mean"`` (over each row's local edges: every edge of an owned target is local, so
        this is the global mean).
        """
        if not self.world:
            return spmm(self.inner, own, reduce=reduce, edge_weight=None if weight_values else _ones(self.inner))
        pending: List[_Pending] = []
        recv = self.fetch(own, pending)
        inner = spmm(self.inner, own, reduce="sum",
                     edge_weight=None if weight_values else _ones(self.inner))
        halo_rows = _Wait.apply(recv, pending)
        out = inner
        if self.halo is not None:
            out = out + spmm(self.halo, halo_rows, reduce="sum",
                             edge_weight=None if weight_values else _ones(self.halo))
        if reduce == "mean":
            out = out * self.inv_degree(own.dtype)
        return out

    def inv_degree(self, dtype: torch.dtype) -> Tensor:
        """``1 / max(local in-degree, 1)`` per owned row, ``[n, 1]``."""
        degree = self.inner.in_degree() + (self.halo.in_degree() if self.halo is not None else 0)
        return degree.to(dtype).clamp(min=1.0).reciprocal().unsqueeze(1)


def _ones(graph) -> Optional[Tensor]:
    """Unit weights for a graph with values whose values must be ignored (None if it has none)."""
    if graph.edge_val is None:
        return None
    return torch.ones_like(graph.edge_val)
