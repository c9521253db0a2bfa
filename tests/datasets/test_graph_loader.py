"""GraphDataset / collate / GraphLoader: batches equal Graph.batch of the same graphs, transposes and
aggregations (forward and backward) equal those of the graphs one at a time, shuffling, drop_last."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.datasets.loader import GraphBatch, GraphDataset, GraphLoader, collate
from sparsegnn.datasets.tu import GraphSample
from sparsegnn.formats.csr import rowptr_to_row, transpose_csr


def random_samples(num=12, seed=0, weighted=False):
    """Directed random graphs with self loops, duplicate edges, an edgeless and a one-node graph."""
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for g in range(num):
        n = [1, 4][g % 2] if g < 2 else int(torch.randint(2, 9, (1,), generator=gen))
        e = 0 if g == 1 else int(torch.randint(0, 3 * n, (1,), generator=gen))
        ei = torch.randint(0, n, (2, e), generator=gen)
        if e >= 2:
            ei[:, 1] = ei[:, 0]                      # a duplicate
        w = torch.rand(e, generator=gen) if weighted else None
        graph = Graph.from_edge_index(ei, w, num_nodes=n)
        samples.append(GraphSample(graph, torch.randn(n, 3, generator=gen), g % 3))
    return samples


def test_collate_equals_graph_batch_of_the_same_graphs():
    samples = random_samples(weighted=True)
    data = GraphDataset.from_samples(samples)
    assert data.num_graphs == 12 and len(data) == 12 and data.num_features == 3
    index = torch.tensor([5, 1, 0, 5, 11, 7])                 # any order, a repeat, the edgeless graph
    batch = collate(data, index)
    expected = Graph.batch([samples[i].graph for i in index.tolist()])
    g = batch.graph
    assert torch.equal(g.rowptr, expected.rowptr) and torch.equal(g.col, expected.col)
    assert torch.equal(g.ptr, expected.ptr) and torch.equal(g.edge_val, expected.edge_val)
    assert g.num_nodes == expected.num_nodes and g.transient
    assert torch.equal(batch.x, torch.cat([samples[i].x for i in index.tolist()]))
    assert batch.y.tolist() == [samples[i].y for i in index.tolist()] and torch.equal(batch.index, index)
    counts = [samples[i].graph.num_nodes for i in index.tolist()]
    assert batch.batch.tolist() == [b for b, c in enumerate(counts) for _ in range(c)]
    assert batch.num_graphs == 6 and batch.ptr is g.ptr
    # what collate put in the cache is what the Graph would compute itself
    assert torch.equal(g.cache.get("row"), rowptr_to_row(g.rowptr, g.num_edges))
    assert torch.equal(g.cache.get("in_degree"), g.rowptr.diff())
    for got, want in zip(g.cache.get("transpose"), transpose_csr(expected.rowptr, expected.col, expected.num_nodes)):
        assert torch.equal(got, want)


def test_aggregation_on_a_batch_equals_graph_by_graph_forward_and_backward():
    samples = random_samples(seed=1, weighted=True)
    data = GraphDataset.from_samples(samples)
    index = torch.tensor([3, 8, 1, 10, 4])
    batch = collate(data, index)
    x = torch.randn(batch.graph.num_nodes, 4, dtype=torch.float64, requires_grad=True)
    out = sg.spmm(batch.graph, x, edge_weight=batch.graph.edge_val.double(), backend="reference")
    parts, start = [], 0
    x_loop = x.detach().clone().requires_grad_()
    for i in index.tolist():
        g = samples[i].graph
        parts.append(sg.spmm(g, x_loop[start:start + g.num_nodes], edge_weight=g.edge_val.double(), backend="reference"))
        start += g.num_nodes
    expected = torch.cat(parts)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(x.grad, x_loop.grad)                  # backward runs on the cached transpose


def test_molecules_and_gcn_normalized(tmp_path):
    from sparsegnn.datasets import load_molecules

    (tmp_path / "m.csv").write_text("smiles,a,b\nCCO,1,\nc1ccccc1,0,1\nC1CC1N,,0\n[Na+].[Cl-],1,1\n")
    mols = load_molecules(tmp_path / "m.csv", backend="builtin")
    data = GraphDataset.from_molecules(mols)
    assert data.y_mask.tolist() == mols.y_mask.tolist() and not torch.isnan(data.y).any()
    normed = data.gcn_normalized()
    batch, nbatch = collate(data, torch.tensor([2, 0, 3])), collate(normed, torch.tensor([2, 0, 3]))
    torch.manual_seed(0)
    conv = sg.nn.GCNConv(data.num_features, 8)
    plain = sg.nn.GCNConv(data.num_features, 8, normalize=False)
    plain.load_state_dict(conv.state_dict())
    torch.testing.assert_close(plain(nbatch.x, nbatch.graph), conv(batch.x, batch.graph))
    assert nbatch.graph.num_edges == batch.graph.num_edges + batch.graph.num_nodes   # one loop per atom


def test_loader_shuffles_with_generator_and_drop_last():
    data = GraphDataset.from_samples(random_samples(num=23))
    loader = GraphLoader(data, 5, shuffle=True, generator=torch.Generator().manual_seed(0))
    assert len(loader) == 5
    first = [b.index.tolist() for b in loader]
    assert [len(i) for i in first] == [5, 5, 5, 5, 3]
    assert sorted(sum(first, [])) == list(range(23))
    second = [b.index.tolist() for b in loader]
    assert second != first and sorted(sum(second, [])) == list(range(23))       # a new order per epoch
    again = GraphLoader(data, 5, shuffle=True, generator=torch.Generator().manual_seed(0))
    assert [b.index.tolist() for b in again] == first
    dropped = GraphLoader(data, 5, drop_last=True)
    assert len(dropped) == 4 and [b.index.tolist() for b in dropped][-1] == [15, 16, 17, 18, 19]
    subset = GraphLoader(data, 4, index=torch.tensor([7, 2, 9]))
    assert [b.index.tolist() for b in subset] == [[7, 2, 9]]
    batch = next(iter(subset))
    assert isinstance(batch, GraphBatch) and batch.x.device == data.device


def test_loader_batches_equal_collate_of_their_graphs():
    data = GraphDataset.from_samples(random_samples(num=17, seed=2, weighted=True))
    loader = GraphLoader(data, 4, shuffle=True, generator=torch.Generator().manual_seed(1))
    for batch in loader:
        want = collate(data, batch.index)
        g, w = batch.graph, want.graph
        for name in ("rowptr", "col", "edge_val", "ptr"):
            assert torch.equal(getattr(g, name), getattr(w, name)), name
        for key in ("row", "in_degree"):
            assert torch.equal(g.cache.get(key), w.cache.get(key)), key
        assert all(torch.equal(a, b) for a, b in zip(g.cache.get("transpose"), w.cache.get("transpose")))
        for name in ("x", "y", "batch"):
            assert torch.equal(getattr(batch, name), getattr(want, name)), name
        assert g.num_nodes == w.num_nodes and g.transient
        counts = batch.graph.ptr.diff()
        assert g.cache.get("batch_stats") == (int(counts.max()), g.num_edges / g.num_nodes, True)
        assert w.cache.get("batch_stats") == g.cache.get("batch_stats")
        if hasattr(Graph, "batch_stats"):                # what the Graph measures itself agrees
            assert Graph(g.rowptr, g.col, None, g.num_nodes, ptr=g.ptr).batch_stats() == g.cache.get("batch_stats")
    ahead = GraphLoader(data, 4, shuffle=True, generator=torch.Generator().manual_seed(1), prefetch=2)
    plain = GraphLoader(data, 4, shuffle=True, generator=torch.Generator().manual_seed(1))
    for a, b in zip(ahead, plain, strict=True):         # a background thread yields the same batches
        assert torch.equal(a.index, b.index) and torch.equal(a.graph.col, b.graph.col) and torch.equal(a.x, b.x)


def test_batch_to_and_items_keep_the_graph_cache():
    data = GraphDataset.from_samples(random_samples(num=4))
    batch = collate(data, torch.tensor([0, 2]))
    moved = batch.to("cpu")
    assert {name for name, _ in batch.items()} == {"graph", "x", "y", "y_mask", "batch", "index", "node_weight",
                                                    "graph_weight"}
    assert torch.equal(moved.graph.col, batch.graph.col) and "transpose" in moved.graph.cache
    assert moved.graph.ptr.tolist() == batch.graph.ptr.tolist()


def test_dataset_errors():
    graphs = Graph.batch([Graph.from_edge_index(torch.tensor([[0], [1]]), num_nodes=2)] * 2)
    cross = Graph(graphs.rowptr, torch.tensor([2, 0]), None, 4, ptr=graphs.ptr)    # an edge from graph 1 into graph 0
    with pytest.raises(ValueError, match=r"GraphDataset\(\): graph is not block-diagonal"):
        GraphDataset(cross, torch.zeros(4, 1), torch.zeros(2))
    with pytest.raises(ValueError, match=r"GraphDataset\(\): graph must be a batch with ptr"):
        GraphDataset(Graph.from_edge_index(torch.tensor([[0], [1]])), torch.zeros(2, 1), torch.zeros(1))
    with pytest.raises(ValueError, match=r"GraphDataset\(\): y must have one row per graph"):
        GraphDataset(graphs, torch.zeros(4, 1), torch.zeros(3))
    with pytest.raises(ValueError, match=r"GraphDataset\(\): x must be"):
        GraphDataset(graphs, torch.zeros(3, 1), torch.zeros(2))
    data = GraphDataset(graphs, torch.zeros(4, 1), torch.zeros(2))
    with pytest.raises(ValueError, match=r"GraphLoader\(\): index must hold graph ids"):
        GraphLoader(data, 2, index=torch.tensor([0, 2]))
    with pytest.raises(ValueError, match=r"GraphLoader\(\): batch_size"):
        GraphLoader(data, 0)


def test_tu_dataset_features(tmp_path):
    import zipfile

    files = {  # two graphs: a triangle (labels 1, 1, 2) and an edge (labels 1, 3), 2 attributes each node
        "T_A.txt": "1, 2\n2, 1\n2, 3\n3, 2\n1, 3\n3, 1\n4, 5\n5, 4\n",
        "T_graph_indicator.txt": "1\n1\n1\n2\n2\n", "T_graph_labels.txt": "1\n-1\n",
        "T_node_labels.txt": "1\n1\n2\n1\n3\n", "T_node_attributes.txt": "1.0, 10\n2.0, 10\n3.0, 20\n4.0, 20\n5.0, 40\n",
    }
    with zipfile.ZipFile(tmp_path / "T.zip", "w") as zf:
        for name, text in files.items():
            zf.writestr(f"T/{name}", text)
    labels_only = GraphDataset.from_tu(tmp_path / "T.zip")
    assert labels_only.x.tolist() == [[1, 0, 0], [1, 0, 0], [0, 1, 0], [1, 0, 0], [0, 0, 1]]
    assert labels_only.y.tolist() == [1, 0] and labels_only.graph.ptr.tolist() == [0, 3, 5]
    both = GraphDataset.from_tu(tmp_path / "T.zip", node_attributes=True)
    assert both.x.shape == (5, 5) and torch.allclose(both.x[:, :2].mean(0), torch.zeros(2), atol=1e-6)
    assert torch.allclose(both.x[:, :2].std(0), torch.ones(2)) and torch.equal(both.x[:, 2:], labels_only.x)
