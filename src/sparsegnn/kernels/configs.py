"""Kernel launch configurations as data, shared by the launchers, the benchmark sweeps and the tuner.

A config is a plain dict of constexpr block sizes and launch options; a search space gives
the values each key may take.  The ``*_candidates`` functions are the current heuristics
(picked from sweeps on the H100, see notes/spmm.md): short lists drawn from the spaces that
first-call autotuning times.
"""
from __future__ import annotations

from typing import Dict, List, Tuple


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


#: Planned SpMM search space: the values each config key may take.  Every autotuning
#: candidate (``spmm_candidates``) is drawn from it, and scripts/sweep_spmm.py sweeps it.
#: GROUP_ROWS x GROUP_E: short rows side by side x edges per step (row-group kernel);
#: ROWS x BLOCK_E: segments per program x edges per step (heavy rows, long-row pieces, flat);
#: LIGHT_STEPS: row-group steps a short row may take before it goes to the segment kernel;
#: FLAT: one launch, one row per program; SEG_WARPS: warps of the segment launches.
SPMM_SPACE: Dict[str, Tuple[int, ...]] = {
    "BLOCK_F": (16, 32, 64, 128, 256),
    "BLOCK_E": (8, 16, 32, 64),
    "ROWS": (1, 2, 4),
    "GROUP_ROWS": (1, 2, 4, 8, 16, 32, 64),
    "GROUP_E": (2, 4, 8, 16, 32),
    "num_warps": (2, 4, 8),
    "SEG_WARPS": (4, 8),
    "LIGHT_STEPS": (4, 64),
    "FLAT": (1,),
}

#: Row-wise SDDMM search space (same meaning of the keys).
SDDMM_SPACE: Dict[str, Tuple[int, ...]] = {
    "BLOCK_F": (16, 32, 64, 128, 256),
    "BLOCK_E": (4, 8, 16, 32, 64),
    "ROWS": (1, 2, 4),
    "num_warps": (2, 4, 8),
}


def in_space(config: Dict[str, int], space: Dict[str, Tuple[int, ...]]) -> bool:
    """Whether every key of ``config`` is a key of ``space`` with an allowed value."""
    return all(key in space and value in space[key] for key, value in config.items())


#: Edges per piece when splitting long rows (the plan's ``chunk``).
SPMM_CHUNKS = (256, 512, 1024, 2048, 4096)

#: Graphs up to this many edges default to a single flat launch (host overhead dominates).
SMALL_GRAPH_EDGES = 500_000

#: Bytes of ``x`` per feature block that should stay resident in L2 while it is gathered.
L2_BUDGET_BYTES = 24 << 20


def spmm_csr_default(num_feats: int) -> Dict[str, int]:
    """Heuristic for the baseline: the whole feature row in one program up to 128 features."""
    block_f = min(max(next_pow2(num_feats), 16), 128)
    return {"BLOCK_E": 16, "BLOCK_F": block_f, "num_warps": 4 if block_f >= 64 else 2}


def spmm_chunk(num_rows: int, num_edges: int) -> int:
    """Piece length for long rows, within ``SPMM_CHUNKS``.

    At least 8x the average degree, and at least ``E / 512`` (a row is only worth splitting
    when it is a sizeable share of one SM's work; small graphs then take a single launch).
    """
    avg = num_edges / max(num_rows, 1)
    target = max(8 * avg, num_edges / 512)
    return next((c for c in SPMM_CHUNKS if c >= target), SPMM_CHUNKS[-1])


def _pow2_floor(n: float) -> int:
    return 1 << max(int(n), 1).bit_length() - 1


