"""Layers against dense float64 formulas and, where importable, PyG's layers with the same weights."""
import pytest
import torch
import torch.nn.functional as F

import sparsegnn as sg
from sparsegnn import Graph, nn as sgnn

from conftest import dense_adjacency

N = 30


@pytest.fixture
def graph_data():
    ei, w = sg.datasets.random_graph(N, 120, seed=21, num_isolated=2, num_empty_rows=3,
                                     num_self_loops=3, num_duplicates=4, weighted=True)
    x = torch.randn(N, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return ei, w.double(), x


def _no_loops_dense(ei, n, w=None):
    a = dense_adjacency(ei, n, w)
    a.fill_diagonal_(0)
    return a


def test_gcnconv_dense_formula(graph_data):
    ei, w, x = graph_data
    conv = sgnn.GCNConv(8, 4).double()
    a = _no_loops_dense(ei, N, w)
    loops = torch.ones(N, dtype=torch.float64)
    for k in range(ei.shape[1]):                 # a node's last self loop sets its weight (PyG's gcn_norm)
        if ei[0, k] == ei[1, k]:
            loops[ei[0, k]] = w[k]
    a = a + torch.diag(loops)
    d = a.sum(1).pow(-0.5)
    expected = (d[:, None] * a * d[None, :]) @ x @ conv.lin.weight.T + conv.bias
    assert torch.allclose(conv(x, ei, w), expected)
    graph_input = conv(x, Graph.from_edge_index(ei, w, num_nodes=N))
    assert torch.allclose(graph_input, expected)


def test_gcnconv_cached_reuses_graph(graph_data):
    ei, _, x = graph_data
    conv = sgnn.GCNConv(8, 4, cached=True).double()
    first = conv(x, ei)
    cached = conv._cached_graph
    assert cached is not None
    assert torch.allclose(conv(x, torch.zeros(2, 0, dtype=torch.int64)), first)  # ignores the new graph
    assert conv._cached_graph is cached
    conv.reset_cache()
    assert conv._cached_graph is None


@pytest.mark.parametrize("aggr", ["mean", "sum", "max"])
@pytest.mark.parametrize("out_channels", [4, 16])
def test_sageconv_dense_formula(graph_data, aggr, out_channels):
    ei, _, x = graph_data
    conv = sgnn.SAGEConv(8, out_channels, aggr=aggr).double()
    a = dense_adjacency(ei, N)
    if aggr == "sum":
        agg = a @ x
    elif aggr == "mean":
        agg = (a @ x) / a.sum(1, keepdim=True).clamp(min=1)
    else:
        agg = torch.stack([
            x[ei[0, ei[1] == i]].max(0).values if bool((ei[1] == i).any()) else torch.zeros(8, dtype=torch.float64)
            for i in range(N)
        ])
    expected = agg @ conv.lin_l.weight.T + conv.lin_l.bias + x @ conv.lin_r.weight.T
    assert torch.allclose(conv(x, ei), expected)


def test_ginconv_dense_formula(graph_data):
    ei, _, x = graph_data
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6)).double()
    conv = sgnn.GINConv(mlp, eps=0.3, train_eps=True).double()
    expected = mlp(1.3 * x + dense_adjacency(ei, N) @ x)
    out = conv(x, ei)
    assert torch.allclose(out, expected)
    out.sum().backward()
    assert conv.eps.grad is not None


def test_agnnconv_dense_formula(graph_data):
    ei, _, x = graph_data
    conv = sgnn.AGNNConv().double()
    with torch.no_grad():
        conv.beta.fill_(1.7)
    mask = _no_loops_dense(ei, N) > 0
    mask |= torch.eye(N, dtype=torch.bool)
    xn = F.normalize(x, dim=-1)
    logits = (1.7 * xn @ xn.T).masked_fill(~mask, float("-inf"))
    # duplicates: each copy of an edge is its own softmax entry
    mult = _no_loops_dense(ei, N) + torch.eye(N, dtype=torch.float64)
    weights = mult * torch.exp(logits - logits.max(1, keepdim=True).values)
    p = weights / weights.sum(1, keepdim=True)
    assert torch.allclose(conv(x, ei), p @ x)
    assert torch.autograd.gradcheck(lambda x: conv(x, ei), (x.clone().requires_grad_(True),))


