"""Graph-level models for batches of small graphs: ``ChemGCN`` (molecules) and ``GINClassifier`` (TU sets).

Both take a batch as one block-diagonal Graph with ``ptr`` (``GraphLoader`` batches,
``Graph.batch``, ``load_molecules(...).graph``) and pool per graph with
:func:`sparsegnn.global_pool`.  Their BatchNorm layers are :class:`~sparsegnn.nn.PaddedBatchNorm1d`
(``BatchNorm1d`` that skips padding nodes inside :func:`~sparsegnn.nn.padded_nodes`), so they
train the same on the padded batches of a captured step.
"""
from __future__ import annotations

from typing import List, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check
from ..ops.pool import POOL_REDUCES, global_pool
from .conv import GCNConv, GINConv
from .norm import PaddedBatchNorm1d

__all__ = ["ChemGCN", "GINClassifier"]


def _ptr_of(fn: str, graph, ptr: Optional[Tensor]) -> Tensor:
    ptr = getattr(graph, "ptr", None) if ptr is None else ptr
    check(ptr is not None, fn, "needs the graphs' node offsets: a batch Graph with ptr, or ptr=")
    return ptr


class ChemGCN(nn.Module):
    r"""ChemGCN (the batched-SpMM paper's Tox21 model): graph convolutions, each followed by
    batch normalisation and ReLU, a global pooling per molecule and a dense head to one logit per task:

    .. math::
        H^{(l+1)} = \mathrm{ReLU}(\mathrm{BN}(\hat A H^{(l)} W^{(l)} + b^{(l)})),\quad
        z_g = \mathrm{pool}_{i \in g} H^{(L)}_i,\quad
        \mathrm{logits}_g = W_2\, \mathrm{drop}(\mathrm{ReLU}(W_1 z_g + b_1)) + b_2

    with :math:`\hat A = \hat D^{-1/2} (A + I) \hat D^{-1/2}` (our :class:`GCNConv`).  The paper's
    Tox21 setting is the default (2 layers of 64); :meth:`wide` is its Reaction100 setting
    (3 layers of 512).

    Args:
        in_channels: atom features (``NUM_ATOM_FEATURES`` for ``load_molecules``).
        num_tasks: logits per molecule (Tox21: 12).
        hidden: channels of every graph convolution.
        num_layers: graph convolutions.
        head: width of the dense head's hidden layer.
        pool: ``"sum"``, ``"mean"`` (default) or ``"max"``.
        dropout: in the head.
        batch_norm: BatchNorm after each convolution (as the paper).
        normalize: the convolutions add self loops and normalise (``True``); ``False`` when the
            graph's edge values already are :math:`\hat A` (``GraphDataset.gcn_normalized()``
            batches: the normalisation done once for the dataset instead of per batch).
        backend: sparse backend of the aggregations.

    Shapes:
        x: [N, in_channels]; graph: N nodes, ptr [B + 1] -> [B, num_tasks] logits.
    """

    def __init__(self, in_channels: int, num_tasks: int, hidden: int = 64, num_layers: int = 2, head: int = 128,
                 pool: str = "mean", dropout: float = 0.2, batch_norm: bool = True, normalize: bool = True,
                 backend: str = "auto") -> None:
        super().__init__()
        check(num_layers >= 1, "ChemGCN", f"num_layers must be >= 1, got {num_layers}")
        check(pool in POOL_REDUCES, "ChemGCN", f"pool must be one of {POOL_REDUCES}, got {pool!r}")
        widths = [in_channels] + [hidden] * num_layers
        self.convs = nn.ModuleList(GCNConv(widths[i], hidden, normalize=normalize, backend=backend)
                                   for i in range(num_layers))
        self.norms = nn.ModuleList(PaddedBatchNorm1d(hidden) if batch_norm else nn.Identity() for _ in range(num_layers))
        self.lin1, self.lin2 = nn.Linear(hidden, head), nn.Linear(head, num_tasks)
        self.pool, self.dropout, self.normalize = pool, dropout, normalize

    @classmethod
    def wide(cls, in_channels: int, num_tasks: int, **kwargs) -> "ChemGCN":
        """The paper's wide setting: 3 graph convolutions of 512 channels."""
        kwargs.setdefault("hidden", 512)
        kwargs.setdefault("num_layers", 3)
        return cls(in_channels, num_tasks, **kwargs)

    def embed(self, x: Tensor, graph, ptr: Optional[Tensor] = None) -> Tensor:
        """The pooled molecule vectors :math:`z_g`, ``[B, hidden]``."""
        ptr = _ptr_of("ChemGCN", graph, ptr)
        for conv, norm in zip(self.convs, self.norms):
            x = F.relu(norm(conv(x, graph)))
        return global_pool(x, ptr, self.pool)

    def forward(self, x: Tensor, graph, ptr: Optional[Tensor] = None) -> Tensor:
        z = F.relu(self.lin1(self.embed(x, graph, ptr)))
        return self.lin2(F.dropout(z, self.dropout, self.training))


