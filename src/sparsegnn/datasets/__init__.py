"""Datasets: ``load(name)`` for node classification, ``load_tu`` for graph classification,
``GraphDataset`` / ``GraphLoader`` (many small graphs, block-diagonal mini-batches) with
random, scaffold and stratified k-fold splits,
readers for common graph formats (``.npz``, SNAP edge lists, Matrix Market, TU batches,
SMILES / MoleculeNet CSV), the real-graph suite (its labelled graphs as node-classification
datasets: ``load("deezer")``), and seeded random graphs.

>>> data = load("cora")          # bundled, no download
>>> data.x.shape, data.num_classes
(torch.Size([2708, 1433]), 7)
"""
from __future__ import annotations

from .loader import GraphBatch, GraphDataset, GraphLoader, collate
from .padding import BatchPadding, StaticBatch, pad_batch
from .molecules import NUM_ATOM_FEATURES, MoleculeBatch, atom_features, load_molecules, smiles_to_edges
from .planetoid import read_planetoid_raw
from .real import RealGraph, load_tu_batch, read_edge_list, read_matrix_market, read_npz_graph
from .node_dataset import NodeDataset
from .load_nodes import PLANETOID, load
from .real_nodes import REAL_NODE_DATASETS, load_real_node_dataset
from .suite import REAL_SUITE, default_data_dir, describe, load_suite_graph
from .synthetic import random_graph
from .splits import murcko_scaffold, random_split, scaffold_split, stratified_kfold
from .tu import GraphSample, load_tu

__all__ = [
    "load", "load_tu", "random_graph", "NodeDataset", "GraphSample", "read_planetoid_raw",
    "RealGraph", "read_npz_graph", "read_edge_list", "read_matrix_market", "load_tu_batch",
    "MoleculeBatch", "smiles_to_edges", "load_molecules", "atom_features", "NUM_ATOM_FEATURES",
    "GraphDataset", "GraphLoader", "GraphBatch", "collate", "BatchPadding", "StaticBatch", "pad_batch",
    "random_split", "scaffold_split", "murcko_scaffold", "stratified_kfold",
    "REAL_SUITE", "default_data_dir", "load_suite_graph", "describe",
    "REAL_NODE_DATASETS", "load_real_node_dataset",
]
