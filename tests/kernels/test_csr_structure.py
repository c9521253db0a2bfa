"""GCN's transform kernels (self loops replaced, values normalised) against ``formats/csr.py``'s
torch implementations and a float64 dense oracle, on graphs with empty rows, isolated nodes,
several self loops per row, duplicates and a hub (Triton's interpreter on a CPU)."""
import pytest
import torch

from sparsegnn import Graph
from sparsegnn.datasets import random_graph
from sparsegnn.formats import csr as csr_fmt

from conftest import DEVICE

pytest.importorskip("triton")
from sparsegnn.kernels import csr_structure  # noqa: E402


def _graph(weighted=False, seed=4):
    ei, w = random_graph(40, 160, seed=seed, num_isolated=3, num_empty_rows=4, num_self_loops=6, num_duplicates=6,
                         weighted=weighted)
    hub = torch.stack([torch.arange(40), torch.full((40,), 9)])         # 40 edges into node 9, one a loop
    loops = torch.tensor([[5, 5, 5], [5, 5, 5]])                         # node 5: three loops more
    ei = torch.cat([ei, hub, loops], 1)
    if weighted:
        gen = torch.Generator().manual_seed(seed)
        w = torch.rand(ei.shape[1], generator=gen) + 0.1
        w[ei[1] == 12] = 0.0                                             # a row of zero degree
    return Graph.from_edge_index(ei, w if weighted else None, num_nodes=40).to(DEVICE)


@pytest.mark.parametrize("seed", [4, 5])
def test_replace_self_loops_equals_the_torch_transform(seed):
    g = _graph(seed=seed)
    got = csr_structure.replace_self_loops(g.rowptr, g.col)
    want = csr_fmt.replace_self_loops(g.rowptr, g.col, g.row)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    rowptr, col, _ = got
    # every node has exactly one loop, the last edge of its row, and no other edge is a loop
    row = csr_fmt.rowptr_to_row(rowptr, col.numel())
    assert torch.equal(col[rowptr[1:] - 1].cpu(), torch.arange(40))
    assert int((row == col).sum()) == 40


def test_replace_self_loops_of_graphs_without_edges_or_nodes():
    empty = torch.zeros(6, dtype=torch.int64, device=DEVICE)             # 5 nodes, no edges
    rowptr, col, source = csr_structure.replace_self_loops(empty, torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert torch.equal(rowptr.cpu(), torch.arange(6)) and torch.equal(col.cpu(), torch.arange(5))
    assert torch.equal(source.cpu(), torch.arange(5))
    rowptr, col, source = csr_structure.replace_self_loops(empty[:1], torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert rowptr.tolist() == [0] and col.numel() == 0 and source.numel() == 0


@pytest.mark.parametrize("mode", ["sym", "row"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_normalize_values_equals_float64(mode, weighted):
    g = _graph(weighted)
    got = csr_structure.normalize_values(g.rowptr, g.col, g.edge_val, mode)
    assert got.dtype == torch.float32 and got.shape == (g.num_edges,)
    row, col = g.row.cpu(), g.col.cpu()
    w = torch.ones(g.num_edges, dtype=torch.float64) if g.edge_val is None else g.edge_val.double().cpu()
    deg = torch.zeros(40, dtype=torch.float64).index_add_(0, row, w)
    inv = torch.where(deg == 0, torch.zeros_like(deg), deg.pow(-0.5) if mode == "sym" else 1 / deg)
    want = inv[row] * w * inv[col] if mode == "sym" else w * inv[row]
    assert torch.allclose(got.double().cpu(), want, rtol=1e-6, atol=1e-7)
    torch_path = csr_fmt.normalize_values(g.rowptr, g.col, g.edge_val, mode, torch.float32)
    assert torch.allclose(got.cpu(), torch_path.cpu(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("weighted", [False, True, "learnable"], ids=["unweighted", "weighted", "learnable"])
def test_gcn_layer_on_the_transform_kernels_equals_the_torch_transform(monkeypatch, weighted):
    """GCNConv's graph from a new ``edge_index``, transformed by the row kernels (forced on under
    the interpreter) and by the torch ops: the same layer output and gradients (learnable edge
    weights take the torch ops, which are differentiable)."""
    from sparsegnn import nn as sgnn
    from sparsegnn.formats import _host
    from sparsegnn.kernels import interpreting
    from sparsegnn.nn import clear_graph_cache
    from sparsegnn.ops import structure

    monkeypatch.setattr(_host, "HOST_MAX_EDGES", 0)      # a GPU's graph built on the GPU (not its host)

    ei, w = random_graph(40, 200, seed=8, num_isolated=2, num_empty_rows=3, num_self_loops=5, num_duplicates=4,
                         weighted=True)
    ei, w = ei.to(DEVICE), (w.to(DEVICE) if weighted else None)   # "learnable": weighted, needing a gradient
    conv = sgnn.GCNConv(6, 5).to(DEVICE)
    results = []
    for forced in (True, False):
        monkeypatch.setattr(structure, "_on_kernels", lambda t, forced=forced: forced and (t.is_cuda or interpreting()))
        clear_graph_cache()
        x = torch.randn(40, 6, generator=torch.Generator().manual_seed(2)).to(DEVICE).requires_grad_()
        weight = w.detach().clone().requires_grad_(weighted == "learnable") if w is not None else None
        out = conv(x, ei.clone(), weight)
        out.pow(2).sum().backward()
        results.append((out.detach(), x.grad, None if weight is None else weight.grad))
    (out_k, grad_k, wgrad_k), (out_t, grad_t, wgrad_t) = results
    assert torch.allclose(out_k, out_t, rtol=1e-5, atol=1e-6)
    assert torch.allclose(grad_k, grad_t, rtol=1e-5, atol=1e-6)
    if weighted == "learnable":
        assert wgrad_k is not None and torch.allclose(wgrad_k, wgrad_t, rtol=1e-5, atol=1e-6)


def test_normalize_reads_strided_values(monkeypatch):
    """Values that are a column of a wider tensor: normalised by position, as the torch ops do."""
    from sparsegnn.kernels import interpreting
    from sparsegnn.ops import structure

    g = _graph()
    w2 = torch.rand(g.num_edges, 3, generator=torch.Generator().manual_seed(6)).to(DEVICE) + 0.1
    strided = g.with_values(w2[:, 1])
    monkeypatch.setattr(structure, "_on_kernels", lambda t: t.is_cuda or interpreting())
    got = structure.normalize(strided, "sym").edge_val
    want = csr_fmt.normalize_values(g.rowptr, g.col, w2[:, 1].contiguous(), "sym", torch.float32)
    assert torch.allclose(got.cpu(), want.cpu(), rtol=1e-6, atol=1e-7)