def _gin_mlp(in_channels: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_channels, hidden), PaddedBatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, hidden))


class GINClassifier(nn.Module):
    r"""GIN for graph classification as in the GIN paper (Xu et al. 2019, its published code):
    ``num_layers - 1`` GIN layers, each an MLP of two linear layers with BatchNorm,
    then BatchNorm and ReLU:

    .. math::
        h^{(l+1)}_i = \mathrm{ReLU}\big(\mathrm{BN}(\mathrm{MLP}^{(l)}((1 + \epsilon) h^{(l)}_i + \textstyle\sum_{j \to i} h^{(l)}_j))\big)

    and a readout of every layer, the input features included (:math:`l = 0 .. L-1`):

    .. math::
        \mathrm{logits}_g = \textstyle\sum_l \mathrm{drop}\big(W^{(l)} \mathrm{pool}_{i \in g} h^{(l)}_i + b^{(l)}\big)

    Args:
        in_channels: node features; ``num_classes``: logits per graph.
        hidden: width of every GIN layer (64).
        num_layers: layers counting the input (5: four GIN layers, five readouts).
        dropout: on each readout's logits (0.5).
        pool: ``"sum"`` (the paper's), ``"mean"`` or ``"max"``.
        train_eps: learn :math:`\epsilon` (GIN-:math:`\epsilon`); default GIN-0.
        backend: sparse backend of the aggregations.

    Shapes:
        x: [N, in_channels]; graph: N nodes, ptr [B + 1] -> [B, num_classes] logits.
    """

    def __init__(self, in_channels: int, num_classes: int, hidden: int = 64, num_layers: int = 5,
                 dropout: float = 0.5, pool: str = "sum", train_eps: bool = False, backend: str = "auto") -> None:
        super().__init__()
        check(num_layers >= 2, "GINClassifier", f"num_layers must be >= 2 (input + one GIN layer), got {num_layers}")
        check(pool in POOL_REDUCES, "GINClassifier", f"pool must be one of {POOL_REDUCES}, got {pool!r}")
        widths: List[int] = [in_channels] + [hidden] * (num_layers - 1)
        self.convs = nn.ModuleList(GINConv(_gin_mlp(widths[i], hidden), train_eps=train_eps, backend=backend)
                                   for i in range(num_layers - 1))
        self.norms = nn.ModuleList(PaddedBatchNorm1d(hidden) for _ in range(num_layers - 1))
        self.heads = nn.ModuleList(nn.Linear(w, num_classes) for w in widths)
        self.pool, self.dropout = pool, dropout

    def forward(self, x: Tensor, graph, ptr: Optional[Tensor] = None) -> Tensor:
        ptr = _ptr_of("GINClassifier", graph, ptr)
        out = F.dropout(self.heads[0](global_pool(x, ptr, self.pool)), self.dropout, self.training)
        for conv, norm, head in zip(self.convs, self.norms, self.heads[1:]):
            x = F.relu(norm(conv(x, graph)))
            out = out + F.dropout(head(global_pool(x, ptr, self.pool)), self.dropout, self.training)
        return out
