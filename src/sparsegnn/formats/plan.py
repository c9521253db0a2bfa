"""Degree-aware work partitioning for CSR kernels (a "plan"): pure tensor code, built once per graph.

Rows with at most ``chunk`` edges are *short*: a program reduces several of them side by side,
each whole.  Short rows are listed by degree bucket (``floor(log2(deg + 1))``, stable, so ids
stay ascending inside a bucket): rows reduced together have similar degrees and similar trip
counts, and neighbouring ids (often sharing neighbours) stay together.
Longer rows are split into pieces of ``chunk`` edges; each piece is reduced into a row of a
partials buffer, and a second pass reduces each long row's partials in a fixed order, so the
result is deterministic (no atomics) and no program walks a hub's full edge list alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Tuple

import torch
from torch import Tensor

from ._host import small_on_gpu


@dataclass
class RowPlan:
    """Work lists for a segment-reduce schedule over a CSR.

    Attributes:
        chunk: edges per piece of a long row.
        short_rows: [S] int32 ids of rows with ``deg <= chunk`` (empty rows included), ordered
            by degree bucket, then id.
        long_rows: [L] int64 ids of rows with ``deg > chunk``.
        piece_start, piece_end: [P] int64 edge range of each piece.
        long_piece_ptr: [L + 1] int64: pieces of long row ``l`` are ``long_piece_ptr[l]:[l+1]``.
        piece_long: [P] int32 index into ``long_rows`` of each piece's row.
        col32: [E] int32 column indices (half the index bytes of int64).
        seg_row, seg_start, seg_end: [S + P] every short row and every piece as one list of
            independent ``(row, first edge, end edge)`` segments (for per-edge outputs: SDDMM).
        bucket_ptr: host list: ``short_rows[bucket_ptr[b]:bucket_ptr[b + 1]]`` have
            ``floor(log2(deg + 1)) == b`` (so kernels can treat light and heavy rows apart).
        max_degree: the largest row degree (host int; bounds the steps of unsplit schedules).
    """

    chunk: int
    short_rows: Tensor
    long_rows: Tensor
    piece_start: Tensor
    piece_end: Tensor
    long_piece_ptr: Tensor
    piece_long: Tensor
    col32: Tensor
    seg_row: Tensor
    seg_start: Tensor
    seg_end: Tensor
    bucket_ptr: list
    max_degree: int = 0
    rowptr: Tensor = None
    _heavy: dict = field(default_factory=dict, repr=False)
    _split: dict = field(default_factory=dict, repr=False)
    _row32: Tensor = field(default=None, repr=False)
    _by_degree: Tensor = field(default=None, repr=False)
    _short_desc: Tensor = field(default=None, repr=False)
    _long_counters: dict = field(default_factory=dict, repr=False)

    @property
    def short_desc(self) -> Tensor:
        """``short_rows`` reversed (built on first use, kept): heaviest bucket first, so a
        single launch over it starts its longest programs first and its short rows fill the
        GPU while they finish, instead of leaving a tail of heavy rows at the end."""
        if self._short_desc is None:
            self._short_desc = self.short_rows.flip(0).contiguous()
        return self._short_desc

    @property
    def rows_by_degree(self) -> Tensor:
        """[N] int32 row ids, most edges first (stable; built on first use, kept): the order in
        which a row-per-warp kernel hands out rows, so hubs start first."""
        if self._by_degree is None:
            deg = self.rowptr[1:] - self.rowptr[:-1]
            self._by_degree = torch.sort(deg, descending=True, stable=True).indices.to(torch.int32)
        return self._by_degree

    @property
    def row32(self) -> Tensor:
        """[E] int32 target row of every edge in CSR order (built on first use, kept: the
        edge-parallel SDDMM reads it in place of the segment lists)."""
        if self._row32 is None:
            counts = self.rowptr[1:] - self.rowptr[:-1]
            rows = torch.arange(counts.numel(), dtype=torch.int32, device=self.rowptr.device)
            self._row32 = torch.repeat_interleave(rows, counts, output_size=self.col32.numel())
        return self._row32

    def to(self, device: torch.device) -> "RowPlan":
        """This plan with every tensor (the lazily built ones included) on ``device``; the
        cached heavy-row lists and split pieces are rebuilt there on use."""
        moved = {}
        for f in fields(self):
            if f.name not in ("_heavy", "_split", "_long_counters"):
                value = getattr(self, f.name)
                moved[f.name] = value.to(device) if isinstance(value, Tensor) else value
        return RowPlan(**moved)

    def num_short_below(self, degree: int) -> int:
        """How many listed short rows are in buckets whose degrees are all <= ``degree``."""
        count = 0
        for b in range(len(self.bucket_ptr) - 1):
            if (1 << (b + 1)) - 1 > degree:
                break
            count = self.bucket_ptr[b + 1]
        return count

    def heavy_rows(self, degree: int) -> Tuple[Tensor, int]:
        """Rows too heavy for light treatment up to ``degree`` edges, and the light bound.

        Returns ``(rows, light_max)``: ``rows`` (int32, cached) holds exactly the rows of more
        than ``light_max`` edges, where ``light_max`` is the top degree of the last whole bucket
        within ``min(degree, chunk)`` (-1 when none fits): heavier short rows, then long rows.
        """
        last = (min(degree, self.chunk) + 1).bit_length() - 2  # last bucket with max degree < limit
        count = self.bucket_ptr[min(last + 1, len(self.bucket_ptr) - 1)] if last >= 0 else 0
        light_max = (1 << (last + 1)) - 2 if last >= 0 else -1
        cached = self._heavy.get(count)
        if cached is None:
            parts, device = [self.short_rows[count:], self.long_rows.to(torch.int32)], self.short_rows.device
            if small_on_gpu(parts[0], self.col32.numel(), "heavy_rows", self.rowptr.numel() - 1):
                parts = [t.cpu() for t in parts]                                     # formats/_host.py
            cached = self._heavy[count] = torch.cat(parts).to(device)
        return cached, light_max

    @property
    def num_pieces(self) -> int:
        return int(self.piece_start.numel())

    def long_counters(self, feature_blocks: int, stream: int = 0) -> Tensor:
        """Zeroed int32 arrival counters ``[L * feature_blocks]``, one per long row and feature
        block, for the calls issued on ``stream`` (a raw stream handle; kept: the kernel that
        combines a long row's pieces in the launch that computes them resets each counter to 0
        after use, so a buffer serves every call of one stream, whose calls run one after the
        other; calls on two streams may overlap, so each stream has its own)."""
        return _zeroed_counters(self._long_counters, feature_blocks, stream, self.long_rows.numel(), self.col32.device)

    def split_pieces(self, degree: int, piece_edges: int) -> "SplitPieces":
        """Rows heavier than ``degree`` edges (as :meth:`heavy_rows`) cut into pieces of
        ``piece_edges`` edges, for the single-launch split schedule (cached per argument pair)."""
        key = (degree, piece_edges)
        if key not in self._split:
            rows, light_max = self.heavy_rows(degree)
            self._split[key] = _split_rows(self.rowptr, rows, light_max, piece_edges)
        return self._split[key]


@dataclass
class SplitPieces:
    """Heavy rows of a CSR cut into fixed-size pieces.

    Attributes:
        heavy_rows: [H] int32 row ids (rows of more than ``light_max`` edges).
        heavy_first: [H + 1] int64: pieces of heavy row ``h`` are ``heavy_first[h]:[h + 1]``.
        piece_heavy: [P] int32 heavy-row index of every piece.
        piece_start: [P] int64 first edge of every piece (a piece ends ``piece_edges`` later
            or at its row's end).
        inv_deg: [H] float32 ``1 / deg`` of every heavy row (mean).
        light_max: rows of at most this many edges are light.
    """

    heavy_rows: Tensor
    heavy_first: Tensor
    piece_heavy: Tensor
    piece_start: Tensor
    inv_deg: Tensor
    light_max: int
    _counters: dict = field(default_factory=dict, repr=False)

    @property
    def num_heavy(self) -> int:
        return int(self.heavy_rows.numel())

    @property
    def num_pieces(self) -> int:
        return int(self.piece_start.numel())

    def counters(self, feature_blocks: int, stream: int = 0) -> Tensor:
        """Zeroed int32 arrival counters ``[H * feature_blocks]`` for the calls issued on
        ``stream`` (kept: the kernel resets each counter to 0 after use, so a buffer serves
        every call of one stream; each stream has its own, as ``RowPlan.long_counters``)."""
        return _zeroed_counters(self._counters, feature_blocks, stream, self.num_heavy, self.heavy_rows.device)


def _zeroed_counters(kept: dict, feature_blocks: int, stream: int, rows: int, device) -> Tensor:
    """The int32 counters ``[rows * feature_blocks]`` kept in ``kept`` for ``(feature_blocks,
    stream)``, zeroed when first made (at least one entry: a kernel needs a valid pointer).
    Inside a CUDA-graph capture new ones, not kept (their memset is part of the graph): a graph
    replays on whatever stream it is handed, so two graphs captured on one pooled capture stream
    would share kept counters, and replayed at once they would race."""
    if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(max(rows * feature_blocks, 1), dtype=torch.int32, device=device)
    key = (feature_blocks, stream)
    if key not in kept:
        kept[key] = torch.zeros(max(rows * feature_blocks, 1), dtype=torch.int32, device=device)
    return kept[key]


def _cut_rows(rowptr: Tensor, rows: Tensor, piece_edges: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Cut ``rows`` into pieces of ``piece_edges`` edges (the last piece of a row may be shorter).

    Returns:
        ``(first_piece, owner, piece_start)``: pieces of ``rows[r]`` are
        ``first_piece[r]:first_piece[r + 1]``; ``owner[p]`` is the index into ``rows`` of piece
        ``p``, ``piece_start[p]`` its first edge.

    Shapes:
        rows: [R] -> first_piece: [R + 1] int64; owner, piece_start: [P] int64.
    """
    rows64 = rows.to(torch.int64)
    pieces = (rowptr[rows64 + 1] - rowptr[rows64] + piece_edges - 1) // piece_edges
    first_piece = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=rowptr.device)
    torch.cumsum(pieces, 0, out=first_piece[1:])
    total = int(first_piece[-1]) if rows.numel() else 0
    owner = torch.repeat_interleave(torch.arange(rows.numel(), device=rowptr.device), pieces, output_size=total)
    index_in_row = torch.arange(total, device=rowptr.device) - first_piece[:-1][owner]
    return first_piece, owner, rowptr[rows64[owner]] + index_in_row * piece_edges


