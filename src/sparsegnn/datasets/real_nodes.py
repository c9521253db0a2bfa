"""Node classification on the labelled graphs of the real suite (``real/<name>.npz``).

The files hold the structure and the node labels ``y``; only Twitch has node features. So that
every model sees the same, fixed input, a :class:`~sparsegnn.datasets.NodeDataset` is made as
follows:

* **features**: the file's own where present (Twitch: 3,170 sparse binary features, densified
  and row-normalised like Planetoid's); else a fixed substitute, ``[z, log(1 + deg)]``: ``z``
  is ``[N, 64]`` standard normal from a ``torch.Generator`` seeded with ``crc32(name)`` (the same
  on every run and machine; independent of the split seed), ``deg`` the in-degree (the degree:
  the graphs store both directions).  ``z`` carries no label information: it lets a GNN
  tell nodes apart, so accuracy comes from the structure and the training labels around a node.
  Accuracies on these graphs compare models with each other, not with published numbers.
* **split**: stratified 60 / 20 / 20 train / val / test: each class's nodes in a random order
  from ``numpy.random.default_rng(seed)``, the first 60 % (rounded) train, the next 20 % val,
  the rest test.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Tuple

import numpy as np
import torch
from torch import Tensor

from .._checks import check
from ..graph import Graph
from .node_dataset import NodeDataset
from .real import read_npz_graph
from .suite import default_data_dir

#: Labelled graphs of ``real/`` that :func:`load_real_node_dataset` turns into datasets.
REAL_NODE_DATASETS: Tuple[str, ...] = ("deezer", "lastfm", "twitch", "wikipedia")
#: Width of the random part of the substitute features.
SUBSTITUTE_DIM = 64
#: Train / val / test fractions of the stratified split.
SPLIT = (0.6, 0.2, 0.2)


def substitute_features(name: str, graph: Graph, dim: int = SUBSTITUTE_DIM) -> Tensor:
    """``[z, log(1 + in-degree)]`` with ``z ~ N(0, 1)`` from a generator seeded by ``crc32(name)``.

    Shapes:
        -> [N, dim + 1] float32.
    """
    generator = torch.Generator().manual_seed(zlib.crc32(name.encode("utf-8")))
    noise = torch.randn(graph.num_nodes, dim, generator=generator)
    degree = graph.in_degree().to(torch.float32)
    return torch.cat([noise, torch.log1p(degree).unsqueeze(1)], dim=1)


def stratified_split(y: Tensor, seed: int = 0, fractions: Tuple[float, float, float] = SPLIT
                     ) -> Tuple[Tensor, Tensor, Tensor]:
    """Train / val / test masks holding ``fractions`` of every class (module doc).

    Shapes:
        y: [N] int64 -> three [N] bool masks, disjoint, covering every node.
    """
    check(abs(sum(fractions) - 1.0) < 1e-9 and min(fractions) >= 0, "stratified_split",
          f"fractions must be non-negative and sum to 1, got {fractions}")
    labels = y.cpu().numpy()
    rng = np.random.default_rng(seed)
    part = np.zeros(labels.shape[0], dtype=np.int64)            # 0 train, 1 val, 2 test
    for cls in np.unique(labels):
        nodes = rng.permutation(np.flatnonzero(labels == cls))
        n_train = int(round(fractions[0] * nodes.size))
        n_val = int(round(fractions[1] * nodes.size))
        part[nodes[n_train:n_train + n_val]] = 1
        part[nodes[n_train + n_val:]] = 2
    part_t = torch.from_numpy(part)
    return part_t == 0, part_t == 1, part_t == 2


def load_real_node_dataset(name: str, data_dir=None, seed: int = 0, normalize_features: bool = True):
    """The real-suite graph ``name`` as a node-classification dataset (module doc).

    Args:
        name: one of :data:`REAL_NODE_DATASETS` (case-insensitive).
        data_dir: the data folder holding ``real/`` (default: :func:`default_data_dir`,
            ``$SPARSEGNN_DATA`` or ``../shared/datasets``).
        seed: seed of the stratified 60 / 20 / 20 split.
        normalize_features: row-normalise the file's own features (Twitch); the substitute
            features are used as they are.

    Returns:
        :class:`~sparsegnn.datasets.NodeDataset` with the file's labels.

    Shapes:
        -> x: [N, F] float32 (F = 3,170 for twitch, 65 otherwise); y: [N] int64; masks: [N] bool.
    """
    fn = "load_real_node_dataset"
    check(isinstance(name, str) and name.lower() in REAL_NODE_DATASETS, fn,
          f"unknown dataset {name!r}; known: {', '.join(REAL_NODE_DATASETS)}")
    key = name.lower()
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    check(root is not None, fn, f"{key!r} needs the data folder: set SPARSEGNN_DATA to the datasets directory "
                                "(with real/) or pass data_dir")
    path = root / "real" / f"{key}.npz"
    check(path.is_file(), fn, f"{key!r}: missing {path}; set SPARSEGNN_DATA to the datasets directory (with real/) "
                              "or pass data_dir")
    real = read_npz_graph(path)
    check(real.y is not None, fn, f"{path} holds no node labels y")
    y = real.y.to(torch.int64)
    if real.x is not None:
        x = real.x
        if normalize_features:
            x = x / x.sum(dim=1, keepdim=True).clamp(min=1e-12)
    else:
        x = substitute_features(key, real.graph)
    train, val, test = stratified_split(y, seed)
    return NodeDataset(key, real.graph, x.contiguous(), y, train, val, test, int(y.max()) + 1)
