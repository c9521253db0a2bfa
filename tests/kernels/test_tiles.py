"""Sparse graph translation (formats/tiles.py) against loops over the raw edge list."""
import copy
import math
from fractions import Fraction

import pytest
import torch

from sparsegnn import Graph
from sparsegnn.formats.tiles import translate

from conftest import DEVICE, dense_adjacency


def _rebuild(tiles, vals, num_rows, num_src):
    """Dense ``[N, M]`` from tiles: ``A[w W + r, cols[b, k]] += vals[b, r, k]``."""
    dense = torch.zeros(tiles.stats.windows * tiles.window, num_src, dtype=torch.float64)
    for b in range(tiles.num_blocks):
        w = int(tiles.block_window[b])
        for r in range(tiles.window):
            for k in range(tiles.block_k):
                v = float(vals[b, r, k])
                if v != 0.0:
                    dense[w * tiles.window + r, int(tiles.block_cols[b, k])] += v
    return dense[:num_rows]


def _on_host(tiles):
    """A host copy of ``tiles`` (reading ``block_vals`` builds them on ``tiles``); ``tiles`` stays where it was."""
    host = copy.copy(tiles)
    for name in ("window_ptr", "block_window", "block_cols", "edge_index", "block_vals"):
        setattr(host, name, getattr(tiles, name).cpu())
    return host


@pytest.fixture(autouse=True)
def _triton_ranks_by_default(monkeypatch):
    """The tests here choose their ranking path: every window's bit set in CUDA
    (``CUDA_ALL_WINDOWS``, and the whole translation there, ``CUDA_WINDOWS``: on by default,
    where CuPy runs) would take most of their small graphs on a GPU, and the Triton sorts they
    test would not run there; the tests of those paths turn them on."""
    import sparsegnn.kernels.translate as kt

    monkeypatch.setattr(kt, "CUDA_ALL_WINDOWS", False)
    monkeypatch.setattr(kt, "CUDA_WINDOWS", False)


def _sorted_key_calls(monkeypatch) -> list:
    """A list that grows by one at each call of the Triton translation's sorted-keys path."""
    import sparsegnn.kernels.translate as kt

    calls, real = [], kt._condense_sorted
    monkeypatch.setattr(kt, "_condense_sorted", lambda *a: calls.append(1) or real(*a))
    return calls


def _big_window_launches(monkeypatch) -> list:
    """A list that grows at each launch ranking big windows: ``"triton"`` for the Triton
    translation's per-window kernel with its big-window branch (``BIG``) compiled in, ``"cuda"``
    for ``kernels.translate_cuda`` (bit sets in shared memory; CuPy and a GPU), ``"cuda-all"``
    for that kernel ranking every window (``big = -1``)."""
    import sparsegnn.kernels.translate as kt

    calls, real, real_cuda = [], kt.launch, kt.translate_cuda.rank_big_windows

    def counted(kernel, grid, args, constexprs, *rest):
        if kernel is kt._window_rank_kernel and constexprs["BIG"]:
            calls.append("triton")
        return real(kernel, grid, args, constexprs, *rest)

    def counted_cuda(*args):
        calls.append("cuda-all" if args[6] == -1 else "cuda")
        return real_cuda(*args)

    monkeypatch.setattr(kt, "launch", counted)
    monkeypatch.setattr(kt.translate_cuda, "rank_big_windows", counted_cuda)
    return calls


def _launched_kernels(monkeypatch) -> list:
    """A list of the Triton kernels ``kernels.translate`` launches from now on (in order)."""
    import sparsegnn.kernels.translate as kt

    launched, real = [], kt.launch
    monkeypatch.setattr(kt, "launch", lambda kernel, *a: launched.append(kernel) or real(kernel, *a))
    return launched


def _assert_index_arrays_equal(got, expected) -> None:
    """``condense``'s four index arrays equal the reference's, element for element."""
    for name, a, b in zip(("window_ptr", "block_window", "block_cols", "edge_index"), got, expected):
        assert torch.equal(a.cpu(), b), name


def _largest_window(rowptr, window: int) -> int:
    """The most edges any window of ``window`` rows holds (0 without rows)."""
    num_rows = rowptr.numel() - 1
    ends = rowptr[torch.arange(0, num_rows + window, window).clamp(max=num_rows)]
    return int(ends.diff().max()) if ends.numel() > 1 else 0


#: ``kernels.translate.CAPS`` per Triton variant: the shipped size classes; small classes, so
#: that the windows of one graph spread over several launches; one class of 16 edges, so that
#: every larger window takes the big-window bit sets; a first class below ``K``, which sends
#: every graph down the sorted-keys path.
TRITON_CAPS = {"triton": None, "triton-classes": (16, 32, 64, 128, 1024), "triton-big": (16,), "triton-sorted": (1,)}