def _split_rows(rowptr: Tensor, rows: Tensor, light_max: int, piece_edges: int) -> SplitPieces:
    if piece_edges < 1:
        raise ValueError(f"split_pieces(): piece_edges must be >= 1, got {piece_edges}")
    heavy_first, owner, piece_start = _cut_rows(rowptr, rows, piece_edges)
    rows64 = rows.to(torch.int64)
    inv_deg = (rowptr[rows64 + 1] - rowptr[rows64]).to(torch.float32).reciprocal()
    return SplitPieces(rows.to(torch.int32), heavy_first, owner.to(torch.int32), piece_start, inv_deg, light_max)


def build_row_plan(rowptr: Tensor, col: Tensor, chunk: int) -> RowPlan:
    """Split rows of a CSR at ``chunk`` edges.

    Shapes:
        rowptr: [N + 1] int64; col: [E] -> RowPlan (see its attributes).
    """
    if chunk < 1:
        raise ValueError(f"build_row_plan(): chunk must be >= 1, got {chunk}")
    if small_on_gpu(col, col.numel(), "row_plan", rowptr.numel() - 1):   # host, lazy lists too (formats/_host.py)
        plan = build_row_plan(rowptr.cpu(), col.cpu(), chunk)
        _ = (plan.rows_by_degree, plan.row32)
        return plan.to(rowptr.device)
    deg = rowptr[1:] - rowptr[:-1]
    is_long = deg > chunk
    short_rows = torch.nonzero(~is_long).flatten()
    # floor(log2(deg + 1)) exactly, from the binary exponent (a float log2 on the GPU can round
    # 2^k - 1 into the bucket below, and the kernels' light/heavy split relies on exact buckets)
    bucket = torch.frexp((deg[short_rows] + 1).to(torch.float64)).exponent.to(torch.int64) - 1
    short_rows = short_rows[torch.argsort(bucket, stable=True)].to(torch.int32)
    counts = torch.bincount(bucket, minlength=1).cpu().tolist() if bucket.numel() else [0]
    bucket_ptr = [0]
    for c in counts:
        bucket_ptr.append(bucket_ptr[-1] + c)
    long_rows = torch.nonzero(is_long).flatten()
    long_piece_ptr, owner, piece_start = _cut_rows(rowptr, long_rows, chunk)
    piece_row = long_rows[owner]
    piece_end = torch.minimum(piece_start + chunk, rowptr[piece_row + 1])
    short64 = short_rows.to(torch.int64)
    seg_row = torch.cat([short64, piece_row]).to(torch.int32)
    seg_start = torch.cat([rowptr[short64], piece_start])
    seg_end = torch.cat([rowptr[short64 + 1], piece_end])
    plan = RowPlan(chunk, short_rows, long_rows, piece_start, piece_end, long_piece_ptr,
                   owner.to(torch.int32), col.to(torch.int32), seg_row, seg_start, seg_end, bucket_ptr,
                   int(deg.max()) if deg.numel() else 0, rowptr)
    _ = plan.short_desc  # built with the plan: never first under a CUDA-graph capture
    return plan

