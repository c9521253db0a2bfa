"""GCN and GraphSAGE over a partitioned graph: every layer aggregates through the halo exchange.

Each rank holds the rows of its owned nodes; a layer's aggregation reads remote neighbours
through :class:`~sparsegnn.distributed.halo.HaloExchange`.  The math is that of the one-GPU
models (PyG's ``GCNConv`` with a precomputed normalisation, ``SAGEConv`` with mean
aggregation), so a model trained on P ranks computes the same losses as on one.  The dense
transform runs before the exchange when it narrows the rows (fewer bytes on the links):
:math:`A (X W) = (A X) W`.
"""
from __future__ import annotations

from typing import List

import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check
from .halo import HaloExchange

__all__ = ["DistGCN", "DistGraphSAGE", "DIST_MODELS", "build_dist_model"]


class _GCNLayer(nn.Module):
    """:math:`Y = \\hat A X W + b` with :math:`\\hat A`'s values on the edges (normalised globally)."""

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(f_in, f_out, bias=False)
        self.bias = nn.Parameter(self.lin.weight.new_zeros(f_out))
        nn.init.xavier_uniform_(self.lin.weight)

    def forward(self, x: Tensor, ex: HaloExchange) -> Tensor:
        if self.lin.out_features <= self.lin.in_features:
            return ex.aggregate(self.lin(x)) + self.bias
        return self.lin(ex.aggregate(x)) + self.bias


class _SAGELayer(nn.Module):
    """PyG's ``SAGEConv`` (mean): :math:`y_i = W_l \\operatorname{mean}_{j \\to i} x_j + b + W_r x_i`."""

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.lin_l = nn.Linear(f_in, f_out)
        self.lin_r = nn.Linear(f_in, f_out, bias=False)

    def forward(self, x: Tensor, ex: HaloExchange) -> Tensor:
        if self.lin_l.out_features < self.lin_l.in_features:
            agg = ex.aggregate(F.linear(x, self.lin_l.weight), reduce="mean", weight_values=False) + self.lin_l.bias
        else:
            agg = self.lin_l(ex.aggregate(x, reduce="mean", weight_values=False))
        return agg + self.lin_r(x)


class _DistModel(nn.Module):
    layer = _GCNLayer

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int = 2,
                 dropout: float = 0.5) -> None:
        super().__init__()
        check(num_layers >= 1, type(self).__name__, f"num_layers must be >= 1, got {num_layers}")
        widths: List[int] = [in_channels] + [hidden] * (num_layers - 1) + [out_channels]
        self.layers = nn.ModuleList(self.layer(widths[i], widths[i + 1]) for i in range(num_layers))
        self.dropout = dropout

    def forward(self, x: Tensor, ex: HaloExchange) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = F.dropout(x, self.dropout, self.training)
            x = layer(x, ex)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


class DistGCN(_DistModel):
    """GCN over a partitioned graph whose edge values are :math:`\\hat D^{-1/2}(A + I)\\hat D^{-1/2}`
    (normalised on the whole graph before partitioning).

    Shapes:
        x: [n, in_channels] (this rank's rows) -> [n, out_channels].
    """

    layer = _GCNLayer


class DistGraphSAGE(_DistModel):
    """GraphSAGE (mean) over a partitioned graph.

    Shapes:
        x: [n, in_channels] (this rank's rows) -> [n, out_channels].
    """

    layer = _SAGELayer


#: ``--model`` names of the distributed models.
DIST_MODELS = {"gcn": DistGCN, "sage": DistGraphSAGE}


def build_dist_model(name: str, in_channels: int, hidden: int, out_channels: int, num_layers: int,
                     dropout: float) -> nn.Module:
    """``"gcn"`` or ``"sage"``."""
    check(name in DIST_MODELS, "build_dist_model", f"model must be one of {sorted(DIST_MODELS)}, got {name!r}")
    return DIST_MODELS[name](in_channels, hidden, out_channels, num_layers, dropout)
