"""The sampler's output record and its cached ``arange`` (shared by ``_core`` and ``_fused``)."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, List

import torch
from torch import Tensor


@dataclass
class SampleOutput:
    """The sampled sub-graph, in local ids, before node and edge attributes are attached.

    Attributes:
        n_id: ``[N_s]`` global id of every local node: the seeds, then each hop's new nodes in
            first-seen order.
        e_id: ``[E_s]`` CSR position (in the sampled graph) of every sampled edge.
        src, dst: ``[E_s]`` local source and target of every sampled edge.  Edges are grouped
            by target: hop by hop, target by target, and within a target by ascending CSR
            position (``dst`` is sorted).
        rowptr: ``[N_s + 1]`` CSR offsets of the sub-graph over ``dst`` (so ``(rowptr, src)``
            is the destination-major CSR of the sub-graph, with no sort).
        num_sampled_nodes: ``[batch_size, new nodes of hop 1, ...]`` (``len(fanouts) + 1`` ints).
        num_sampled_edges: edges sampled at each hop (``len(fanouts)`` ints).
    """

    n_id: Tensor
    e_id: Tensor
    src: Tensor
    dst: Tensor
    rowptr: Tensor
    num_sampled_nodes: List[int]
    num_sampled_edges: List[int]


_ARANGE = threading.local()     # per thread: a thread (e.g. a prefetching one) keeps to one CUDA stream
_ARANGE_MAX = 1 << 24


def _arange(n: int, device: torch.device) -> Tensor:
    """``arange(n)`` as a view of a cached buffer (read-only: never write into it); saves a launch."""
    if n > _ARANGE_MAX:
        return torch.arange(n, device=device)
    buffers: Dict[torch.device, Tensor] = _ARANGE.__dict__.setdefault("buffers", {})
    buf = buffers.get(device)
    if buf is None or buf.numel() < n:
        buf = torch.arange(min(max(n, 2 * (0 if buf is None else buf.numel()), 4096), _ARANGE_MAX), device=device)
        buffers[device] = buf
    return buf[:n]
