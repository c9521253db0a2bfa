"""Message-passing layers with PyG-compatible signatures.

Each layer takes node features ``x`` and either a :class:`~sparsegnn.Graph` or a PyG
``edge_index`` (row 0 = source, row 1 = target).  The formula in each docstring is the code.

A graph built from an ``edge_index`` (with its transform: GCN's normalisation, GAT's self
loops) is cached process-wide by the identity and version of the tensor, so calling a model
with the same ``edge_index`` every step builds it once and every layer shares it; a Graph
caches its transformed forms on itself (see ``_graph_input``).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops import spmm
from ..ops.attention import agnn_attention, gat_attention
from ._graph_input import GraphInputMixin, as_float_tensor, gcn_normalized, identity, self_looped


class GCNConv(GraphInputMixin, nn.Module):
    r"""Graph convolution (Kipf & Welling):
    :math:`X' = \hat D^{-1/2} (A + I) \hat D^{-1/2} X W + b`, with :math:`\hat D` the
    in-degree of :math:`A + I` (edge weights summed).  Every node ends with one self loop of
    weight 1, or of its existing self loops' summed weight (PyG keeps just one of them).

    Args:
        in_channels, out_channels: feature widths.
        cached: keep the normalised graph of the first call for every later call, whatever the
            graph argument (one fixed graph). Without it, graphs are still cached by the identity
            and version of ``edge_index`` / ``edge_weight``.
        normalize: apply the symmetric normalisation with self loops; otherwise ``X' = A X W + b``.
        bias: learn ``b``.
        backend: sparse backend for the aggregation.

    Shapes:
        x: [N, in_channels]; graph: Graph or edge_index [2, E]; edge_weight: [E] -> [N, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, cached: bool = False, normalize: bool = True,
                 bias: bool = True, backend: str = "auto") -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.cached, self.normalize, self.backend = cached, normalize, backend
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self.reset_cache()

    def forward(self, x: Tensor, graph, edge_weight: Optional[Tensor] = None) -> Tensor:
        as_float_tensor(x, "GCNConv")
        g = self._graph("GCNConv", graph, edge_weight, x.shape[0], gcn_normalized if self.normalize else identity)
        # Aggregate on the narrower side: A (X W) == (A X) W.
        if self.out_channels <= self.in_channels:
            out = spmm(g, self.lin(x), backend=self.backend)
        else:
            out = self.lin(spmm(g, x, backend=self.backend))
        return out + self.bias if self.bias is not None else out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels})"


