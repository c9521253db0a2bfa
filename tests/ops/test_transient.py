"""Transient graphs (one training step, e.g. a sampled mini-batch): same results, no per-structure work.

The ops run plan-free kernels with heuristic configs on them: nothing planned, no signature
computed, nothing tuned or stored.  Checked against the same graph not marked transient and
against dense float64 formulas, forward and backward, on every backend.
"""
import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.ops.attention import gat_attention
from sparsegnn.tune import tuner_invocations

from conftest import DEVICE, dense_adjacency

BACKENDS = ["reference", "cpu", "triton"]


def _device(backend):
    return "cpu" if backend == "cpu" else DEVICE


def _graphs(graph_case, backend):
    _, n, ei, w = graph_case
    plain = Graph.from_edge_index(ei, num_nodes=n).to(_device(backend))
    transient = Graph(plain.rowptr, plain.col, None, n, transient=True)
    return n, ei, w, plain, transient


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_spmm_on_a_transient_graph(graph_case, backend, reduce):
    n, ei, w, plain, transient = _graphs(graph_case, backend)
    device = _device(backend)
    weight = plain.to_graph_order(w.to(device)).float()
    x = torch.randn(n, 7, device=device)
    results = []
    before = tuner_invocations()
    for g in (transient, plain):
        xg = x.clone().requires_grad_()
        wg = weight.clone().requires_grad_()
        out = sg.spmm(g, xg, reduce, edge_weight=wg, backend=backend)
        grads = torch.autograd.grad(out, (xg, wg), torch.ones_like(out))
        results.append((out, *grads))
        if g is transient:
            assert tuner_invocations() == before                 # nothing tuned ...
            assert not any(k in g.cache for k in ("plan", "signature", "stats"))   # ... planned or measured
            assert g.t().transient                                # the backward's transpose too
    for got, want in zip(*results):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    if reduce == "sum":   # and the plain graph's result is the dense formula
        dense = dense_adjacency(ei, n, w).float().to(device)
        assert torch.allclose(results[0][0], dense @ x, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_head_spmm_and_gat_on_a_transient_graph(graph_case, backend):
    n, _, _, plain, transient = _graphs(graph_case, backend)
    device = _device(backend)
    gen = torch.Generator().manual_seed(4)
    feat = torch.randn(n, 2, 3, generator=gen).to(device)
    a_src, a_dst = (torch.randn(n, 2, generator=gen).to(device) for _ in range(2))
    alpha = torch.rand(plain.num_edges, 2, generator=gen).to(device)
    outs = [sg.spmm(g, feat, edge_weight=alpha, backend=backend) for g in (transient, plain)]
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    grads = []
    for g in (transient, plain):
        inputs = [t.clone().requires_grad_() for t in (feat, a_src, a_dst)]
        out = gat_attention(g, *inputs, negative_slope=0.2, backend=backend)
        if out.requires_grad:      # (the reference returns plain zeros for a graph without edges)
            got = torch.autograd.grad(out.square().sum(), inputs, allow_unused=True)
        else:
            got = (None,) * 3
        grads.append((out, *[torch.zeros_like(t) if d is None else d for t, d in zip(inputs, got)]))
    for got, want in zip(*grads):
        assert torch.allclose(got, want, atol=1e-5)


def test_transient_survives_graph_transformations():
    g = Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]))
    t = Graph(g.rowptr, g.col, None, 3, transient=True)
    for made in (t.t(), t.with_values(torch.ones(3)), t.add_self_loops(), t.remove_self_loops(),
                 t.remove_duplicates(), t.to("cpu"), t.add_self_loops().normalize("sym")):
        assert made.transient
    assert not g.transient and not g.t().transient


def test_sampled_batches_are_transient_with_their_backward_parts_prebuilt():
    from sparsegnn.formats.csr import rowptr_to_row
    from sparsegnn.sampling import NeighborLoader

    ei = torch.randint(0, 60, (2, 500), generator=torch.Generator().manual_seed(3))
    g = Graph.from_edge_index(ei, num_nodes=60).remove_duplicates()          # one id per (target, source) below
    loader = NeighborLoader(g, [4, 3], batch_size=8, x=torch.randn(60, 5), generator=torch.Generator().manual_seed(1))
    batch = next(iter(loader))
    sub = batch.graph
    assert sub.transient
    assert torch.equal(sub.row, rowptr_to_row(sub.rowptr, sub.num_edges))        # prebuilt by the sampler ...
    rowptr_t, col_t, perm = sub.transpose_parts()                                # ... the transpose is A^T
    dense = torch.zeros(sub.num_nodes, sub.num_src)
    dense[sub.row, sub.col] = torch.arange(1.0, sub.num_edges + 1)             # edge ids (no duplicates here)
    assert not bool(((sub.row[1:] == sub.row[:-1]) & (sub.col[1:] == sub.col[:-1])).any())
    rows_t = rowptr_to_row(rowptr_t, sub.num_edges)
    assert torch.equal(dense[col_t, rows_t], perm.float() + 1)                 # edge k of A^T is edge perm[k]
    out = sg.spmm(sub, batch.x.requires_grad_(), "mean")
    (gx,) = torch.autograd.grad(out.sum(), batch.x)
    dense = torch.zeros(sub.num_nodes, sub.num_src).index_put_((sub.row, sub.col), torch.ones(sub.num_edges),
                                                                accumulate=True)
    mean = dense / dense.sum(1, keepdim=True).clamp(min=1)
    assert torch.allclose(out, mean @ batch.x.detach(), atol=1e-5)
    assert torch.allclose(gx, mean.sum(0)[:, None].expand_as(gx), atol=1e-5)


