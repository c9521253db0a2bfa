"""Seeded random graphs for tests and examples.

``random_graph`` draws uniform edges and then plants the awkward cases every kernel must get
right: isolated nodes (no edges at all), empty rows (nodes with no incoming edge), self loops
and duplicate edges.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


def random_graph(
    num_nodes: int,
    num_edges: int,
    seed: int = 0,
    *,
    num_isolated: int = 0,
    num_empty_rows: int = 0,
    num_self_loops: int = 0,
    num_duplicates: int = 0,
    weighted: bool = False,
    device: Optional[torch.device] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """A seeded random directed multigraph as ``(edge_index, edge_weight)``.

    The last ``num_isolated`` nodes touch no edge; the ``num_empty_rows`` nodes before them
    have outgoing but no incoming edges.  ``num_self_loops`` loops and ``num_duplicates``
    copies of existing edges are appended (so ``E = num_edges + loops + duplicates``).

    Shapes:
        -> edge_index: [2, E] int64, edge_weight: [E] float32 (uniform in [0.5, 1.5)) or None.
    """
    if num_nodes < 0 or num_edges < 0:
        raise ValueError(f"random_graph(): sizes must be >= 0, got {num_nodes} nodes, {num_edges} edges")
    if num_isolated + num_empty_rows > num_nodes:
        raise ValueError("random_graph(): num_isolated + num_empty_rows exceeds num_nodes")
    gen = torch.Generator().manual_seed(seed)
    connected = num_nodes - num_isolated
    targets_hi = connected - num_empty_rows
    if num_edges > 0 and (connected == 0 or targets_hi == 0):
        raise ValueError("random_graph(): no nodes left to carry edges")
    src = torch.randint(0, max(connected, 1), (num_edges,), generator=gen)
    dst = torch.randint(0, max(targets_hi, 1), (num_edges,), generator=gen)
    parts = [torch.stack([src, dst])]
    if num_self_loops:
        loops = torch.randint(0, max(targets_hi, 1), (num_self_loops,), generator=gen)
        parts.append(torch.stack([loops, loops]))
    if num_duplicates and num_edges:
        pick = torch.randint(0, num_edges, (num_duplicates,), generator=gen)
        parts.append(parts[0][:, pick])
    edge_index = torch.cat(parts, dim=1)
    weight = None
    if weighted:
        weight = torch.rand(edge_index.shape[1], generator=gen) + 0.5
    if device is not None:
        edge_index = edge_index.to(device)
        weight = weight.to(device) if weight is not None else None
    return edge_index, weight
