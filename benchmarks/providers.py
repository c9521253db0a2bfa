"""Benchmark providers: name -> function building a zero-argument callable for one case.

Every provider computes the same thing as the reference op for the case, so outputs can be
checked against it.  Providers that materialise ``[E, F]`` intermediates (the PyG gather /
scatter path, the gather SDDMM) are the ones that run out of memory on large graphs.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
from torch import Tensor

from sparsegnn.graph import Graph
from sparsegnn.ops import sddmm, spmm


class Inputs:
    """Tensors of one case: graph (with values), dense inputs, and lazily built baselines' forms."""

    def __init__(self, graph: Graph, x: Tensor, y: Optional[Tensor] = None) -> None:
        self.graph, self.x, self.y = graph, x, y
        self._csr: Optional[Tensor] = None

    @property
    def csr(self) -> Tensor:
        if self._csr is None:
            self._csr = self.graph.to_torch_sparse_csr(self.x.dtype)
        return self._csr


def _pyg_scatter_spmm(inp: Inputs, reduce: str) -> Callable[[], Tensor]:
    from torch_geometric.utils import scatter

    g = inp.graph
    row, col, val = g.row, g.col, g.edge_val.to(inp.x.dtype)
    return lambda: scatter(inp.x.index_select(0, col) * val.unsqueeze(-1), row, 0, dim_size=g.num_nodes, reduce=reduce)


def _naive_triton(inp: Inputs) -> Callable[[], Tensor]:
    from sparsegnn.kernels.spmm_csr import spmm_csr

    g = inp.graph
    return lambda: spmm_csr(g.rowptr, g.col, g.edge_val, inp.x)


SPMM_PROVIDERS: Dict[str, Callable[[Inputs, str], Callable[[], Tensor]]] = {
    "sparsegnn": lambda inp, reduce: (lambda: spmm(inp.graph, inp.x, reduce=reduce, backend="triton")),
    "naive-triton": lambda inp, reduce: _naive_triton(inp),
    "cusparse": lambda inp, reduce: (lambda: torch.sparse.mm(inp.csr, inp.x)),
    "pyg-scatter": _pyg_scatter_spmm,
}
#: Which providers compute which reduce.
SPMM_REDUCES = {"sparsegnn": ("sum", "mean", "max"), "naive-triton": ("sum",), "cusparse": ("sum",),
                "pyg-scatter": ("sum", "mean", "max")}


def _sampled_addmm(inp: Inputs) -> Callable[[], Tensor]:
    g = inp.graph
    template = torch.sparse_csr_tensor(g.rowptr, g.col, torch.zeros(g.num_edges, dtype=inp.x.dtype, device=inp.x.device),
                                       (g.num_nodes, g.num_nodes))
    b_t = inp.y.t()
    return lambda: torch.sparse.sampled_addmm(template, inp.x, b_t, beta=0.0).values()


def _gather_dot(inp: Inputs) -> Callable[[], Tensor]:
    g = inp.graph
    return lambda: (inp.x.index_select(0, g.row) * inp.y.index_select(0, g.col)).sum(-1)


SDDMM_PROVIDERS: Dict[str, Callable[[Inputs], Callable[[], Tensor]]] = {
    "sparsegnn": lambda inp: (lambda: sddmm(inp.graph, inp.x, inp.y, "dot", backend="triton")),
    "sampled_addmm": _sampled_addmm,
    "gather": _gather_dot,
}

#: Providers whose working set includes an [E, F] intermediate.
MATERIALISING = {"pyg-scatter", "gather"}