def test_gatconv_dense_formula(graph_data):
    ei, _, x = graph_data
    heads, channels = 3, 4
    conv = sgnn.GATConv(8, channels, heads=heads).double()
    h = (x @ conv.lin.weight.T).view(N, heads, channels)
    a_src = (h * conv.att_src).sum(-1)
    a_dst = (h * conv.att_dst).sum(-1)
    mult = _no_loops_dense(ei, N) + torch.eye(N, dtype=torch.float64)
    outs = []
    for k in range(heads):
        e = F.leaky_relu(a_dst[:, k, None] + a_src[None, :, k], 0.2).masked_fill(mult == 0, float("-inf"))
        wts = mult * torch.exp(e - e.max(1, keepdim=True).values)
        outs.append((wts / wts.sum(1, keepdim=True)) @ h[:, k])
    expected = torch.cat(outs, dim=1) + conv.bias
    assert torch.allclose(conv(x, ei), expected)


def test_layer_rejects_bad_input(graph_data):
    ei, w, x = graph_data
    conv = sgnn.GCNConv(8, 4).double()
    with pytest.raises(ValueError, match="GCNConv"):
        conv(x[:, 0], ei)
    with pytest.raises(ValueError, match="edge_weight"):
        conv(x, Graph.from_edge_index(ei, num_nodes=N), w)
    with pytest.raises(ValueError, match="out of range"):
        conv(x[:10], ei)


@pytest.mark.parametrize("name", ["gcn", "agnn", "sage", "gin", "gat"])
def test_models_forward_backward(name):
    from sparsegnn.training import build_model

    ei, _ = sg.datasets.random_graph(40, 160, seed=3)
    x = torch.randn(40, 12)
    model = build_model(name, 12, 5, hidden=16)
    out = model(x, Graph.from_edge_index(ei, num_nodes=40))
    assert out.shape == (40, 5)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------- PyG equivalence (GPU image has PyG)
def _pyg():
    return pytest.importorskip("torch_geometric.nn")


def test_matches_pyg_gcn_sage_gin(graph_data):
    pyg = _pyg()
    ei, w, x = graph_data
    ours, theirs = sgnn.GCNConv(8, 4).double(), pyg.GCNConv(8, 4).double()
    theirs.lin.weight.data.copy_(ours.lin.weight)
    theirs.bias.data.copy_(ours.bias)
    assert torch.allclose(ours(x, ei), theirs(x, ei))
    # Weighted: PyG keeps one of a node's repeated self loops, we sum them (documented), so
    # compare on a graph whose nodes have at most one self loop.
    is_loop = ei[0] == ei[1]
    first_loop = is_loop & ~torch.tensor([bool(is_loop[:k][ei[0, :k] == ei[0, k]].any()) for k in range(ei.shape[1])])
    keep = ~is_loop | first_loop
    assert torch.allclose(ours(x, ei[:, keep], w[keep]), theirs(x, ei[:, keep], w[keep]))
    ours, theirs = sgnn.SAGEConv(8, 4).double(), pyg.SAGEConv(8, 4).double()
    theirs.lin_l.weight.data.copy_(ours.lin_l.weight)
    theirs.lin_l.bias.data.copy_(ours.lin_l.bias)
    theirs.lin_r.weight.data.copy_(ours.lin_r.weight)
    assert torch.allclose(ours(x, ei), theirs(x, ei))
    mlp = torch.nn.Linear(8, 4).double()
    ours, theirs = sgnn.GINConv(mlp, eps=0.2), pyg.GINConv(mlp, eps=0.2)  # PyG re-initialises mlp here
    assert torch.allclose(ours(x, ei), theirs(x, ei))


def test_matches_pyg_agnn_gat(graph_data):
    pyg = _pyg()
    ei, _, x = graph_data
    ours, theirs = sgnn.AGNNConv().double(), pyg.AGNNConv().double()
    assert torch.allclose(ours(x, ei), theirs(x, ei))
    ours, theirs = sgnn.GATConv(8, 4, heads=2).double(), pyg.GATConv(8, 4, heads=2).double()
    theirs.lin.weight.data.copy_(ours.lin.weight)
    theirs.att_src.data.copy_(ours.att_src)
    theirs.att_dst.data.copy_(ours.att_dst)
    theirs.bias.data.copy_(ours.bias)
    assert torch.allclose(ours(x, ei), theirs(x, ei))
