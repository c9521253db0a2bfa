import numpy as np
import pytest
import torch

from sparsegnn import Graph
from sparsegnn.datasets import random_graph

from conftest import dense_adjacency


def test_from_edge_index_matches_dense(graph_case):
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w, num_nodes=n)
    assert g.num_nodes == n and g.num_edges == ei.shape[1]
    assert torch.equal(g.to_dense(torch.float64), dense_adjacency(ei, n, w))
    # CSR invariants: rows sorted, rowptr consistent.
    assert int(g.rowptr[0]) == 0 and int(g.rowptr[-1]) == g.num_edges
    assert bool((g.row[1:] >= g.row[:-1]).all()) if g.num_edges > 1 else True


def test_edge_order_roundtrip():
    ei, w = random_graph(30, 90, seed=3, num_duplicates=4, weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=30)
    # CSR edge k is input edge edge_perm[k]
    assert torch.equal(g.col, ei[0, g.edge_perm]) and torch.equal(g.row, ei[1, g.edge_perm])
    assert torch.equal(g.edge_val, w[g.edge_perm])
    assert torch.equal(g.to_input_order(g.to_graph_order(w)), w)
    assert torch.equal(g.to_input_order(g.edge_val), w)


def test_transpose_is_reverse_graph(graph_case):
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w, num_nodes=n)
    t = g.t()
    assert torch.equal(t.to_dense(torch.float64), dense_adjacency(ei, n, w).T)
    rowptr_t, col_t, perm = g.transpose_parts()
    assert torch.equal(col_t, g.row[perm])
    assert g.t() is t  # cached


def test_add_self_loops_one_per_node():
    ei = torch.tensor([[0, 0, 1, 2, 2], [0, 0, 2, 1, 2]])  # node 0 has a duplicated loop
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    g = Graph.from_edge_index(ei, w, num_nodes=4).add_self_loops(fill_value=7.0)
    dense = g.to_dense(torch.float64)
    assert dense.diagonal().tolist() == [3.0, 7.0, 5.0, 7.0]  # existing loops summed, new ones filled
    assert int((g.row == g.col).sum()) == 4
    assert dense[2, 1] == 3.0 and dense[1, 2] == 4.0
    unweighted = Graph.from_edge_index(ei, num_nodes=4).add_self_loops()
    assert unweighted.to_dense(torch.float64).diagonal().tolist() == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_remove_duplicates(reduce):
    ei = torch.tensor([[1, 1, 1, 0, 2], [0, 0, 0, 1, 0]])
    w = torch.tensor([1.0, 4.0, 2.5, 3.0, 5.0])
    g = Graph.from_edge_index(ei, w, num_nodes=3).remove_duplicates(reduce)
    assert g.num_edges == 3
    expected = {"sum": 7.5, "mean": 2.5, "max": 4.0, "min": 1.0}[reduce]
    assert g.to_dense(torch.float64)[0, 1] == expected
    assert g.to_dense(torch.float64)[0, 2] == 5.0 and g.to_dense(torch.float64)[1, 0] == 3.0


def test_normalize_sym_and_row(graph_case):
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w.double(), num_nodes=n)
    a = dense_adjacency(ei, n, w)  # duplicates summed
    deg = a.sum(1)
    inv_sqrt = torch.where(deg > 0, deg.pow(-0.5), torch.zeros_like(deg))
    inv = torch.where(deg > 0, 1 / deg, torch.zeros_like(deg))
    assert torch.allclose(g.normalize("sym").to_dense(torch.float64), inv_sqrt[:, None] * a * inv_sqrt[None, :])
    assert torch.allclose(g.normalize("row").to_dense(torch.float64), inv[:, None] * a)


def test_gcn_normalization_formula():
    ei, _ = random_graph(20, 60, seed=5, num_self_loops=3, num_duplicates=2)
    g = Graph.from_edge_index(ei, num_nodes=20).add_self_loops().normalize("sym")
    a = dense_adjacency(ei, 20)
    a.fill_diagonal_(0)
    a = a + torch.eye(20, dtype=torch.float64)
    d = a.sum(1).pow(-0.5)
    assert torch.allclose(g.to_dense(torch.float64), d[:, None] * a * d[None, :], atol=1e-6)


