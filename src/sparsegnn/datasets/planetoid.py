"""Planetoid citation graphs (Cora, Citeseer, Pubmed): raw-file reader and the bundled plain format.

Raw Planetoid files (``ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}``) are Python pickles.
They are read here with a restricted unpickler that only builds numpy arrays, scipy sparse
matrices and dicts, so a tampered file cannot run code.  The bundled Cora is a plain ``.npz``
(no pickles) converted from the raw files.

Split (Planetoid / Kipf & Welling): the labelled ``x`` rows for training (20 per class),
the next 500 nodes for validation, the ``test.index`` nodes (1,000) for testing.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Dict

import numpy as np

_ALLOWED = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("collections", "defaultdict"), ("builtins", "list"), ("builtins", "int"),
    ("scipy.sparse.csr", "csr_matrix"), ("scipy.sparse._csr", "csr_matrix"),
    ("scipy.sparse.lil", "lil_matrix"), ("scipy.sparse._lil", "lil_matrix"),
    ("copyreg", "_reconstructor"), ("builtins", "object"),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        module = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)
        if (module, name) not in _ALLOWED:
            raise ValueError(f"load_planetoid(): refusing to unpickle {module}.{name}")
        if module in ("scipy.sparse.csr", "scipy.sparse.lil"):  # deprecated paths of old pickles
            module = "scipy.sparse"
        return super().find_class(module, name)


def _unpickle(path: Path):
    with open(path, "rb") as f:
        return _SafeUnpickler(io.BytesIO(f.read()), encoding="latin1").load()


def read_planetoid_raw(root, name: str) -> Dict[str, np.ndarray]:
    """Read raw Planetoid files into plain arrays (the fields of the bundled ``.npz``).

    Works for every Planetoid set (``cora``, ``citeseer``, ``pubmed``): test nodes missing from
    ``tx``/``ty`` (Citeseer's isolated nodes) get zero features and label 0, and real-valued
    features (Pubmed's TF-IDF) are kept as float32.

    Returns:
        dict with ``feat_indptr, feat_indices, feat_data, feat_shape`` (CSR features),
        ``edge_index`` [2, E] (both directions, no duplicates, no self loops), ``y`` [N],
        ``train_idx``, ``val_idx``, ``test_idx``.
    """
    try:
        import scipy.sparse as sp
    except ImportError as exc:  # pragma: no cover - exercised only without scipy
        raise ValueError("load_planetoid(): reading raw Planetoid files needs scipy (pip install scipy)") from exc
    root = Path(root)
    parts = {}
    for key in ("x", "y", "tx", "ty", "allx", "ally", "graph"):
        path = root / f"ind.{name}.{key}"
        if not path.exists():
            raise ValueError(f"load_planetoid(): missing file {path}")
        parts[key] = _unpickle(path)
    path = root / f"ind.{name}.test.index"
    if not path.exists():
        raise ValueError(f"load_planetoid(): missing file {path}")
    test_index = np.loadtxt(path, dtype=np.int64, ndmin=1)
    sorted_test = np.sort(test_index)
    tx, ty = sp.csr_matrix(parts["tx"]), np.asarray(parts["ty"])
    span = int(sorted_test[-1] - sorted_test[0] + 1)
    if span > tx.shape[0]:  # Citeseer: isolated test nodes are missing from tx/ty; pad with zero rows
        if tx.shape[0] != sorted_test.size or ty.shape[0] != sorted_test.size:
            raise ValueError(f"load_planetoid(): {name}: tx/ty have {tx.shape[0]}/{ty.shape[0]} rows "
                             f"for {sorted_test.size} test indices")
        place = sorted_test - sorted_test[0]
        rows = np.repeat(place, np.diff(tx.indptr))
        tx = sp.csr_matrix((tx.data, (rows, tx.indices)), shape=(span, tx.shape[1]))
        ty_ext = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
        ty_ext[place, :] = ty
        ty = ty_ext
    features = sp.vstack([sp.csr_matrix(parts["allx"]), tx]).tocsr()
    labels = np.vstack([np.asarray(parts["ally"]), ty])
    # The rows of tx/ty are the test nodes in sorted order; node test_index[k] is row sorted_test[k].
    order = np.arange(features.shape[0])
    order[test_index] = sorted_test
    features, labels = features[order], labels[order]
    num_nodes = features.shape[0]
    src, dst = [], []
    for node, neighbours in parts["graph"].items():
        for nb in neighbours:
            if nb != node and nb < num_nodes and node < num_nodes:
                src += [node, nb]
                dst += [nb, node]
    pairs = np.unique(np.stack([np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)]), axis=1)
    features = features.astype(np.float32)
    features.sort_indices()
    return {
        "feat_indptr": features.indptr.astype(np.int64),
        "feat_indices": features.indices.astype(np.int32),
        "feat_data": features.data.astype(np.float32),
        "feat_shape": np.array(features.shape, dtype=np.int64),
        "edge_index": pairs.astype(np.int32),
        "y": labels.argmax(1).astype(np.int64),
        "train_idx": np.arange(parts["y"].shape[0], dtype=np.int64),
        "val_idx": np.arange(parts["y"].shape[0], min(parts["y"].shape[0] + 500, num_nodes), dtype=np.int64),
        "test_idx": sorted_test.astype(np.int64),
    }
