"""Sparse graph translation (TC-GNN, section 4.1): row windows condensed into dense tiles.

The CSR rows are cut into *windows* of ``W`` consecutive rows.  Within a window, the distinct
source columns its edges touch are *condensed*: listed in ascending order and renumbered
``0, 1, ...``; every ``K`` condensed columns form one *block*, a dense ``[W, K]`` tile of edge
values (duplicates summed).  A tensor-core SpMM then computes each window's output rows as
``sum_b tile_b @ X[cols_b]``: one ``[W, K] x [K, F]`` matrix product per block, and a source row
shared by several rows of the window is loaded once.

Without translation, a window would need one block per distinct column *block* ``col // K``
it touches (TC-GNN's Fig. 7a compares the two counts; ``TileStats``).

The reference here is tensor ops on the graph's device (sort / unique / scan, no Python loop
over windows; two host syncs: the sizes of ``unique`` and of the block count);
``kernels.translate.condense`` does the same index work in Triton, one program per window
sorting its edges in registers (a bit set of its columns where it holds over 2048 edges),
and is passed in by ``ops.tiles.translate_graph``.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from .csr import rowptr_to_row

__all__ = ["TileGraph", "TileSchedule", "TileStats", "translate", "tile_memory_bytes", "tile_values",
           "rows_ordered"]


class TileStats:
    """What translation did to one graph.

    Attributes:
        windows: row windows (``ceil(N / W)``).
        blocks_plain: ``[W, K]`` blocks needed without condensing (distinct ``(window, col // K)``).
        blocks: blocks after condensing the columns of each window.
        fill: distinct ``(row, col)`` positions / tile area of the blocks (``blocks * W * K``).
        ms: wall time of the translation (synchronised).

    ``blocks_plain`` and ``fill`` are reports, not inputs of any kernel: they are counted on
    first access (one more sort of the edges and a pass over the tile slots), not by
    :func:`translate`, whose time ``ms`` is what a tensor-core call costs once per graph.
    """

    def __init__(self, windows: int, blocks: int, ms: float, count: Callable[[], Tuple[int, int]],
                 area: int):
        """``count()``: (blocks_plain, occupied tile slots), called once, on first read;
        ``area``: slots per block (W * K)."""
        self.windows, self.blocks, self.ms = windows, blocks, ms
        self._count, self._counts, self._area = count, None, area

    def _counted(self) -> Tuple[int, int]:
        if self._counts is None:
            self._counts, self._count = self._count(), None
        return self._counts

    @property
    def blocks_plain(self) -> int:
        return self._counted()[0]

    @property
    def fill(self) -> float:
        return self._counted()[1] / max(self.blocks * self._area, 1)

    def as_dict(self) -> Dict[str, float]:
        return {"windows": self.windows, "blocks_plain": self.blocks_plain, "blocks": self.blocks,
                "fill": self.fill, "ms": self.ms}

    def __repr__(self) -> str:   # counts nothing: "not counted" until blocks_plain / fill are read
        counted = self._counts is not None
        parts = {"windows": self.windows, "blocks_plain": self.blocks_plain if counted else "not counted",
                 "blocks": self.blocks, "fill": self.fill if counted else "not counted", "ms": self.ms}
        return "TileStats(" + ", ".join(f"{k}={v!r}" for k, v in parts.items()) + ")"


@dataclass
class TileGraph:
    """A CSR graph translated into condensed ``[W, K]`` tiles.

    Attributes:
        window, block_k: ``W`` rows per window, ``K`` condensed columns per block.
        num_rows, num_src: ``N`` targets, ``M`` sources.
        window_ptr: ``[windows + 1]`` int64: the blocks of window ``w`` are ``window_ptr[w]:window_ptr[w+1]``.
        block_window: ``[B]`` int64 window of each block.
        block_cols: ``[B, K]`` int64 source node of each condensed column (0 past a window's
            last column; its tile column is all zeros).
        block_vals: ``[B, W, K]`` float32 tile values: ``A[w W + r, block_cols[b, k]]`` at ``[b, r, k]``
            (edge values summed over duplicates; 1 per edge without values).  Without edge
            values they are built on first read: a caller with weights of its own
            (``tiles_of``) never pays for a tile array of ones (yelp: 0.9 GB).
        edge_index: ``[E]`` int64 flat position of every CSR edge in ``block_vals`` (``b W K + r K + k``):
            new edge values (attention weights) become tiles with one ``index_add_`` (``tiles_of``).
        stats: :class:`TileStats`.
        rowptr: ``[N + 1]`` int64 the translated graph's row offsets (the caller's tensor where it
            is contiguous int64, else a copy: the runs kernel reads it with stride 1).

    Shapes:
        B blocks: block_cols [B, K], block_vals [B, W, K].

    **Runs** (the encoding without tile values).  Where the rows are :attr:`ordered`, slots never
    fall along a row, so row ``r``'s edges in block ``b`` are one run of its CSR edges, in column
    order (duplicates side by side, summed by the kernel): the edges ``e`` after those of the
    window's earlier blocks with ``edge_index[e] / (W K) = b``, at tile column
    ``edge_index[e] mod K``.  A kernel then builds
    each tile in registers from ``edge_index`` and per-edge values in CSR order
    (``kernels.spmm_tiles``, ``encoding="runs"``): no ``[B, W, K]`` values are written (reddit:
    7.3 GB of fp32 tiles, more time than a training epoch to zero and fill).
    """

    window: int
    block_k: int
    num_rows: int
    num_src: int
    window_ptr: Tensor
    block_window: Tensor
    block_cols: Tensor
    _block_vals: Optional[Tensor]
    edge_index: Tensor
    stats: TileStats
    _ordered: object = None
    rowptr: Optional[Tensor] = None
    _schedules: Dict[int, "TileSchedule"] = field(default_factory=dict, repr=False)

    @property
    def ordered(self) -> bool:
        """True where no row's slots fall along its edges (:func:`rows_ordered`: columns sorted
        within each row; duplicate edges allowed): the runs encoding holds.  A device flag
        from the translation, read once (one sync) on first access."""
        if not isinstance(self._ordered, bool):
            self._ordered = bool(self._ordered)
        return self._ordered

    @property
    def block_vals(self) -> Tensor:
        if self._block_vals is None:
            self._block_vals = self.tiles_of(None)
        return self._block_vals

    @block_vals.setter
    def block_vals(self, value: Tensor) -> None:
        self._block_vals = value

    @property
    def num_blocks(self) -> int:
        return int(self.block_cols.shape[0])

    def schedule(self, chunk: int = 16) -> "TileSchedule":
        """The work items of the tile SpMM with at most ``chunk`` blocks each (cached per chunk).

        A window of ``b`` blocks becomes ``ceil(b / chunk)`` items (an empty window one empty
        item, which writes its zero rows): a window holding a hub row of thousands of edges is
        spread over many programs instead of one program looping over all its blocks.
        """
        if not (isinstance(chunk, int) and chunk > 0):
            raise ValueError(f"TileGraph.schedule(): chunk must be a positive int, got {chunk!r}")
        cached = self._schedules.get(chunk)
        if cached is None:
            cached = self._schedules[chunk] = _schedule(self, chunk)
        return cached

    def tiles_of(self, values: Optional[Tensor], dtype: torch.dtype = torch.float32) -> Tensor:
        """Tile values ``[B, W, K]`` of ``dtype`` for per-edge ``values`` ``[E]`` in CSR order
        (None: 1 per edge); duplicates summed.  Differentiable with respect to ``values``.

        One in-place ``index_add_`` into fresh zeros: ``index_put(accumulate=True)`` sorts the
        indices first on CUDA, and the out-of-place ``index_add`` copies the tiles (yelp:
        0.9 GB, 0.6 ms).  It adds with atomics, so three or more duplicates of one edge may
        sum in a different order from call to call (bit-reproducible under
        ``torch.use_deterministic_algorithms``, where PyTorch makes it deterministic)."""
        return tile_values(self.edge_index, self.num_blocks, self.window, self.block_k, values, dtype)


def rows_ordered(edge_index: Tensor, row: Tensor) -> Tensor:
    """0-d bool: no edge's slot below its predecessor's in the same row (CSR order).  Slots rise
    with the condensed column, so this holds where each row's columns are sorted (duplicate
    edges allowed); the runs encoding (``TileGraph``) needs it.

    Shapes:
        edge_index, row: [E] -> [].
    """
    same = row[1:] == row[:-1]
    return ~(same & (edge_index[1:] < edge_index[:-1])).any()


def tile_values(edge_index: Tensor, num_blocks: int, window: int, block_k: int, values: Optional[Tensor],
                dtype: torch.dtype = torch.float32) -> Tensor:
    """``[num_blocks, W, K]`` tiles of ``dtype`` holding per-edge ``values`` (None: 1 per edge) at
    the flat slots ``edge_index`` (``TileGraph.tiles_of``'s work; duplicates summed by one in-place
    ``index_add_`` into fresh zeros).

    Shapes:
        edge_index: [E] -> [num_blocks, window, block_k].
    """
    device = edge_index.device
    if values is None:
        values = torch.ones((), dtype=dtype, device=device).expand(edge_index.numel())
    elif values.dtype != dtype:
        values = values.to(dtype)
    flat = torch.zeros((num_blocks, window, block_k), dtype=dtype, device=device)
    flat.view(-1).index_add_(0, edge_index, values)     # in place: no copy of the tiles
    return flat


@dataclass
class TileSchedule:
    """Work items of the tile SpMM (see :meth:`TileGraph.schedule`).

    Attributes:
        chunk: at most this many blocks per item.
        item_window, item_start, item_end: ``[I]`` int64 window and block range of each item.
        item_split: ``[I]`` int32, 1 where the item's window is spread over several items (its
            rows are accumulated with atomics into a zeroed output).
        split_rows: ``[R]`` int64 rows (``< N``) of the windows spread over several items.
        max_row: the most edges of any row (the runs encoding's binary searches take
            ``max_row.bit_length()`` steps).
    """

    chunk: int
    item_window: Tensor
    item_start: Tensor
    item_end: Tensor
    item_split: Tensor
    split_rows: Tensor
    max_row: int = 0

    @property
    def num_items(self) -> int:
        return int(self.item_window.numel())


def _schedule(tiles: "TileGraph", chunk: int) -> TileSchedule:
    device = tiles.window_ptr.device
    num_windows = tiles.window_ptr.numel() - 1
    per_window = tiles.window_ptr[1:] - tiles.window_ptr[:-1]
    items = torch.div(per_window + chunk - 1, chunk, rounding_mode="floor").clamp(min=1)
    rowptr = tiles.rowptr
    longest = (rowptr[1:] - rowptr[:-1]).max().to(items.dtype) if rowptr is not None and rowptr.numel() > 1 \
        else items.new_zeros(())
    num_items, max_row = torch.stack([items.sum(), longest]).tolist()     # one sync
    windows = torch.arange(num_windows, device=device)
    item_window = torch.repeat_interleave(windows, items, output_size=num_items)
    first = torch.cumsum(items, 0) - items
    nth = torch.arange(num_items, device=device) - first[item_window]
    item_start = tiles.window_ptr[item_window] + nth * chunk
    item_end = torch.minimum(item_start + chunk, tiles.window_ptr[item_window + 1])
    split = items > 1
    item_split = split[item_window].to(torch.int32)
    split_windows = windows[split]
    rows = (split_windows[:, None] * tiles.window + torch.arange(tiles.window, device=device)).flatten()
    return TileSchedule(chunk, item_window, item_start, item_end, item_split, rows[rows < tiles.num_rows], max_row)


def _condense(rowptr: Tensor, row: Tensor, col: Tensor, num_src: int, window: int, block_k: int,
              values: Optional[Tensor] = None):
    """``(window_ptr, block_window, block_cols, edge_index, None)`` with tensor ops (the
    reference; ``kernels.translate.condense`` computes the same per window, by a sort or a bit set).
    ``values`` is taken for the protocol of ``translate``'s ``condense``; the tile values are left
    to :func:`tile_values`."""
    device = row.device
    num_windows = -(-(rowptr.numel() - 1) // window)
    span = max(int(num_src), 1)
    shift_w, shift_k = window.bit_length() - 1, block_k.bit_length() - 1
    # distinct (window, column) pairs, sorted by window then column: the condensed columns
    # (int32 keys where they fit: the radix sort then makes half the passes)
    key = (row >> shift_w) * span + col
    if num_windows * span < 2 ** 31:
        key = key.to(torch.int32)
    keys, inverse = torch.unique(key, sorted=True, return_inverse=True)
    key_win = torch.div(keys, span, rounding_mode="floor")
    key_col = keys - key_win * span
    # first key of each window (the keys are sorted by window), blocks per window
    bounds = torch.searchsorted(key_win, torch.arange(num_windows + 1, device=device, dtype=keys.dtype))
    window_ptr = torch.zeros(num_windows + 1, dtype=torch.int64, device=device)
    blocks_per_window = (bounds.diff() + (block_k - 1)) >> shift_k
    torch.cumsum(blocks_per_window, 0, out=window_ptr[1:])
    num_blocks = int(window_ptr[-1]) if num_windows else 0
    # flat slot (block * K + column in block) of each key: its window's first slot plus its rank
    key_pos = (window_ptr[:-1] * block_k - bounds[:-1])[key_win] + torch.arange(keys.numel(), device=device)
    block_cols = torch.zeros(num_blocks * block_k, dtype=torch.int64, device=device)
    block_cols[key_pos] = key_col.to(torch.int64)
    block_window = torch.repeat_interleave(torch.arange(num_windows, device=device), blocks_per_window,
                                           output_size=num_blocks)
    # an edge's tile position: its key's block and column (block * W * K + column), its row
    # within the window
    key_base = key_pos + (key_pos >> shift_k) * ((window - 1) * block_k)
    edge_index = key_base[inverse] + ((row & (window - 1)) << shift_k)
    return window_ptr, block_window, block_cols.view(num_blocks, block_k), edge_index, None


def _count_stats(rowptr: Tensor, col: Tensor, edge_index: Tensor, num_src: int, num_blocks: int, window: int,
                 block_k: int) -> Tuple[int, int]:
    """``TileStats``' counts: distinct ``(window, column // K)`` (blocks without condensing) and
    tile slots holding an edge (distinct ``(row, column)`` positions)."""
    rows = rowptr_to_row(rowptr, col.numel())
    col_blocks = -(-max(int(num_src), 1) // block_k)
    plain = torch.unique(torch.div(rows, window, rounding_mode="floor") * col_blocks
                         + torch.div(col.to(torch.int64), block_k, rounding_mode="floor")).numel()
    occupied = torch.zeros(num_blocks * window * block_k, dtype=torch.bool, device=edge_index.device)
    occupied[edge_index] = True
    return plain, int(occupied.sum())


def translate(rowptr: Tensor, col: Tensor, num_src: int, edge_val: Optional[Tensor] = None,
              window: int = 16, block_k: int = 16, row: Optional[Tensor] = None,
              condense: Optional[Callable] = None) -> TileGraph:
    """Translate a CSR graph into condensed tiles (see the module doc).

    Args:
        rowptr: ``[N + 1]`` row offsets; col: ``[E]`` source of every edge (``< num_src``).
        num_src: ``M``, the number of source nodes.
        edge_val: ``[E]`` edge values or None (ones).
        window: ``W`` rows per window (16: the MMA's M side).
        block_k: ``K`` condensed columns per block (16 for fp32/tf32 and bf16 ``tl.dot``).
        row: ``[E]`` target of every edge, if the caller has it (else expanded from ``rowptr``).
        condense: ``condense(rowptr, row, col, num_src, window, block_k, values=edge_val)`` ->
            ``(window_ptr, block_window, block_cols, edge_index[, block_vals[, ordered]])``,
            the index work and, where it builds them, the tiles of ``edge_val`` and the rows'
            order flag (missing or None: built here by :func:`tile_values`, :func:`rows_ordered`);
            default the tensor-op reference (``ops/tiles.py`` passes
            ``kernels.translate.condense`` on CUDA).

    Returns:
        :class:`TileGraph` with its :class:`TileStats`.

    Raises:
        ValueError: ``window`` or ``block_k`` not a positive power of two; ``edge_val`` not one
            value per edge.

    Cost: in the reference one sort (``unique`` of the ``(window, column)`` keys, int32 where
    they fit) and about 30 small tensor ops (57-62 kernels); with the Triton ``condense`` a sort
    per window in registers (a bit set per window of more than 2048 edges), 2 kernels for the
    structure of a small graph (the fused pass), 7-10 on large ones, two more for the dense tile
    values (``tile_values``); two host syncs (three where the Triton path falls back to sorted
    keys; one where the small graphs' translation runs in one CUDA launch).
    The statistics are counted when first read (:class:`TileStats`), the tile values are added
    by the Triton slot pass or one ``index_add_``: launches and syncs, not GPU work, dominate a
    translation's time (measurements: ``docs/design/tensor-cores.md``).
    """
    for name, value in (("window", window), ("block_k", block_k)):
        if not (isinstance(value, int) and value > 0 and value & (value - 1) == 0):
            raise ValueError(f"translate(): {name} must be a positive power of two, got {value!r}")
    if edge_val is not None and edge_val.shape != (col.numel(),):
        raise ValueError(f"translate(): edge_val must have shape ({col.numel()},), one value per edge, "
                         f"got {tuple(edge_val.shape)}")
    device = rowptr.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    num_rows, num_edges = rowptr.numel() - 1, col.numel()
    num_windows = -(-num_rows // window)
    row = rowptr_to_row(rowptr, num_edges) if row is None else row.to(torch.int64)
    parts = tuple((condense or _condense)(rowptr, row, col, num_src, window, block_k, values=edge_val))
    window_ptr, block_window, block_cols, edge_index, block_vals, ordered = parts + (None,) * (6 - len(parts))
    num_blocks = block_cols.shape[0]
    if edge_val is not None and block_vals is None:
        block_vals = tile_values(edge_index, num_blocks, window, block_k, edge_val)
    if ordered is None:
        ordered = rows_ordered(edge_index, row)
    count = functools.partial(_count_stats, rowptr, col, edge_index, num_src, num_blocks, window, block_k)
    stats = TileStats(num_windows, num_blocks, 0.0, count, window * block_k)
    tiles = TileGraph(window, block_k, num_rows, int(num_src), window_ptr, block_window,
                      block_cols, block_vals, edge_index, stats, ordered,
                      rowptr.to(torch.int64).contiguous())     # as the runs kernel reads it
    sync()
    stats.ms = 1000.0 * (time.perf_counter() - start)
    return tiles


def tile_memory_bytes(stats: TileStats, window: int = 16, block_k: int = 16, value_bytes: int = 4) -> int:
    """Bytes of the dense tile values (``blocks * W * K * value_bytes``) plus the column lists."""
    return stats.blocks * (window * block_k * value_bytes + block_k * 8)