def test_batch_block_diagonal():
    gs = [Graph.from_edge_index(*random_graph(n, 3 * n, seed=n, weighted=True), num_nodes=n) for n in (3, 5, 1, 4)]
    b = Graph.batch(gs)
    assert b.ptr.tolist() == [0, 3, 8, 9, 13]
    assert torch.equal(b.to_dense(torch.float64), torch.block_diag(*[g.to_dense(torch.float64) for g in gs]))
    assert b.batch_vector().tolist() == [0] * 3 + [1] * 5 + [2] + [3] * 4


def test_conversions_roundtrip():
    ei, w = random_graph(15, 40, seed=7, weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=15)
    dense = g.to_dense(torch.float64)
    csr = g.to_torch_sparse_csr()
    assert torch.allclose(csr.to_dense().double(), dense)
    assert torch.allclose(Graph.from_torch_sparse(csr).to_dense(torch.float64), dense)
    coo = dense.to_sparse()
    assert torch.allclose(Graph.from_torch_sparse(coo).to_dense(torch.float64), dense)
    import scipy.sparse as sp  # in the test extra

    m = sp.csr_matrix(dense.numpy())
    assert np.allclose(Graph.from_scipy(m).to_dense(torch.float64).numpy(), dense.numpy())
    r = Graph.from_csr(g.rowptr, g.col, g.edge_val)
    assert torch.equal(r.to_dense(torch.float64), dense)


def test_to_device_keeps_structure():
    ei, w = random_graph(10, 20, seed=1, weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=10)
    h = g.to("cpu")
    assert torch.equal(h.to_dense(), g.to_dense()) and torch.equal(h.edge_perm, g.edge_perm)


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "edge_index, kwargs, message",
    [
        (torch.tensor([[0, -1], [1, 0]]), {}, "negative"),
        (torch.tensor([[0, 5], [1, 0]]), {"num_nodes": 3}, "out of range"),
        (torch.tensor([[0.0, 1.0], [1.0, 0.0]]), {}, "integer dtype"),
        (torch.tensor([0, 1, 2]), {}, r"shape \[2, E\]"),
        (torch.zeros(3, 2, dtype=torch.int64), {}, r"shape \[2, E\]"),
        (torch.tensor([[0, 1], [1, 0]]), {"edge_weight": torch.ones(3)}, "has 3 entries"),
        (torch.tensor([[0, 1], [1, 0]]), {"edge_weight": torch.ones(2, dtype=torch.int64)}, "floating-point"),
        ([[0, 1], [1, 0]], {}, "must be a torch.Tensor"),
    ],
)
def test_from_edge_index_rejects_bad_input(edge_index, kwargs, message):
    with pytest.raises(ValueError, match=r"Graph.from_edge_index\(\): .*" + message):
        Graph.from_edge_index(edge_index, **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs two devices (CPU + CUDA)")
def test_from_edge_index_rejects_mixed_devices():
    with pytest.raises(ValueError, match="one device"):
        Graph.from_edge_index(torch.tensor([[0, 1], [1, 0]]), torch.ones(2, device="cuda"))


def test_from_csr_rejects_bad_input():
    with pytest.raises(ValueError, match=r"Graph.from_csr\(\): rowptr must start at 0"):
        Graph.from_csr(torch.tensor([0, 1, 3]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="non-decreasing"):
        Graph.from_csr(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="out of range"):
        Graph.from_csr(torch.tensor([0, 1, 2]), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="integer dtype"):
        Graph.from_csr(torch.tensor([0.0, 1.0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="2-D sparse"):      # rectangular [N, M] is a bipartite graph
        Graph.from_torch_sparse(torch.ones(2, 3, 2).to_sparse())


def test_transformation_arguments_validated():
    g = Graph.from_edge_index(torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match=r"Graph.normalize\(\): mode"):
        g.normalize("col")
    with pytest.raises(ValueError, match=r"Graph.remove_duplicates\(\): reduce"):
        g.remove_duplicates("prod")
    with pytest.raises(ValueError, match="at least one graph"):
        Graph.batch([])
