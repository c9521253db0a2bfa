"""The ranged CSR build of large graphs (``coo_to_csr(..., lean=True)``): the same CSR and
permutation as one sort of every edge, with ranges and thresholds scaled down to small graphs."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn.datasets import random_graph
from sparsegnn.formats import csr as csr_fmt

from conftest import DEVICE


@pytest.mark.parametrize("range_edges", [1, 7, 64, 10_000])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_ranged_build_equals_one_sort(monkeypatch, range_edges, dtype):
    ei, _ = random_graph(50, 400, seed=3, num_isolated=3, num_empty_rows=5, num_self_loops=4, num_duplicates=30)
    hub = torch.stack([torch.arange(120) % 50, torch.full((120,), 17)])      # a row wider than a range
    ei = torch.cat([ei, hub, ei[:, :40]], 1).to(dtype).to(DEVICE)            # duplicates in input order
    want = csr_fmt.coo_to_csr(ei[1], ei[0], 50)
    monkeypatch.setattr(csr_fmt, "LEAN_MIN_EDGES", 1)
    monkeypatch.setattr(csr_fmt, "LEAN_RANGE_EDGES", range_edges)
    got = csr_fmt.coo_to_csr(ei[1], ei[0], 50, lean=True)
    assert got[2].dtype == torch.int32 and got[1].dtype == torch.int64
    for a, b in zip(got, want):
        assert torch.equal(a.long().cpu(), b.long().cpu())


def test_graph_from_a_large_edge_index_keeps_its_order_maps(monkeypatch):
    """A Graph built the lean way: int32 ``edge_perm``, and per-edge values moved between the
    caller's order and the CSR order as before."""
    ei, w = random_graph(30, 200, seed=5, num_duplicates=10, weighted=True)
    ref = sg.Graph.from_edge_index(ei, w, num_nodes=30)                     # one sort
    monkeypatch.setattr(csr_fmt, "LEAN_MIN_EDGES", 1)
    monkeypatch.setattr(csr_fmt, "LEAN_RANGE_EDGES", 16)
    g = sg.Graph.from_edge_index(ei.to(DEVICE), w.to(DEVICE), num_nodes=30)
    assert ref.edge_perm.dtype == torch.int64
    assert g.edge_perm.dtype == torch.int32
    assert torch.equal(g.edge_val.cpu(), ref.edge_val)
    assert torch.equal(g.to_input_order(g.edge_val).cpu(), w)
    assert torch.equal(g.to_graph_order(w.to(DEVICE)).cpu(), ref.edge_val)
    x = torch.randn(30, 5, dtype=torch.float64)
    assert torch.allclose(sg.spmm(g, x.to(DEVICE)).cpu(), sg.spmm(ref, x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a synchronisation debug mode needs CUDA")
def test_no_ranged_build_where_host_reads_are_forbidden(monkeypatch):
    """The ranged build reads sizes back to the host; under ``set_sync_debug_mode("error")`` (a
    replay's warm-up) the one sort runs instead, and the build stays free of host reads."""
    monkeypatch.setattr(csr_fmt, "LEAN_MIN_EDGES", 1)
    ei, _ = random_graph(30, 200, seed=6)
    ei = ei.cuda()
    torch.cuda.set_sync_debug_mode("error")
    try:
        g = sg.Graph.from_edge_index(ei, num_nodes=30)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert g.edge_perm.dtype == torch.int64
