"""The node-classification dataset: one graph with features, labels and split masks."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Tuple

import numpy as np
import torch
from torch import Tensor

from ..graph import Graph

_BUNDLED = Path(__file__).parent / "data"


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


def node_dataset_from_arrays(name: str, arrays, normalize_features: bool) -> NodeDataset:
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


def bundled_path(key: str) -> Path:
    """The file of a dataset shipped with the package (``cora``)."""
    return _BUNDLED / f"{key}.npz"


def load_bundled(key: str, normalize_features: bool = True) -> NodeDataset:
    """The bundled dataset ``key`` with its standard split."""
    with np.load(bundled_path(key), allow_pickle=False) as arrays:
        return node_dataset_from_arrays(key, dict(arrays), normalize_features)
