"""Kernel launch configurations as data, shared by the launchers, the benchmark sweeps and the tuner.

Each entry is a plain dict of constexpr block sizes and launch options.  The ``*_default`` /
``*_config`` functions are the current heuristics, picked from sweeps on the H100
(see notes/spmm.md); they return entries of the matching search space.
"""
from __future__ import annotations

from typing import Dict, List


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


#: Row-per-program CSR SpMM (the unplanned baseline).
SPMM_CSR_SPACE: List[Dict[str, int]] = [
    {"BLOCK_E": block_e, "BLOCK_F": block_f, "num_warps": warps}
    for block_e in (8, 16, 32)
    for block_f in (32, 64, 128)
    for warps in (2, 4, 8)
]

#: Planned segment-reduce SpMM: rows per program, edges per step, features per program, warps.
SPMM_PLAN_SPACE: List[Dict[str, int]] = [
    {"ROWS": rows, "BLOCK_E": block_e, "BLOCK_F": block_f, "num_warps": warps}
    for rows in (1, 2, 4)
    for block_e in (8, 16, 32, 64)
    for block_f in (16, 32, 64, 128, 256)
    for warps in (2, 4, 8)
    if block_e * block_f <= 8192
]

#: Short-row groups: rows side by side x edges per step (with BLOCK_F of SPMM_PLAN_SPACE).
SPMM_GROUP_SPACE: List[Dict[str, int]] = [
    {"GROUP_ROWS": rows, "GROUP_E": block_e}
    for rows in (1, 2, 4, 8, 16, 32, 64)
    for block_e in (2, 4, 8, 16, 32)
    if rows * block_e <= 256
]

#: Edges per piece when splitting long rows (the plan's ``chunk``).
SPMM_CHUNKS = (128, 256, 512, 1024, 2048, 4096)

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


def spmm_plan_config(num_rows: int, num_edges: int, num_feats: int, elem_size: int) -> Dict[str, int]:
    """Heuristic config of the planned SpMM.

    ``BLOCK_F``: the widest power of two (<= F, <= 256) whose ``x`` slice ``N x BLOCK_F`` fits
    the L2 budget (at least 32), so gathers hit L2.  ``BLOCK_E``: enough edges per step to
    cover the average degree without a mostly-masked tile.  ``ROWS``: several short rows per
    program when rows are very short.
    """
    full = min(max(next_pow2(num_feats), 16), 256)
    block_f = full
    while block_f > 32 and num_rows * block_f * elem_size > L2_BUDGET_BYTES:
        block_f //= 2
    avg = num_edges / max(num_rows, 1)
    block_e = 8 if avg <= 8 else 16 if avg <= 24 else 32
    block_e = min(block_e, max(8, 4096 // block_f))
    rows = 4 if avg <= 4 else 2 if avg <= 16 else 1
    warps = 4 if block_e * block_f >= 1024 else 2
    group_e = min(max(next_pow2(int(avg)), 2), 16)
    group_rows = max(1, min(64, 2048 // (group_e * block_f)))
    return {"ROWS": rows, "BLOCK_E": block_e, "BLOCK_F": block_f, "num_warps": warps,
            "GROUP_ROWS": group_rows, "GROUP_E": group_e}


#: Row-wise SDDMM: segments per program, edges per step, features per step, warps.
SDDMM_SPACE: List[Dict[str, int]] = [
    {"ROWS": rows, "BLOCK_E": block_e, "BLOCK_F": block_f, "num_warps": warps}
    for rows in (1, 2, 4)
    for block_e in (8, 16, 32, 64)
    for block_f in (32, 64, 128, 256)
    for warps in (2, 4, 8)
    if block_e * block_f <= 8192
]


def sddmm_config(num_rows: int, num_edges: int, num_feats: int, op: str) -> Dict[str, int]:
    """Heuristic SDDMM config: the feature row in as few steps as possible (<= 256 wide)."""
    block_f = min(max(next_pow2(num_feats), 16), 256 if op == "dot" else 128)
    avg = num_edges / max(num_rows, 1)
    block_e = 8 if avg <= 8 else 16 if avg <= 24 else 32
    block_e = min(block_e, max(8, 4096 // block_f))
    rows = 4 if avg <= 4 else 2 if avg <= 16 else 1
    warps = 4 if block_e * block_f >= 1024 else 2
    return {"ROWS": rows, "BLOCK_E": block_e, "BLOCK_F": block_f, "num_warps": warps}