class SAGEConv(GraphInputMixin, nn.Module):
    r"""GraphSAGE: :math:`x'_i = W_1 \,\mathrm{mean}_{j \to i} x_j + b + W_2 x_i` (``root_weight``).

    ``aggr`` may be ``"mean"``, ``"sum"`` or ``"max"``; ``normalize=True`` L2-normalises the output.

    Shapes:
        x: [N, in_channels] -> [N, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, aggr: str = "mean", root_weight: bool = True,
                 normalize: bool = False, bias: bool = True, backend: str = "auto") -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.aggr, self.root_weight, self.normalize, self.backend = aggr, root_weight, normalize, backend
        self.cached = False
        self.lin_l = nn.Linear(in_channels, out_channels, bias=bias)
        self.lin_r = nn.Linear(in_channels, out_channels, bias=False) if root_weight else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_l.reset_parameters()
        if self.lin_r is not None:
            self.lin_r.reset_parameters()

    def forward(self, x: Tensor, graph, edge_weight: Optional[Tensor] = None) -> Tensor:
        as_float_tensor(x, "SAGEConv")
        g = self._graph("SAGEConv", graph, edge_weight, x.shape[0], identity)
        if self.aggr in ("mean", "sum") and self.out_channels < self.in_channels:
            # Linear aggregations commute with the projection: aggregate the narrower features.
            out = spmm(g, F.linear(x, self.lin_l.weight), reduce=self.aggr, backend=self.backend)
            if self.lin_l.bias is not None:
                out = out + self.lin_l.bias
        else:
            out = self.lin_l(spmm(g, x, reduce=self.aggr, backend=self.backend))
        if self.lin_r is not None:
            out = out + self.lin_r(x)
        return F.normalize(out, p=2.0, dim=-1) if self.normalize else out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, aggr={self.aggr})"


class GINConv(GraphInputMixin, nn.Module):
    r"""Graph isomorphism layer: :math:`x'_i = h_\Theta\big((1 + \epsilon) x_i + \sum_{j \to i} x_j\big)`.

    Args:
        nn_module: the MLP :math:`h_\Theta`.
        eps: initial :math:`\epsilon`; ``train_eps`` makes it learnable.

    Shapes:
        x: [N, F_in] -> [N, F_out of nn_module].
    """

    def __init__(self, nn_module: Callable[[Tensor], Tensor], eps: float = 0.0, train_eps: bool = False,
                 backend: str = "auto") -> None:
        super().__init__()
        self.nn = nn_module
        self.initial_eps, self.backend = eps, backend
        self.cached = False
        if train_eps:
            self.eps = nn.Parameter(torch.tensor([float(eps)]))
        else:
            self.register_buffer("eps", torch.tensor([float(eps)]))

    def reset_parameters(self) -> None:
        if hasattr(self.nn, "reset_parameters"):
            self.nn.reset_parameters()
        self.eps.data.fill_(self.initial_eps)

    def forward(self, x: Tensor, graph, edge_weight: Optional[Tensor] = None) -> Tensor:
        as_float_tensor(x, "GINConv")
        g = self._graph("GINConv", graph, edge_weight, x.shape[0], identity)
        return self.nn((1 + self.eps) * x + spmm(g, x, backend=self.backend))

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(nn={self.nn})"


class AGNNConv(GraphInputMixin, nn.Module):
    r"""Attention-based propagation (Thekumparampil et al.):
    :math:`x'_i = \sum_{j \in N(i) \cup \{i\}} P_{ij} x_j`,
    :math:`P_{ij} = \mathrm{softmax}_j(\beta \cos(x_i, x_j))`.

    Self loops are replaced by exactly one per node. ``requires_grad`` makes ``beta`` learnable.

    Shapes:
        x: [N, F] -> [N, F].
    """

    def __init__(self, requires_grad: bool = True, cached: bool = False, backend: str = "auto") -> None:
        super().__init__()
        self.requires_grad, self.cached, self.backend = requires_grad, cached, backend
        if requires_grad:
            self.beta = nn.Parameter(torch.ones(1))
        else:
            self.register_buffer("beta", torch.ones(1))

    def reset_parameters(self) -> None:
        self.beta.data.fill_(1.0)
        self.reset_cache()

    def forward(self, x: Tensor, graph) -> Tensor:
        as_float_tensor(x, "AGNNConv")
        g = self._graph("AGNNConv", graph, None, x.shape[0], self_looped)
        return agnn_attention(g, x, self.beta, backend=self.backend)   # scores, softmax, sum: fused

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}()"


class GATConv(GraphInputMixin, nn.Module):
    r"""Graph attention (Velickovic et al.), multi-head:
    :math:`x'_i = \Vert_h \sum_{j \in N(i) \cup \{i\}} \alpha^h_{ij} W^h x_j`,
    :math:`\alpha^h_{ij} = \mathrm{softmax}_j\,\mathrm{LeakyReLU}(a^h_{src} \cdot W^h x_j + a^h_{dst} \cdot W^h x_i)`.

    Heads are concatenated (``concat=True``) or averaged.  Self loops are replaced by exactly
    one per node when ``add_self_loops``.  Scores, softmax, attention dropout and the weighted
    sum run as one fused op (:func:`sparsegnn.ops.attention.gat_attention`).

    Shapes:
        x: [N, in_channels] -> [N, heads * out_channels] (concat) or [N, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 bias: bool = True, backend: str = "auto") -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.backend = add_self_loops, backend
        self.cached = False
        self.lin = nn.Linear(in_channels, heads * out_channels, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        width = heads * out_channels if concat else out_channels
        self.bias = nn.Parameter(torch.empty(width)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor, graph) -> Tensor:
        as_float_tensor(x, "GATConv")
        g = self._graph("GATConv", graph, None, x.shape[0], self_looped if self.add_self_loops else identity)
        heads, channels = self.heads, self.out_channels
        h = self.lin(x).view(-1, heads, channels)
        alpha_src = (h * self.att_src).sum(-1)            # [N, H]
        alpha_dst = (h * self.att_dst).sum(-1)            # [N, H]
        # scores, softmax, attention dropout and aggregation of every head: one fused op
        out = gat_attention(g, h, alpha_src, alpha_dst, self.negative_slope,
                            self.dropout if self.training else 0.0, backend=self.backend)   # [N, H, C]
        out = out.reshape(-1, heads * channels) if self.concat else out.mean(dim=1)
        return out + self.bias if self.bias is not None else out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
