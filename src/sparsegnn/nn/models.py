"""Reference GNN models with the papers' settings.

- ``GCN``: 2 layers, 16 hidden (Kipf & Welling; TC-GNN's setting).
- ``AGNN``: 4 layers, 32 hidden: input projection, ``num_layers - 2`` attention propagations,
  output projection (TC-GNN's setting; the AGNN paper's architecture).
- ``GraphSAGE`` / ``GIN`` / ``GAT``: full-batch models as in MaxK-GNN (hidden 256, LayerNorm
  after every hidden layer, dropout).
- ``MaxKGNN``: MaxK-GNN's model (input projection, ``num_layers`` convolutions with the MaxK
  nonlinearity or its ReLU baseline, LayerNorm, output projection).

``precision`` (GCN, AGNN, GraphSAGE, GIN): ``"ieee"`` (default, exact), ``"tf32"`` or ``"bf16"``
for every layer's sum / mean aggregation (see :func:`sparsegnn.spmm`).

``replay`` (GCN, AGNN, GraphSAGE, GIN, GAT, MaxKGNN): training steps on a CUDA graph that call the model
with the same ``x`` and :class:`~sparsegnn.Graph` replay its forward and backward from CUDA
graphs after two eager calls (None: when the forward keeps at most ``nn.replay.default_budget``
alive, 1/64 of the device's memory and at least 512 MiB; True: always; False: never).  See :mod:`sparsegnn.nn.replay`.
"""
from __future__ import annotations

from typing import List, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check
from ..ops.dropout import dropout
from ..ops.maxk import layer_norm_maxk
from .conv import AGNNConv, GATConv, GCNConv, GINConv, SAGEConv
from .maxk import MaxKGCNConv, MaxKGINConv, MaxKSAGEConv
from .replay import Replayable


class GCN(Replayable):
    """Logits ``A_hat relu(A_hat drop(X) W1) W2`` with dropout before each layer.

    Shapes:
        x: [N, in_channels] -> [N, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, hidden: int = 16, dropout: float = 0.5,
                 backend: str = "auto", precision: str = "ieee", replay: Optional[bool] = None) -> None:
        super().__init__(replay)
        self.dropout = dropout
        self.conv1 = GCNConv(in_channels, hidden, cached=True, backend=backend, precision=precision)
        self.conv2 = GCNConv(hidden, out_channels, cached=True, backend=backend, precision=precision)

    def _forward(self, x: Tensor, graph) -> Tensor:
        x = dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(x, graph))
        x = dropout(x, self.dropout, self.training)
        return self.conv2(x, graph)


class AGNN(Replayable):
    """``lin_out(prop_L(...prop_1(relu(lin_in(drop(X))))))`` with ``L = num_layers - 2`` AGNNConv.

    The first propagation has a fixed ``beta`` (as in the AGNN paper), the rest learn it.

    Shapes:
        x: [N, in_channels] -> [N, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, hidden: int = 32, num_layers: int = 4,
                 dropout: float = 0.5, backend: str = "auto", precision: str = "ieee",
                 replay: Optional[bool] = None) -> None:
        super().__init__(replay)
        if num_layers < 3:
            raise ValueError(f"AGNN(): num_layers must be >= 3 (input, propagation, output), got {num_layers}")
        self.dropout = dropout
        self.lin_in = nn.Linear(in_channels, hidden)
        self.props = nn.ModuleList(
            [AGNNConv(requires_grad=i > 0, cached=True, backend=backend, precision=precision)
             for i in range(num_layers - 2)]
        )
        self.lin_out = nn.Linear(hidden, out_channels)

    def _forward(self, x: Tensor, graph) -> Tensor:
        x = dropout(x, self.dropout, self.training)
        x = F.relu(self.lin_in(x))
        for prop in self.props:
            x = prop(x, graph)
        x = dropout(x, self.dropout, self.training)
        return self.lin_out(x)


class _NormedStack(Replayable):
    """``num_layers`` conv layers; LayerNorm + ReLU + dropout after every one but the last."""

    def __init__(self, convs: List[nn.Module], hidden: int, dropout: float, norm: bool,
                 replay: Optional[bool] = None) -> None:
        super().__init__(replay)
        self.convs = nn.ModuleList(convs)
        self.norms = nn.ModuleList([nn.LayerNorm(hidden) if norm else nn.Identity() for _ in convs[:-1]])
        self.dropout = dropout

    def _forward(self, x: Tensor, graph) -> Tensor:
        """``graph``: one graph for every layer, or a list of one graph per layer
        (``sampling.layer_graphs(batch)``: layer ``l`` then computes only its graph's targets,
        ``conv((x[:g.num_src], x[:g.num_nodes]), g)``)."""
        if isinstance(graph, (list, tuple)):
            check(len(graph) == len(self.convs), type(self).__name__,
                  f"got {len(graph)} layer graphs for {len(self.convs)} layers")
        for i, (conv, norm) in enumerate(zip(self.convs[:-1], self.norms)):
            x = dropout(F.relu(norm(_layer(conv, x, graph, i))), self.dropout, self.training)
        return _layer(self.convs[-1], x, graph, len(self.convs) - 1)


