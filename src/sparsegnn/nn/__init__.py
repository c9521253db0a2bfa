"""Layers (PyG-compatible signatures) and reference models."""
from .conv import AGNNConv, GATConv, GCNConv, GINConv, SAGEConv
from .models import AGNN, GAT, GCN, GIN, GraphSAGE

__all__ = ["GCNConv", "SAGEConv", "GINConv", "AGNNConv", "GATConv", "GCN", "AGNN", "GraphSAGE", "GIN", "GAT"]