def test_layers_given_a_sampled_edge_index_reuse_the_batch_graph():
    from sparsegnn.nn import GATConv, SAGEConv
    from sparsegnn.sampling import NeighborLoader

    ei = torch.randint(0, 80, (2, 700), generator=torch.Generator().manual_seed(5))
    g = Graph.from_edge_index(ei, num_nodes=80)
    loader = NeighborLoader(g, [5, 4], batch_size=10, x=torch.randn(80, 6), generator=torch.Generator().manual_seed(2))
    batch = next(iter(loader))
    for conv in (SAGEConv(6, 3), GATConv(6, 2, heads=2)):
        out_ei = conv(batch.x, batch.edge_index)
        out_graph = conv(batch.x, batch.graph)
        assert torch.allclose(out_ei, out_graph, atol=1e-6)
    used = SAGEConv(6, 3)._graph("SAGEConv", batch.edge_index, None, batch.num_nodes, sg.nn._graph_input.identity)
    assert used.transient and used.rowptr is batch.graph.rowptr           # the batch's Graph, not a rebuild
    edited = batch.edge_index.clone()                                     # another tensor: built from scratch
    assert not SAGEConv(6, 3)._graph("SAGEConv", edited, None, batch.num_nodes,
                                     sg.nn._graph_input.identity).transient
    # a PyG layer on the same batch agrees (edge order of edge_index = the graph's CSR order)
    import torch_geometric.nn as pyg_nn
    pyg = pyg_nn.SAGEConv(6, 3)
    ours = SAGEConv(6, 3)
    ours.load_state_dict(pyg.state_dict())
    assert torch.allclose(ours(batch.x, batch.edge_index), pyg(batch.x, batch.edge_index), atol=1e-5)


def test_every_layer_on_a_sampled_batch_plans_and_tunes_nothing(monkeypatch):
    """Layers derive graphs from the batch's (self loops, edge graphs, ...): transient too."""
    import sparsegnn.tune.autotune as autotune
    from sparsegnn.nn import AGNNConv, GATConv, GATv2Conv, GCNConv, GINConv, GINEConv, SAGEConv
    from sparsegnn.sampling import NeighborLoader

    keys = []
    real_key = autotune.decision_key
    monkeypatch.setattr(autotune, "decision_key", lambda *a, **k: keys.append(a[0]) or real_key(*a, **k))
    built = []                      # every Graph made while the layers run must be transient too
    real_init = Graph.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(Graph, "__init__", recording_init)
    ei = torch.randint(0, 90, (2, 800), generator=torch.Generator().manual_seed(6))
    g = Graph.from_edge_index(ei, num_nodes=90)
    loader = NeighborLoader(g, [5, 4], batch_size=12, x=torch.randn(90, 6), generator=torch.Generator().manual_seed(3))
    batch = next(iter(loader))
    built.clear()
    edge_attr = torch.randn(batch.num_edges if hasattr(batch, "num_edges") else batch.edge_index.shape[1], 3)
    layers = [(GCNConv(6, 4), {}), (SAGEConv(6, 4), {}), (GINConv(torch.nn.Linear(6, 4)), {}),
              (GINEConv(torch.nn.Linear(6, 4), edge_dim=3), {"edge_attr": edge_attr}),
              (GATConv(6, 2, heads=2), {}), (GATConv(6, 2, heads=2, edge_dim=3), {"edge_attr": edge_attr}),
              (GATv2Conv(6, 2, heads=2), {}), (AGNNConv(), {})]
    for conv, kwargs in layers:
        for graph_arg in (batch.graph, batch.edge_index):
            x = batch.x.clone().requires_grad_()
            out = conv(x, graph_arg, **kwargs)
            out.square().sum().backward()
            assert keys == [], f"{type(conv).__name__} looked up tuning decisions: {keys}"
            made = [h for h in built if not h.transient]
            assert not made, f"{type(conv).__name__} built a non-transient graph: {made[0]}"
            built.clear()
    assert g.cache.get("plan") is None


def test_one_prefetching_iteration_at_a_time():
    from sparsegnn.sampling import NeighborLoader

    g = Graph.from_edge_index(torch.randint(0, 40, (2, 200), generator=torch.Generator().manual_seed(1)), num_nodes=40)
    loader = NeighborLoader(g, [3], batch_size=5, prefetch=1)
    first = iter(loader)
    next(first)
    with pytest.raises(ValueError, match=r"NeighborLoader\(\): with prefetch, one iteration at a time"):
        next(iter(loader))
    first.close()                                  # finished (or broken out of): a new loop may start
    assert sum(1 for _ in loader) == len(loader)


def test_pyg_batch_to_moves_the_batch_graph():
    from sparsegnn.sampling import NeighborLoader

    g = Graph.from_edge_index(torch.randint(0, 30, (2, 120), generator=torch.Generator().manual_seed(2)), num_nodes=30)
    batch = next(iter(NeighborLoader(g, [3, 2], batch_size=4, x=torch.randn(30, 3))))
    moved = batch.to("meta")                 # PyG's Data.to: every attribute with a .to(device, non_blocking)
    assert moved.x.device.type == "meta" and moved.graph.device.type == "meta"
    assert moved.graph.transient and moved.graph.num_nodes == batch.graph.num_nodes
