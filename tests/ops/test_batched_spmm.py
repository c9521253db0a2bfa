"""Batched SpMM over many small graphs (one program per graph), against float64 oracles.

Without a GPU the Triton kernels run in the interpreter (conftest), on small batches."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.datasets.synthetic import small_graph_batch
from sparsegnn.kernels.spmm_batched import batched_config, spmm_batched

from conftest import DEVICE, dense_adjacency


def _awkward_batch(kind, seed=0):
    """A batch with a graph of no nodes, an isolated node, self loops, duplicate edges and a
    row with no edges; edge weights in [0.5, 1.5).  Returns (edge_index, weight, ptr, N)."""
    ei, ptr = small_graph_batch(5, 3, 17, kind, seed=seed)
    n = int(ptr[-1])
    sizes = (ptr[1:] - ptr[:-1]).tolist()
    ptr = torch.tensor([0] + list(torch.tensor(sizes[:2]).cumsum(0)) + [sum(sizes[:2])]
                       + list(sum(sizes[:2]) + torch.tensor(sizes[2:]).cumsum(0)))    # an empty graph third
    ptr = torch.cat([ptr, torch.tensor([n + 1])])                                   # and an isolated node last
    g0 = int(ptr[1])
    extra = torch.tensor([[0, 1, 2, 0], [0, 1, 1, 1]])                            # loops and a duplicate in graph 0
    keep = ~((ei[1] == g0 - 1))                                                    # graph 0's last row: no edges
    ei = torch.cat([ei[:, keep], extra], 1)
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(ei.shape[1], generator=gen) + 0.5
    return ei, w, ptr, n + 1


def _oracle(ei, w, n, x, reduce):
    a = dense_adjacency(ei, n, w)
    if reduce == "sum":
        return a @ x.double()
    if reduce == "mean":
        return (a @ x.double()) / dense_adjacency(ei, n).sum(1, keepdim=True).clamp(min=1)
    out = torch.zeros(n, x.shape[1], dtype=torch.float64)
    for i in range(n):
        msgs = [w[e] * x[int(ei[0, e])].double() for e in range(ei.shape[1]) if int(ei[1, e]) == i]
        if msgs:
            out[i] = torch.stack(msgs).max(0).values
    return out


@pytest.mark.parametrize("kind", ["molecule", "dense"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("dense,block_e", [(0, 1), (0, 2), (1, 1)])
def test_batched_kernels_match_float64(kind, reduce, dense, block_e):
    """Both kernels, every reduce they claim, feature blocks looping (F = 40 > BLOCK_F = 16)."""
    if dense and reduce == "max":
        pytest.skip("the dense-tile kernel sums (max takes the gather kernel)")
    ei, w, ptr, n = _awkward_batch(kind)
    g = Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE)
    x = torch.randn(n, 40)
    cfg = dict(DENSE=dense, MAXN=32, BLOCK_F=16, BLOCK_E=block_e, num_warps=4)
    got = spmm_batched(ptr.to(DEVICE), g.rowptr, g.col, g.edge_val, x.to(DEVICE), cfg, reduce)
    want = _oracle(ei, w, n, x, reduce)
    assert float((got.double().cpu() - want).norm() / want.norm()) < 1e-6


def test_batched_kernel_bfloat16_accumulates_in_fp32():
    ei, w, ptr, n = _awkward_batch("dense", seed=3)
    g = Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE)
    x = torch.randn(n, 32).bfloat16()
    for dense in (0, 1):
        got = spmm_batched(ptr.to(DEVICE), g.rowptr, g.col, g.edge_val, x.to(DEVICE),
                           dict(DENSE=dense, MAXN=32, BLOCK_F=32, BLOCK_E=1, num_warps=4))
        want = _oracle(ei, w, n, x.float(), "sum")
        assert got.dtype == torch.bfloat16
        assert float((got.double().cpu() - want).norm() / want.norm()) < 1e-2


def test_batch_tiles_hold_each_graphs_adjacency():
    from sparsegnn.kernels.spmm_batched import batch_tiles

    ei, w, ptr, n = _awkward_batch("dense", seed=2)
    g = Graph.from_edge_index(ei, w, num_nodes=n)
    tiles = batch_tiles(ptr, g.rowptr, g.row, g.col, g.edge_val, "sum", 32)
    a = dense_adjacency(ei, n, w)
    for b in range(ptr.numel() - 1):
        lo, hi = int(ptr[b]), int(ptr[b + 1])
        torch.testing.assert_close(tiles[b, : hi - lo, : hi - lo].double(), a[lo:hi, lo:hi])
        assert float(tiles[b, hi - lo:].abs().sum() + tiles[b, :, hi - lo:].abs().sum()) == 0.0


def test_dense_kernel_refuses_max():
    ei, w, ptr, n = _awkward_batch("molecule")
    g = Graph.from_edge_index(ei, w, num_nodes=n)
    with pytest.raises(ValueError, match=r"spmm_batched\(\): .*max"):
        spmm_batched(ptr, g.rowptr, g.col, g.edge_val, torch.randn(n, 4),
                     dict(DENSE=1, MAXN=32, BLOCK_F=16, BLOCK_E=1, num_warps=4), "max")


def test_batched_config_follows_structure():
    assert batched_config(37, 64, 2.3, "sum") == dict(DENSE=0, MAXN=64, BLOCK_F=64, BLOCK_E=2, num_warps=8)
    assert batched_config(37, 512, 9.0, "sum")["DENSE"] == 1
    assert batched_config(37, 512, 9.0, "max")["DENSE"] == 0          # max cannot be a product
    assert batched_config(100, 64, 9.0, "sum")["DENSE"] == 0          # 128-node tiles gather
    assert batched_config(5, 8, 2.0, "sum")["MAXN"] == 16


def test_batch_stats_and_transpose_keep_the_blocks():
    ei, w, ptr, n = _awkward_batch("molecule")
    g = Graph.from_edge_index(ei, w, num_nodes=n)
    g = Graph(g.rowptr, g.col, g.edge_val, n, ptr=ptr)
    sizes = ptr[1:] - ptr[:-1]
    largest, mean_degree, inside = g.batch_stats()
    assert largest == int(sizes.max()) and inside and mean_degree == pytest.approx(ei.shape[1] / n)
    assert torch.equal(g.t().ptr, ptr) and g.t().batch_stats()[2]
    crossing = Graph.from_edge_index(torch.cat([ei, torch.tensor([[0], [n - 2]])], 1), num_nodes=n)
    crossing = Graph(crossing.rowptr, crossing.col, None, n, ptr=ptr)
    assert crossing.batch_stats()[2] is False                           # an edge between graphs
    assert Graph.from_edge_index(ei, num_nodes=n).batch_stats() is None


def test_large_batches_take_the_csr_kernels(monkeypatch):
    """Above BATCHED_MAX_TOTAL_NODES nodes a batch runs the tuned CSR kernels (faster there,
    benchmarks/h100/batched_vs_csr.json), without the batch_stats sync; same result."""
    from sparsegnn.kernels import spmm_batched as mod
    from sparsegnn.ops import _triton

    calls = []
    real = mod.spmm_batched
    monkeypatch.setattr(mod, "spmm_batched", lambda *a, **k: calls.append(1) or real(*a, **k))
    ei, w, ptr, n = _awkward_batch("molecule", seed=6)
    g0 = Graph.from_edge_index(ei, w, num_nodes=n)
    x = torch.randn(n, 8)
    small = sg.spmm(Graph(g0.rowptr, g0.col, g0.edge_val, n, ptr=ptr).to(DEVICE), x.to(DEVICE), backend="triton")
    assert len(calls) == 1
    monkeypatch.setattr(_triton, "BATCHED_MAX_TOTAL_NODES", n - 1)
    big = Graph(g0.rowptr, g0.col, g0.edge_val, n, ptr=ptr).to(DEVICE)
    out = sg.spmm(big, x.to(DEVICE), backend="triton")
    assert len(calls) == 1 and "batch_stats" not in big.cache
    torch.testing.assert_close(out, small, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_spmm_on_a_batch_graph_takes_the_batched_kernel_with_gradients(reduce, monkeypatch):
    """sparsegnn.spmm on a Graph with ptr (Triton backend) runs the batched kernel, forward and
    (sum / mean) backward (the transpose keeps ptr); values and gradients match float64."""
    from sparsegnn.kernels import spmm_batched as mod

    calls = []
    real = mod.spmm_batched
    monkeypatch.setattr(mod, "spmm_batched", lambda *a, **k: calls.append(1) or real(*a, **k))
    ei, w, ptr, n = _awkward_batch("molecule", seed=5)
    g0 = Graph.from_edge_index(ei, w, num_nodes=n)
    g = Graph(g0.rowptr, g0.col, g0.edge_val, n, ptr=ptr).to(DEVICE)
    x = torch.randn(n, 24)
    xg = x.clone().to(DEVICE).requires_grad_()
    out = sg.spmm(g, xg, reduce=reduce, backend="triton")
    up = torch.randn(n, 24)
    out.backward(up.to(DEVICE))
    assert len(calls) == (1 if reduce == "max" else 2)   # forward, and the transposed backward (max: masked)
    xr = x.double().requires_grad_()
    want = sg.spmm(Graph.from_edge_index(ei, w.double(), num_nodes=n), xr, reduce=reduce, backend="reference")
    want.backward(up.double())
    want = want.detach()
    assert float((out.detach().double().cpu() - want).norm() / want.norm()) < 1e-6
    assert float((xg.grad.double().cpu() - xr.grad).norm() / xr.grad.norm()) < 1e-6
