"""GPC-style learned cost model: ranks a kernel's candidate configs from graph and config features.

Following GPC: inputs are logs of sizes and shares, normalised
(the stored mean/std stand in for batch norm), then dense layers with ReLU.  What it learns is
the *order* of a case's candidates (a case = graph x F x dtype): it is trained with a listwise
loss (ListNet: per case, the softmax of the negated outputs is fitted to the softmax of
``-log2(ms / best) / tau``), so its capacity goes to telling the fastest configs apart rather
than to the slow tail's exact times, and a timing spike on a slow config barely moves it.
The output is scaled by ``tau``: it approximates ``log2(ms / case's best)`` up to a per-case
constant; lower is faster, and only the order is used (zero-shot pick, shortlist).

Inputs (``build_inputs``): the graph's sizes, degree quantiles, spread, hub share and
locality, F and the element size, and what the config implies on this graph, derived from the
kernels' launch logic (``kernels/spmm_csr.py``, ``formats/plan.py``): the config family (flat,
hybrid flat, split, row groups, plan-sized groups), the rows too heavy for the light path
and the edges in them (interpolated from the degree quantiles), programs and feature blocks
launched, serial steps of the longest program, the edge slots stepped over in all, tile sizes
per thread, and the kernel launches (the row-group and planned schedules launch one kernel,
and a second that combines the pieces of rows over the plan's chunk: on small graphs each
launch costs more than the kernel).  Inputs version 3 adds the occupancy of the launch
(``occupancy_inputs``: programs launched over programs the H100's 132 SMs hold at once for the
config's warps, bytes one step of the running programs gathers, the gathered slice of ``x``
over the 50 MB L2, bytes per gathered row, programs running at once) and, for every config-part
input ``c``, ``c`` minus its mean over the case's candidate list (``rel_*``): a row then says
where the config stands among the case's candidates, so ``build_inputs`` must be given the
whole candidate list (``rank`` and ``predict`` are, at run time and in the fit).  These are
computed from the same ``GraphStats``, F and element size that ``features.py`` gets;
``features.signature`` is not involved.

The weights are plain JSON (never a pickle) under ``tune/data/``, one file per GPU they were
fitted on where the package ships one (``model_file``; else the H100's), written by
``scripts/fit_cost_model.py`` from sweep data of ``scripts/sweep_tune.py`` (the JSON records the
data files' names and checksums), timed as the tuner times (CUDA-graph replays).  An ensemble of
small MLPs is stored as one MLP (the members' hidden layers side by side, block diagonal, the
output averaging them), so inference is two or three numpy matrix products (~0.1-0.3 ms per case
with the features, all in Python/numpy).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..kernels.configs import spmm_chunk
from .features import GraphStats
from .store import device_slug

DATA_DIR = Path(__file__).parent / "data"
MODEL_FILE = "cost_model_spmm.json"

#: Version of ``build_inputs``' layout; the shipped JSON records the one it was fitted on.
#: 1: graph + config values; 2: + what the config implies on the graph (launch logic);
#: 3: + occupancy inputs (``OCCUPANCY_NAMES``) + every config-part input relative to the
#: candidate list's mean (``rel_*``); 4: ``launches`` of the row-group and planned configs
#: counts their single launch (+ the combine of long rows).
INPUTS_VERSION = 4

#: The GPU the weights are fitted for (H100 SXM), as the occupancy inputs use it.
NUM_SMS = 132
#: Programs (thread blocks) one SM holds at once at most, and warps (64 x 32 = 2048 threads).
MAX_PROGRAMS_PER_SM = 32
MAX_WARPS_PER_SM = 64
#: L2 cache size in bytes (50 MB).
L2_BYTES = 50 * 2 ** 20

GRAPH_NAMES = (
    "log_nodes", "log_edges", "log_deg_mean", "log_deg_max", "log_deg_p50", "log_deg_p90", "log_deg_p99",
    "spread", "empty_frac", "hub_share", "local_frac", "window_frac", "log_F", "elem_size", "log_x_bytes",
    "log_gathered_bytes", "log_chunk", "has_long_rows",
)
CONFIG_NAMES = (
    # the config's own values
    "is_flat", "is_hybrid_flat", "is_split", "is_grouped", "is_planned", "log_block_f", "log_block_e",
    "log_warps", "log_group_rows", "log_light_e", "log_heavy_e", "log_piece_steps", "inline",
    # implied on this graph
    "log_feature_blocks", "feature_lane_use", "log_programs", "log_waves", "log_serial_steps",
    "log_serial_over_mean_steps", "log_steps_total", "log_slot_use", "log_tile", "log_tile_per_thread",
    "log_tile_bytes", "launches", "log_launch_over_bytes", "log_threads", "log_edges_per_program",
)
#: Occupancy (version 3), see ``occupancy_inputs``.
OCCUPANCY_NAMES = (
    "log_launched_over_resident", "log_bytes_in_flight", "log_x_slice_over_l2", "log_row_bytes", "log_resident",
)

#: Names of the input columns (the JSON stores them; ``CostModel`` checks the width): the graph
#: part, the config part (config values, implied, occupancy), then the config part again minus
#: its mean over the candidate list (``rel_`` + name).
INPUT_NAMES = (GRAPH_NAMES + CONFIG_NAMES + OCCUPANCY_NAMES
               + tuple("rel_" + name for name in CONFIG_NAMES + OCCUPANCY_NAMES))


def _lg(value: float) -> float:
    return math.log2(max(value, 0.0) + 1.0)


def _bucket_limit(degree: int) -> int:
    """Top degree of the last whole degree bucket (``floor(log2(deg + 1))``) within ``degree``:
    the light bound ``RowPlan.heavy_rows`` / ``num_short_below`` use (-1 when none fits)."""
    last = (int(degree) + 1).bit_length() - 2
    return (1 << (last + 1)) - 2 if last >= 0 else -1


class DegreeProfile:
    """A graph's degree distribution, interpolated from its quantiles.

    The share of rows of degree > t is taken as a power law in ``t + 1`` between the points
    (0, non-empty share), (p50, 0.5), (p90, 0.1), (p99, 0.01), (max, 1 / N); the share of edges
    in those rows is its integral (closed form per piece) over the profile's own total, and is
    pinned to the exact ``hub_share`` (edges in rows of > 256) where the graph has such rows:
    thresholds that are not quantiles (the light bounds, the plan's chunk) get an estimate.
    Results are memoised per threshold.
    """

    HUB = 256

    def __init__(self, stats: GraphStats) -> None:
        self.stats = stats
        n = max(stats.num_nodes, 1)
        d50 = max(stats.deg_p50, 0.0)
        d90 = max(stats.deg_p90, d50)
        d99 = max(stats.deg_p99, d90)
        dmax = max(float(stats.deg_max), d99)
        nonempty = max(1.0 - stats.empty_frac, 0.0)
        points = [(0.0, nonempty), (d50, 0.5), (d90, 0.1), (d99, 0.01), (dmax, 1.0 / n)]
        # pieces (d0, d1, f0, slope) of positive length: P(D > x) = f0 ((x + 1) / (d0 + 1))^-slope
        self.pieces = []
        for (d0, f0), (d1, f1) in zip(points, points[1:]):
            if d1 > d0:
                f0, f1 = max(f0, 1e-12), max(min(f1, f0), 1e-12)
                self.pieces.append((d0, d1, f0, math.log(f0 / f1) / math.log((d1 + 1) / (d0 + 1))))
        self._rows: Dict[float, float] = {}
        self._edges: Dict[float, float] = {}
        self._total = self._integral(0.0)
        self._hub = self._share(self.HUB) if stats.deg_max > self.HUB else 0.0

    def rows_above(self, t: float) -> float:
        """Share of rows with degree > t."""
        got = self._rows.get(t)
        if got is None:
            got = self._rows[t] = self._rows_above(t)
        return got

    def _rows_above(self, t: float) -> float:
        if t >= self.stats.deg_max:
            return 0.0
        for d0, d1, f0, slope in self.pieces:
            if t < d1:
                return f0 * ((max(t, d0) + 1) / (d0 + 1)) ** -slope
        return 0.0

    def _integral(self, t: float) -> float:
        """``int_t^max P(D > x) dx``."""
        total = 0.0
        for d0, d1, f0, slope in self.pieces:
            lo, hi = max(d0, t) + 1, d1 + 1
            if hi <= lo:
                continue
            scale = f0 * (d0 + 1) ** slope
            if abs(slope - 1.0) < 1e-9:
                total += scale * math.log(hi / lo)
            else:
                total += scale * (hi ** (1 - slope) - lo ** (1 - slope)) / (1 - slope)
        return total

    def _share(self, t: float) -> float:
        if t >= self.stats.deg_max or self._total <= 0:
            return 0.0
        return min(max((t * self.rows_above(t) + self._integral(t)) / self._total, 0.0), 1.0)

    def edges_above(self, t: float) -> float:
        """Share of edges in rows of degree > t.  With rows over 256 the exact ``hub_share``
        is used: above 256 it is spread by the profile's shape, below it the profile's edges
        between t and 256 (over the true mean degree) are added to it."""
        got = self._edges.get(t)
        if got is None:
            if self._hub <= 0:
                got = self._share(t)
            elif t >= self.HUB:
                got = self.stats.hub_share * self._share(t) / self._hub
            else:
                hub = self.HUB
                middle = t * self.rows_above(t) - hub * self.rows_above(hub) + self._integral(t) - self._integral(hub)
                got = min(self.stats.hub_share + max(middle, 0.0) / max(self.stats.deg_mean, 1e-12), 1.0)
            self._edges[t] = got
        return got


def graph_context(stats: GraphStats, num_feats: int, elem_size: int) -> Tuple:
    """What every config's input row shares: the graph part and the degree profile."""
    n, e = max(stats.num_nodes, 1), max(stats.num_edges, 1)
    chunk = spmm_chunk(n, e)
    mean = stats.deg_mean
    graph_part = [
        _lg(n), _lg(e), _lg(mean), _lg(stats.deg_max), _lg(stats.deg_p50), _lg(stats.deg_p90), _lg(stats.deg_p99),
        stats.deg_std / mean if mean > 0 else 0.0, stats.empty_frac, stats.hub_share, stats.local_frac,
        stats.window_frac, _lg(num_feats), float(elem_size), _lg(max(stats.sources, 1) * num_feats * elem_size),
        _lg(e * num_feats * elem_size), _lg(chunk), float(stats.deg_max > chunk),
    ]
    return graph_part, DegreeProfile(stats), chunk


def occupancy_inputs(num_src: int, num_feats: int, elem_size: int, block_f: int, warps: int, launched: float,
                     tile: float) -> List[float]:
    """The occupancy part of a config's row (``OCCUPANCY_NAMES``), from the launch geometry.

    With ``L`` programs launched (row programs x feature blocks, ``launched``) of ``W`` warps,
    an SM holds ``r = min(MAX_PROGRAMS_PER_SM, MAX_WARPS_PER_SM // W)`` of them (registers and
    shared memory are not modelled), the GPU ``R = NUM_SMS * r``, and ``A = min(L, R)`` run at
    once.  A step of a program gathers ``tile`` elements (edges x features, see
    ``config_inputs``), and each gathered row of ``x`` is ``b = min(BLOCK_F, F) * elem_size``
    contiguous bytes.  The grid runs feature blocks slowest, so while one runs its programs
    gather from an ``S x min(BLOCK_F, F)`` slice of ``x`` (``S = num_src``: the rows of ``x``,
    a bipartite graph's sources).  Inputs (``lg(v) = log2(v + 1)``):

    - ``log_launched_over_resident = lg(L / R)`` (waves at this config's occupancy);
    - ``log_bytes_in_flight = lg(A * tile * elem_size)`` (bytes one step of all running programs requests);
    - ``log_x_slice_over_l2 = lg(S * b / L2_BYTES)`` (whether the gathered slice stays in L2);
    - ``log_row_bytes = lg(b)`` (sector use of a gathered row);
    - ``log_resident = lg(A)``.
    """
    per_sm = max(min(MAX_PROGRAMS_PER_SM, MAX_WARPS_PER_SM // max(warps, 1)), 1)
    capacity = NUM_SMS * per_sm
    active = min(launched, capacity)
    row_bytes = min(block_f, max(num_feats, 1)) * elem_size
    return [_lg(launched / capacity), _lg(active * tile * elem_size), _lg(max(num_src, 1) * row_bytes / L2_BYTES),
            _lg(row_bytes), _lg(active)]


def config_inputs(stats: GraphStats, num_feats: int, elem_size: int, config: Dict[str, int], profile: DegreeProfile,
                  chunk: int) -> List[float]:
    """The config part of an input row (``CONFIG_NAMES + OCCUPANCY_NAMES``): the config's
    values, what they imply on this graph, and the occupancy (``occupancy_inputs``)."""
    n, e = max(stats.num_nodes, 1), max(stats.num_edges, 1)
    mean, dmax = stats.deg_mean, float(stats.deg_max)
    num_feats = max(num_feats, 1)
    block_f = config.get("BLOCK_F", 32)
    fblocks = -(-num_feats // block_f)
    warps = config.get("num_warps", 1)
    block_e = config.get("BLOCK_E", 8)
    flat, split = bool(config.get("FLAT")), bool(config.get("SPLIT"))
    grouped = not flat and not split and config.get("LIGHT_STEPS", 0) == 64
    planned = not (flat or split or grouped)
    heavy_e = config.get("HEAVY_E", 0)
    group_rows = 1
    launches = 1.0
    if flat or split:  # one program per row (heavy rows: listed first, or cut into pieces)
        light_e = block_e
        if heavy_e:
            light_max = _bucket_limit(min(8 * block_e, chunk))
            heavy_rows = profile.rows_above(light_max) * n
            heavy_edges = profile.edges_above(light_max) * e
        else:
            light_max, heavy_rows, heavy_edges = dmax, 0.0, 0.0
        if split:
            heavy_e = heavy_e or 32
            piece_e = heavy_e * config.get("PIECE_STEPS", 8)
            programs = n + heavy_edges / piece_e + heavy_rows * 0.5
            serial = (max(min(light_max, dmax) / block_e, min(dmax, piece_e) / heavy_e)
                      + (dmax / piece_e if light_max < dmax else 0.0) / 4)
            if not config.get("INLINE", 1) and heavy_rows >= 0.5:
                launches += 1.0
        elif heavy_e:
            programs = n + heavy_rows
            serial = max(min(light_max, dmax) / block_e, dmax / heavy_e if heavy_rows >= 0.5 else 0.0)
        else:
            programs = n
            serial = dmax / block_e
        steps = ((e - heavy_edges) / block_e + (n - heavy_rows) * (1 - stats.empty_frac) * 0.5 * (1 - 1.0 / block_e)
                 + heavy_edges / max(heavy_e, 1) + heavy_rows * 0.5)
        tile = block_e * block_f
    else:  # light rows side by side in groups; heavier short rows and long-row pieces in the same launch
        group_e, group_rows = config.get("GROUP_E", 1), config.get("GROUP_ROWS", 1)
        if grouped:
            light_max = _bucket_limit(64 * group_e)
        elif group_rows == 1 and group_e >= block_e:
            light_max = chunk
        else:
            light_max = _bucket_limit(4 * group_e)
        light_max = min(light_max, chunk)
        long_rows, long_edges = profile.rows_above(chunk) * n, profile.edges_above(chunk) * e
        seg_rows = profile.rows_above(light_max) * n - long_rows
        seg_edges = profile.edges_above(light_max) * e - long_edges
        light_rows = n - seg_rows - long_rows
        programs = light_rows / group_rows + seg_rows + long_edges / chunk + long_rows * 0.5
        launches += 1.0 if dmax > chunk else 0.0   # one launch, and a combining one for long rows
        # a group steps as long as its largest row (rows of one degree bucket: up to ~2x the mean)
        steps = (light_rows / group_rows * (min(mean, light_max) * 1.5 / group_e + 0.5) + seg_edges / block_e
                 + seg_rows * 0.5 + long_edges / block_e)
        serial = max(min(dmax, light_max) / group_e, min(dmax, chunk) / block_e if dmax > light_max else 0.0)
        tile = group_rows * group_e * block_f
        light_e = group_e
    programs = max(programs, 1.0)
    threads = 32 * warps
    gathered = e * num_feats * elem_size
    return [
        float(flat and not heavy_e), float(flat and bool(heavy_e)), float(split), float(grouped), float(planned),
        _lg(block_f), _lg(block_e), _lg(warps), _lg(group_rows), _lg(light_e), _lg(heavy_e),
        _lg(config.get("PIECE_STEPS", 0)), float(config.get("INLINE", 1)),
        _lg(fblocks), num_feats / (fblocks * block_f), _lg(programs * fblocks), _lg(programs * fblocks / (132 * 16)),
        _lg(serial), _lg(serial) - _lg(steps / programs), _lg(steps * fblocks),
        _lg(steps * tile * fblocks / (e * num_feats)), _lg(tile), _lg(tile / threads), _lg(tile * elem_size),
        launches, _lg(launches * 1e-3 / max(gathered / 3e9, 1e-9)), _lg(programs * fblocks * threads),
        _lg(e / programs),
    ] + occupancy_inputs(stats.sources, num_feats, elem_size, block_f, warps, programs * fblocks, tile)


def build_inputs(stats: GraphStats, num_feats: int, elem_size: int, configs: Sequence[Dict[str, int]]) -> np.ndarray:
    """Model input rows for every config of one case's candidate list.

    A row is ``[g, c_i, c_i - mean_j c_j]``: the graph part ``g`` (``GRAPH_NAMES``, the same
    in every row), the config part ``c_i`` of config i (``CONFIG_NAMES + OCCUPANCY_NAMES``), and
    ``c_i`` minus the mean of ``c_j`` over all of ``configs`` (the ``rel_`` columns: where a
    config stands among the case's candidates).  ``configs`` must therefore be the whole
    candidate list of the case, as ``CostModel.rank`` / ``predict`` receive it at run time and
    ``scripts/fit_cost_model.py`` passes it in training; a row depends on the other configs.

    Shapes:
        -> [len(configs), len(INPUT_NAMES)] float64.
    """
    graph_part, profile, chunk = graph_context(stats, num_feats, elem_size)
    width = len(CONFIG_NAMES) + len(OCCUPANCY_NAMES)
    part = np.asarray([config_inputs(stats, num_feats, elem_size, cfg, profile, chunk) for cfg in configs],
                      dtype=np.float64).reshape(len(configs), width)
    relative = part - part.mean(0) if len(configs) else part
    graph = np.broadcast_to(np.asarray(graph_part, dtype=np.float64), (len(configs), len(graph_part)))
    return np.concatenate([graph, part, relative], axis=1).reshape(len(configs), len(INPUT_NAMES))


class CostModel:
    """An MLP over ``build_inputs`` rows (an ensemble is stored as one wider MLP).

    Args:
        spec: dict with ``mean``, ``std`` (input normalisation) and ``layers`` (list of
            ``{"W": [out][in], "b": [out]}``, ReLU between layers, linear output); optional
            ``inputs_version`` (must be ``INPUTS_VERSION`` when present).
    """

    def __init__(self, spec: Dict) -> None:
        self.spec = spec
        self.mean = np.asarray(spec["mean"], dtype=np.float64)
        self.std = np.asarray(spec["std"], dtype=np.float64)
        self.layers = [(np.asarray(layer["W"], dtype=np.float64), np.asarray(layer["b"], dtype=np.float64))
                       for layer in spec["layers"]]
        if not self.layers or self.layers[0][0].shape[1] != self.mean.size or self.std.size != self.mean.size:
            raise ValueError("CostModel(): the first layer's width does not match the input normalisation")
        version = spec.get("inputs_version")
        if version is not None and version != INPUTS_VERSION:
            raise ValueError(f"CostModel(): weights fitted on inputs version {version}, "
                             f"this code builds {INPUTS_VERSION}")

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
        """Relative log2 time of every config on this graph (lower is faster).  ``configs`` is
        the case's whole candidate list (the ``rel_*`` inputs are relative to its mean).

        Shapes:
            configs: C dicts -> [C].
        """
        return self.predict_matrix(build_inputs(stats, num_feats, elem_size, configs))

    def rank(self, stats: GraphStats, num_feats: int, elem_size: int, configs: Sequence[Dict[str, int]]) -> List[int]:
        """Indices of ``configs``, predicted fastest first."""
        return [int(i) for i in np.argsort(self.predict(stats, num_feats, elem_size, configs), kind="stable")]

    def to_json(self) -> Dict:
        return self.spec


def model_file(device: Optional[str] = None) -> str:
    """The weights' file name for a device: ``cost_model_spmm.<device-slug>.json`` when the
    package ships weights fitted on that GPU (timings, and so the best configs, differ between
    GPUs: weights fitted on the H200's family graphs picked within 10 % of the best on 58 % of
    the H100 sweeps' cases, 87 % the other way round), else the default ``MODEL_FILE``
    (fitted on the H100).

    Args:
        device: a device name as ``torch.cuda.get_device_name`` gives it (``"NVIDIA H200"``),
            or None for the default.
    """
    if device:
        name = f"cost_model_spmm.{device_slug(device)}.json"
        if (DATA_DIR / name).exists():
            return name
    return MODEL_FILE


def weights_id(name: str) -> str:
    """``name`` tagged with a digest of the file's bytes (``cost_model_spmm.json#1a2b3c4d``), or
    ``name`` itself where the package ships no such file: what a stored pick of the model
    records as the weights that made it, so that weights refitted under the same file name
    (a GPU's own, fitted on more data) make their picks again."""
    return _weights_digest(str(DATA_DIR / name), name)


@functools.lru_cache(maxsize=None)
def _weights_digest(path: str, name: str) -> str:
    file = Path(path)
    if not file.is_file():
        return name
    return f"{name}#{hashlib.blake2b(file.read_bytes(), digest_size=4).hexdigest()}"


@functools.lru_cache(maxsize=None)
def load_model(device: Optional[str] = None) -> Optional[CostModel]:
    """The shipped model for ``device`` (a GPU's name; ``model_file``), or None when no weights
    are shipped (then the tuner times every candidate, and zero-shot picks fall back to the
    heuristic)."""
    return _load_file(model_file(device))


@functools.lru_cache(maxsize=None)
def _load_file(name: str) -> Optional[CostModel]:
    path = DATA_DIR / name
    if not path.exists():
        return None
    with open(path) as f:
        return CostModel(json.load(f))
