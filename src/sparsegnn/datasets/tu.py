"""TU-Dortmund graph-classification collections in their raw text format.

A collection ``NAME`` holds ``NAME_A.txt`` (1-based ``source, target`` lines over all graphs),
``NAME_graph_indicator.txt`` (graph id of every node, 1-based), ``NAME_graph_labels.txt``,
and optionally ``NAME_node_attributes.txt`` (comma-separated floats) and
``NAME_node_labels.txt`` (integers, one-hot encoded here).
"""
from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import Tensor

from ..graph import Graph


@dataclass
class GraphSample:
    """One graph of a graph-classification set: structure, node features ``[n, F]``, label."""

    graph: Graph
    x: Tensor
    y: int


def _read_members(path: Path) -> Dict[str, bytes]:
    if path.is_dir():
        return {p.name: p.read_bytes() for p in path.rglob("*.txt")}
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            return {Path(n).name: zf.read(n) for n in zf.namelist() if n.endswith(".txt")}
    raise ValueError(f"load_tu(): {path} is neither a directory nor a .zip file")


def _array(members: Dict[str, bytes], name: str, dtype) -> Optional[np.ndarray]:
    data = members.get(name)
    if data is None:
        return None
    return np.loadtxt(io.BytesIO(data), delimiter=",", dtype=dtype, ndmin=2)


def tu_attribute_width(path, name: Optional[str] = None) -> int:
    """Columns of continuous node attributes (``NAME_node_attributes.txt``) of a TU collection;
    0 without that file.  The node features of :func:`load_tu` / ``load_tu_batch`` start with them."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"tu_attribute_width(): {path} does not exist")
    attrs = _array(_read_members(path), f"{name or path.stem}_node_attributes.txt", np.float32)
    return 0 if attrs is None else attrs.shape[1]


def load_tu(path, name: Optional[str] = None) -> List[GraphSample]:
    """Read a TU collection from a ``.zip`` or a directory.

    Node features are the node attributes (if any) followed by one-hot node labels (if any);
    a collection with neither gets a constant feature.  Graph labels are shifted to start at 0.

    Args:
        path: the collection's zip file or directory.
        name: collection name (default: the file name without extension, e.g. ``PROTEINS_full``).

    Returns:
        list of :class:`GraphSample`, one per graph, each graph's edges in its own node ids.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"load_tu(): {path} does not exist")
    name = name or path.stem
    members = _read_members(path)
    if f"{name}_A.txt" not in members:
        raise ValueError(f"load_tu(): {name}_A.txt not found in {path}")
    edges = _array(members, f"{name}_A.txt", np.int64) - 1
    indicator = _array(members, f"{name}_graph_indicator.txt", np.int64)[:, 0] - 1
    labels = _array(members, f"{name}_graph_labels.txt", np.int64)[:, 0]
    labels = labels - labels.min()
    feats = []
    attrs = _array(members, f"{name}_node_attributes.txt", np.float32)
    if attrs is not None:
        feats.append(attrs)
    node_labels = _array(members, f"{name}_node_labels.txt", np.int64)
    if node_labels is not None:
        nl = node_labels[:, 0] - node_labels[:, 0].min()
        feats.append(np.eye(int(nl.max()) + 1, dtype=np.float32)[nl])
    x_all = np.concatenate(feats, axis=1) if feats else np.ones((indicator.shape[0], 1), np.float32)

    num_graphs = int(indicator.max()) + 1
    node_ptr = np.concatenate([[0], np.cumsum(np.bincount(indicator, minlength=num_graphs))])
    edge_graph = indicator[edges[:, 0]]
    order = np.argsort(edge_graph, kind="stable")
    edges, edge_graph = edges[order], edge_graph[order]
    edge_ptr = np.concatenate([[0], np.cumsum(np.bincount(edge_graph, minlength=num_graphs))])
    samples = []
    for g in range(num_graphs):
        lo, hi = node_ptr[g], node_ptr[g + 1]
        local = torch.from_numpy(edges[edge_ptr[g]:edge_ptr[g + 1]].T - lo).contiguous()
        samples.append(GraphSample(Graph.from_edge_index(local, num_nodes=int(hi - lo)),
                                   torch.from_numpy(x_all[lo:hi]), int(labels[g])))
    return samples
