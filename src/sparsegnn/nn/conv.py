"""Message-passing layers with PyG 2.8's signatures, options, parameter names and outputs.

Each family lives in its own module (``gcn``, ``sage``, ``gin``, ``gat``, ``agnn``); this one
re-exports them.  Every layer takes the graph in each form PyG's does: a
:class:`~sparsegnn.Graph`, an ``edge_index`` (row 0 = source, row 1 = target; with
``edge_weight`` / ``edge_attr``), PyG's ``EdgeIndex``, a torch sparse COO/CSR ``adj_t``
(``adj_t[i, j]`` = weight of ``j -> i``) or a ``torch_sparse.SparseTensor``.  The graph built
from it (with the layer's transform: GCN's normalisation, GAT's self loops) is cached
process-wide by the identity and version of the tensor, so calling a model with the same
``edge_index`` every step builds it once and every layer shares it; a Graph caches its
transformed forms on itself (see ``_graph_input``).  Options PyG has that sparsegnn cannot
honour raise ``ValueError`` naming the argument (see ``_inputs``).
"""
from .agnn import AGNNConv
from .gat import GATConv, GATv2Conv
from .gcn import GCNConv
from .gin import GINConv, GINEConv
from .sage import SAGEConv

__all__ = ["GCNConv", "SAGEConv", "GINConv", "GINEConv", "GATConv", "GATv2Conv", "AGNNConv"]