@pytest.mark.slow
@pytest.mark.parametrize("window,block_k", [(4, 4), (16, 16), (2, 8)])
@pytest.mark.parametrize("index_work", ["reference", *TRITON_CAPS])
def test_translation_rebuilds_the_graph_and_condenses_each_window(graph_case, window, block_k, index_work,
                                                                  monkeypatch):
    """Both implementations of the index work (tensor ops; ``kernels.translate.condense``, its
    per-window path with several size classes and its sorted-keys path)."""
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w, num_nodes=n)
    if index_work != "reference":
        import sparsegnn.kernels.translate as kt
        from sparsegnn.kernels.translate import condense

        if TRITON_CAPS[index_work] is not None:
            monkeypatch.setattr(kt, "CAPS", TRITON_CAPS[index_work])
        sorted_calls, big_calls = _sorted_key_calls(monkeypatch), _big_window_launches(monkeypatch)
        on = g.to(DEVICE)
        tiles = _on_host(translate(on.rowptr, on.col, n, on.edge_val, window=window, block_k=block_k,
                                   condense=condense))
        # the path the variant names was the one taken (a graph without rows has no windows to sort)
        assert bool(sorted_calls) == (index_work == "triton-sorted" or tiles.stats.windows == 0)
        caps = TRITON_CAPS[index_work] or kt.CAPS
        assert bool(big_calls) == (not sorted_calls and _largest_window(g.rowptr, window) > caps[-1])
    else:
        tiles = translate(g.rowptr, g.col, n, g.edge_val, window=window, block_k=block_k)
    dense = dense_adjacency(ei, n, w)
    assert torch.allclose(_rebuild(tiles, tiles.block_vals, n, n), dense, atol=1e-6)
    # structure only (ones) and new per-edge values through edge_index
    assert torch.allclose(_rebuild(tiles, tiles.tiles_of(None), n, n), dense_adjacency(ei, n), atol=1e-6)
    # each window's condensed columns: its distinct sources, ascending, K per block
    rows = g.row.tolist()
    cols = g.col.tolist()
    expected_blocks, plain = 0, 0
    for win in range(tiles.stats.windows):
        distinct = sorted({c for r, c in zip(rows, cols) if r // window == win})
        expected_blocks += math.ceil(len(distinct) / block_k)
        plain += len({c // block_k for c in distinct})
        lo, hi = int(tiles.window_ptr[win]), int(tiles.window_ptr[win + 1])
        listed = tiles.block_cols[lo:hi].flatten().tolist()[:len(distinct)]
        assert listed == distinct
        assert all(int(tiles.block_window[b]) == win for b in range(lo, hi))
    assert tiles.stats.blocks == tiles.num_blocks == expected_blocks
    assert tiles.stats.blocks_plain == plain and tiles.stats.blocks <= tiles.stats.blocks_plain
    positions = len(set(zip(rows, cols)))
    area = tiles.num_blocks * window * block_k
    assert tiles.stats.fill == pytest.approx(positions / area if area else 0.0)


def test_translation_of_a_bipartite_graph_and_bad_arguments(monkeypatch):
    ei = torch.tensor([[0, 7, 7, 3, 9, 0], [0, 0, 1, 4, 4, 2]])
    g = Graph.from_edge_index(ei, num_nodes=5, num_src=10)
    tiles = translate(g.rowptr, g.col, g.num_src, window=2, block_k=2)
    dense = torch.zeros(5, 10, dtype=torch.float64).index_put_((ei[1], ei[0]), torch.ones(6, dtype=torch.float64),
                                                               accumulate=True)
    assert torch.equal(_rebuild(tiles, tiles.block_vals, 5, 10), dense)
    for bad in (0, 3, -4):
        with pytest.raises(ValueError, match=r"translate\(\): window must be a positive power of two"):
            translate(g.rowptr, g.col, 10, window=bad)
    # the caller's cached row of every edge gives the same tiles, so do the Triton index work
    # (per window; where a window outgrows the largest size class (window 0 holds three edges)
    # by its bit set, or by sorted keys where bit sets are not allowed or M = 2^31 makes them
    # too large), non-contiguous index tensors and keys wider than 32 bits (M = 2^31: int64
    # keys; the tiles do not depend on M); the statistics read lazily
    import sparsegnn.kernels.translate as kt
    from sparsegnn.kernels.translate import condense

    taken, big = _sorted_key_calls(monkeypatch), _big_window_launches(monkeypatch)

    def big_windows(*args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(kt, "CAPS", (2,))
            return condense(*args, **kwargs)

    def sorted_keys(*args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(kt, "CAPS", (2,))
            m.setattr(kt, "BIG_WORDS", 0)
            m.setattr(kt, "BIG_WORDS_PER_EDGE", 0)
            m.setattr(kt, "CUDA_BIG_WINDOWS", False)
            return condense(*args, **kwargs)

    on = g.to(DEVICE)
    strided = torch.stack([on.col, on.col.flip(0)], 1)[:, 0]          # the same values, stride 2
    assert not strided.is_contiguous()
    for num_src, row, col, fast in ((10, on.row, on.col, None), (10, None, on.col, condense),
                                    (10, None, strided, condense), (10, None, strided, None),
                                    (10, None, strided, big_windows), (10, None, strided, sorted_keys),
                                    (2 ** 31, None, on.col, None), (2 ** 31, None, on.col, condense),
                                    (2 ** 31, None, on.col, big_windows), (2 ** 31, None, on.col, sorted_keys)):
        again = _on_host(translate(on.rowptr, col, num_src, window=2, block_k=2, row=row, condense=fast))
        for name in ("window_ptr", "block_window", "block_cols", "edge_index", "block_vals"):
            assert torch.equal(getattr(again, name), getattr(tiles, name)), (num_src, fast, name)
        assert (again.stats.blocks_plain, again.stats.fill) == (tiles.stats.blocks_plain, tiles.stats.fill)
    assert again.stats.as_dict().keys() == {"windows", "blocks_plain", "blocks", "fill", "ms"}
    assert (len(taken), len(big)) == (3, 1)


def _window_graph(counts, window, num_src, seed=0, last_rows=None):
    """``(rowptr, row, col)`` of a CSR graph whose window ``i`` holds ``counts[i]`` edges (random rows
    within the window, random sources with repeats: duplicate edges and self loops), rows sorted;
    the last window has ``last_rows`` rows (default ``window``: the row count a multiple of it)."""
    gen = torch.Generator().manual_seed(seed)
    num_rows = (len(counts) - 1) * window + (window if last_rows is None else last_rows)
    rows, cols = [], []
    for w, count in enumerate(counts):
        rows.append(w * window + torch.randint(min(window, num_rows - w * window), (count,), generator=gen))
        cols.append(torch.randint(num_src, (count,), generator=gen))
    row, col = torch.cat(rows), torch.cat(cols)
    order = torch.argsort(row * num_src + col, stable=True)
    row, col = row[order], col[order]
    rowptr = torch.zeros(num_rows + 1, dtype=torch.int64)
    rowptr[1:] = torch.cumsum(torch.bincount(row, minlength=num_rows), 0)
    return rowptr, row, col


SHIPPED_CLASS_CASES = [
    ((0, 1, 64, 65, 256, 257), 16, 3000, "classes", torch.int64),   # windows at and just past the shipped classes
    ((0, 1, 64, 65, 256, 257), 16, 3000, "classes", torch.int32),
    ((1024, 0, 1025, 2048, 3), 8, 3000, "classes", torch.int64),    # the two largest classes, one empty window
    ((5, 2049, 64), 16, 3000, "big", torch.int32),                  # one window over the largest class: bit set
    ((6000, 3, 2100, 0, 70, 2049), 16, 4000, "big", torch.int64),   # three of them, one of 6000 edges
    ((2049, 3, 5000), 16, 200_000, "big", torch.int32),             # columns over 6250 words: scans carried
    ((5, 2049, 64), 16, 3 * 2 ** 20, "sorted", torch.int64),        # bit sets over the scratch bound: sorted keys
    ((70, 300, 10), 128, 3000, "sorted", torch.int64),              # K over the smallest class: sorted keys
]


# the fused pass off too where it would run (no window over the classes, K within them)
@pytest.mark.parametrize("counts,block_k,num_src,path,index_dtype,fused",
                         [case + (fused,) for case in SHIPPED_CLASS_CASES
                          for fused in ((True, False) if case[3] == "classes" else (True,))])
@pytest.mark.slow
def test_triton_translation_at_the_shipped_size_classes(counts, block_k, num_src, path, index_dtype, fused,
                                                        monkeypatch):
    """``kernels.translate.condense`` with the shipped ``CAPS`` (no patched classes): windows
    holding exactly a class's edge count and one more, the largest classes, windows over
    ``CAPS[-1]`` edges (their bit sets, or sorted keys where the bit sets would outgrow
    ``BIG_WORDS``), ``K > CAPS[0]``, and int32 index tensors, equal to the tensor-op reference
    element for element; graphs without big windows in the one fused launch (``FUSED_WINDOWS``)
    or by the sorts, the scan and the slot pass."""
    from sparsegnn.formats.tiles import _condense, rows_ordered
    import sparsegnn.kernels.translate as kt
    from sparsegnn.kernels.translate import CAPS, condense

    assert CAPS == (64, 256, 1024, 2048)          # the classes this test's counts sit on
    monkeypatch.setattr(kt, "BIG_WORDS", 2 ** 16)   # 2^16 words: M = 3 * 2^20 needs 98k for one window
    monkeypatch.setattr(kt, "FUSED_WINDOWS", fused)
    window = 16
    rowptr, row, col = _window_graph(counts, window, num_src)
    expected = _condense(rowptr, row, col, num_src, window, block_k)
    taken, big = _sorted_key_calls(monkeypatch), _big_window_launches(monkeypatch)
    launched = _launched_kernels(monkeypatch)
    got = condense(rowptr.to(index_dtype).to(DEVICE), row.to(index_dtype).to(DEVICE),
                   col.to(index_dtype).to(DEVICE), num_src, window, block_k)
    assert (bool(taken), bool(big)) == (path == "sorted", path == "big")
    one_launch = fused and path == "classes"
    assert (launched == [kt._window_sizes_kernel, kt._fused_windows_kernel]) is one_launch
    assert (kt._fused_windows_kernel in launched) is one_launch
    for name, a, b in zip(("window_ptr", "block_window", "block_cols", "edge_index"), got, expected):
        assert a.dtype == torch.int64, name
        assert torch.equal(a.cpu(), b), name
    # the order flag (random sources repeat: duplicate edges where they meet; then the same
    # graph with its duplicates dropped)
    assert bool(got.ordered) is bool(rows_ordered(expected[3], row))
    keep = torch.ones_like(row, dtype=torch.bool)
    keep[1:] = (row[1:] != row[:-1]) | (col[1:] != col[:-1])
    rowptr_u = torch.zeros_like(rowptr)
    rowptr_u[1:] = torch.cumsum(torch.bincount(row[keep], minlength=rowptr.numel() - 1), 0)
    unique = condense(rowptr_u.to(DEVICE), row[keep].to(DEVICE), col[keep].to(DEVICE), num_src, window, block_k)
    assert bool(unique.ordered)
    # and one row's columns reversed (the longest row of the largest window): not ordered
    longest = int(torch.argmax(rowptr[1:] - rowptr[:-1]))
    span = slice(int(rowptr[longest]), int(rowptr[longest + 1]))
    flipped = col.clone()
    flipped[span] = flipped[span].flip(0)
    if int(col[span].unique().numel()) > 1:
        reversed_ = condense(rowptr.to(index_dtype).to(DEVICE), row.to(index_dtype).to(DEVICE),
                             flipped.to(index_dtype).to(DEVICE), num_src, window, block_k)
        assert not bool(reversed_.ordered)


def _cuda_kernels() -> bool:
    from sparsegnn.kernels import _cupy

    return DEVICE == "cuda" and _cupy.available()


@pytest.mark.skipif(not _cuda_kernels(), reason="the CUDA big-window kernel needs CuPy and a GPU")
@pytest.mark.parametrize("counts,window,block_k,num_src,index_dtype", [
    ((5, 2049, 64), 16, 16, 3000, torch.int32),                 # one big window among sorted ones
    ((6000, 3, 2100, 0, 70, 2049), 16, 16, 4000, torch.int64),  # three, an empty window between
    ((3000, 2500, 2049), 16, 8, 5000, torch.int64),             # every window big: no Triton launch
    ((2049, 3, 5000), 16, 16, 200_000, torch.int32),            # bit set of 6250 words, columns spread
    ((40_000, 2049), 16, 16, 800_000, torch.int64),             # 25k words: 200 KB of shared memory
    ((2100, 9000, 1), 4, 16, 100_000, torch.int64),             # windows of 4 rows
    ((2100, 9000, 1), 8, 8, 33, torch.int32),                   # few columns, many duplicates
    ((2100, 9000, 3000), 16, 16, 5000, torch.int64),            # the last window of 3 rows (clamped range)
])
def test_cuda_big_windows_equal_the_reference_and_the_triton_bit_sets(counts, window, block_k, num_src,
                                                                      index_dtype, monkeypatch):
    """``kernels.translate_cuda`` (the big windows' bit sets in shared memory) gives the tensor-op
    reference's tiles element for element and the Triton bit sets' ``code`` and block counts;
    the Triton path runs where ``CUDA_BIG_WINDOWS`` is off; the order flag of either, also with
    the rows' columns reversed."""
    from sparsegnn.formats.tiles import _condense, rows_ordered
    import sparsegnn.kernels.translate as kt

    rowptr, row, col = _window_graph(counts, window, num_src, last_rows=3 if counts[-1] == 3000 else None)
    expected = _condense(rowptr, row, col, num_src, window, block_k)
    monkeypatch.setattr(kt, "BIG_WORDS", 2 ** 26)       # the Triton bit sets allowed at M = 800k
    monkeypatch.setattr(kt, "CUDA_MIN_WORK", 0)         # these windows are below the work that pays CuPy's launch
    monkeypatch.setattr(kt, "CUDA_BIG_SHARE", 10 ** 6)  # and some hold one big window of several
    # each row's columns reversed: descending, so not ordered where a row has two columns
    flipped = _flipped_rows(rowptr, col)
    for cols in (col, flipped):
        args = (rowptr.to(index_dtype).to(DEVICE), row.to(index_dtype).to(DEVICE), cols.to(index_dtype).to(DEVICE),
                num_src, window, block_k)
        got = {}
        for cuda in (True, False):
            monkeypatch.setattr(kt, "CUDA_BIG_WINDOWS", cuda)
            big = _big_window_launches(monkeypatch)
            got[cuda] = kt.condense(*args)
            assert big == ["cuda" if cuda else "triton"]
            if cols is col:
                for name, a, b in zip(("window_ptr", "block_window", "block_cols", "edge_index"), got[cuda], expected):
                    assert torch.equal(a.cpu(), b), (cuda, name)
            assert bool(got[cuda].ordered) is bool(rows_ordered(got[cuda].edge_index.cpu(), row)), cuda
        assert torch.equal(got[True].edge_index, got[False].edge_index)
        assert bool(got[True].ordered) is (cols is col)


def test_cuda_big_windows_only_where_the_bit_set_fits_and_the_work_pays(monkeypatch):
    """Big windows keep the Triton bit sets where CuPy or the shared memory is missing, and where
    their scratch words and edges fall short of ``CUDA_MIN_WORK``."""
    import sparsegnn.kernels.translate as kt
    from sparsegnn.kernels import _cupy, translate_cuda

    col = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    assert not translate_cuda.fits(10, col.cpu()) and not translate_cuda.fits(10, col.float())
    if _cuda_kernels():
        optin = _cupy.shared_bytes_optin(col.device)
        assert translate_cuda.fits((optin - 1024) // 8, col)
        assert not translate_cuda.fits((optin - 1024) // 8 + 1, col)
    rowptr, row, col = _window_graph((3000, 5, 2500, 7, 1, 0, 0, 9), 16, 500)   # 2 of 8 windows big: 5500 edges, 16 words
    args = (rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 500, 16, 16)
    for min_work, share, cuda in ((5500 + 2 * 16, 4, _cuda_kernels()), (5500 + 2 * 16 + 1, 4, False),
                                  (0, 3, False)):
        monkeypatch.setattr(kt, "CUDA_MIN_WORK", min_work)
        monkeypatch.setattr(kt, "CUDA_BIG_SHARE", share)     # at least one window in `share` big
        big = _big_window_launches(monkeypatch)
        kt.condense(*args)
        assert big == ["cuda" if cuda else "triton"], (min_work, share)
    monkeypatch.setattr(kt, "CUDA_BIG_SHARE", 4)
    monkeypatch.setattr(kt, "CUDA_MIN_WORK", 0)
    monkeypatch.setattr(_cupy, "available", lambda: False)
    assert not translate_cuda.fits(10, col)
    big = _big_window_launches(monkeypatch)
    kt.condense(*args)
    assert big == ["triton"]


def _rank_big_windows_torch(rowptr, col, code, blocks, counts, num_windows, big, window, block_k, num_words,
                            threads=None):
    """``kernels.translate_cuda.rank_big_windows``'s contract by tensor ops (its module doc)."""
    num_rows = rowptr.numel() - 1
    blocks[0] = 0
    for w in range(num_windows):
        e0, e1 = int(rowptr[w * window]), int(rowptr[min(w * window + window, num_rows)])
        if e1 - e0 <= big:
            continue
        c = col[e0:e1].long()
        distinct = torch.unique(c)
        code[e0:e1] = (2 * torch.searchsorted(distinct, c) + 1).to(code.dtype)
        blocks[w + 1] = -(-distinct.numel() // block_k)
        counts[w] = distinct.numel()


@pytest.mark.parametrize("counts,last_rows", [((3000, 5, 2500, 64), None), ((3000, 2500, 2049), None),
                                              ((100, 2100, 2500), 5)])
def test_cuda_big_windows_share_the_work_with_the_triton_sorts(counts, last_rows, monkeypatch):
    """Where the CUDA kernel takes the big windows, the Triton kernel sorts the others (and is not
    launched where every window is big): the kernel stood in for by its contract in tensor ops,
    so that CI checks this split without a GPU."""
    from sparsegnn.formats.tiles import _condense
    import sparsegnn.kernels.translate as kt

    monkeypatch.setattr(kt, "CUDA_MIN_WORK", 0)
    monkeypatch.setattr(kt.translate_cuda, "fits", lambda num_words, col, threads=None: True)
    monkeypatch.setattr(kt.translate_cuda, "rank_big_windows", _rank_big_windows_torch)
    launched = _launched_kernels(monkeypatch)
    big = _big_window_launches(monkeypatch)
    rowptr, row, col = _window_graph(counts, 16, 3000, last_rows=last_rows)
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 3000, 16, 16)
    assert big == ["cuda"]
    assert (kt._window_rank_kernel in launched) is (min(counts) <= kt.CAPS[-1])
    for name, a, b in zip(("window_ptr", "block_window", "block_cols", "edge_index"), got,
                          _condense(rowptr, row, col, 3000, 16, 16)):
        assert torch.equal(a.cpu(), b), name


def _flipped_rows(rowptr, col):
    """``col`` with each row's columns reversed (descending: not ordered where a row has two)."""
    return torch.cat([col[int(rowptr[r]):int(rowptr[r + 1])].flip(0) for r in range(rowptr.numel() - 1)])


#: Graphs of the CUDA bit-set kernels' GPU tests: ``(counts, window, block_k, num_src, index
#: dtype, last_rows)`` (``_window_graph``).
CUDA_BIT_SET_CASES = [
    ((5, 0, 300, 64, 1, 0), 16, 16, 700, torch.int32, None),        # empty windows, first and between
    ((0, 40, 2049, 3, 5000, 17), 16, 16, 3000, torch.int64, 5),     # big windows too; a last window of 5 rows
    ((700, 33, 0, 129), 16, 8, 40, torch.int64, None),              # 40 columns: many duplicates, K = 8
    ((90, 91, 92, 93, 94), 4, 16, 20_000, torch.int32, 3),          # windows of 4 rows, columns spread
    ((1,) * 40, 8, 16, 64, torch.int64, 1),                         # one edge a window: 40 look-back steps
]


@pytest.mark.skipif(not _cuda_kernels(), reason="every window's bit set in CUDA needs CuPy and a GPU")
@pytest.mark.parametrize("threads", [32, 128, 512])
@pytest.mark.parametrize("counts,window,block_k,num_src,index_dtype,last_rows", CUDA_BIT_SET_CASES)
def test_cuda_all_windows_equal_the_reference(counts, window, block_k, num_src, index_dtype, last_rows, threads,
                                              monkeypatch):
    """``CUDA_ALL_WINDOWS``: every window ranked by its bit set in shared memory (one launch, no
    Triton sort), at any block size, equal to the tensor-op reference element for element;
    the order flag, also with the rows' columns reversed; the tile values added in the slot
    pass equal ``tile_values``'s."""
    from sparsegnn.formats.tiles import _condense, rows_ordered, tile_values
    import sparsegnn.kernels.translate as kt

    monkeypatch.setattr(kt, "CUDA_ALL_WINDOWS", True)
    monkeypatch.setattr(kt, "CUDA_ALL_THREADS", threads)
    monkeypatch.setattr(kt, "CUDA_ALL_WORDS_PER_EDGE", 10 ** 6)     # whatever the words per edge
    monkeypatch.setattr(kt, "FUSED_WINDOWS", False)
    rowptr, row, col = _window_graph(counts, window, num_src, seed=len(counts), last_rows=last_rows)
    values = torch.rand(row.numel(), dtype=torch.float64) + 0.5
    for cols in (col, _flipped_rows(rowptr, col)):
        expected = _condense(rowptr, row, cols, num_src, window, block_k)
        expected_vals = tile_values(expected[3], expected[2].shape[0], window, block_k, values)
        launched, big = _launched_kernels(monkeypatch), _big_window_launches(monkeypatch)
        got = kt.condense(rowptr.to(index_dtype).to(DEVICE), row.to(index_dtype).to(DEVICE),
                          cols.to(index_dtype).to(DEVICE), num_src, window, block_k, values=values.to(DEVICE))
        assert big == ["cuda-all"] and kt._window_rank_kernel not in launched
        _assert_index_arrays_equal(got, expected)
        assert torch.allclose(got.block_vals.cpu(), expected_vals, rtol=1e-6, atol=1e-6)
        assert bool(got.ordered) is bool(rows_ordered(expected[3], row))
    assert not bool(got.ordered) or all(int(rowptr[r + 1] - rowptr[r]) < 2 for r in range(rowptr.numel() - 1))


@pytest.mark.parametrize("words_per_edge,fused_windows,cuda_all", [
    (None, False, True),       # words * windows exactly at the bound: taken
    (-1, False, False),        # one edge's worth short: the Triton sorts
    (None, True, False),       # a graph the fused pass takes keeps it
])
@pytest.mark.slow
def test_cuda_all_windows_only_where_the_words_are_few_for_the_edges(words_per_edge, fused_windows, cuda_all,
                                                                     monkeypatch):
    """``condense`` ranks every window by the CUDA bit sets where the bit sets' words over all
    windows are at most ``CUDA_ALL_WORDS_PER_EDGE`` times the edges and the fused pass does not
    run (the kernel stood in for by its contract in tensor ops, so CI checks the choice without
    a GPU); the big windows then need no sorted keys even where their Triton scratch would not
    fit; equal to the reference either way."""
    from sparsegnn.formats.tiles import _condense
    import sparsegnn.kernels.translate as kt

    counts = (3, 2100, 0, 70, 17)                   # 2190 edges, 5 windows, one big
    rowptr, row, col = _window_graph(counts, 16, 3200)      # 100 words a window
    monkeypatch.setattr(kt, "CUDA_ALL_WINDOWS", True)
    monkeypatch.setattr(kt, "CUDA_ALL_WORDS_PER_EDGE", Fraction(5 * 100 + (words_per_edge or 0), sum(counts)))
    monkeypatch.setattr(kt, "FUSED_WINDOWS", fused_windows)
    monkeypatch.setattr(kt, "FUSED_SMALL_WINDOW", 10 ** 6)       # (the big window aside)
    monkeypatch.setattr(kt, "CAPS", (64, 256, 1024, 4096))       # no big window: the fused pass may run
    monkeypatch.setattr(kt, "CUDA_MIN_WORK", 10 ** 9)            # the big windows' CUDA kernel never pays
    monkeypatch.setattr(kt.translate_cuda, "fits", lambda num_words, col, threads=None: True)
    monkeypatch.setattr(kt.translate_cuda, "rank_big_windows", _rank_big_windows_torch)
    launched, big = _launched_kernels(monkeypatch), _big_window_launches(monkeypatch)
    taken = _sorted_key_calls(monkeypatch)
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 3200, 16, 16)
    assert (big == ["cuda-all"]) is cuda_all
    assert (kt._window_rank_kernel in launched) is (not cuda_all and not fused_windows)
    assert (kt._fused_windows_kernel in launched) is fused_windows
    assert not taken
    _assert_index_arrays_equal(got, _condense(rowptr, row, col, 3200, 16, 16))
    # a big window whose Triton scratch is over BIG_WORDS: sorted keys, unless every window goes to CUDA
    monkeypatch.setattr(kt, "CAPS", (64, 256, 1024, 2048))
    monkeypatch.setattr(kt, "BIG_WORDS", 0)
    monkeypatch.setattr(kt, "BIG_WORDS_PER_EDGE", 0)
    monkeypatch.setattr(kt, "FUSED_WINDOWS", False)
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 3200, 16, 16)
    assert bool(taken) is (words_per_edge is not None)
    assert big == (["cuda-all"] if cuda_all else []) + ([] if taken else ["cuda-all"])
    _assert_index_arrays_equal(got, _condense(rowptr, row, col, 3200, 16, 16))


@pytest.mark.parametrize("counts,big_mean", [((3, 2100, 0, 70, 17), False), ((2048, 2048), False),
                                             ((3000, 2500, 2049, 700), True)])
@pytest.mark.slow
def test_cuda_all_windows_block_size_follows_the_mean_window(counts, big_mean, monkeypatch):
    """Every window by the CUDA bit sets at ``CUDA_ALL_THREADS`` threads a block, or at the big
    windows' ``translate_cuda.THREADS`` where the mean window holds over ``CAPS[-1]`` edges
    (exactly ``CAPS[-1]``: not over), with ``fits`` asked at that block size; one launch, also
    where the big windows' own CUDA launch would run; where the kernel does not fit, the
    Triton sorts (the kernel stood in for by its contract, which records the block size)."""
    from sparsegnn.formats.tiles import _condense
    import sparsegnn.kernels.translate as kt

    seen, asked = [], []

    def stand_in(*args):
        seen.append(args[10])
        return _rank_big_windows_torch(*args)

    fit = [True]
    monkeypatch.setattr(kt, "CUDA_ALL_WINDOWS", True)
    monkeypatch.setattr(kt, "CUDA_ALL_THREADS", 96)
    monkeypatch.setattr(kt, "FUSED_WINDOWS", False)
    monkeypatch.setattr(kt, "CUDA_MIN_WORK", 0)               # the big windows' own launch would pay
    monkeypatch.setattr(kt, "CUDA_BIG_SHARE", 10 ** 6)
    monkeypatch.setattr(kt.translate_cuda, "fits", lambda num_words, col, threads=None: asked.append(threads) or fit[0])
    monkeypatch.setattr(kt.translate_cuda, "rank_big_windows", stand_in)
    rowptr, row, col = _window_graph(counts, 16, 3200)
    expected = _condense(rowptr, row, col, 3200, 16, 16)
    launched = _launched_kernels(monkeypatch)
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 3200, 16, 16)
    threads = kt.translate_cuda.THREADS if big_mean else 96
    assert seen == [threads] and asked == [threads] and kt._window_rank_kernel not in launched
    _assert_index_arrays_equal(got, expected)
    fit[0] = False                                            # no CuPy, or the bit set too large
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 3200, 16, 16)
    assert seen == [threads] and kt._window_rank_kernel in launched
    _assert_index_arrays_equal(got, expected)


@pytest.mark.parametrize("max_windows,small_window,read,fused", [
    (2, 100, False, False),    # over FUSED_MAX_WINDOWS windows, mean 438 edges over 100: no read-back
    (2, 438, True, False),     # mean exactly FUSED_SMALL_WINDOW: the fused pass might run, read
    (10, 100, True, False),    # few windows: read (then the big window keeps the fused pass out)
    (10, 3000, True, True),    # no big window and few windows (CAPS up to 4096): fused, CuPy not asked
])
@pytest.mark.slow
def test_cuda_all_windows_without_the_sizes_read_back(max_windows, small_window, read, fused, monkeypatch):
    """Where every window goes to the CUDA bit sets and the fused pass cannot run (over
    ``FUSED_MAX_WINDOWS`` windows and a mean window over ``FUSED_SMALL_WINDOW`` edges), the
    window sizes are not read back (one host sync less); elsewhere they are, and a graph the
    fused pass takes never asks CuPy (``fits``: its first call compiles the kernel); the
    tiles equal the reference's either way."""
    from sparsegnn.formats.tiles import _condense
    import sparsegnn.kernels.translate as kt

    reads, asked, real_read = [], [], kt._read_sizes
    monkeypatch.setattr(kt, "_read_sizes", lambda ws: reads.append(1) or real_read(ws))
    monkeypatch.setattr(kt, "CUDA_ALL_WINDOWS", True)
    monkeypatch.setattr(kt, "FUSED_MAX_WINDOWS", max_windows)
    monkeypatch.setattr(kt, "FUSED_SMALL_WINDOW", small_window)
    if fused:
        monkeypatch.setattr(kt, "CAPS", (64, 256, 1024, 4096))
    monkeypatch.setattr(kt.translate_cuda, "fits", lambda num_words, col, threads=None: asked.append(1) or True)
    monkeypatch.setattr(kt.translate_cuda, "rank_big_windows", _rank_big_windows_torch)
    big = _big_window_launches(monkeypatch)
    rowptr, row, col = _window_graph((3, 2100, 0, 70, 17), 16, 3200)      # 2190 edges, 5 windows
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 3200, 16, 16)
    assert bool(reads) is read and bool(asked) is not fused
    assert big == ([] if fused else ["cuda-all"])
    _assert_index_arrays_equal(got, _condense(rowptr, row, col, 3200, 16, 16))


def _translate_windows_torch(rowptr, row, col, ws, window_ptr, block_cols, block_window, edge_index, values, tiles,
                             num_windows, window, block_k, num_words, threads):
    """``kernels.translate_cuda.translate_windows``'s contract by tensor ops (its doc): the
    reference's arrays written into the outputs, the values added at their slots, the order
    flag into ``ws[2]``."""
    from sparsegnn.formats.tiles import _condense, rows_ordered

    assert ws.numel() == 4 + num_windows and not ws.any()      # zeros, as the look-back needs
    assert col.max() < 32 * num_words if col.numel() else True
    ptr, win, cols, slots, _ = _condense(rowptr, row, col, 32 * num_words, window, block_k)
    window_ptr.copy_(ptr)
    block_cols[:cols.shape[0]] = cols
    block_window[:win.numel()] = win
    edge_index.copy_(slots)
    if values is not None:
        tiles.view(-1).index_add_(0, slots, values)
    ws[2] = int(rows_ordered(slots, row))


def _cuda_windows_calls(monkeypatch, real=None) -> list:
    """A list that grows by one at each call of ``translate_cuda.translate_windows`` (``real``
    runs it: the CUDA kernel, or its contract in tensor ops)."""
    import sparsegnn.kernels.translate as kt

    calls, real = [], real or kt.translate_cuda.translate_windows
    monkeypatch.setattr(kt.translate_cuda, "translate_windows", lambda *a: calls.append(a[-1]) or real(*a))
    return calls


@pytest.mark.skipif(not _cuda_kernels(), reason="the translation in one CUDA launch needs CuPy and a GPU")
@pytest.mark.parametrize("threads", [32, 128, 512])
@pytest.mark.parametrize("counts,window,block_k,num_src,index_dtype,last_rows", CUDA_BIT_SET_CASES + [
    ((0, 0, 0, 1, 0, 0, 0), 16, 16, 50, torch.int32, 2),            # one edge, windows without any
    ((0,) * 7, 16, 16, 50, torch.int64, 2),                         # no edges at all
    (tuple((i * 37) % 301 for i in range(3000)), 16, 16, 5000, torch.int32, None),   # 3000 windows
])
def test_cuda_windows_translate_in_one_launch_equal_to_the_reference(counts, window, block_k, num_src, index_dtype,
                                                                     last_rows, threads, monkeypatch):
    """``CUDA_WINDOWS``: the whole translation in one CUDA launch (no Triton kernel, no window
    sizes read back), at any block size, equal to the tensor-op reference element for element,
    also over 3000 windows (look-backs over many windows still running, 5 calls); the order
    flag, also with the rows' columns reversed; the tile values added there equal
    ``tile_values``'s, and none are written without values (null pointers)."""
    from sparsegnn.formats.tiles import _condense, rows_ordered, tile_values
    import sparsegnn.kernels.translate as kt

    monkeypatch.setattr(kt, "CUDA_WINDOWS", True)
    monkeypatch.setattr(kt, "CUDA_WINDOWS_WAVES", 10 ** 9)          # whatever the waves
    monkeypatch.setattr(kt, "CUDA_WINDOWS_THREADS", threads)
    reads, real_read = [], kt._read_sizes
    monkeypatch.setattr(kt, "_read_sizes", lambda ws: reads.append(1) or real_read(ws))
    rowptr, row, col = _window_graph(counts, window, num_src, seed=len(counts), last_rows=last_rows)
    values = torch.rand(row.numel(), dtype=torch.float64) + 0.5
    for cols in (col, _flipped_rows(rowptr, col)):
        expected = _condense(rowptr, row, cols, num_src, window, block_k)
        expected_vals = tile_values(expected[3], expected[2].shape[0], window, block_k, values)
        for run in range(5 if len(counts) > 1000 else 2):
            vals = values.to(DEVICE) if run % 2 == 0 else None      # and without values: null pointers
            launched, calls = _launched_kernels(monkeypatch), _cuda_windows_calls(monkeypatch)
            got = kt.condense(rowptr.to(index_dtype).to(DEVICE), row.to(index_dtype).to(DEVICE),
                              cols.to(index_dtype).to(DEVICE), num_src, window, block_k, values=vals)
            assert calls == [threads] and not launched and not reads
            _assert_index_arrays_equal(got, expected)
            if vals is not None:
                assert torch.allclose(got.block_vals.cpu(), expected_vals, rtol=1e-6, atol=1e-6)
            else:
                assert got.block_vals is None
            assert bool(got.ordered) is bool(rows_ordered(expected[3], row))
    assert not bool(got.ordered) or all(int(rowptr[r + 1] - rowptr[r]) < 2 for r in range(rowptr.numel() - 1))


@pytest.mark.parametrize("counts,resident,waves_max,words,fit,taken", [
    ((3, 2100, 0, 70, 17), 5, 1, 100, True, True),    # 5 windows in one wave of 5 blocks, 100 words: one launch
    ((3, 2100, 0, 70, 17), 4, 1, 100, True, False),   # two waves (CUDA_WINDOWS_WAVES = 1): the Triton passes
    ((3, 2100, 0, 70, 17), 3, 2, 100, True, True),    # two waves of 3, two allowed
    ((3, 2100, 0, 70, 17), 2, 2, 100, True, False),   # three waves of 2, two allowed
    ((3, 2100, 0, 70, 17), 5, 1, 99, True, False),    # the bit set over CUDA_WINDOWS_WORDS
    ((3, 2100, 0, 70, 17), 5, 1, 100, False, False),  # no CuPy, or the kernel does not load
    ((2047, 2049), 5, 1, 100, True, True),            # a mean window of CAPS[-1] edges (one window over)
    ((2048, 2049), 5, 1, 100, True, False),           # a mean window over CAPS[-1] edges
])
def test_cuda_windows_only_where_few_waves_of_small_windows(counts, resident, waves_max, words, fit, taken,
                                                            monkeypatch):
    """``condense`` translates in one CUDA launch where the mean window holds at most
    ``CAPS[-1]`` edges, the bit set at most ``CUDA_WINDOWS_WORDS`` words, the windows fill at
    most ``CUDA_WINDOWS_WAVES`` waves of resident blocks (asked at the block size and words)
    and the kernel fits (asked for ``translate_windows``): then no Triton kernel runs and no
    window size is read back; else the Triton passes.  The kernel stood in for by its
    contract in tensor ops (CI checks the choice and the outputs' wiring without a GPU); equal
    to the reference either way, the tile values too."""
    from sparsegnn.formats.tiles import _condense, tile_values
    import sparsegnn.kernels.translate as kt

    rowptr, row, col = _window_graph(counts, 16, 3200)      # 100 words
    asked, waves = [], []
    monkeypatch.setattr(kt, "CUDA_WINDOWS", True)
    monkeypatch.setattr(kt, "CUDA_WINDOWS_WAVES", waves_max)
    monkeypatch.setattr(kt, "CUDA_WINDOWS_THREADS", 96)
    monkeypatch.setattr(kt, "CUDA_WINDOWS_WORDS", words)
    monkeypatch.setattr(kt.translate_cuda, "resident_blocks",
                        lambda num_words, threads, device: waves.append((num_words, threads)) or resident)
    monkeypatch.setattr(kt.translate_cuda, "fits", lambda num_words, col, threads=None, name="rank_big_windows":
                        asked.append((name, threads)) or (fit and name == "translate_windows"))
    calls = _cuda_windows_calls(monkeypatch, _translate_windows_torch)
    launched = _launched_kernels(monkeypatch)
    reads, real_read = [], kt._read_sizes
    monkeypatch.setattr(kt, "_read_sizes", lambda ws: reads.append(1) or real_read(ws))
    values = torch.rand(row.numel(), dtype=torch.float64) + 0.5
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 3200, 16, 16, values=values.to(DEVICE))
    assert calls == ([96] if taken else [])
    assert bool(launched) is not taken and bool(reads) is not taken
    small = sum(counts) <= kt.CAPS[-1] * len(counts)
    assert waves == ([(100, 96)] if small and words == 100 else [])
    assert (("translate_windows", 96) in asked) is (small and words == 100 and resident * waves_max >= 5)
    expected = _condense(rowptr, row, col, 3200, 16, 16)
    _assert_index_arrays_equal(got, expected)
    assert torch.allclose(got.block_vals.cpu(), tile_values(expected[3], expected[2].shape[0], 16, 16, values),
                          rtol=1e-6, atol=1e-6)
    assert bool(got.ordered)


@pytest.mark.parametrize("values_kind", ["none", "grad", "deterministic", "fused"])
def test_cuda_windows_adds_only_fused_values(values_kind, monkeypatch):
    """The one-launch translation gets the values and the zeroed tiles only where it adds them
    (values without a gradient, no deterministic algorithms asked for); else null pointers (not
    the placeholders the Triton passes get), and ``translate`` builds the tiles by
    ``index_add_``: equal to ``tile_values`` either way (the kernel stood in for by its contract)."""
    from sparsegnn.formats.tiles import tile_values
    import sparsegnn.kernels.translate as kt

    rowptr, row, col = _window_graph((3, 200, 0, 70, 17), 16, 3200)
    monkeypatch.setattr(kt, "CUDA_WINDOWS", True)
    monkeypatch.setattr(kt.translate_cuda, "resident_blocks", lambda num_words, threads, device: 10)
    monkeypatch.setattr(kt.translate_cuda, "fits", lambda num_words, col, threads=None, name="": True)
    passed = []
    monkeypatch.setattr(kt.translate_cuda, "translate_windows",
                        lambda *a: passed.append((a[8], a[9])) or _translate_windows_torch(*a))
    values = None if values_kind == "none" else (torch.rand(row.numel(), dtype=torch.float64) + 0.5).to(DEVICE)
    if values_kind == "grad":
        values.requires_grad_()
    if values_kind == "deterministic":
        monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    tiles = translate(rowptr.to(DEVICE), col.to(DEVICE), 3200, values, row=row.to(DEVICE), condense=kt.condense)
    (vals, tile_array), = passed
    assert (vals is None and tile_array is None) is (values_kind != "fused")
    if values_kind == "fused":
        assert vals.dtype == torch.float32 and tile_array.dtype == torch.float32
    expected = tile_values(tiles.edge_index.cpu(), tiles.num_blocks, 16, 16,
                           None if values is None else values.detach().cpu())
    assert torch.allclose(tiles.block_vals.detach().cpu(), expected, rtol=1e-6, atol=1e-6)


def test_resident_blocks_follow_threads_and_shared_memory(monkeypatch):
    """Blocks resident at once: SMs x the fewest of threads an SM / threads a block, shared
    memory an SM / (the bit set with its prefix counts + 2 KB), 32; 0 off CUDA."""
    from sparsegnn.kernels import translate_cuda

    assert translate_cuda.resident_blocks(100, 128, torch.device("cpu")) == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(translate_cuda, "_sm_limits", lambda index: (132, 2048, 228 * 1024))
    cuda = torch.device("cuda", 0)
    assert translate_cuda.resident_blocks(100, 128, cuda) == 132 * 16           # threads bound
    assert translate_cuda.resident_blocks(100, 32, cuda) == 132 * 32            # 32 blocks an SM at most
    assert translate_cuda.resident_blocks(8192, 128, cuda) == 132 * 3           # 66 KB a block
    assert translate_cuda.resident_blocks(7040, 128, cuda) == 132 * 4           # 4 x (56320 + 2048) B exactly
    assert translate_cuda.resident_blocks(7041, 128, cuda) == 132 * 3           # 8 bytes more: 3
    assert translate_cuda.resident_blocks(28_000, 128, cuda) == 132             # 226 KB: one
    assert translate_cuda.resident_blocks(30_000, 128, cuda) == 0               # none fits


def test_cuda_windows_rejects_bad_threads_and_workspace():
    """``translate_windows`` checks its block size and its workspace's length before any launch."""
    from sparsegnn.kernels import translate_cuda

    e = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="threads must be a multiple of 32"):
        translate_cuda.translate_windows(e, e, e, torch.zeros(6, dtype=torch.int64), e, e, e, e, None, None,
                                         2, 16, 16, 1, 48)
    with pytest.raises(ValueError, match="ws must be 6 int64 zeros"):
        translate_cuda.translate_windows(e, e, e, torch.zeros(5, dtype=torch.int64), e, e, e, e, None, None,
                                         2, 16, 16, 1, 128)


@pytest.mark.parametrize("one_program", [True, False])
def test_window_sizes_kernel_writes_every_field(one_program):
    """``_window_sizes_kernel`` over an output holding garbage (one program: nothing zeroes it) or
    zeros (atomics): the largest window, the big windows' count and edges, the order flag's 1."""
    import triton
    import sparsegnn.kernels.translate as kt

    rowptr, _, _ = _window_graph((3, 70, 0, 16, 17, 200, 5), 4, 50, last_rows=2)
    # 4 fields, the ticket, the look-back's error flag, 2 unused, 7 look-back states, one past the end (never written)
    ws = torch.full((16,), 12345, dtype=torch.int64) if one_program else torch.zeros(16, dtype=torch.int64)
    ws[-1] = 777
    ws = ws.to(DEVICE)
    kt.launch(kt._window_sizes_kernel, (1 if one_program else triton.cdiv(7, 4),),
              (rowptr.to(DEVICE), ws, rowptr.numel() - 1, 7, 16), dict(WINDOW=4, ONE=one_program, BLOCK=4), 4)
    got = ws.tolist()
    assert got[:6] == [200, 3, 1, 70 + 17 + 200, 0, 0]
    assert got[8:] == [0] * 7 + [777]


@pytest.mark.parametrize("order", ["together", "last_first"])
@pytest.mark.parametrize("num_windows,chunk", [
    (1, 16), (15, 16), (16, 16), (37, 16), (700, 256), (3000, 256),
    pytest.param(200_000, 256, marks=pytest.mark.skipif(DEVICE != "cuda", reason="782 chunks side by side: "
                                                        "the GPU's look-back waits (slow in the interpreter)"))])
def test_scan_sums_the_block_counts_and_pads_each_windows_last_block(num_windows, chunk, order):
    """``_scan_kernel``: ``window_ptr = cumsum([0, blocks...])`` over chunks of ``chunk`` windows,
    each chunk's offset found by the look-back (several chunks where ``num_windows + 1 >
    chunk``), and zeros in ``block_cols`` from each window's last column to its last block's
    end, no write elsewhere (sentinels stay); every chunk took one ticket, no look-back error.
    ``last_first``: one chunk a launch, the last first, its ticket and the earlier chunks'
    states preset (the interpreter runs programs in ticket order, which would hide a chunk
    that read its number from ``program_id`` instead of the ticket)."""
    import triton
    import sparsegnn.kernels.translate as kt

    gen = torch.Generator().manual_seed(num_windows)
    k = 8
    blocks = torch.randint(0, 4, (num_windows,), generator=gen)
    # a window of b blocks holds between (b - 1) K + 1 and b K columns (none where b = 0)
    counts = torch.where(blocks > 0, (blocks - 1) * k + 1 + torch.randint(0, k, (num_windows,), generator=gen), 0)
    x = torch.cat([torch.zeros(1, dtype=torch.int64), blocks])
    window_ptr = torch.cumsum(x, 0)
    total = int(window_ptr[-1])
    sentinel = -5
    block_cols = torch.full((total + 1, k), sentinel, dtype=torch.int64, device=DEVICE)   # a spare block
    out = torch.full((num_windows + 1,), sentinel, dtype=torch.int64, device=DEVICE)
    ws = torch.zeros(8 + num_windows, dtype=torch.int64, device=DEVICE)
    chunks = triton.cdiv(num_windows + 1, chunk)
    # chunk t's inclusive prefix: the cumsum at its last entry
    states = [4 * int(window_ptr[min((t + 1) * chunk, num_windows + 1) - 1]) + 2 for t in range(chunks)]
    args = (x.to(DEVICE), out, counts.to(torch.int32).to(DEVICE), block_cols, ws, num_windows + 1)
    constexprs = dict(BLOCK_K=k, BLOCK=chunk, LOOK=kt.LOOK_BACK, SLEEP=kt._look_back_sleep())
    if order == "together":
        kt.launch(kt._scan_kernel, (chunks,), args, constexprs, 4)
    else:
        for t in reversed(range(chunks)):
            ws[8:8 + t] = torch.tensor(states[:t], dtype=torch.int64)
            ws[8 + t:] = 0
            ws[4] = t
            kt.launch(kt._scan_kernel, (1,), args, constexprs, 4)
    assert out.cpu().tolist() == window_ptr.tolist()
    expected = torch.full(((total + 1) * k,), sentinel, dtype=torch.int64)
    for w in range(num_windows):
        expected[int(window_ptr[w]) * k + int(counts[w]):int(window_ptr[w + 1]) * k] = 0
    assert torch.equal(block_cols.cpu().flatten(), expected)
    assert ws[5].item() == 0
    if order == "together":
        assert ws[4].item() == chunks
        assert ws[8:8 + chunks].cpu().tolist() == states


@pytest.mark.parametrize("num_windows", [3, 4, 7, 8, 9])
def test_three_pass_translation_at_the_scans_chunk_boundaries(num_windows, monkeypatch):
    """The sorts, the scan and the slot pass (fused pass off) with scan chunks of 4 windows:
    window counts around multiples of the chunk (``num_windows + 1`` entries: a chunk holding
    only ``window_ptr``'s last entry where ``num_windows`` is a multiple) give the reference's
    arrays."""
    from sparsegnn.formats.tiles import _condense
    import sparsegnn.kernels.translate as kt

    monkeypatch.setattr(kt, "SCAN_BLOCK", 4)
    monkeypatch.setattr(kt, "FUSED_WINDOWS", False)
    counts = tuple((7 * w) % 40 for w in range(num_windows))
    rowptr, row, col = _window_graph(counts, 16, 300, seed=num_windows)
    expected = _condense(rowptr, row, col, 300, 16, 8)
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 300, 16, 8)
    _assert_index_arrays_equal(got, expected)


