"""Convert raw Planetoid files into the plain ``.npz`` bundled with sparsegnn (no pickles).

Usage:
    python scripts/convert_planetoid.py ../shared/datasets/planetoid cora src/sparsegnn/datasets/data/cora.npz
"""
import sys

import numpy as np

from sparsegnn.datasets.planetoid import read_planetoid_raw

if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    root, name, out = sys.argv[1:]
    arrays = read_planetoid_raw(root, name)
    np.savez_compressed(out, **arrays)
    print(f"{name}: {arrays['feat_shape'].tolist()} features, {arrays['edge_index'].shape[1]} edges -> {out}")