def _layer(conv: nn.Module, x: Tensor, graph, i: int) -> Tensor:
    """Layer ``i`` on one shared graph, or on its own graph of a per-layer list (bipartite)."""
    if not isinstance(graph, (list, tuple)):
        return conv(x, graph)
    g = graph[i]
    return conv((x[:g.num_src], x[:g.num_nodes]), g)


def _widths(in_channels: int, hidden: int, out_channels: int, num_layers: int) -> List[int]:
    if num_layers < 1:
        raise ValueError(f"model(): num_layers must be >= 1, got {num_layers}")
    return [in_channels] + [hidden] * (num_layers - 1) + [out_channels]


class GraphSAGE(_NormedStack):
    """Stack of mean-aggregating ``SAGEConv`` (hidden 256, LayerNorm, dropout 0.5 by default).

    Shapes:
        x: [N, in_channels] -> [N, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, hidden: int = 256, num_layers: int = 3,
                 dropout: float = 0.5, norm: bool = True, backend: str = "auto", precision: str = "ieee",
                 replay: Optional[bool] = None) -> None:
        w = _widths(in_channels, hidden, out_channels, num_layers)
        convs = [SAGEConv(w[i], w[i + 1], backend=backend, precision=precision) for i in range(num_layers)]
        super().__init__(convs, hidden, dropout, norm, replay)


class GIN(_NormedStack):
    """Stack of ``GINConv`` with 2-layer MLPs (hidden 256, LayerNorm, dropout 0.5 by default).

    Shapes:
        x: [N, in_channels] -> [N, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, hidden: int = 256, num_layers: int = 3,
                 dropout: float = 0.5, norm: bool = True, backend: str = "auto", precision: str = "ieee",
                 replay: Optional[bool] = None) -> None:
        w = _widths(in_channels, hidden, out_channels, num_layers)
        convs = [
            GINConv(nn.Sequential(nn.Linear(w[i], w[i + 1]), nn.ReLU(), nn.Linear(w[i + 1], w[i + 1])), backend=backend,
                    precision=precision)
            for i in range(num_layers)
        ]
        super().__init__(convs, hidden, dropout, norm, replay)