@pytest.mark.parametrize("window_number,look", [(0, 4), (1, 4), (9, 4), (9, 16), (300, 128)])
def test_look_back_adds_the_counts_back_to_the_nearest_inclusive_prefix(window_number, look):
    """``_look_back`` of window ``w`` over states left by earlier windows, some with their count
    only (``4 c + 1``), some with their inclusive prefix (``4 p + 2``): the window's first block
    is the nearest prefix plus the counts after it (a prefix of 0 before window 0), read
    ``LOOK`` windows a step (several steps where no prefix is near), and the window's own state
    ends as its inclusive prefix.  (On the GPU windows run side by side and the reads wait for
    states still zero; here one program runs, so every state is set before.)"""
    from _translate_kernels import look_back_kernel

    gen = torch.Generator().manual_seed(window_number)
    counts = torch.randint(0, 5, (window_number + 1,), generator=gen)
    prefix = torch.cumsum(counts, 0)
    # inclusive prefixes published by a few windows only (none within the last `look` of them for w = 9, look 4)
    published = torch.rand(window_number, generator=gen) < 0.05
    if window_number == 9:
        published[:] = False
        published[2] = True
    states = torch.where(published, 4 * prefix[:window_number] + 2, 4 * counts[:window_number] + 1)
    state = torch.cat([states, torch.tensor([0, 99])]).to(DEVICE)
    out = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    blocks = int(counts[window_number])
    look_back_kernel[(1,)](state, out, window_number, blocks, LOOK=look, SLEEP=-1)
    first = int(prefix[window_number] - blocks)
    assert out.tolist() == [first, 0]              # no error: every state it needed was set
    assert state.tolist()[window_number:] == [4 * (first + blocks) + 2, 99]
    assert torch.equal(state[:window_number].cpu(), states)


