"""Compressed Balanced Sparse Row (CBSR, MaxK-GNN): a feature matrix with exactly ``k`` kept
entries per row, stored as ``values [N, k]`` and their column ``index [N, k]``.

Every row holds the same number of entries, so row ``i``'s entries start at ``i k``: no row
pointer, coalesced reads, and ``k (s + b)`` bytes per row (``s``: value size, ``b``: index size,
1 byte while ``F <= 256``) instead of ``F s``.  The indices of a row are strictly increasing
(the kept features in feature order), which keeps every conversion deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def index_dtype(num_cols: int) -> torch.dtype:
    """The narrowest integer dtype that holds column ids below ``num_cols``: uint8 up to 256
    columns, int16 up to 32,768, else int32."""
    if num_cols <= 256:
        return torch.uint8
    if num_cols <= (1 << 15):
        return torch.int16
    return torch.int32


@dataclass(frozen=True)
class CBSR:
    """``k`` entries per row of an ``[N, num_cols]`` matrix.

    Attributes:
        values: [N, k] the kept entries (any float dtype; may carry autograd history).
        index: [N, k] their columns, strictly increasing along each row (``index_dtype``).
        num_cols: F, the dense width.

    Shapes:
        values, index: [N, k] -> dense [N, num_cols].
    """

    values: Tensor
    index: Tensor
    num_cols: int

    def __post_init__(self):
        if self.values.dim() != 2 or self.index.shape != self.values.shape:
            raise ValueError(f"CBSR(): values and index must be [N, k] of one shape, got "
                             f"{tuple(self.values.shape)} and {tuple(self.index.shape)}")
        if self.index.dtype.is_floating_point or self.index.dtype == torch.bool:
            raise ValueError(f"CBSR(): index must be an integer tensor, got {self.index.dtype}")
        if not 0 < self.values.shape[1] <= self.num_cols:
            raise ValueError(f"CBSR(): k = {self.values.shape[1]} entries per row must be in [1, num_cols = "
                             f"{self.num_cols}]")
        if self.values.device != self.index.device:
            raise ValueError(f"CBSR(): values on {self.values.device}, index on {self.index.device}")

    @property
    def k(self) -> int:
        return int(self.values.shape[1])

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.values.shape[0], self.num_cols))

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    def long_index(self) -> Tensor:
        """``index`` as int64 (for ``scatter`` / ``gather``)."""
        return self.index.long()

    def to_dense(self) -> Tensor:
        """The ``[N, num_cols]`` matrix, zeros off the kept entries (differentiable in ``values``)."""
        out = self.values.new_zeros(self.shape)
        return out.scatter_(1, self.long_index(), self.values)    # in place: no copy of the zeros

    def gather(self, dense: Tensor) -> Tensor:
        """``dense`` sampled at the kept positions: ``[N, k]`` with ``out[i, s] = dense[i, index[i, s]]``."""
        return dense.gather(1, self.long_index())

    def with_values(self, values: Tensor) -> "CBSR":
        """The same positions with other values (e.g. a gradient)."""
        return CBSR(values, self.index, self.num_cols)

    def check_index(self) -> None:
        """Raise ``ValueError`` unless every row's columns are strictly increasing and below
        ``num_cols`` (one host sync: for inputs built outside :func:`sparsegnn.maxk`)."""
        idx = self.long_index()
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.num_cols):
            raise ValueError(f"CBSR(): index values must lie in [0, {self.num_cols})")
        if self.k > 1 and bool((idx[:, 1:] <= idx[:, :-1]).any()):
            raise ValueError("CBSR(): the columns of each row must be strictly increasing")
