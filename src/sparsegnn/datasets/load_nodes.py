"""``load(name)``: node-classification datasets by name (bundled Cora, raw Planetoid files, the
real suite's labelled graphs)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .node_dataset import NodeDataset, node_dataset_from_arrays, bundled_path, load_bundled
from .planetoid import read_planetoid_raw
from .real_nodes import REAL_NODE_DATASETS, load_real_node_dataset
from .suite import default_data_dir

PLANETOID = ("cora", "citeseer", "pubmed")


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
        return node_dataset_from_arrays(key, read_planetoid_raw(root, key), normalize_features)
    if not bundled_path(key).exists():
        folder = _planetoid_folder(key, data_dir)
        if folder is None:
            raise ValueError(f"load(): {name!r} is not bundled; pass root= a directory with its raw Planetoid files, "
                             "or set SPARSEGNN_DATA / data_dir to a data folder with planetoid/")
        return node_dataset_from_arrays(key, read_planetoid_raw(str(folder), key), normalize_features)
    return load_bundled(key, normalize_features)
