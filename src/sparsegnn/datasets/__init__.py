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

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ..graph import Graph
from .loader import GraphBatch, GraphDataset, GraphLoader, collate
from .padding import BatchPadding, StaticBatch, pad_batch
from .molecules import NUM_ATOM_FEATURES, MoleculeBatch, atom_features, load_molecules, smiles_to_edges
from .planetoid import read_planetoid_raw
from .real import RealGraph, load_tu_batch, read_edge_list, read_matrix_market, read_npz_graph
from .real_nodes import REAL_NODE_DATASETS, load_real_node_dataset
from .suite import REAL_SUITE, default_data_dir, describe, load_suite_graph
from .synthetic import random_graph
from .splits import murcko_scaffold, random_split, scaffold_split, stratified_kfold
from .tu import GraphSample, load_tu

_BUNDLED = Path(__file__).parent / "data"
PLANETOID = ("cora", "citeseer", "pubmed")


@dataclass
class NodeDataset:
    """A node-classification graph with its features, labels and split masks.

    Shapes:
        x: [N, F] float32; y: [N] int64; *_mask: [N] bool.
    """

    name: str
    graph: Graph
    x: Tensor
    y: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    num_classes: int

    def to(self, device) -> "NodeDataset":
        return replace(self, graph=self.graph.to(device), x=self.x.to(device), y=self.y.to(device),
                       train_mask=self.train_mask.to(device), val_mask=self.val_mask.to(device),
                       test_mask=self.test_mask.to(device))

    def reorder(self, method: str = "rcm") -> Tuple["NodeDataset", Tensor]:
        """The dataset with its nodes renumbered (``Graph.reorder``), features, labels and masks
        permuted with them: ``(dataset, perm)``; per-node results come back with ``out[inverse]``,
        ``inverse[perm] = arange(N)``."""
        graph, perm = self.graph.reorder(method)
        return replace(self, graph=graph, x=self.x[perm], y=self.y[perm], train_mask=self.train_mask[perm],
                       val_mask=self.val_mask[perm], test_mask=self.test_mask[perm]), perm

    def __repr__(self) -> str:
        return (f"NodeDataset({self.name}: {self.graph.num_nodes} nodes, {self.graph.num_edges} edges, "
                f"{self.x.shape[1]} features, {self.num_classes} classes, train/val/test "
                f"{int(self.train_mask.sum())}/{int(self.val_mask.sum())}/{int(self.test_mask.sum())})")


def _from_arrays(name: str, arrays, normalize_features: bool) -> NodeDataset:
    num_nodes, num_feats = (int(v) for v in arrays["feat_shape"])
    indptr = np.asarray(arrays["feat_indptr"], dtype=np.int64)
    dense = np.zeros((num_nodes, num_feats), dtype=np.float32)
    dense[np.repeat(np.arange(num_nodes), np.diff(indptr)), np.asarray(arrays["feat_indices"], dtype=np.int64)] = arrays["feat_data"]
    x = torch.from_numpy(dense)
    if normalize_features:  # row-normalise (Kipf & Welling's preprocessing)
        x = x / x.sum(dim=1, keepdim=True).clamp(min=1e-12)
    edge_index = torch.from_numpy(np.asarray(arrays["edge_index"], dtype=np.int64))
    y = torch.from_numpy(np.asarray(arrays["y"], dtype=np.int64))

    def mask(key: str) -> Tensor:
        m = torch.zeros(num_nodes, dtype=torch.bool)
        m[torch.from_numpy(np.asarray(arrays[key], dtype=np.int64))] = True
        return m

    graph = Graph.from_edge_index(edge_index, num_nodes=num_nodes)
    return NodeDataset(name, graph, x, y, mask("train_idx"), mask("val_idx"), mask("test_idx"), int(y.max()) + 1)


def _planetoid_folder(key: str, data_dir) -> Optional[Path]:
    """``<data folder>/planetoid`` when it holds ``ind.<key>.*`` files, else None."""
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    if root is None:
        return None
    folder = root / "planetoid"
    return folder if (folder / f"ind.{key}.graph").is_file() else None


def load(name: str, root: Optional[str] = None, normalize_features: bool = True, *, data_dir=None,
         seed: int = 0) -> NodeDataset:
    """Load a node-classification dataset.

    Args:
        name: ``"cora"`` (bundled), ``"citeseer"`` or ``"pubmed"`` (raw Planetoid files from
            ``root`` or the data folder's ``planetoid/``), or a labelled real-suite graph,
            ``"deezer"``, ``"lastfm"``, ``"twitch"``, ``"wikipedia"`` (from the data folder's
            ``real/``; see :func:`load_real_node_dataset` for their features and split).
        root: directory with raw Planetoid files ``ind.<name>.*``; when given, they are read
            instead of the bundled copy.
        normalize_features: divide each feature row by its sum (Planetoid, Twitch).
        data_dir: the data folder (default: :func:`default_data_dir`: ``$SPARSEGNN_DATA`` or
            ``../shared/datasets``), for the names not bundled.
        seed: seed of the real-suite graphs' stratified 60 / 20 / 20 split (Planetoid has its
            standard split).

    Returns:
        :class:`NodeDataset` (the standard Planetoid split for Planetoid).
    """
    key = name.lower()
    if key in REAL_NODE_DATASETS:
        if root is not None:
            raise ValueError(f"load(): root is for raw Planetoid files; {name!r} is read from data_dir/real")
        return load_real_node_dataset(key, data_dir, seed, normalize_features)
    if key not in PLANETOID:
        raise ValueError(f"load(): unknown dataset {name!r}; known: {', '.join(PLANETOID + REAL_NODE_DATASETS)}")
    if root is not None:
        if not Path(root).is_dir():
            raise ValueError(f"load(): root {root!r} is not a directory")
        return _from_arrays(key, read_planetoid_raw(root, key), normalize_features)
    bundled = _BUNDLED / f"{key}.npz"
    if not bundled.exists():
        folder = _planetoid_folder(key, data_dir)
        if folder is None:
            raise ValueError(f"load(): {name!r} is not bundled; pass root= a directory with its raw Planetoid files, "
                             "or set SPARSEGNN_DATA / data_dir to a data folder with planetoid/")
        return _from_arrays(key, read_planetoid_raw(str(folder), key), normalize_features)
    with np.load(bundled, allow_pickle=False) as arrays:
        return _from_arrays(key, dict(arrays), normalize_features)


__all__ = [
    "load", "load_tu", "random_graph", "NodeDataset", "GraphSample", "read_planetoid_raw",
    "RealGraph", "read_npz_graph", "read_edge_list", "read_matrix_market", "load_tu_batch",
    "MoleculeBatch", "smiles_to_edges", "load_molecules", "atom_features", "NUM_ATOM_FEATURES",
    "GraphDataset", "GraphLoader", "GraphBatch", "collate", "BatchPadding", "StaticBatch", "pad_batch",
    "random_split", "scaffold_split", "murcko_scaffold", "stratified_kfold",
    "REAL_SUITE", "default_data_dir", "load_suite_graph", "describe",
    "REAL_NODE_DATASETS", "load_real_node_dataset",
]