def _run_in_thread(fn):
    import threading

    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


@pytest.mark.skipif(DEVICE == "cuda", reason="a second thread sets a state while the kernel runs: the Triton "
                    "interpreter's CPU tensors (the GPU's waits: test_fused_pass_of_many_windows_on_the_gpu)")
@pytest.mark.parametrize("look", [4, 128])
def test_look_back_waits_for_a_count_it_needs_and_only_for_one_it_needs(look):
    """A state still zero between the window and the nearest inclusive prefix holds the
    look-back (``SLEEP = 0``: it reads again) until another program sets it; a zero past that
    prefix does not.  With ``SLEEP < 0`` (the interpreter's ordered programs) a needed zero is
    a bug: the look-back ends at once and sets its error flag."""
    import time
    from _translate_kernels import look_back_kernel

    # windows 0..5 with counts 1..6: window 1 published its prefix (3), window 3 nothing yet
    state = torch.tensor([4 * 1 + 1, 4 * 3 + 2, 4 * 3 + 1, 0, 4 * 5 + 1, 4 * 6 + 1, 0], dtype=torch.int64)
    out = torch.full((2,), -7, dtype=torch.int64)
    out[1] = 0
    thread = _run_in_thread(lambda: look_back_kernel[(1,)](state, out, 6, 7, LOOK=look, SLEEP=0))
    time.sleep(1.0)
    assert thread.is_alive() and int(out[0]) == -7, "the look-back did not wait for window 3's count"
    state[3] = 4 * 4 + 1
    thread.join(60)
    assert not thread.is_alive()
    assert out.tolist() == [3 + 3 + 4 + 5 + 6, 0] and int(state[6]) == 4 * (21 + 7) + 2
    # window 0 unknown, but window 1's prefix is nearer: not waited for
    state = torch.tensor([0, 4 * 3 + 2, 4 * 3 + 1, 4 * 4 + 1, 0], dtype=torch.int64)
    out = torch.zeros(2, dtype=torch.int64)
    thread = _run_in_thread(lambda: look_back_kernel[(1,)](state, out, 4, 2, LOOK=look, SLEEP=0))
    thread.join(60)
    assert not thread.is_alive(), "the look-back waited for a count it does not need"
    assert out.tolist() == [3 + 3 + 4, 0] and int(state[4]) == 4 * 12 + 2
    # ordered programs: a needed zero is an error, not a wait
    state = torch.tensor([4 * 1 + 1, 0, 0], dtype=torch.int64)
    out = torch.zeros(2, dtype=torch.int64)
    thread = _run_in_thread(lambda: look_back_kernel[(1,)](state, out, 2, 1, LOOK=look, SLEEP=-1))
    thread.join(60)
    assert not thread.is_alive() and int(out[1]) == 1


