"""Planetoid citation graphs (Cora, Citeseer): raw-file reader and the bundled plain format.

Raw Planetoid files (``ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}``) are Python pickles.
They are read here with a restricted unpickler that only builds numpy arrays, scipy sparse
matrices and dicts, so a tampered file cannot run code.  The bundled Cora is a plain ``.npz``
(no pickles) made by ``scripts/convert_planetoid.py``.

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
        return super().find_class(module, name)


def _unpickle(path: Path):
    with open(path, "rb") as f:
        return _SafeUnpickler(io.BytesIO(f.read()), encoding="latin1").load()


def read_planetoid_raw(root, name: str) -> Dict[str, np.ndarray]:
    """Read raw Planetoid files into plain arrays (the fields of the bundled ``.npz``).

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
    test_index = np.loadtxt(root / f"ind.{name}.test.index", dtype=np.int64)
    sorted_test = np.sort(test_index)
    tx, ty = parts["tx"], parts["ty"]
    if name == "citeseer":  # isolated test nodes are missing from tx/ty: pad with zero rows
        span = int(sorted_test[-1] - sorted_test[0] + 1)
        tx_ext = sp.lil_matrix((span, tx.shape[1]))
        tx_ext[sorted_test - sorted_test[0], :] = tx
        ty_ext = np.zeros((span, ty.shape[1]))
        ty_ext[sorted_test - sorted_test[0], :] = ty
        tx, ty = tx_ext, ty_ext
    features = sp.vstack([parts["allx"], tx]).tolil()
    features[test_index, :] = features[sorted_test, :]
    labels = np.vstack([parts["ally"], ty])
    labels[test_index, :] = labels[sorted_test, :]
    num_nodes = features.shape[0]
    src, dst = [], []
    for node, neighbours in parts["graph"].items():
        for nb in neighbours:
            if nb != node and nb < num_nodes and node < num_nodes:
                src += [node, nb]
                dst += [nb, node]
    pairs = np.unique(np.stack([np.array(src), np.array(dst)]), axis=1)
    features = features.tocsr().astype(np.float32)
    features.sort_indices()
    return {
        "feat_indptr": features.indptr.astype(np.int64),
        "feat_indices": features.indices.astype(np.int32),
        "feat_data": features.data.astype(np.float32),
        "feat_shape": np.array(features.shape, dtype=np.int64),
        "edge_index": pairs.astype(np.int32),
        "y": labels.argmax(1).astype(np.int64),
        "train_idx": np.arange(parts["y"].shape[0], dtype=np.int64),
        "val_idx": np.arange(parts["y"].shape[0], parts["y"].shape[0] + 500, dtype=np.int64),
        "test_idx": sorted_test.astype(np.int64),
    }
