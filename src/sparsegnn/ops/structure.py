"""The layers' graph transforms (GCN's self loops and normalisation) on the device's kernels.

``formats/csr.py`` holds the torch implementations (the CPU's, the reference); a graph on a
CUDA device with Triton installed takes ``kernels/csr_structure.py``'s row kernels instead:
~4 launches where the torch ops take ~45, the bulk of a new graph's GCN transform.
"""
from __future__ import annotations

from typing import Callable, Tuple

import torch
from torch import Tensor

from ..formats import csr as csr_fmt
from ..graph import Graph
from ..kernels import interpreting, triton_available


def _on_kernels(t: Tensor) -> bool:
    return t.is_cuda and triton_available() and not interpreting()


def replace_self_loops(graph: Graph, row: Callable[[], Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """``formats.csr.replace_self_loops`` of a square ``graph`` (``row()``: its target per edge,
    asked for only by the torch path).

    Shapes:
        -> ``(rowptr' [N + 1], col' [E'], source [E'])`` (see ``formats.csr.replace_self_loops``).
    """
    if _on_kernels(graph.col):
        from ..kernels import csr_structure

        return csr_structure.replace_self_loops(graph.rowptr, graph.col)
    return csr_fmt.replace_self_loops(graph.rowptr, graph.col, row())


def normalize(graph: Graph, mode: str) -> Graph:
    """``graph.normalize(mode)``: the values ``D^-1/2 A D^-1/2`` (``"sym"``) or ``D^-1 A``
    (``"row"``), ``D`` the weighted in-degree; on the row kernels for fp32 (or no) values that
    need no gradient (the kernels are not differentiable; the torch ops are)."""
    val = graph.edge_val
    needs_grad = val is not None and val.requires_grad and torch.is_grad_enabled()
    if (_on_kernels(graph.col) and not needs_grad
            and (val is None or (val.dtype == torch.float32 and val.dim() == 1))
            and mode in ("sym", "row") and not (mode == "sym" and graph.is_bipartite)):
        from ..kernels import csr_structure

        return graph.with_values(csr_structure.normalize_values(graph.rowptr, graph.col, val, mode))
    return graph.normalize(mode)