@pytest.mark.parametrize("counts,block_k", [((3, 70, 0, 16, 17, 200, 5), 16), ((5, 9, 1, 0, 33), 8),
                                            ((7, 7, 7), 4)])
def test_fused_pass_writes_only_its_own_windows_slots(counts, block_k, monkeypatch):
    """The fused pass run one window a launch, the last window first (the earlier windows'
    states preset to the reference's prefixes, the ticket to the window, the block arrays to a
    sentinel): a write into another window's slots (padding past its last block, a block column
    or window of a neighbour) would survive; in order, the neighbour's own writes hide it."""
    from sparsegnn.formats.tiles import _condense
    import sparsegnn.kernels.translate as kt

    rowptr, row, col = _window_graph(counts, 16, 400)
    expected = _condense(rowptr, row, col, 400, 16, block_k)
    window_ptr = expected[0].to(DEVICE)
    real, launched = kt.launch, []

    def one_window_at_a_time(kernel, grid, args, constexprs, warps):
        if kernel is not kt._fused_windows_kernel:
            return real(kernel, grid, args, constexprs, warps)
        launched.append(kernel)
        ws, block_cols, block_window = args[3], args[5], args[6]
        block_cols.fill_(-5)
        block_window.fill_(-5)
        for w in reversed(range(grid[0])):
            ws[8:8 + w] = 4 * window_ptr[1:w + 1] + 2
            ws[8 + w:] = 0
            ws[4] = w
            real(kernel, (1,), args, constexprs, warps)

    monkeypatch.setattr(kt, "launch", one_window_at_a_time)
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 400, 16, block_k)
    assert launched
    _assert_index_arrays_equal(got, expected)


@pytest.mark.slow
@pytest.mark.parametrize("one_program", [True, False])
def test_fused_pass_starts_from_a_zero_ticket_and_zero_states(one_program, monkeypatch):
    """Where the fused pass launches, its ticket, error flag and look-back states are zero, the
    window sizes read by one program (its stores) or by atomics (a zeroed buffer), and the
    tiles equal the reference's."""
    from sparsegnn.formats.tiles import _condense
    import sparsegnn.kernels.translate as kt

    monkeypatch.setattr(kt, "SIZES_ONE_PROGRAM", 10 ** 9 if one_program else 0)
    rowptr, row, col = _window_graph((3, 70, 0, 16, 17, 200, 5) * 3, 16, 400)
    expected = _condense(rowptr, row, col, 400, 16, 16)
    real, seen = kt.launch, []

    def spy(kernel, grid, args, constexprs, warps):
        if kernel is kt._fused_windows_kernel:
            ws = args[3]
            seen.append((ws[4:6].tolist(), bool((ws[8:] == 0).all()), ws.numel() - 8))
        return real(kernel, grid, args, constexprs, warps)

    monkeypatch.setattr(kt, "launch", spy)
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 400, 16, 16)
    assert seen == [([0, 0], True, 21)]
    _assert_index_arrays_equal(got, expected)


@pytest.mark.skipif(DEVICE != "cuda", reason="windows side by side, waiting on each other: the GPU "
                    "(the interpreter runs the programs one at a time)")
@pytest.mark.parametrize("one_program", [True, False])
def test_fused_pass_of_many_windows_on_the_gpu(one_program, monkeypatch):
    """2000 windows of the smallest and the largest size class mixed (the slow sorts make the
    look-backs wait) in the fused pass, five times each, equal to the reference (a review found that
    with the wait on unknown states removed, 5 of 5 runs were wrong on an H200)."""
    from sparsegnn.formats.tiles import _condense
    import sparsegnn.kernels.translate as kt

    monkeypatch.setattr(kt, "SIZES_ONE_PROGRAM", 10 ** 9 if one_program else 0)
    monkeypatch.setattr(kt, "FUSED_MAX_WINDOWS", 10 ** 6)
    gen = torch.Generator().manual_seed(44)
    counts = tuple(int(c) for c in torch.where(torch.rand(2000, generator=gen) < 0.05, 2000, 40))
    rowptr, row, col = _window_graph(counts, 16, 50_000)
    expected = _condense(rowptr, row, col, 50_000, 16, 16)
    launched = _launched_kernels(monkeypatch)
    for _ in range(5):
        got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 50_000, 16, 16)
        _assert_index_arrays_equal(got, expected)
    assert launched.count(kt._fused_windows_kernel) == 5


