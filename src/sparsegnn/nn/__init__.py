"""Layers (PyG-compatible signatures), MaxK-GNN layers and model, reference models, graph-level
models for batches of small graphs (``ChemGCN``, ``GINClassifier``), ``prepare``
for ``torch.compile``, and ``accelerate`` (a PyG model's convs swapped for ours)."""
from .conv import AGNNConv, GATConv, GATv2Conv, GCNConv, GINConv, GINEConv, SAGEConv
from .maxk import MaxKGCNConv, MaxKGINConv, MaxKSAGEConv
from .models import AGNN, GAT, GCN, GIN, GraphSAGE, MaxKGNN
from .graphclass import ChemGCN, GINClassifier
from .norm import PaddedBatchNorm1d, padded_nodes
from .accelerate import AccelerateReport, accelerate
from .prepare import prepare
from .replay import enable_replay
from ._graph_input import clear_graph_cache, graph_cache_info, set_graph_cache_size

__all__ = ["clear_graph_cache", "graph_cache_info", "set_graph_cache_size", "GCNConv", "SAGEConv", "GINConv", "GINEConv", "AGNNConv", "GATConv", "GATv2Conv", "GCN", "AGNN",
           "GraphSAGE", "GIN", "GAT", "MaxKSAGEConv", "MaxKGCNConv", "MaxKGINConv", "MaxKGNN", "prepare", "accelerate",
           "AccelerateReport", "enable_replay", "ChemGCN", "GINClassifier", "PaddedBatchNorm1d", "padded_nodes"]