class GAT(Replayable):
    """Two-layer GAT (8 heads x 8 hidden, ELU, dropout 0.6 on features and attention).

    Shapes:
        x: [N, in_channels] -> [N, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, hidden: int = 8, heads: int = 8,
                 dropout: float = 0.6, backend: str = "auto", replay: Optional[bool] = None) -> None:
        super().__init__(replay)
        self.dropout = dropout
        self.conv1 = GATConv(in_channels, hidden, heads=heads, dropout=dropout, backend=backend)
        self.conv2 = GATConv(hidden * heads, out_channels, heads=1, dropout=dropout, backend=backend)

    def _forward(self, x: Tensor, graph) -> Tensor:
        x = dropout(x, self.dropout, self.training)
        x = F.elu(self.conv1(x, graph))
        x = dropout(x, self.dropout, self.training)
        return self.conv2(x, graph)


#: ``conv=`` of :class:`MaxKGNN` and ``nonlinearity=``.
MAXK_CONVS = ("sage", "gcn", "gin")
NONLINEARITIES = ("maxk", "relu")


def _fusable(norm: nn.Module) -> bool:
    """Whether ``layer_norm_maxk`` may stand in for ``norm``: a plain affine ``nn.LayerNorm`` over the
    last dimension with no hooks (a subclass's forward or a hook would be skipped)."""
    return (type(norm) is nn.LayerNorm and norm.weight is not None and len(norm.normalized_shape) == 1
            and not (norm._forward_hooks or norm._forward_pre_hooks))


class MaxKGNN(Replayable):
    r"""MaxK-GNN's model: ``lin_in``, ``num_layers`` hidden layers each followed by LayerNorm, ``lin_out``.

    :math:`\sigma` below is MaxK (``nonlinearity="maxk"``: the ``k`` largest entries per row,
    dropout on the kept values, the CBSR aggregated by the MaxK convs) or ReLU (``"relu"``: the
    paper's baseline, the same structure with dense dropout; its ``lin_in`` has a bias, MaxK's none).

    * Default: :math:`h \leftarrow \mathrm{LN}(\mathrm{conv}(\mathrm{drop}(\sigma(h))))` for every
      conv, the linear maps after the aggregation (:class:`~sparsegnn.nn.MaxKSAGEConv`,
      :class:`~sparsegnn.nn.MaxKGCNConv`, :class:`~sparsegnn.nn.MaxKGINConv` with MaxK; the plain
      ``SAGEConv`` / ``GCNConv`` / ``GINConv`` after ReLU and dropout for the baseline).  This is
      the authors' SAGE model.  Between two MaxK convs a plain ``nn.LayerNorm`` (affine, no hooks)
      and the next selection run as one op (:func:`sparsegnn.layer_norm_maxk`: the normalised
      matrix is never written), equal to ``norm`` followed by the conv's own ``maxk`` (in fp16 /
      bf16 up to which of the entries that tie after rounding are kept: the fused op ranks in fp32).
    * ``linear_first=True`` with ``conv="gcn"`` / ``"gin"``: the authors' GCN / GIN models (the
      paper's Eq. 3: the aggregation takes "the feature map post linear layer and the MaxK
      nonlinearity"): ``lin_in`` then ReLU, and per layer
      :math:`h \leftarrow \mathrm{LN}(\mathrm{aggr}(\mathrm{drop}(\sigma(h W))))`, an aggregation
      without weight after the nonlinearity (the MaxK convs with ``linear_first``, or their ReLU
      twins), GIN with a learned :math:`\epsilon`.  SAGE has no such option: its placement is the authors'.

    Convs (``hidden -> hidden``): ``"sage"`` mean-aggregating GraphSAGE (root weight, bias),
    ``"gcn"`` GCN (self loops, symmetric normalisation, bias), ``"gin"`` GIN with
    :math:`h_\Theta` = one ``Linear(hidden, hidden)`` (GIN-0 by default).  ``lin_in`` /
    ``lin_out`` are ``torch.nn.Linear``; the defaults are MaxK-GNN's Table 3 (3 layers, hidden
    256, dropout 0.5, k = 32 of 256).  The two nonlinearities have the same ``state_dict`` keys
    and shapes but one: under MaxK ``lin_in`` has no bias.

    Why no bias under MaxK: MaxK ranks the entries of each row, and a per-unit offset moves a
    unit's rank in every row alike. torch's default ``Linear`` init draws a bias as wide as one
    weight, while ``W x`` on a row-normalised sparse input (bag-of-words: Cora, Citeseer) averages
    some 20-30 weights: the bias outweighs it, nearly every node keeps the same ``k`` units, and
    the others, never kept, get no gradient (Citeseer, k = 32 of 256: 54-57 units ever kept after
    training with the bias, 227-230 without). A zero-initialised bias does not help: Adam moves it
    as fast as a weight. The ReLU model keeps its bias, which it needs (Cora, 30 seeds: 0.63 points
    lower without it); the gradient reaches every positive unit there. With ``linear_first`` the
    same holds for GCN (its linear map has no bias); GIN's first ``h_\Theta`` keeps its bias, which
    still outweighs its small input on such features (removing it gave no test gain on Citeseer,
    CPU, 5 seeds: ``docs/design/maxk.md``).

    Args:
        in_channels: input feature width.
        out_channels: classes (logit width).
        conv: ``"sage"``, ``"gcn"`` or ``"gin"``.
        hidden: hidden width (the width MaxK selects from).
        num_layers: convolutions (``>= 1``).
        k: entries kept per row by MaxK, ``1 <= k <= hidden`` (unused with ``"relu"``).
        dropout: dropout after the nonlinearity (on the kept values with MaxK).
        norm: LayerNorm after every conv (else identity).
        nonlinearity: ``"maxk"`` or ``"relu"``.
        backend: sparse backend of the aggregations.
        linear_first: GCN / GIN as the authors' models (above); not with SAGE (a ``ValueError``).
        replay: replay the forward and backward from CUDA graphs (module doc; None: auto). A
            step on a graph of up to a few million edges is host-bound in eager mode (MaxK's
            more so: its selection, CBSR aggregations and root terms are more ops than a ReLU;
            on small graphs its eager layers aggregate the dense selection instead, at the
            ReLU's ops plus one selection launch), so the replay is what lets MaxK's smaller GPU
            work show in the step time.

    Shapes:
        x: [N, in_channels]; graph: anything the convs take -> [N, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, conv: str = "sage", hidden: int = 256,
                 num_layers: int = 3, k: int = 32, dropout: float = 0.5, norm: bool = True,
                 nonlinearity: str = "maxk", backend: str = "auto", linear_first: bool = False,
                 replay: Optional[bool] = None) -> None:
        super().__init__(replay)
        fn = "MaxKGNN"
        check(conv in MAXK_CONVS, fn, f"conv must be one of {MAXK_CONVS}, got {conv!r}")
        check(nonlinearity in NONLINEARITIES, fn, f"nonlinearity must be one of {NONLINEARITIES}, got {nonlinearity!r}")
        check(isinstance(hidden, int) and hidden >= 1, fn, f"hidden must be a positive int, got {hidden!r}")
        check(isinstance(num_layers, int) and num_layers >= 1, fn, f"num_layers must be >= 1, got {num_layers!r}")
        check(0.0 <= dropout < 1.0, fn, f"dropout must be in [0, 1), got {dropout!r}")
        if nonlinearity == "maxk":
            check(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= hidden, fn,
                  f"k must be an int in [1, hidden = {hidden}], got {k!r}")
        self.conv, self.nonlinearity, self.dropout = conv, nonlinearity, float(dropout)
        check(not (linear_first and conv == "sage"), fn,
              "linear_first places MaxK after GCN's / GIN's linear map; SAGE's placement is already the "
              "authors' (MaxK before the aggregation and its linear maps)")
        self.linear_first = bool(linear_first)
        self.k = k if nonlinearity == "maxk" else None
        # MaxK's lin_in has no bias, ReLU's has one (the class doc says why)
        self.lin_in = nn.Linear(in_channels, hidden, bias=nonlinearity == "relu")
        self.convs = nn.ModuleList([self._make_conv(conv, hidden, backend) for _ in range(num_layers)])
        self.norms = nn.ModuleList([nn.LayerNorm(hidden) if norm else nn.Identity() for _ in range(num_layers)])
        self.lin_out = nn.Linear(hidden, out_channels)

    def reset_parameters(self) -> None:
        """Re-initialise every layer (``lin_in`` stays without a bias under MaxK: the class doc says why)."""
        for module in (self.lin_in, *self.convs, *self.norms, self.lin_out):
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def _make_conv(self, conv: str, hidden: int, backend: str) -> nn.Module:
        k, p = (self.k if self.nonlinearity == "maxk" else None), self.dropout
        if self.linear_first:       # the authors' GCN / GIN; k None: the convs' ReLU twins
            if conv == "gcn":
                return MaxKGCNConv(hidden, hidden, k, dropout=p, backend=backend, linear_first=True)
            return MaxKGINConv(nn.Linear(hidden, hidden), k, dropout=p, train_eps=True, backend=backend,
                               linear_first=True)
        if k is not None:
            if conv == "sage":
                return MaxKSAGEConv(hidden, hidden, k, dropout=p, backend=backend)
            if conv == "gcn":
                return MaxKGCNConv(hidden, hidden, k, dropout=p, backend=backend)
            return MaxKGINConv(nn.Linear(hidden, hidden), k, dropout=p, backend=backend)
        if conv == "sage":
            return SAGEConv(hidden, hidden, backend=backend)
        if conv == "gcn":
            return GCNConv(hidden, hidden, backend=backend)
        return GINConv(nn.Linear(hidden, hidden), backend=backend)

    def _forward(self, x: Tensor, graph) -> Tensor:
        x = self.lin_in(x)
        if self.linear_first:       # the convs begin with a linear map: the authors' input ReLU
            x = F.relu(x)
        # MaxK on the input of the next conv: its LayerNorm and selection fused (the normalised
        # matrix is never written; ``layer_norm_maxk``), the conv applying the dropout; not where
        # the convs aggregate the dense selection (an eager call on a small graph: ``dense_path``)
        fuse = (self.nonlinearity == "maxk" and not self.linear_first
                and not self.convs[0].dense_path(x, graph))
        last = len(self.convs) - 1
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            if self.nonlinearity == "relu" and not self.linear_first:
                x = conv(dropout(F.relu(x), self.dropout, self.training), graph)
            else:                   # the nonlinearity and dropout inside the conv (x a CBSR when fused)
                x = conv(x, graph)
            if fuse and i < last and _fusable(norm):
                x = layer_norm_maxk(x, self.k, norm.weight, norm.bias, norm.eps,
                                    backend=self.convs[i + 1].backend)
            else:
                x = norm(x)
        return self.lin_out(x)

    def extra_repr(self) -> str:
        k = f", k={self.k}" if self.k is not None else ""
        first = ", linear_first=True" if self.linear_first else ""
        return f"conv={self.conv!r}, nonlinearity={self.nonlinearity!r}{k}, dropout={self.dropout}{first}"
