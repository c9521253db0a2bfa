"""Locality reordering: permutations, the renumbered graph, and training that never leaks the order."""
import importlib.util

import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.formats.tiles import translate

from conftest import dense_adjacency

_METIS = pytest.param("metis", marks=pytest.mark.skipif(importlib.util.find_spec("pymetis") is None,
                                                        reason="pymetis not installed (the [metis] extra; CI has it)"))
METHODS = ["degree", "rcm", _METIS, "lpa"]


@pytest.mark.parametrize("method", METHODS)
def test_reorder_renumbers_the_same_graph(graph_case, method):
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w, num_nodes=n)
    h, perm = g.reorder(method)
    assert sorted(perm.tolist()) == list(range(n))                        # a permutation
    dense = dense_adjacency(ei, n, w)
    assert torch.allclose(h.to_dense(torch.float64), dense[perm][:, perm])   # A' = P A P^T
    # edge values stay with their edges, and edge_perm still points at the caller's edges
    src, dst = ei[0][h.edge_perm], ei[1][h.edge_perm]
    assert torch.equal(perm[h.col], src) and torch.equal(perm[h.row], dst)
    assert torch.equal(h.edge_val, w[h.edge_perm].to(h.edge_val.dtype))
    # an op on the renumbered graph, mapped back, is the op on the original
    x = torch.randn(n, 3, dtype=torch.float64)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n)
    out = sg.spmm(h, x[perm], backend="reference")[inverse]
    assert torch.allclose(out, dense @ x)


def test_degree_order_puts_hubs_first_and_rcm_narrows_a_shuffled_band():
    n = 200
    i = torch.arange(n - 1)
    band = torch.cat([torch.stack([i, i + 1]), torch.stack([i + 1, i])], dim=1)   # a path: bandwidth 1
    shuffle = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    g = Graph.from_edge_index(shuffle[band], num_nodes=n)
    bandwidth = lambda graph: int((graph.row - graph.col).abs().max())          # noqa: E731
    assert bandwidth(g) > 50
    h, _ = g.reorder("rcm")
    assert bandwidth(h) == 1                                                     # the path found again
    deg = torch.tensor([1, 5, 2, 9, 0])
    ei = torch.cat([torch.stack([torch.zeros(int(d), dtype=torch.long), torch.full((int(d),), v)])
                    for v, d in enumerate(deg.tolist()) if d], dim=1)
    _, perm = Graph.from_edge_index(ei, num_nodes=5).reorder("degree")
    assert perm.tolist() == [3, 1, 2, 0, 4]


@pytest.mark.parametrize("method", ["lpa", _METIS])
def test_community_orders_regroup_shuffled_cliques_and_improve_tile_fill(method):
    # cliques of 16 nodes, numbered at random: each clique's nodes must end up together
    k, size = 48, 16                    # 768 nodes: 3 METIS partitions of 16 whole cliques
    n = k * size
    blocks = [torch.cartesian_prod(torch.arange(size), torch.arange(size)) + c * size for c in range(k)]
    edges = torch.cat(blocks).T
    edges = edges[:, edges[0] != edges[1]]
    shuffle = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    g = Graph.from_edge_index(shuffle[edges], num_nodes=n)
    h, perm = g.reorder(method)
    inverse = torch.empty_like(shuffle)
    inverse[shuffle] = torch.arange(n)
    # LPA: each clique is one community, contiguous; METIS: 3 partitions of 256 nodes, each
    # clique inside one (cutting one costs 64+ edges), so within a span of one partition
    span = size if method == "lpa" else 256
    position = torch.empty_like(perm)
    position[inverse[perm]] = torch.arange(n)                                # new position of clique node
    for c in range(k):
        nodes = position[c * size:(c + 1) * size]
        assert int(nodes.max() - nodes.min()) < span
    before = translate(g.rowptr, g.col, n).stats
    after = translate(h.rowptr, h.col, n).stats
    assert after.blocks < before.blocks and after.fill > before.fill


def test_reorder_errors():
    g = Graph.from_edge_index(torch.tensor([[0, 1], [1, 2]]), num_nodes=3)
    with pytest.raises(ValueError, match=r"reorder\(\): method must be one of"):
        g.reorder("metis-fast")
    with pytest.raises(ValueError, match=r"Graph.reorder\(\): needs a square graph"):
        Graph.from_edge_index(torch.tensor([[0], [1]]), num_nodes=2, num_src=5).reorder("degree")
    with pytest.raises(ValueError, match=r"Graph.reorder\(\): a batch of graphs"):
        Graph.batch([g, g]).reorder("degree")


@pytest.mark.parametrize("method", ["rcm", "lpa"])
def test_training_on_a_reordered_dataset_reports_the_original_results(method):
    from sparsegnn.training import train_node_classifier

    data = sg.datasets.load("cora")
    plain = train_node_classifier(data, "gcn", epochs=3, dropout=0.0, progress=False)
    moved = train_node_classifier(data, "gcn", epochs=3, dropout=0.0, progress=False, reorder=method)
    # same weights (same seed), same nodes: the order changes only the summation order
    assert moved.losses == pytest.approx(plain.losses, rel=1e-4)
    assert moved.test_acc == pytest.approx(plain.test_acc, abs=2e-3)
    reordered, perm = data.reorder(method)
    assert torch.equal(reordered.y, data.y[perm]) and torch.equal(reordered.train_mask, data.train_mask[perm])