@pytest.mark.parametrize("max_windows,small_window,fused", [
    (10 ** 6, 0, True),      # few windows
    (2, 10 ** 6, True),      # many windows, every one small
    (2, 64, False),          # many windows, one of them large: a slow sort would hold up the look-backs
])
def test_fused_launch_only_for_few_windows_or_small_ones(max_windows, small_window, fused, monkeypatch):
    """``condense`` takes the one fused launch where the graph has at most ``FUSED_MAX_WINDOWS``
    windows or none over ``FUSED_SMALL_WINDOW`` edges, else the sorts, the scan and the slot
    pass; both equal the reference."""
    from sparsegnn.formats.tiles import _condense
    import sparsegnn.kernels.translate as kt

    monkeypatch.setattr(kt, "FUSED_MAX_WINDOWS", max_windows)
    monkeypatch.setattr(kt, "FUSED_SMALL_WINDOW", small_window)
    rowptr, row, col = _window_graph((3, 70, 0, 16, 17, 200, 5), 16, 400)
    expected = _condense(rowptr, row, col, 400, 16, 16)
    launched = _launched_kernels(monkeypatch)
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 400, 16, 16)
    assert (kt._fused_windows_kernel in launched) is fused
    assert (kt._edge_slot_kernel in launched) is not fused
    _assert_index_arrays_equal(got, expected)


@pytest.mark.slow
@pytest.mark.parametrize("one_program", [True, False])
def test_window_sizes_in_one_program_or_by_atomics(one_program, monkeypatch):
    """The window sizes (largest, big windows and their edges, the order flag's reset) read by
    one program (few windows: no zeroed output) or by programs of 1024 windows with atomics
    give the reference's tiles and order flag, with windows past the classes (bit sets) too."""
    from sparsegnn.formats.tiles import _condense, rows_ordered
    import sparsegnn.kernels.translate as kt

    monkeypatch.setattr(kt, "SIZES_ONE_PROGRAM", 10 ** 9 if one_program else 0)
    monkeypatch.setattr(kt, "CAPS", (16, 64))
    counts = (3, 70, 0, 16, 17, 200) * 10 + (65,)
    rowptr, row, col = _window_graph(counts, 4, 300)
    expected = _condense(rowptr, row, col, 300, 4, 8)
    big = _big_window_launches(monkeypatch)
    for cols in (col, col.flip(0)):     # rows sorted; then every row reversed (where it has two columns)
        got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), cols.to(DEVICE), 300, 4, 8)
        if cols is col:
            _assert_index_arrays_equal(got, expected)
        assert got.ordered.dtype == torch.bool and got.ordered.dim() == 0
        assert bool(got.ordered) is bool(rows_ordered(got.edge_index.cpu(), row)) is (cols is col)
    assert big == ["triton", "triton"]


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("fused", [True, False])
def test_triton_translation_builds_the_tile_values(deterministic, fused, monkeypatch):
    """The Triton index work adds the edge values into their tiles in its slot pass (atomics;
    the fused pass's or ``_edge_slot_kernel``'s), except under deterministic algorithms, where
    it leaves them to ``translate``'s ``index_add_``; either way the tiles equal the
    reference's; unfused, the block counts scanned in chunks of 4 windows (several chunks, as on
    graphs of many windows)."""
    from sparsegnn.formats.tiles import _condense, tile_values
    import sparsegnn.kernels.translate as kt

    monkeypatch.setattr(kt, "SCAN_BLOCK", 4)
    monkeypatch.setattr(kt, "FUSED_WINDOWS", fused)
    launched = _launched_kernels(monkeypatch)
    # no big window (fused where on); windows in three size classes and an empty one (the
    # interpreter's cost grows with the class: a 2000-edge window took most of this test's time)
    rowptr, row, col = _window_graph((5, 70, 300, 0, 20), 16, 500)
    values = torch.rand(row.numel(), dtype=torch.float64) + 0.5
    expected = _condense(rowptr, row, col, 500, 16, 16, values=values)
    assert expected[4] is None                               # the reference leaves them to translate
    expected_vals = tile_values(expected[3], expected[2].shape[0], 16, 16, values)
    dev = [t.to(DEVICE) for t in (rowptr, row, col)]
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        got = kt.condense(*dev, 500, 16, 16, values=values.to(DEVICE))
        tiles = translate(dev[0], dev[2], 500, values.to(DEVICE), row=dev[1], condense=kt.condense)
    finally:
        torch.use_deterministic_algorithms(was)
    _assert_index_arrays_equal(got, expected)
    assert (got[4] is None) == deterministic
    built = [tiles.block_vals] + ([] if deterministic else [got[4]])
    for vals in built:
        assert vals.dtype == torch.float32 and vals.shape == expected_vals.shape
        assert torch.allclose(vals.cpu(), expected_vals, rtol=1e-6, atol=1e-6)
    assert kt.condense(*dev, 500, 16, 16)[4] is None
    assert (kt._fused_windows_kernel in launched) is fused and (kt._edge_slot_kernel in launched) is not fused


def test_translation_values_are_checked_differentiable_and_not_over_allocated():
    """Edge values must be one per edge (both index works, ``translate`` and ``condense``); values
    that need a gradient keep it through the Triton translation (``index_add_``, not the slot
    pass's atomics); where the windows' rows share their columns, the blocks returned own their
    memory (not views of the bound's larger allocation)."""
    import sparsegnn.kernels.translate as kt

    rowptr, row, col = _window_graph((300, 40, 700, 3), 16, 24)      # 24 sources: columns shared
    dev = [t.to(DEVICE) for t in (rowptr, row, col)]
    for index_work in (None, kt.condense):
        with pytest.raises(ValueError, match=r"translate\(\): edge_val must have shape"):
            translate(dev[0], dev[2], 24, torch.ones(row.numel() - 1, device=DEVICE), condense=index_work)
    with pytest.raises(ValueError, match=r"condense\(\): values must have shape"):
        kt.condense(*dev, 24, 16, 16, values=torch.ones(row.numel() + 1, device=DEVICE))
    values = (torch.rand(row.numel(), dtype=torch.float64) + 0.5).to(DEVICE).requires_grad_()
    tiles = translate(dev[0], dev[2], 24, values, row=dev[1], condense=kt.condense)
    up = torch.rand_like(tiles.block_vals)
    (tiles.block_vals * up).sum().backward()
    assert torch.allclose(values.grad.float(), up.flatten()[tiles.edge_index], rtol=1e-6)
    bound = (row.numel() + 4 * 15) // 16
    assert 2 * tiles.num_blocks < bound                                # the case the copy is for
    for t in (tiles.block_cols, tiles.block_window, tiles.block_vals):
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()


@pytest.mark.parametrize("counts", [(5, 0, 40), (5, 0, 40, 7), (3,) * 17])
def test_condensed_arrays_start_on_128_bytes(counts):
    """The arrays ``condense`` carves out of its two allocations each start 128 bytes into their
    storage (window counts odd and even; a fresh allocation's alignment or more): the kernels
    that read them later are specialised on 16-byte alignment (vector loads)."""
    import sparsegnn.kernels.translate as kt

    rowptr, row, col = _window_graph(counts, 16, 300)
    got = kt.condense(rowptr.to(DEVICE), row.to(DEVICE), col.to(DEVICE), 300, 16, 16)
    for name in ("window_ptr", "block_window", "block_cols", "edge_index"):
        array = getattr(got, name)
        assert (array.data_ptr() - array.untyped_storage().data_ptr()) % 128 == 0, name
        assert array.data_ptr() % 16 == 0, name


