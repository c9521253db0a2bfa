@pytest.mark.skipif(not _cuda_kernels(), reason="whole tiles by the CUDA kernel need CuPy and a GPU")
@pytest.mark.parametrize("counts,window,block_k,num_src,index_dtype,last_rows", CUDA_BIT_SET_CASES + [
    ((0,) * 7, 16, 16, 50, torch.int64, 2),                         # no edges: no blocks
])
@pytest.mark.parametrize("walk", [0, 2])
def test_fill_tiles_equal_the_tile_values(counts, window, block_k, num_src, index_dtype, last_rows, walk,
                                          monkeypatch):
    """``translate_cuda.fill_tiles``: whole tiles summed in shared memory, ``FILL_CHUNK`` at a
    time (windows of more blocks take several chunks), equal to ``tile_values``'s ``index_add_``
    into zeros, for values and for ones, with the rows ordered (the windows of over
    ``FILL_WALK_CHUNKS`` chunks walk each row once: every window, or those over 2 chunks; the
    flag on the GPU or read) and not (each chunk scans the window); it declines (None) values
    that need a gradient or are not float32, and deterministic algorithms."""
    from sparsegnn.formats.tiles import _condense, rows_ordered, tile_values
    from sparsegnn.kernels import translate_cuda

    monkeypatch.setattr(translate_cuda, "FILL_CHUNK", 3)               # chunks end inside windows
    monkeypatch.setattr(translate_cuda, "FILL_WALK_CHUNKS", walk)      # walked: windows of over `walk` chunks
    rowptr, row, col = _window_graph(counts, window, num_src, seed=len(counts), last_rows=last_rows)
    values = torch.rand(row.numel(), dtype=torch.float64) + 0.5
    for cols in (col, _flipped_rows(rowptr, col)):                      # rows ordered, then not
        window_ptr, _, block_cols, edge_index, _ = _condense(rowptr, row, cols, num_src, window, block_k)
        num_blocks = block_cols.shape[0]
        ordered = rows_ordered(edge_index, row)
        on = [t.to(DEVICE) for t in (rowptr, window_ptr, edge_index)]
        for vals in (values, None):
            expected = tile_values(edge_index, num_blocks, window, block_k, vals)
            # the flag as the translation leaves it (on the GPU), read, and False (every chunk scans)
            for flag in (ordered.to(DEVICE), bool(ordered), False):
                got = translate_cuda.fill_tiles(*on, None if vals is None else vals.float().to(DEVICE), num_blocks,
                                                window, block_k, flag)
                assert got.dtype == torch.float32 and got.shape == (num_blocks, window, block_k)
                assert torch.allclose(got.cpu(), expected, rtol=1e-6, atol=1e-6), (bool(ordered), flag)
    with pytest.raises(ValueError, match="ordered must be a bool"):
        translate_cuda.fill_tiles(*on, None, num_blocks, window, block_k, torch.ones(2, dtype=torch.bool))
    vals = values.float().to(DEVICE)
    assert translate_cuda.fill_tiles(*on, vals.double(), num_blocks, window, block_k) is None
    assert translate_cuda.fill_tiles(*on, vals.clone().requires_grad_(), num_blocks, window, block_k) is None
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert translate_cuda.fill_tiles(*on, vals, num_blocks, window, block_k) is None


def test_tiles_of_takes_the_fill_where_it_runs(monkeypatch):
    """``translate(fill=...)`` keeps the fill on the ``TileGraph``: ``tiles_of`` (and the tiles of
    ``edge_val`` in ``translate``, and ``block_vals``' ones) take float32 tiles from it, and
    ``tile_values`` where it declines or for another dtype; ``fill_tiles`` declines off CUDA."""
    from sparsegnn.formats.tiles import tile_values
    from sparsegnn.kernels import translate_cuda

    rowptr, row, col = _window_graph((5, 0, 40, 7), 16, 300)
    values = torch.rand(row.numel()) + 0.5
    calls, answer = [], [True]

    def fill(rowptr_, window_ptr, edge_index, vals, num_blocks, window, block_k, ordered):
        calls.append(vals)
        assert torch.equal(rowptr_, rowptr) and window_ptr.numel() == 5 and (window, block_k) == (16, 16)
        assert bool(ordered)                             # the rows' columns are sorted
        return 2 * tile_values(edge_index, num_blocks, window, block_k, vals) if answer[0] else None

    tiles = translate(rowptr, col, 300, edge_val=values, row=row, fill=fill)
    expected = tile_values(tiles.edge_index, tiles.num_blocks, 16, 16, values)
    assert len(calls) == 1 and torch.equal(tiles.block_vals, 2 * expected)        # the fill's answer
    assert torch.equal(tiles.tiles_of(values), 2 * expected) and len(calls) == 2
    assert torch.equal(tiles.tiles_of(values, torch.float64), expected.double()) and len(calls) == 2
    answer[0] = False                                                              # declined: index_add_
    assert torch.equal(tiles.tiles_of(values), expected) and len(calls) == 3
    bare = translate(rowptr, col, 300, row=row, fill=fill)
    assert torch.equal(bare.block_vals, tile_values(bare.edge_index, bare.num_blocks, 16, 16, None))
    assert calls[-1] is None and len(calls) == 4
    if not _cuda_kernels():
        assert translate_cuda.fill_tiles(rowptr, tiles.window_ptr, tiles.edge_index, values, tiles.num_blocks,
                                         16, 16) is None


