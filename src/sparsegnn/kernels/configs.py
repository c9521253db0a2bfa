"""Kernel launch configurations as data, shared by the launchers, ``triton.autotune`` and the tuner.

Each entry is a plain dict of constexpr block sizes and launch options.
"""
from __future__ import annotations

from typing import Dict, List


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


#: Search space of the row-per-program CSR SpMM (BLOCK_E edges x BLOCK_F features per step).
SPMM_CSR_SPACE: List[Dict[str, int]] = [
    {"BLOCK_E": block_e, "BLOCK_F": block_f, "num_warps": warps}
    for block_e in (8, 16, 32)
    for block_f in (32, 64, 128)
    for warps in (2, 4, 8)
]


def spmm_csr_default(num_feats: int) -> Dict[str, int]:
    """Heuristic config: the whole feature row in one program up to 128 features."""
    block_f = min(max(next_pow2(num_feats), 16), 128)
    return {"BLOCK_E": 16, "BLOCK_F": block_f, "num_warps": 4 if block_f >= 64 else 2}


__all__ = ["SPMM_CSR_SPACE", "spmm_csr_default", "next_pow2"]
