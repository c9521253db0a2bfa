"""The real-graph suite: the real graphs at hand (``shared/datasets``), one loader for all.

The data folder holds ``planetoid/``, ``real/``, ``tu/`` and ``molecules/`` (see its README).
It is found through ``$SPARSEGNN_DATA`` or next to the working directory / checkout; Cora is
bundled with the package and needs no data folder. Nothing is cached on disk.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from .._checks import check
from ..graph import Graph
from .molecules import load_molecules
from .node_dataset import load_bundled
from .planetoid import read_planetoid_raw
from .real import load_tu_batch, read_npz_graph

#: Names of the real-graph suite, smallest structures first within each kind.
REAL_SUITE: Tuple[str, ...] = (
    "cora", "citeseer", "deezer", "lastfm", "twitch", "wikipedia", "roadnet-pa-excerpt",
    "reddit-threads-10k", "PROTEINS_full", "ENZYMES", "tox21",
)
_REAL_NPZ = ("deezer", "lastfm", "twitch", "wikipedia", "roadnet-pa-excerpt", "reddit-threads-10k")
_PLANETOID_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")


def default_data_dir() -> Optional[Path]:
    """The data folder: ``$SPARSEGNN_DATA`` if set, else the first existing of
    ``./shared/datasets``, ``../shared/datasets`` and ``<repo>/../shared/datasets``; None if none exists.
    """
    env = os.environ.get("SPARSEGNN_DATA")
    if env:
        return Path(env).expanduser()
    repo = Path(__file__).resolve().parents[3]  # src/sparsegnn/datasets/suite.py -> repo
    for candidate in (Path("shared/datasets"), Path("../shared/datasets"), repo.parent / "shared" / "datasets"):
        if candidate.is_dir():
            return candidate.resolve()
    return None


def _canonical(name: str) -> str:
    check(isinstance(name, str), "load_suite_graph", f"name must be a str, got {type(name).__name__}")
    by_lower = {n.lower(): n for n in REAL_SUITE}
    check(name.lower() in by_lower, "load_suite_graph", f"unknown suite graph {name!r}; known: {', '.join(REAL_SUITE)}")
    return by_lower[name.lower()]


def suite_files(name: str, data_dir) -> Tuple[Path, ...]:
    """The files under ``data_dir`` that ``load_suite_graph(name)`` reads (none for Cora)."""
    name, root = _canonical(name), Path(data_dir)
    if name == "cora":
        return ()
    if name == "citeseer":
        return tuple(root / "planetoid" / f"ind.citeseer.{p}" for p in _PLANETOID_PARTS)
    if name in _REAL_NPZ:
        return (root / "real" / f"{name}.npz",)
    if name == "tox21":
        return (root / "molecules" / "tox21.csv",)
    return (root / "tu" / f"{name}.zip",)


def _bare(graph: Graph) -> Graph:
    return Graph(graph.rowptr, graph.col, None, graph.num_nodes, ptr=graph.ptr)


def load_suite_graph(name: str, data_dir=None) -> Graph:
    """The graph of suite member ``name``: natural node order, no edge values.

    Args:
        name: one of :data:`REAL_SUITE` (case-insensitive).
        data_dir: the data folder (default: :func:`default_data_dir`).

    Returns:
        :class:`~sparsegnn.Graph` (``ptr`` set for the batches: reddit-threads-10k, PROTEINS_full,
        ENZYMES, tox21). Tox21 is always parsed with the built-in SMILES parser, so the graph
        does not depend on whether RDKit is installed.

    Shapes:
        -> Graph with the node and edge counts of the data README (see :func:`describe`).
    """
    fn = "load_suite_graph"
    name = _canonical(name)
    if name == "cora":
        return _bare(load_bundled("cora").graph)
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    check(root is not None, fn, f"{name!r} needs the data folder: set SPARSEGNN_DATA to the datasets "
                                "directory (with planetoid/, real/, tu/, molecules/) or pass data_dir")
    missing = [str(p) for p in suite_files(name, root) if not p.is_file()]
    check(not missing, fn, f"{name!r}: missing {', '.join(missing[:3])}; set SPARSEGNN_DATA to the datasets "
                           "directory (with planetoid/, real/, tu/, molecules/) or pass data_dir")
    if name == "citeseer":
        arrays = read_planetoid_raw(root / "planetoid", "citeseer")
        edge_index = torch.from_numpy(arrays["edge_index"].astype("int64"))
        return _bare(Graph.from_edge_index(edge_index, num_nodes=int(arrays["feat_shape"][0])))
    if name in _REAL_NPZ:
        return _bare(read_npz_graph(root / "real" / f"{name}.npz").graph)
    if name == "tox21":
        # The built-in SMILES parser whether or not RDKit is installed: the same graph everywhere
        # (RDKit rejects 8 of the 7,831 molecules for valence; their graphs are otherwise identical).
        return _bare(load_molecules(root / "molecules" / "tox21.csv", backend="builtin").graph)
    return _bare(load_tu_batch(root / "tu" / f"{name}.zip").graph)


def describe(graph: Graph) -> Dict[str, float]:
    """Summary for the suite table: ``nodes``, ``edges``, ``max_in_degree``, ``mean_degree``
    (edges / nodes) and ``graphs`` (1 unless batched)."""
    check(isinstance(graph, Graph), "describe", f"expected a Graph, got {type(graph).__name__}")
    n, e = graph.num_nodes, graph.num_edges
    return {
        "nodes": n,
        "edges": e,
        "max_in_degree": int(graph.in_degree().max()) if n else 0,
        "mean_degree": e / n if n else 0.0,
        "graphs": 1 if graph.ptr is None else int(graph.ptr.numel() - 1),
    }
