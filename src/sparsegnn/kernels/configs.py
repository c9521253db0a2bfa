"""Kernel launch configurations as data, shared by the launchers, the benchmark sweeps and the tuner.

A config is a plain dict of constexpr block sizes and launch options; a search space gives
the values each key may take.  The ``*_candidates`` functions are the current heuristics
(picked from sweeps on the H100, see ``docs/design/spmm.md``): short lists drawn from the
spaces that first-call autotuning times.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


#: Planned SpMM search space: the values each config key may take.  Every autotuning
#: candidate (``spmm_candidates``) is drawn from it; ``scripts/sweep_tune.py`` times every
#: candidate.
#: GROUP_ROWS x GROUP_E: short rows side by side x edges per step (row-group kernel);
#: ROWS x BLOCK_E: segments per program x edges per step (heavy rows, long-row pieces, flat);
#: LIGHT_STEPS: row-group steps a short row may take before it gets a program of its own;
#: FLAT: one launch, one row per program; SEG_WARPS: warps of the combining launches;
#: HEAVY_E: in a flat launch, edges per step of the rows heavier than LIGHT_STEPS steps.
SPMM_SPACE: Dict[str, Tuple[int, ...]] = {
    "BLOCK_F": (16, 32, 64, 128, 256),
    "BLOCK_E": (4, 8, 16, 32, 64),
    "ROWS": (1, 2, 4),
    "GROUP_ROWS": (1, 2, 4, 8, 16, 32, 64),
    "GROUP_E": (1, 2, 4, 8, 16, 32),
    "num_warps": (1, 2, 4, 8),
    "SEG_WARPS": (4, 8),
    "LIGHT_STEPS": (4, 8, 16, 64),
    "FLAT": (1,),
    "HEAVY_E": (16, 32, 64),
    "SPLIT": (1,),
    "PIECE_STEPS": (4, 8, 16, 32),
    "INLINE": (0, 1),
    "num_stages": (1, 2, 3, 4),
}

#: Row-wise SDDMM search space (same meaning of the keys).
SDDMM_SPACE: Dict[str, Tuple[int, ...]] = {
    "BLOCK_F": (16, 32, 64, 128, 256),
    "BLOCK_E": (4, 8, 16, 32, 64, 128, 256),
    "ROWS": (1, 2, 4),
    "FLAT": (0, 1),
    "num_warps": (1, 2, 4, 8),
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


def _unique(configs: List[Dict[str, int]]) -> List[Dict[str, int]]:
    """``configs`` without repeats, first occurrence kept (the heuristic stays first)."""
    out: List[Dict[str, int]] = []
    for cfg in configs:
        if cfg not in out:
            out.append(cfg)
    return out


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


def spmm_plan_config(num_rows: int, num_edges: int, num_feats: int, elem_size: int,
                     max_degree: Optional[int] = None) -> Dict[str, int]:
    """Heuristic config of the planned SpMM (the first autotuning candidate)."""
    return spmm_candidates(num_rows, num_edges, num_feats, elem_size, max_degree)[0]


#: An unsplit schedule (flat) may take at most this many edge steps for the largest row, so a
#: hub does not leave one program running long after the rest.
FLAT_MAX_STEPS = 256


def _flat(block_e: int, block_f: int, num_warps: int, heavy_e: int = 0) -> Dict[str, int]:
    """One launch, one program per row; with ``heavy_e``, rows of more than 8 steps are listed
    first and take ``heavy_e`` edges per step."""
    cfg = {"FLAT": 1, "ROWS": 1, "BLOCK_E": block_e, "BLOCK_F": block_f, "num_warps": num_warps}
    return dict(cfg, HEAVY_E=heavy_e, LIGHT_STEPS=8) if heavy_e else cfg


def _split(block_e: int, block_f: int, num_warps: int, piece_steps: int = 8, inline: int = 1,
           heavy_e: int = 32) -> Dict[str, int]:
    """One launch; rows of more than 8 light steps are cut into pieces of ``piece_steps`` x
    ``heavy_e`` edges, launched first, and combined in piece order by the last piece to finish
    (``inline``) or by a second launch: no row takes more than ``piece_steps`` serial steps,
    however large its degree (hubs of thousands of edges in small graphs)."""
    return {"SPLIT": 1, "ROWS": 1, "BLOCK_E": block_e, "BLOCK_F": block_f, "num_warps": num_warps,
            "HEAVY_E": heavy_e, "PIECE_STEPS": piece_steps, "LIGHT_STEPS": 8, "INLINE": inline}


def _grouped(group_rows: int, group_e: int, block_f: int, num_warps: int, block_e: int) -> Dict[str, int]:
    """Single launch, heaviest first (``spmm_csr._grouped_kernel``): every short row up to 64
    steps of ``group_e`` edges in groups; heavier rows one per program and long-row pieces at
    ``block_e`` edges per step."""
    return {"GROUP_ROWS": group_rows, "GROUP_E": group_e, "BLOCK_F": block_f, "ROWS": 1,
            "BLOCK_E": block_e, "num_warps": num_warps, "SEG_WARPS": 4, "LIGHT_STEPS": 64}


def spmm_candidates(num_rows: int, num_edges: int, num_feats: int, elem_size: int,
                    max_degree: Optional[int] = None, multi_head: bool = False) -> List[Dict[str, int]]:
    """Autotuning candidates for the planned SpMM, the heuristic first.

    From the grid sweeps on the H100 (``docs/design/spmm.md``, timed from a cold L2 as the
    benchmark times): small tiles with one or two warps win almost everywhere, because many resident
    programs keep many independent gathers in flight.  Four families:

    - flat, one program per row (rows in id order, which keeps the L2 reuse of community
      graphs): only when the largest row takes at most ``FLAT_MAX_STEPS`` steps
      (``max_degree`` unknown: no flat configs); the hybrid variants give rows of more than 8
      steps their own programs, launched first, with 32 edges per step (the largest row's
      serial steps bound a small graph's time);
    - row groups of similar-degree rows, 1-2 edges per row per step, rows of more than 64
      steps one per program, long-row pieces: one launch, heaviest first (+ a combine);
    - split: flat, with rows of more than 8 light steps cut into pieces of a few steps that
      the last one to finish combines (one launch whatever the hubs);
    - the plan-sized schedule of ``_plan_entry``: the same launch with groups sized to the
      graph and a light bound of 4 steps.

    ``multi_head`` (edge values ``[E, H]``) keeps the flat and split families only.
    """
    full = min(max(next_pow2(num_feats), 16), 256)
    width = lambda w: min(full, w)  # noqa: E731
    flat_ok = lambda block_e: max_degree is not None and -(-max_degree // block_e) <= FLAT_MAX_STEPS  # noqa: E731
    out: List[Dict[str, int]] = []
    flat = [_flat(4, width(128), 1), _flat(4, width(256), 1), _flat(8, width(64), 2), _flat(16, 32, 2)]
    if num_edges <= SMALL_GRAPH_EDGES:
        flat += [_flat(8, width(128), 1), _flat(32, 32, 4)]
    hybrid = [_flat(4, width(128), 1, 32), _flat(8, width(64), 2, 32), _flat(4, width(64), 1, 32)]
    out += [c for c in hybrid + flat if flat_ok(c.get("HEAVY_E", c["BLOCK_E"]))]
    if max_degree is not None and max_degree > 8 * 4:  # some row is heavy for a light program
        out += [_split(4, width(128), 1), _split(8, width(64), 2), _split(4, width(64), 1, 16),
                _split(4, width(128), 1, 4), _split(4, width(128), 1, 8, inline=0)]
    if multi_head:
        return _unique(out) or [_split(4, width(128), 1)]
    # the best single-launch configs on the stand-ins and real graphs (docs/design/spmm.md)
    out += [_grouped(16, 1, width(32), 2, 32), _grouped(8, 1, width(64), 1, 16), _grouped(8, 1, width(64), 2, 32),
            _grouped(8, 1, width(128), 2, 16), _grouped(4, 1, width(64), 1, 32), _grouped(4, 1, width(128), 2, 16),
            _grouped(16, 1, width(64), 4, 32), _grouped(4, 2, width(32), 1, 16), _grouped(4, 1, width(128), 1, 16),
            _grouped(16, 1, width(32), 1, 32), _grouped(16, 1, width(128), 4, 16)]
    # Plan-sized groups: the widest feature block whose x slice fits the L2 budget.
    block_f = full
    while block_f > 32 and num_rows * block_f * elem_size > L2_BUDGET_BYTES:
        block_f //= 2
    avg = num_edges / max(num_rows, 1)
    out += [_plan_entry(num_rows, avg, block_f), _plan_entry(num_rows, avg, 32)]
    return _unique(out)


def sddmm_candidates(num_rows: int, num_edges: int, num_feats: int, op: str) -> List[Dict[str, int]]:
    """SDDMM autotuning candidates, heuristic first.

    From the grid sweep on the H100 (``docs/design/sddmm.md``, cold L2): one or two warps per
    program and small tiles win everywhere: at F <= 32 two segments of 16 edges per program, wider
    features 8 edges x 128 features (``dot`` loops over feature blocks).  ``FLAT=1`` configs
    run the edge-parallel kernel (``BLOCK_E`` consecutive edges per program, whatever the rows).
    """
    full = min(max(next_pow2(num_feats), 16), 256 if op == "dot" else 128)
    cfg = lambda rows, block_e, block_f, warps: {"ROWS": rows, "BLOCK_E": block_e, "BLOCK_F": block_f,  # noqa: E731
                                                  "num_warps": warps}
    if full <= 32:
        out = [cfg(2, 16, full, 1), cfg(1, 32, full, 1), cfg(1, 32, full, 2), cfg(1, 16, full, 1), cfg(4, 16, full, 1)]
    else:
        wide = min(full, 128)
        out = [cfg(1, 8, wide, 1), cfg(2, 8, wide, 1), cfg(1, 4, wide, 2), cfg(1, 16, 64, 2), cfg(1, 8, 64, 1)]
        if full == 256:
            out += [cfg(1, 4, 256, 1), cfg(1, 8, 256, 2)]
    # edge-parallel: about 4k elements per program (32 per thread at 4 warps)
    flat_f = min(full, 128)
    flat_e = max(4096 // flat_f, 16)
    out += [dict(cfg(1, flat_e, flat_f, 4), FLAT=1), dict(cfg(1, flat_e // 2, flat_f, 2), FLAT=1),
            dict(cfg(1, min(flat_e * 2, 256), flat_f, 8), FLAT=1)]
    return _unique(out)


def sddmm_config(num_rows: int, num_edges: int, num_feats: int, op: str) -> Dict[str, int]:
    """Heuristic SDDMM config (the first autotuning candidate)."""
    return sddmm_candidates(num_rows, num_edges, num_feats, op)[0]