def test_translation_builds_values_and_statistics_only_when_asked(monkeypatch):
    """Without edge values the tile array of ones is built on first read (weighted calls build
    their own); the statistics are counted on first read, once; ``translate_graph`` passes the
    Triton index work wherever Triton runs; ``tiles_of`` is differentiable in the values."""
    import sparsegnn.kernels.translate as kt
    from sparsegnn.ops.tiles import translate_graph

    ei = torch.tensor([[0, 7, 7, 3, 9, 0, 0], [0, 0, 1, 4, 4, 2, 2]])
    g = Graph.from_edge_index(ei, num_nodes=5, num_src=10).to(DEVICE)
    calls = []
    real = kt.condense
    monkeypatch.setattr(kt, "condense", lambda *a, **k: calls.append(a) or real(*a, **k))
    tiles = translate_graph(g, window=2, block_k=2)
    assert len(calls) == 1
    assert tiles._block_vals is None and "not counted" in repr(tiles.stats)
    dense = torch.zeros(5, 10, dtype=torch.float64).index_put_((ei[1], ei[0]), torch.ones(7, dtype=torch.float64),
                                                               accumulate=True)
    assert torch.equal(_rebuild(_on_host(tiles), tiles.block_vals.cpu(), 5, 10), dense)   # built now
    assert tiles._block_vals is not None
    plain = len({(int(r) // 2, int(c) // 2) for c, r in ei.T})     # distinct (window, column // K)
    assert tiles.stats.blocks_plain == plain == 5 and "not counted" not in repr(tiles.stats)
    # gradients of the tile values with respect to the edge values: each edge's slot, summed
    values = torch.rand(7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    vals = tiles.tiles_of(values, torch.float64)
    up = torch.rand_like(vals)
    (vals * up).sum().backward()
    assert torch.equal(values.grad, up.flatten()[tiles.edge_index])


@pytest.mark.parametrize("dtype,precision,tol", [(torch.float32, "ieee", 1e-5), (torch.float32, "tf32", 5e-3),
                                                 (torch.bfloat16, "ieee", 5e-3)])
@pytest.mark.parametrize("width", [5, 40])
def test_tile_spmm_matches_the_dense_product(graph_case, dtype, precision, tol, width):
    from sparsegnn.kernels.spmm_tiles import spmm_tiles

    from conftest import DEVICE
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE)
    tiles = translate(g.rowptr, g.col, n, g.edge_val, window=16, block_k=16)
    x = torch.randn(n, width, generator=torch.Generator().manual_seed(2)).to(dtype).to(DEVICE)
    out = spmm_tiles(tiles, x, precision=precision)
    want = dense_adjacency(ei, n, w) @ x.double().cpu()
    assert out.dtype == dtype and out.shape == (n, width)
    assert float((out.double().cpu() - want).norm()) <= tol * max(float(want.norm()), 1.0)
    # other edge values through the tile positions (e.g. attention weights): ones here
    ones = spmm_tiles(tiles, x, values=tiles.tiles_of(None), precision=precision)
    want_ones = dense_adjacency(ei, n) @ x.double().cpu()
    assert float((ones.double().cpu() - want_ones).norm()) <= tol * max(float(want_ones.norm()), 1.0)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("block_f,chunk", [(16, 16), (32, 1)])
@pytest.mark.parametrize("dtype,tiles_half,precision,tol", [
    (torch.float32, False, "ieee", 1e-5), (torch.float32, False, "tf32", 5e-3),
    (torch.bfloat16, True, "ieee", 1e-2), (torch.float16, True, "ieee", 5e-3)])
def test_tile_spmm_every_kernel_config(graph_case, swap, block_f, chunk, dtype, tiles_half, precision, tol):
    """Each launch shape the timing sweep and the dispatcher can pick: both MMA orientations,
    feature blocks narrower than F (two programs per window, the second masked), fp32 tiles and
    native half tiles with half features, windows whole or spread over one item per block
    (``chunk=1``: atomics into zeroed rows, through an fp32 buffer for half outputs)."""
    from sparsegnn.kernels.spmm_tiles import spmm_tiles

    from conftest import DEVICE
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE)
    tiles = translate(g.rowptr, g.col, n, g.edge_val)
    x = torch.randn(n, 40, generator=torch.Generator().manual_seed(3)).to(dtype).to(DEVICE)
    vals = tiles.tiles_of(g.edge_val, dtype if tiles_half else torch.float32)
    out = spmm_tiles(tiles, x, vals, precision=precision, block_f=block_f, swap=swap, chunk=chunk)
    want = dense_adjacency(ei, n, w) @ x.double().cpu()
    if chunk == 1 and tiles.num_blocks > tiles.stats.windows:
        assert tiles.schedule(1).split_rows.numel() > 0     # the atomic path did run
    assert out.dtype == dtype and out.shape == (n, 40)
    assert float((out.double().cpu() - want).norm()) <= tol * max(float(want.norm()), 1.0)


def _hub_graph(seed=0, duplicates=False):
    """A graph whose windows span several blocks (a hub row of 100 sources, rows of 1-20), empty
    rows and an isolated node, self loops; with ``duplicates`` its repeated edges kept and 40
    copies of one edge (more than ``K`` edges in one block row), else merged; every row's
    columns sorted: ``(Graph, dense [N, N] float64)``.  40 nodes (the interpreter's cost grows
    with the blocks)."""
    gen = torch.Generator().manual_seed(seed)
    n = 40
    rows = [torch.full((100,), 3), torch.randint(0, 34, (200,), generator=gen), torch.arange(0, 34, 7)]
    cols = [torch.randint(0, n - 1, (100,), generator=gen), torch.randint(0, n - 1, (200,), generator=gen),
            torch.arange(0, 34, 7)]
    if duplicates:
        rows.append(torch.full((40,), 17))
        cols.append(torch.full((40,), 33))
    row, col = torch.cat(rows), torch.cat(cols)
    keep = (row % 9) != 5                                          # empty rows
    ei = torch.stack([col[keep], row[keep]])
    w = torch.rand(ei.shape[1], generator=gen, dtype=torch.float64) + 0.5
    g = Graph.from_edge_index(ei, w.float(), num_nodes=n)
    return (g if duplicates else g.remove_duplicates()), dense_adjacency(ei, n, w)


@pytest.mark.parametrize("index_work", ["reference", "triton", "big windows", "sorted keys"])
def test_translation_order_flag(index_work, monkeypatch):
    """``ordered`` from either index work (the Triton slot pass, its big windows, the sorted
    keys' edge pass): True for sorted columns, duplicate edges or not; False with a row's
    columns out of order (``Graph.from_csr`` keeps them as given)."""
    import sparsegnn.kernels.translate as kt
    from sparsegnn.formats.tiles import rows_ordered

    fast = None
    if index_work != "reference":
        fast = kt.condense
        if index_work != "triton":
            monkeypatch.setattr(kt, "CAPS", (2,))
        if index_work == "sorted keys":
            monkeypatch.setattr(kt, "BIG_WORDS", 0)
            monkeypatch.setattr(kt, "BIG_WORDS_PER_EDGE", 0)
            monkeypatch.setattr(kt, "CUDA_BIG_WINDOWS", False)
    g, _ = _hub_graph()
    dup = Graph.from_edge_index(torch.stack([g.col, g.row]).cpu()[:, [0, 0, 1, 2, 3]], num_nodes=g.num_nodes)
    col = g.col.clone()
    row0 = slice(int(g.rowptr[3]), int(g.rowptr[4]))                # the hub row: reverse its columns
    col[row0] = col[row0].flip(0)
    shuffled = Graph.from_csr(g.rowptr, col, num_nodes=g.num_nodes)
    for graph, ordered in ((g, True), (dup, True), (_hub_graph(duplicates=True)[0], True), (shuffled, False)):
        on = graph.to(DEVICE)
        tiles = translate(on.rowptr, on.col, on.num_src, row=on.row, condense=fast)
        assert tiles.ordered is ordered and bool(rows_ordered(tiles.edge_index.cpu(), on.row.cpu())) is ordered


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("block_f,chunk", [(16, 16), (32, 1), (16, 3)])
@pytest.mark.parametrize("dtype,vals_half,precision,tol", [
    (torch.float32, False, "ieee", 1e-5), (torch.float32, False, "tf32", 5e-3),
    (torch.bfloat16, True, "ieee", 1e-2), (torch.float16, True, "ieee", 5e-3), (torch.float16, False, "ieee", 5e-3)])
@pytest.mark.slow
@pytest.mark.parametrize("duplicates", [False, True])
def test_tile_spmm_on_runs_every_config(swap, block_f, chunk, dtype, vals_half, precision, tol, duplicates):
    """The runs encoding (tiles built from the slots and per-edge values in CSR order) against float64: both
    orientations, feature blocks narrower than F, windows whole, one block an item or items
    starting mid-window (``chunk=3``: each row's first edge found by binary search), duplicate
    edges summed (40 copies of one edge: a block row of more than ``K`` edges),
    fp32 and native half values, values or none (ones); and its refusals."""
    from sparsegnn.kernels.spmm_tiles import spmm_tiles

    g, dense = _hub_graph(1, duplicates)
    g = g.to(DEVICE)
    n = g.num_nodes
    tiles = translate(g.rowptr, g.col, n, row=g.row)
    assert (g.num_edges > int((dense != 0).sum())) is duplicates
    assert tiles.ordered and tiles.num_blocks > tiles.stats.windows
    x = torch.randn(n, 40, generator=torch.Generator().manual_seed(3)).to(dtype).to(DEVICE)
    vals = g.edge_val.to(dtype if vals_half else torch.float32)
    ones = dense_adjacency(torch.stack([g.col, g.row]).cpu(), n)       # each edge 1, duplicates counted
    for values, want in ((vals, dense @ x.double().cpu()), (None, ones @ x.double().cpu())):
        out = spmm_tiles(tiles, x, values, precision=precision, block_f=block_f, swap=swap, chunk=chunk,
                         encoding="runs")
        assert out.dtype == dtype and out.shape == (n, 40)
        assert float((out.double().cpu() - want).norm()) <= tol * float(want.norm())
    with pytest.raises(ValueError, match="one per edge"):
        spmm_tiles(tiles, x, vals[1:], encoding="runs")
    with pytest.raises(ValueError, match="encoding must be"):
        spmm_tiles(tiles, x, encoding="sparse")
    unsorted = Graph.from_csr(torch.tensor([0, 2, 2]), torch.tensor([1, 0]), num_nodes=2).to(DEVICE)
    with pytest.raises(ValueError, match="sorted columns"):
        spmm_tiles(translate(unsorted.rowptr, unsorted.col, 2), x[:2], encoding="runs")


@pytest.mark.parametrize("chunk", [1, 2, 16])
def test_tile_schedule_covers_every_block_once(graph_case, chunk):
    _, n, ei, _ = graph_case
    g = Graph.from_edge_index(ei, num_nodes=n)
    tiles = translate(g.rowptr, g.col, n, window=4, block_k=4)
    sched = tiles.schedule(chunk)
    assert tiles.schedule(chunk) is sched                       # cached per chunk
    covered = {}
    for w, s, e, split in zip(sched.item_window.tolist(), sched.item_start.tolist(), sched.item_end.tolist(),
                              sched.item_split.tolist()):
        assert 0 <= e - s <= chunk
        lo, hi = int(tiles.window_ptr[w]), int(tiles.window_ptr[w + 1])
        assert lo <= s <= e <= hi
        covered.setdefault(w, []).extend(range(s, e))
        assert split == int(-(-(hi - lo) // chunk) > 1)
    for w in range(tiles.stats.windows):                       # every window, empty ones too
        lo, hi = int(tiles.window_ptr[w]), int(tiles.window_ptr[w + 1])
        assert sorted(covered[w]) == list(range(lo, hi))
    want_rows = [r for w in range(tiles.stats.windows)
                 if int(tiles.window_ptr[w + 1] - tiles.window_ptr[w]) > chunk
                 for r in range(4 * w, min(4 * w + 4, n))]
    assert sched.split_rows.tolist() == want_rows
    with pytest.raises(ValueError, match=r"TileGraph.schedule\(\): chunk must be a positive int"):
        tiles.schedule(0)


def test_tile_spmm_rejects_an_unknown_precision():
    from sparsegnn.kernels.spmm_tiles import spmm_tiles

    g = Graph.from_edge_index(torch.tensor([[0], [1]]), num_nodes=2)
    with pytest.raises(ValueError, match=r"spmm_tiles\(\): precision must be one of"):
        spmm_tiles(translate(g.rowptr, g.col, 2), torch.randn(2, 4), precision="fp8")


@pytest.mark.parametrize("precision,tol", [("ieee", 1e-5), ("tf32", 5e-3)])
def test_spmm_tc_forward_and_backward_against_float64(graph_case, precision, tol):
    from sparsegnn.ops.tiles import spmm_tc

    from conftest import DEVICE
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, num_nodes=n).to(DEVICE)
    gen = torch.Generator().manual_seed(4)
    x64 = torch.randn(n, 20, generator=gen, dtype=torch.float64)
    weight = g.to_graph_order(w.to(DEVICE)).float().requires_grad_()
    x = x64.float().to(DEVICE).requires_grad_()
    out = spmm_tc(g, x, weight, precision=precision)
    xr, wr = x64.clone().requires_grad_(), w.double().clone().requires_grad_()
    dense = torch.zeros(n, n, dtype=torch.float64).index_put((ei[1], ei[0]), wr, accumulate=True)
    ref = dense @ xr
    grad = torch.randn(n, 20, generator=gen, dtype=torch.float64)
    gx, gw = torch.autograd.grad(out, (x, weight), grad.float().to(DEVICE))
    rx, rw = torch.autograd.grad(ref, (xr, wr), grad)
    scale = lambda t: max(float(t.norm()), 1.0)  # noqa: E731
    assert float((out.double().cpu() - ref.detach()).norm()) <= tol * scale(ref)
    assert float((gx.double().cpu() - rx).norm()) <= tol * scale(rx)
    assert float((g.to_input_order(gw).double().cpu() - rw).norm()) <= max(tol, 1e-5) * scale(rw)


@pytest.mark.parametrize("rowptr_kind", ["int64", "int32", "strided"])
def test_tile_spmm_runs_searches_the_longest_row_and_any_rowptr(rowptr_kind):
    """Items starting at every block (``chunk=1``) of a window whose longest row has 255 edges,
    just under a power of two: the binary search for each row's first edge in the item needs
    all ``log2`` steps (one fewer stops short).  The translation keeps an int64, contiguous
    copy of an int32 or strided ``rowptr`` (the runs kernel reads it with stride 1)."""
    from sparsegnn.kernels.spmm_tiles import spmm_tiles

    gen = torch.Generator().manual_seed(7)
    n = 300
    row = torch.cat([torch.full((255,), 5), torch.randint(6, 40, (300,), generator=gen)])
    col = torch.cat([torch.randperm(n, generator=gen)[:255], torch.randint(0, n, (300,), generator=gen)])
    ei = torch.stack([col, row])
    w = torch.rand(ei.shape[1], generator=gen, dtype=torch.float64) + 0.5
    g = Graph.from_edge_index(ei, w.float(), num_nodes=n).to(DEVICE)
    rowptr = {"int64": g.rowptr, "int32": g.rowptr.to(torch.int32),
              "strided": torch.stack([g.rowptr, g.rowptr], 1)[:, 0]}[rowptr_kind]
    tiles = translate(rowptr, g.col, n, row=g.row)
    assert tiles.rowptr.dtype == torch.int64 and tiles.rowptr.is_contiguous()
    assert tiles.schedule(1).max_row == 255
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    want = dense_adjacency(ei, n, w) @ x.double().cpu()
    for swap in (False, True):
        out = spmm_tiles(tiles, x, g.edge_val, precision="ieee", chunk=1, swap=swap, encoding="runs")
        assert float((out.double().cpu() - want).norm()) <= 1e-5 * float(want.norm())


@pytest.mark.parametrize("precision,tol", [("ieee", 1e-5), ("tf32", 5e-3)])
def test_spmm_tc_and_every_tile_config_on_runs(precision, tol, monkeypatch):
    """Where the library takes the runs encoding (``RUNS_MIN_BYTES`` set to 0 here: every
    ordered graph), ``spmm_tc``'s forward, its backward on the transpose's tiles and the weight
    gradient, and every tile config the tuner can pick (at 20 and 96 features), against float64 (duplicate edges
    summed); a graph whose rows are not sorted keeps the dense tiles."""
    import sparsegnn.ops.tiles as tile_ops

    monkeypatch.setattr(tile_ops, "RUNS_MIN_BYTES", 0)
    g, dense = _hub_graph(2, duplicates=True)
    g = g.to(DEVICE)
    n = g.num_nodes
    assert tile_ops.tile_encoding(tile_ops.tiles_of_graph(g)) == "runs"
    assert tile_ops.tile_encoding(tile_ops.tiles_of_graph(g.t())) == "runs"
    gen = torch.Generator().manual_seed(4)
    x64 = torch.randn(n, 20, generator=gen, dtype=torch.float64)
    weight = g.edge_val.clone().requires_grad_()
    x = x64.float().to(DEVICE).requires_grad_()
    out = tile_ops.spmm_tc(g, x, weight, precision=precision)
    grad = torch.randn(n, 20, generator=gen, dtype=torch.float64)
    gx, gw = torch.autograd.grad(out, (x, weight), grad.float().to(DEVICE))
    ref = dense @ x64
    rows, cols = g.row.cpu(), g.col.cpu()
    assert float((out.detach().double().cpu() - ref).norm()) <= tol * float(ref.norm())
    assert float((gx.double().cpu() - dense.T @ grad).norm()) <= tol * float((dense.T @ grad).norm())
    want_gw = (grad[rows] * x64[cols]).sum(1)
    assert float((gw.double().cpu() - want_gw).norm()) <= max(tol, 1e-5) * float(want_gw.norm())
    for half in (False, True):
        for width in (20, 96):          # the configs of narrow and of wide features (swapped, 8 warps, ...)
            xs = torch.randn(n, width, generator=gen).to(DEVICE).to(torch.float16 if half else torch.float32)
            want = dense @ xs.double().cpu()
            for config in [c for c in tile_ops.tc_candidates(width, half) if c["path"] == 1]:
                got = tile_ops._run_sum(g, xs, g.edge_val, precision, config)
                assert float((got.double().cpu() - want).norm()) <= max(tol, 5e-3 if half else 0) * float(want.norm())
    unsorted = Graph.from_csr(torch.tensor([0, 2, 2]), torch.tensor([1, 0]), num_nodes=2).to(DEVICE)
    assert tile_ops.tile_encoding(tile_ops.tiles_of_graph(unsorted)) == "dense"


def test_spmm_tc_on_a_bipartite_graph_and_its_errors():
    from sparsegnn.ops.tiles import spmm_tc

    from conftest import DEVICE
    ei = torch.tensor([[0, 7, 7, 3, 9, 0, 30], [0, 0, 1, 4, 4, 2, 2]])
    g = Graph.from_edge_index(ei, num_nodes=5, num_src=33).to(DEVICE)
    x = torch.randn(33, 8).to(DEVICE).requires_grad_()
    out = spmm_tc(g, x, precision="ieee")
    dense = torch.zeros(5, 33).index_put_((ei[1], ei[0]), torch.ones(7), accumulate=True).to(DEVICE)
    assert torch.allclose(out, dense @ x, atol=1e-5)
    (gx,) = torch.autograd.grad(out.sum(), x)
    assert torch.allclose(gx, dense.sum(0)[:, None].expand(33, 8), atol=1e-5)
    g, x = g.to("cpu"), x.detach().cpu()
    with pytest.raises(ValueError, match=r"spmm_tc\(\): precision must be"):
        spmm_tc(g, x, precision="fp16")
    with pytest.raises(ValueError, match=r"spmm_tc\(\): x has 5 rows but the graph has 33 source nodes"):
        spmm_tc(g, torch.randn(5, 8))


@pytest.mark.parametrize("precision,tol", [("ieee", 1e-5), ("tf32", 5e-3)])
@pytest.mark.parametrize("width", [7, 48])
def test_tile_sddmm_matches_per_edge_dot_products(graph_case, precision, tol, width):
    from sparsegnn.kernels.spmm_tiles import sddmm_tiles

    from conftest import DEVICE
    _, n, ei, _ = graph_case
    g = Graph.from_edge_index(ei, num_nodes=n).to(DEVICE)
    tiles = translate(g.rowptr, g.col, n)
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(n, width, generator=gen, dtype=torch.float64)
    b = torch.randn(n, width, generator=gen, dtype=torch.float64)
    out = sddmm_tiles(tiles, a.float().to(DEVICE), b.float().to(DEVICE), precision=precision)
    rows, cols = g.row.cpu().tolist(), g.col.cpu().tolist()
    want = torch.tensor([float(a[i] @ b[j]) for i, j in zip(rows, cols)], dtype=torch.float64)
    assert out.shape == (g.num_edges,)
    assert float((out.double().cpu() - want).norm()) <= tol * max(float(want.norm()), 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("precision,tol", [("tf32", 5e-3), ("bf16", 1e-2)])
def test_spmm_precision_runs_on_tiles_with_autograd(graph_case, reduce, precision, tol, fresh_store, monkeypatch):
    """A tuner that finds a tile config fastest: forward and backward run the reduced path."""
    import sparsegnn as sg
    from sparsegnn.ops import tiles as tile_ops
    from sparsegnn.tune import set_timer

    from conftest import DEVICE
    set_timer(lambda run, cfg: 0.5 if cfg.get("path") == 1 else 1.0)
    calls = []
    real = tile_ops._run_sum
    monkeypatch.setattr(tile_ops, "_run_sum", lambda *a: calls.append((a[3], a[4]["path"])) or real(*a))
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE)
    x64 = torch.randn(n, 24, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    x = x64.float().to(DEVICE).requires_grad_()
    out = sg.spmm(g, x, reduce, backend="triton", precision=precision)
    dense = dense_adjacency(ei, n, w)
    if reduce == "mean":
        dense = dense / dense_adjacency(ei, n).sum(1, keepdim=True).clamp(min=1)
    want = dense @ x64
    assert out.dtype == torch.float32
    assert float((out.detach().double().cpu() - want).norm()) <= tol * max(float(want.norm()), 1.0)
    (gx,) = torch.autograd.grad(out.sum(), x)
    want_gx = dense.sum(0)[:, None].expand(n, 24)
    assert float((gx.double().cpu() - want_gx).norm()) <= tol * max(float(want_gx.norm()), 1.0)
    # forward and backward took the tuned reduced-precision path (every candidate is tested below)
    assert calls == [(precision, 1), (precision, 1)]


def test_spmm_precision_elsewhere_is_exact_and_checked():
    import sparsegnn as sg

    g = Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)
    x = torch.randn(3, 4, dtype=torch.float64)
    for backend in ("reference", "cpu"):       # no tensor cores there: the exact result
        assert torch.allclose(sg.spmm(g, x, backend=backend, precision="tf32"), g.to_dense(torch.float64) @ x)
    assert torch.allclose(sg.spmm(g, x, "max", backend="reference", precision="bf16"),
                          sg.spmm(g, x, "max", backend="reference"))
    with pytest.raises(ValueError, match=r"spmm\(\): precision must be one of"):
        sg.spmm(g, x, precision="fp8")


@pytest.mark.slow
@pytest.mark.parametrize("width,dtype", [(24, torch.float32), (64, torch.float32), (160, torch.float32),
                                         (24, torch.bfloat16), (64, torch.bfloat16), (160, torch.bfloat16),
                                         (64, torch.float16)])
def test_every_precise_spmm_candidate_matches_float64(graph_case, width, dtype):
    """Each config the ``spmm_tc`` tuner can pick (the exact call, the tile configs, the row
    kernel on packed or bf16-rounded features) on its own, at both precisions."""
    from sparsegnn.ops.tiles import TC_SPACE, _run_sum, tc_candidates

    from conftest import DEVICE
    half = dtype != torch.float32
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE)
    x64 = torch.randn(n, width, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    x = x64.to(dtype).to(DEVICE)
    want = dense_adjacency(ei, n, w) @ x.double().cpu()
    candidates = tc_candidates(width, half)
    assert candidates[0] == {"path": 0}                   # the exact call is the default
    assert {c["path"] for c in candidates} == {0, 1} | (set() if half else {3})
    cases = [(config, "bf16" if half else "tf32") for config in candidates]
    if dtype != torch.bfloat16:                           # "bf16" on other features: rounded in the call
        rounded = tc_candidates(width, True, rounded=True)
        assert {c["path"] for c in rounded} == {0, 1, 4, 5}
        cases += [(config, "bf16") for config in rounded]
    for config, precision in cases:
        assert all(v in TC_SPACE[k] for k, v in config.items())
        for weight in (g.edge_val, None):
            out = _run_sum(g, x, weight, precision, config)
            ref = want if weight is not None else dense_adjacency(ei, n) @ x.double().cpu()
            tol = 1e-2 if precision == "bf16" else 5e-3
            assert out.shape == (n, width) and out.dtype == x.dtype
            assert float((out.double().cpu() - ref).norm()) <= tol * max(float(ref.norm()), 1.0), config


def test_spmm_tf32_on_the_packed_path_forward_and_backward(fresh_store, monkeypatch):
    """A tuner that picks the packed path (path 3) for every tf32 decision: ``spmm`` with
    learnable features and edge weights on a bipartite graph matches float64, gradients too
    (``dX`` by the packed path on the transpose, ``dw`` exact)."""
    import sparsegnn as sg
    from sparsegnn.ops import tiles
    from sparsegnn.tune import set_timer

    from conftest import DEVICE
    monkeypatch.setattr(tiles, "PACKED_MIN_WORK", 0)          # offered on a small graph too
    picked = []
    set_timer(lambda run, cfg: picked.append(cfg) or (0.5 if cfg == {"path": 3} else 1.0))
    gen = torch.Generator().manual_seed(12)
    src, dst = torch.randint(0, 37, (300,), generator=gen), torch.randint(0, 23, (300,), generator=gen)
    g = Graph.from_edge_index(torch.stack([src, dst]), num_nodes=23, num_src=37).to(DEVICE)
    dense = torch.zeros(23, 37, dtype=torch.float64)
    w64 = torch.rand(300, generator=gen, dtype=torch.float64) + 0.5
    x64 = torch.randn(37, 40, generator=gen, dtype=torch.float64)
    dense.index_put_((dst, src), w64, accumulate=True)
    w = w64.float()[g.edge_perm.cpu()].to(DEVICE).requires_grad_() if g.edge_perm is not None else None
    assert w is not None
    x = x64.float().to(DEVICE).requires_grad_()
    out = sg.spmm(g, x, edge_weight=w, backend="triton", precision="tf32")
    upstream = torch.randn(23, 40, generator=gen, dtype=torch.float64)
    (out * upstream.float().to(DEVICE)).sum().backward()
    assert {"path": 3} in picked
    tol = 5e-3
    assert float((out.detach().double().cpu() - dense @ x64).norm()) <= tol * float((dense @ x64).norm())
    assert float((x.grad.double().cpu() - dense.T @ upstream).norm()) <= tol * float((dense.T @ upstream).norm())
    # dw_e = <upstream_i, x_j> for edge j -> i (CSR order of the graph)
    want_dw = (upstream[dst] * x64[src]).sum(1)[g.edge_perm.cpu()]
    assert float((w.grad.double().cpu() - want_dw).norm()) <= 1e-5 * float(want_dw.norm())


def test_precise_spmm_rebuilds_cached_values_after_an_in_place_update():
    import sparsegnn as sg

    from conftest import DEVICE
    ei = torch.tensor([[0, 1, 2, 2, 3], [1, 2, 0, 3, 0]])
    weight = torch.rand(5) + 0.5
    g = Graph.from_edge_index(ei, weight, num_nodes=4).to(DEVICE)
    x = torch.randn(4, 16).to(DEVICE)
    first = sg.spmm(g, x, backend="triton", precision="tf32")
    assert torch.allclose(first.cpu(), g.to_dense().cpu() @ x.cpu(), atol=5e-3)
    with torch.no_grad():
        g.edge_val.mul_(2.0)                 # an optimiser step on a learnable edge weight
    second = sg.spmm(g, x, backend="triton", precision="tf32")
    assert torch.allclose(second.cpu(), 2 * first.cpu(), atol=1e-2)


@pytest.mark.parametrize("width", [24, 80])
def test_every_precise_sddmm_candidate_and_the_tuned_call_match_float64(graph_case, width):
    """Each config the ``sddmm_tc`` tuner can pick (row-wise exact, tiles with 32 / 64
    features per step), and ``sddmm(precision=)`` with its gradients."""
    import sparsegnn as sg
    from sparsegnn.ops.tiles import SDDMM_TC_SPACE, _sddmm_run, sddmm_candidates

    from conftest import DEVICE
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE)
    gen = torch.Generator().manual_seed(12)
    a64 = torch.randn(n, width, generator=gen, dtype=torch.float64)
    b64 = torch.randn(n, width, generator=gen, dtype=torch.float64)
    a, b = a64.float().to(DEVICE), b64.float().to(DEVICE)
    row, col = g.row.cpu(), g.col.cpu()
    want = (a64[row] * b64[col]).sum(-1)
    scale = max(float(want.norm()), 1.0)
    candidates = sddmm_candidates(width)
    assert {c["path"] for c in candidates} == {0, 1}
    for config in candidates:
        assert all(v in SDDMM_TC_SPACE[k] for k, v in config.items())
        out = _sddmm_run(g, a, b, config)
        assert out.shape == (g.num_edges,) and out.dtype == torch.float32
        assert float((out.double().cpu() - want).norm()) <= 5e-3 * scale, config
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = sg.sddmm(g, ag, bg, backend="triton", precision="tf32")
    assert float((out.detach().double().cpu() - want).norm()) <= 5e-3 * scale
    weight = torch.linspace(-1, 1, g.num_edges, dtype=torch.float64)
    (out * weight.float().to(DEVICE)).sum().backward()
    dense = torch.zeros(n, n, dtype=torch.float64).index_put_((row, col), weight, accumulate=True)
    for got, ref in ((ag.grad, dense @ b64), (bg.grad, dense.t() @ a64)):
        assert float((got.double().cpu() - ref).norm()) <= 5e-3 * max(float(ref.norm()), 1.0)
    with pytest.raises(ValueError, match=r"sddmm\(\): precision must be one of"):
        sg.sddmm(g, a, b, precision="fp8")