def _plan_entry(num_rows: int, avg: float, block_f: int, group_rows=None, group_e=None) -> Dict[str, int]:
    """A planned-SpMM config for ``BLOCK_F``: short-row groups sized to a 512..2048-element tile,
    with enough programs (``N / 16384`` rows per group at most) to fill the GPU."""
    if group_rows is None:
        group_rows = min(max(_pow2_floor(num_rows / 16384), 1), 64)
        group_e = min(max(next_pow2(int(avg)) // 2, 2), 32)
        while group_rows * group_e * block_f > 2048 and group_rows > 1:
            group_rows //= 2
        while group_rows * group_e * block_f < 512 and group_e < 32:
            group_e *= 2
    tile = group_rows * group_e * block_f
    return {"GROUP_ROWS": group_rows, "GROUP_E": group_e, "BLOCK_F": block_f,
            "ROWS": 1, "BLOCK_E": _segment_edges(block_f), "num_warps": 4 if tile >= 1024 else 2, "SEG_WARPS": 4}


def _segment_edges(block_f: int) -> int:
    """Edges per step for one-row-per-program schedules: a tile of about 2048 elements."""
    return min(max(2048 // block_f, 8), 32)


def spmm_plan_config(num_rows: int, num_edges: int, num_feats: int, elem_size: int) -> Dict[str, int]:
    """Heuristic config of the planned SpMM (the first autotuning candidate).

    ``BLOCK_F``: the widest power of two (<= F, <= 256) whose ``x`` slice ``N x BLOCK_F`` fits
    the L2 budget (at least 32), so gathers hit L2.
    """
    return spmm_candidates(num_rows, num_edges, num_feats, elem_size)[0]


def spmm_candidates(num_rows: int, num_edges: int, num_feats: int, elem_size: int) -> List[Dict[str, int]]:
    """Autotuning candidates: the heuristic first, then other feature widths and group shapes."""
    full = min(max(next_pow2(num_feats), 16), 256)
    block_f = full
    while block_f > 32 and num_rows * block_f * elem_size > L2_BUDGET_BYTES:
        block_f //= 2
    avg = num_edges / max(num_rows, 1)
    first = _plan_entry(num_rows, avg, block_f)
    out = [first]
    gr, ge = first["GROUP_ROWS"], first["GROUP_E"]
    for shape in ((gr * 2, max(ge // 2, 2)), (max(gr // 2, 1), min(ge * 2, 32))):
        out.append(_plan_entry(num_rows, avg, block_f, *shape))
    out.append(dict(first, num_warps=8))
    for width in (32, 64, 128, 256):
        if width != block_f and width <= full:
            out.append(_plan_entry(num_rows, avg, width))
    # Flat single-launch schedules: on small graphs host launch cost dominates, so one launch
    # wins; they lead the list there.
    flat = [{"FLAT": 1, "ROWS": 1, "BLOCK_E": _segment_edges(width), "BLOCK_F": width, "num_warps": 4}
            for width in sorted({min(full, 256), min(full, 128), min(full, 64)}, reverse=True)]
    # Single-launch row groups: every short row grouped (LIGHT_STEPS large), none split.
    grouped = [dict(_plan_entry(num_rows, avg, min(full, 64), gr, ge), LIGHT_STEPS=64) for gr, ge in ((4, 8), (2, 16))]
    if num_edges <= SMALL_GRAPH_EDGES:
        out = flat + grouped + out
    elif num_edges <= 8 * SMALL_GRAPH_EDGES:
        out = out + grouped + flat
    unique = []
    for cfg in out:
        if cfg not in unique:
            unique.append(cfg)
    return unique


def sddmm_candidates(num_rows: int, num_edges: int, num_feats: int, op: str) -> List[Dict[str, int]]:
    """SDDMM autotuning candidates, heuristic first: a [BLOCK_E, BLOCK_F] tile of about 2048
    elements (the feature row in one step up to 256 for ``dot``), one segment per program on
    graphs too small to fill the GPU otherwise."""
    block_f = min(max(next_pow2(num_feats), 16), 256 if op == "dot" else 128)
    block_e = min(max(2048 // block_f, 8), 32)
    avg = num_edges / max(num_rows, 1)
    rows = 1 if num_rows < 200_000 else 4 if avg <= 4 else 2 if avg <= 16 else 1
    base = {"ROWS": rows, "BLOCK_E": block_e, "BLOCK_F": block_f, "num_warps": 4}
    out = [base, dict(base, BLOCK_E=min(block_e * 2, 64)), dict(base, BLOCK_E=max(block_e // 2, 4)),
           dict(base, ROWS=max(rows // 2, 1) if rows > 1 else 2)]
    if block_f > 32:
        out.append(dict(base, BLOCK_F=block_f // 2, BLOCK_E=min(block_e * 2, 64)))
    unique = []
    for cfg in out:
        if cfg not in unique:
            unique.append(cfg)
    return unique


def sddmm_config(num_rows: int, num_edges: int, num_feats: int, op: str) -> Dict[str, int]:
    """Heuristic SDDMM config (the first autotuning candidate)."""
    return sddmm_candidates(num_rows, num_edges, num_feats, op)[0]
