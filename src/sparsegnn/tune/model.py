"""GPC-style learned cost model: predicts a kernel config's time from graph and config features.

Following GPC (``shared/papers/gpc.txt``): inputs go through a log (``features.py`` takes
log2 of every size), a normalisation (the stored mean/std stand in for batch norm), three
dense layers, and the target is normalised per case: the model predicts
``log2(ms) - mean over the case's configs of log2(ms)``, so it learns which config is fast
*relative to the others* on a graph rather than the graph's absolute scale.  Only the ranking
matters to its users (zero-shot pick, shortlist for the autotuner).

The weights are plain JSON (never a pickle) under ``tune/data/``, written by
``scripts/fit_cost_model.py`` from the sweep data in ``benchmarks/h100/tune_sweep.jsonl``.
Inference is a few small numpy matrix products (tens of microseconds).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from .features import GraphStats, config_vector, graph_vector

DATA_DIR = Path(__file__).parent / "data"
MODEL_FILE = "cost_model_spmm.json"


class CostModel:
    """A small MLP over ``[graph_vector, config_vector]``.

    Args:
        spec: dict with ``mean``, ``std`` (input normalisation) and ``layers`` (list of
            ``{"W": [out][in], "b": [out]}``, ReLU between layers, linear output).
    """

    def __init__(self, spec: Dict) -> None:
        self.spec = spec
        self.mean = np.asarray(spec["mean"], dtype=np.float64)
        self.std = np.asarray(spec["std"], dtype=np.float64)
        self.layers = [(np.asarray(layer["W"], dtype=np.float64), np.asarray(layer["b"], dtype=np.float64))
                       for layer in spec["layers"]]
        if not self.layers or self.layers[0][0].shape[1] != self.mean.size:
            raise ValueError("CostModel(): the first layer's width does not match the input normalisation")

    def predict_matrix(self, inputs: np.ndarray) -> np.ndarray:
        """Predicted relative log2 time of each input row.

        Shapes:
            inputs: [C, D] -> [C].
        """
        h = (np.asarray(inputs, dtype=np.float64) - self.mean) / self.std
        for i, (weight, bias) in enumerate(self.layers):
            h = h @ weight.T + bias
            if i + 1 < len(self.layers):
                h = np.maximum(h, 0.0)
        return h[:, 0]

    def predict(self, stats: GraphStats, num_feats: int, elem_size: int, configs: Sequence[Dict[str, int]]) -> np.ndarray:
        """Relative log2 time of every config on this graph (lower is faster).

        Shapes:
            configs: C dicts -> [C].
        """
        return self.predict_matrix(build_inputs(stats, num_feats, elem_size, configs))

    def rank(self, stats: GraphStats, num_feats: int, elem_size: int, configs: Sequence[Dict[str, int]]) -> List[int]:
        """Indices of ``configs``, predicted fastest first."""
        return [int(i) for i in np.argsort(self.predict(stats, num_feats, elem_size, configs), kind="stable")]

    def to_json(self) -> Dict:
        return self.spec


def build_inputs(stats: GraphStats, num_feats: int, elem_size: int, configs: Sequence[Dict[str, int]]) -> np.ndarray:
    """Model input rows ``[graph_vector, config_vector]`` for every config.

    Shapes:
        -> [len(configs), D] float64.
    """
    graph_part = graph_vector(stats, num_feats, elem_size)
    return np.asarray([graph_part + config_vector(cfg, stats, num_feats) for cfg in configs], dtype=np.float64)


@functools.lru_cache(maxsize=None)
def load_model(name: str = MODEL_FILE) -> Optional[CostModel]:
    """The shipped model, or None when no weights are shipped (then the tuner times every
    candidate, and zero-shot picks fall back to the heuristic)."""
    path = DATA_DIR / name
    if not path.exists():
        return None
    with open(path) as f:
        return CostModel(json.load(f))
