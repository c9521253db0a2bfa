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

from .._checks import MAX_NODES, check_count
from ..graph import Graph

#: Most one-hot columns a node-label file may ask for (largest label - smallest + 1).  Real
#: collections have a few dozen labels; a stray label of 1e8 would otherwise make a dense
#: ``[nodes, 1e8]`` feature matrix (petabytes for a large collection).
MAX_LABELS = 100_000
#: Most entries of a dense feature matrix built from a file's sizes (rows x columns, float32:
#: 8 GiB); larger sizes come from a damaged or hostile file, refused before allocating.
MAX_DENSE = 2 ** 31


@dataclass
class GraphSample:
    """One graph of a graph-classification set: structure, node features ``[n, F]``, label."""

    graph: Graph
    x: Tensor
    y: int


def _read_members(path: Path, fn: str = "load_tu") -> Dict[str, bytes]:
    """The ``.txt`` members of a collection (zip or directory), by base name.

    A damaged archive (truncated, not a zip, a corrupt member) is a ``ValueError`` naming the
    file, not a bare ``zipfile.BadZipFile``."""
    if path.is_dir():
        return {p.name: p.read_bytes() for p in path.rglob("*.txt")}
    if path.suffix == ".zip":
        try:
            with zipfile.ZipFile(path) as zf:
                return {Path(n).name: zf.read(n) for n in zf.namelist() if n.endswith(".txt")}
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError) as exc:
            raise ValueError(f"{fn}(): {path} is not a readable zip file ({type(exc).__name__}: {exc})") from exc
    raise ValueError(f"{fn}(): {path} is neither a directory nor a .zip file")


def _bad_line(source: str, comment: str, ncols: int, dtype, finite: bool) -> str:
    """Where ``source`` (a file's text) first breaks a table of ``ncols`` numbers of ``dtype``:
    ``", line K: <why>: '<line>'"`` with K the file's 1-based line number, or ``""`` if no line
    does.  Runs only after the fast parse failed, so the per-line Python loop costs nothing on
    good files."""
    kind = "integer" if dtype == np.int64 else "number"
    for number, line in enumerate(source.split("\n"), 1):
        fields = line.split()
        if not fields or fields[0].startswith(comment):
            continue
        shown = line.strip()[:80]
        if len(fields) != ncols:
            return f", line {number}: expected {ncols} columns, got {len(fields)}: {shown!r}"
        for field in fields:
            try:
                value = int(field) if dtype == np.int64 else float(field)
            except ValueError:
                return f", line {number}: {field[:40]!r} is not a valid {kind}: {shown!r}"
            if finite and not np.isfinite(value):
                return f", line {number}: NaN or infinite value: {shown!r}"
    return ""


def _array(members: Dict[str, bytes], name: str, dtype, fn: str = "load_tu") -> Optional[np.ndarray]:
    """The comma-separated table ``name``, or None without it; a bad token or a ragged row is a
    ``ValueError`` naming the member and its line (``numpy.loadtxt``'s message carries the line)."""
    data = members.get(name)
    if data is None:
        return None
    try:
        table = np.loadtxt(io.BytesIO(data), delimiter=",", dtype=dtype, ndmin=2)
    except ValueError as exc:
        text = data.decode("utf-8", errors="replace").replace(",", " ")
        first = next((line for line in text.split("\n") if line.strip()), "")
        where = _bad_line(text, "#", len(first.split()), np.int64 if dtype == np.int64 else np.float64, False)
        raise ValueError(f"{fn}(): {name}{where or ': ' + str(exc)}") from None
    if np.issubdtype(table.dtype, np.floating) and not np.isfinite(table).all():
        line = int(np.nonzero(~np.isfinite(table).all(axis=1))[0][0]) + 1
        raise ValueError(f"{fn}(): {name}, data line {line}: NaN or infinite value")
    return table


def one_hot_labels(labels: np.ndarray, fn: str, what: str) -> np.ndarray:
    """``[n, L]`` float32 one-hot rows of integer ``labels`` (shifted to start at 0), the width
    checked against :data:`MAX_LABELS` and :data:`MAX_DENSE` before the matrix is made."""
    shifted = labels - labels.min()
    width = check_count(int(shifted.max()) + 1, fn, f"one-hot width of {what} (largest label - smallest + 1)",
                        MAX_LABELS)
    check_count(shifted.size * width, fn, f"entries of the one-hot features of {what}", MAX_DENSE)
    out = np.zeros((shifted.size, width), dtype=np.float32)
    out[np.arange(shifted.size), shifted] = 1.0
    return out


def _graph_count(indicator: np.ndarray, fn: str, what: str) -> int:
    """Graphs of a collection: the largest 1-based graph id, which no more than the nodes can reach."""
    check_count(int(indicator.min()) + 1 if indicator.size else 0, fn, f"smallest graph id in {what}", MAX_NODES)
    return check_count(int(indicator.max()) + 1 if indicator.size else 0, fn,
                       f"largest graph id in {what} (for {indicator.size} nodes)", max(indicator.size, 0))


def tu_attribute_width(path, name: Optional[str] = None) -> int:
    """Columns of continuous node attributes (``NAME_node_attributes.txt``) of a TU collection;
    0 without that file.  The node features of :func:`load_tu` / ``load_tu_batch`` start with them."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"tu_attribute_width(): {path} does not exist")
    attrs = _array(_read_members(path, "tu_attribute_width"), f"{name or path.stem}_node_attributes.txt", np.float32,
                   "tu_attribute_width")
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
    for suffix in ("graph_indicator", "graph_labels"):
        if f"{name}_{suffix}.txt" not in members:
            raise ValueError(f"load_tu(): {name}_{suffix}.txt not found in {path}")
    edges = _array(members, f"{name}_A.txt", np.int64) - 1
    indicator = _array(members, f"{name}_graph_indicator.txt", np.int64)[:, 0] - 1
    labels = _array(members, f"{name}_graph_labels.txt", np.int64)[:, 0]
    n = indicator.shape[0]
    if edges.size and (edges.shape[1] != 2 or edges.min() < 0 or edges.max() >= n):
        raise ValueError(f"load_tu(): {name}_A.txt must hold 'source, target' pairs within 1..{n}")
    num_graphs = _graph_count(indicator, "load_tu", f"{name}_graph_indicator.txt")
    if labels.size != num_graphs:
        raise ValueError(f"load_tu(): {name}_graph_labels.txt has {labels.size} labels for {num_graphs} graphs")
    labels = labels - labels.min()
    feats = []
    attrs = _array(members, f"{name}_node_attributes.txt", np.float32)
    if attrs is not None:
        feats.append(attrs)
    node_labels = _array(members, f"{name}_node_labels.txt", np.int64)
    if node_labels is not None:
        feats.append(one_hot_labels(node_labels[:, 0], "load_tu", f"{name}_node_labels.txt"))
    if any(f.shape[0] != n for f in feats):
        raise ValueError(f"load_tu(): node attribute/label files must have {n} rows")
    x_all = np.concatenate(feats, axis=1) if feats else np.ones((indicator.shape[0], 1), np.float32)

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
