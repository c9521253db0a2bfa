"""Layers (PyG-compatible signatures), reference models, and ``prepare`` for ``torch.compile``."""
from .conv import AGNNConv, GATConv, GCNConv, GINConv, SAGEConv
from .models import AGNN, GAT, GCN, GIN, GraphSAGE
from .prepare import prepare

__all__ = ["GCNConv", "SAGEConv", "GINConv", "AGNNConv", "GATConv", "GCN", "AGNN", "GraphSAGE", "GIN", "GAT",
           "prepare"]
