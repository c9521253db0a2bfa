"""``SAGEConv``: PyG 2.8's GraphSAGE layer, every option and input form, on the SpMM."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_precision
from ._graph_input import GraphInputMixin, graph_kind, identity
from ._inputs import (Features, GraphArg, message_passing_options, node_counts, propagate,
                      split_features, unsupported)
from ._linear import Linear

__all__ = ["SAGEConv"]


#: GEMM flops worth one byte gathered by an aggregation (fp32 tensor-free GEMM rate over the
#: gather's effective bandwidth: ~40 TFLOP/s vs ~2.5 TB/s on an H100; the CPU ratio is similar).
FLOPS_PER_BYTE = 16


def _project_first(graph, width: int, out: int) -> bool:
    r"""Whether ``A (X W^T)`` is cheaper than ``(A X) W^T`` for the mean / sum aggregation.

    Cost in flop units: projecting first multiplies all :math:`S` source rows and gathers
    :math:`E` rows of ``out`` floats, :math:`2 S w o + 4 c E o`; aggregating first gathers
    :math:`E` rows of ``width`` floats and multiplies the :math:`T` target rows,
    :math:`2 T w o + 4 c E w` (:math:`c` = ``FLOPS_PER_BYTE``).  On a square graph
    (:math:`S = T`) that is ``out < width``; on a trimmed mini-batch layer (few targets, many
    sources: ``sampling.layer_graphs``) aggregating the wide input first can be 2-5x cheaper.
    """
    gather = 4 * FLOPS_PER_BYTE * graph.num_edges
    return 2 * graph.num_src * width * out + gather * out < 2 * graph.num_nodes * width * out + gather * width


class SAGEConv(GraphInputMixin, nn.Module):
    r"""GraphSAGE, PyG's ``SAGEConv``:
    :math:`x'_i = W_1 x_i + W_2 \,\mathrm{aggr}_{j \to i}\, x_j + b` (``lin_r`` = :math:`W_1`,
    ``lin_l`` = :math:`W_2, b`), optionally :math:`\ell_2`-normalised.

    With ``project=True`` the sources are first projected, :math:`x_j \leftarrow
    \mathrm{ReLU}(W_3 x_j + b_3)` (``lin``).  Bipartite: ``x = (x_src, x_dst)``, the graph's
    ``edge_index[0]`` indexes ``x_src`` and ``edge_index[1]`` indexes ``x_dst``; ``x_dst=None``
    drops the root term.  A torch sparse ``adj_t`` (and a Graph's ``edge_val``) weighs the
    messages, :math:`w_{ji} x_j`; a ``SparseTensor``'s values are dropped (as in PyG).  The
    linear aggregations ("mean", "sum") run on the narrower side of ``lin_l``.

    Args:
        in_channels: input width, ``-1`` (lazy), or ``(source width, target width)``.
        out_channels: output width.
        aggr: ``"mean"`` (default), ``"sum"``/``"add"``, ``"max"`` or ``"min"``; an
            ``Aggregation`` object or a list raises ``ValueError``.
        normalize: :math:`\ell_2`-normalise the output rows.
        root_weight: add :math:`W_1 x_i`.
        project: project the sources first (needs a known source width).
        bias: learn ``b``.
        aggr_kwargs, flow, decomposed_layers: PyG's ``MessagePassing`` arguments; only their
            defaults are supported.
        node_dim: node dimension of the features (default -2: ``[..., N, F]``).
        backend: sparse backend of the aggregation.
        precision: ``"ieee"`` (default: exact), ``"tf32"`` or ``"bf16"``: the sum / mean
            aggregation on tensor cores where the tuner finds it faster (see
            :func:`sparsegnn.spmm`; max / min stay exact).

    Shapes:
        x: [N, F] or ([M, F_s], [N, F_t] or None), optionally with leading batch dimensions;
        size: (M, N) -> [N, out_channels].
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, aggr="mean",
                 normalize: bool = False, root_weight: bool = True, project: bool = False, bias: bool = True, *,
                 aggr_kwargs: Optional[dict] = None, flow: str = "source_to_target", node_dim: int = -2,
                 decomposed_layers: int = 1, backend: str = "auto", precision: str = "ieee") -> None:
        super().__init__()
        self.reduce = message_passing_options("SAGEConv", aggr, aggr_kwargs, flow, decomposed_layers, node_dim=node_dim)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.aggr, self.normalize, self.root_weight, self.project = aggr, normalize, root_weight, project
        self.flow, self.node_dim, self.backend = flow, node_dim, backend
        self.precision = check_precision("SAGEConv", precision)
        self.cached = False
        widths = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        if project:
            if widths[0] <= 0:
                raise unsupported("SAGEConv", "in_channels", in_channels,
                                  "project=True needs the source width (no lazy initialisation, as in PyG)")
            self.lin = Linear(widths[0], widths[0], bias=True)
        self.lin_l = Linear(widths[0], out_channels, bias=bias)
        self.lin_r = Linear(widths[1], out_channels, bias=False) if root_weight else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.project:
            self.lin.reset_parameters()
        self.lin_l.reset_parameters()
        if self.lin_r is not None:
            self.lin_r.reset_parameters()

    def forward(self, x: Features, edge_index: GraphArg, size: Optional[Tuple[int, int]] = None, *,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        """``edge_weight`` (keyword only; not in PyG's signature) weighs an ``edge_index``'s messages,
        as a torch sparse ``adj_t``'s values do."""
        fn = "SAGEConv"
        x_src, x_dst, _ = split_features(fn, x)
        num_src, num_dst = node_counts(fn, edge_index, x_src, x_dst, size, self.node_dim)
        if self.project:
            x_src = F.relu(self.lin(x_src))
        graph = self._graph(fn, edge_index, edge_weight, num_dst, identity, num_src=num_src,
                            sparse_values=graph_kind(edge_index) != "sparse_tensor")
        width = x_src.size(-1)
        self.lin_l.initialize(width)
        if self.reduce in ("sum", "mean") and _project_first(graph, width, self.out_channels):
            # linear aggregations commute with the projection: project first where it is cheaper
            out = propagate(graph, F.linear(x_src, self.lin_l.weight), self.reduce, self.node_dim,
                            backend=self.backend, precision=self.precision)
            if self.lin_l.bias is not None:
                out = out + self.lin_l.bias
        else:
            out = self.lin_l(propagate(graph, x_src, self.reduce, self.node_dim, backend=self.backend,
                                        precision=self.precision))
        if self.lin_r is not None and x_dst is not None:
            out = out + self.lin_r(x_dst)
        return F.normalize(out, p=2.0, dim=-1) if self.normalize else out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, aggr={self.aggr})"
