"""Graphs that layers build from ``edge_index`` are cached by tensor identity and version.

Every output is compared with the same layer called on a Graph built fresh from the same
tensors, so the cache can only change the cost of a call, never its result.
"""
import gc

import pytest
import torch

import sparsegnn as sg
import sparsegnn.training  # noqa: F401  (the GAT test reaches it as sg.training; run alone it must be imported)
from sparsegnn import Graph, nn as sgnn
from sparsegnn.nn import _graph_input as _gi
from sparsegnn.nn._graph_input import (
    GraphInputMixin, GraphTransform, clear_graph_cache, gcn_normalized, graph_builds, graph_cache_info,
    self_looped, set_graph_cache_size,
)

N = 30
NAMES = ["gcn", "sage", "gin", "gat", "agnn"]


@pytest.fixture(autouse=True)
def _empty_cache():
    clear_graph_cache()
    yield
    clear_graph_cache()


@pytest.fixture
def data():
    ei, w = sg.datasets.random_graph(N, 120, seed=21, num_isolated=2, num_empty_rows=3,
                                     num_self_loops=3, num_duplicates=4, weighted=True)
    x = torch.randn(N, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return ei, w.double(), x


def _layer(name, dtype=torch.float64, backend="reference"):
    torch.manual_seed(0)
    if name == "gcn":
        layer = sgnn.GCNConv(8, 4, backend=backend)
    elif name == "sage":
        layer = sgnn.SAGEConv(8, 4, backend=backend)
    elif name == "gin":
        layer = sgnn.GINConv(torch.nn.Linear(8, 4), eps=0.1, backend=backend)
    elif name == "gat":
        layer = sgnn.GATConv(8, 4, heads=2, backend=backend)
    else:
        layer = sgnn.AGNNConv(backend=backend)
    return layer.to(dtype)


def _fresh(layer, x, ei, ew=None):
    """The layer on a Graph built from scratch (its transform also computed from scratch)."""
    return layer(x, Graph.from_edge_index(ei.clone(), None if ew is None else ew.clone(), N))


def _builds_during(fn):
    before = graph_builds()
    result = fn()
    return graph_builds() - before, result


@pytest.mark.parametrize("name", NAMES)
def test_same_tensor_builds_once(data, name):
    ei, _, x = data
    layer = _layer(name)
    builds, outs = _builds_during(lambda: [layer(x, ei) for _ in range(3)])
    assert builds == 1
    expected = _fresh(layer, x, ei)
    for out in outs:
        assert torch.allclose(out, expected)


@pytest.mark.parametrize("name", NAMES)
def test_new_tensor_same_content_rebuilds(data, name):
    ei, _, x = data
    layer = _layer(name)
    first = layer(x, ei)
    builds, second = _builds_during(lambda: layer(x, ei.clone()))
    assert builds == 1
    assert torch.allclose(first, second)


@pytest.mark.parametrize("name", NAMES)
def test_inplace_edit_rebuilds(data, name):
    ei, _, x = data
    ei = ei.clone()
    layer = _layer(name)
    before = layer(x, ei)
    ei[0] = (ei[0] + 7) % N                       # another graph, same tensor object
    builds, after = _builds_during(lambda: layer(x, ei))
    assert builds == 1
    assert not torch.allclose(before, after)
    assert torch.allclose(after, _fresh(_layer(name), x, ei))
    assert graph_cache_info()["entries"] == 1      # the stale entry was dropped
    assert _builds_during(lambda: layer(x, ei))[0] == 0


def test_inplace_edit_of_view_rebuilds(data):
    ei, _, x = data
    ei = ei.clone()
    layer = _layer("gcn")
    layer(x, ei)
    targets = ei[1]                                 # a view: views share the version counter
    targets[:5] = targets[5:10].clone()
    builds, out = _builds_during(lambda: layer(x, ei))
    assert builds == 1
    assert torch.allclose(out, _fresh(layer, x, ei))


def test_layers_of_a_model_share_one_graph(data):
    ei, _, x = data
    conv1, conv2 = sgnn.GCNConv(8, 16).double(), sgnn.GCNConv(16, 4).double()
    g1 = conv1._graph("GCNConv", ei, None, N, gcn_normalized)
    g2 = conv2._graph("GCNConv", ei, None, N, gcn_normalized)
    assert g1 is g2
    gat, agnn = sgnn.GATConv(8, 4).double(), sgnn.AGNNConv().double()
    assert gat._graph("GATConv", ei, None, N, self_looped) is agnn._graph("AGNNConv", ei, None, N, self_looped)

    def step():
        out = conv2(torch.relu(conv1(x, ei)), ei)
        out.sum().backward()
        return out

    builds, _ = _builds_during(lambda: [step() for _ in range(3)])
    assert builds == 0                              # built above, shared by both layers
    model = torch.nn.ModuleList([sgnn.GATConv(8, 4, heads=2), sgnn.GATConv(8, 4, heads=1), sgnn.AGNNConv()]).double()
    builds, _ = _builds_during(lambda: [m(x, ei.clone() if i == 0 else ei) for i, m in enumerate(model)])
    assert builds == 1                              # only the clone: GAT and AGNN share the self-looped graph


def test_library_gat_model_builds_once(data):
    ei, _, x = data
    model = sg.training.build_model("gat", 8, 3, hidden=4).double()
    builds, _ = _builds_during(lambda: [model(x, ei).sum().backward() for _ in range(3)])
    assert builds == 1


def test_static_edge_weight_cached_and_invalidated(data):
    ei, w, x = data
    w = w.clone()
    layer = _layer("gcn")
    builds, outs = _builds_during(lambda: [layer(x, ei, w) for _ in range(3)])
    assert builds == 1
    assert torch.allclose(outs[0], _fresh(layer, x, ei, w))
    w.mul_(2.0).add_(0.5)                           # new weights, same tensor
    builds, out = _builds_during(lambda: layer(x, ei, w))
    assert builds == 1
    assert torch.allclose(out, _fresh(layer, x, ei, w))
    assert _builds_during(lambda: layer(x, ei, w.clone()))[0] == 1


@pytest.mark.parametrize("name", ["gcn", "sage", "gin"])
def test_edge_weight_gradients(data, name):
    ei, w, x = data
    layer = _layer(name)
    weight = torch.nn.Parameter(w.clone())
    opt = torch.optim.SGD([weight], lr=0.1)
    before = graph_builds()
    for step in range(3):
        opt.zero_grad()
        xs = x.clone().requires_grad_(True)
        out = layer(xs, ei, edge_weight=weight)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        ref_w = weight.detach().clone().requires_grad_(True)
        ref_x = x.clone().requires_grad_(True)
        ref = layer(ref_x, _fresh_graph(name, ei, ref_w))
        (ref * torch.linspace(-1, 1, ref.numel(), dtype=ref.dtype).view_as(ref)).sum().backward()
        assert torch.allclose(out, ref)
        assert weight.grad is not None and torch.allclose(weight.grad, ref_w.grad)
        assert torch.allclose(xs.grad, ref_x.grad)
        assert weight.grad.abs().sum() > 0
        opt.step()                                  # in-place update: the next step sees new weights
    assert graph_builds() - before == 1             # structure and routing once; values every call
    (entry,) = _gi._CACHE.values()
    assert entry.router is not None and entry.router.ok   # the cheap path, not the per-call fallback


def _fresh_graph(name, ei, weight):
    """The transformed graph for ``name`` built from scratch, with values differentiable in ``weight``."""
    g = Graph.from_edge_index(ei, weight, N)
    return _Transformed(gcn_normalized(g) if name == "gcn" else g)


class _Transformed(Graph):
    """A Graph already transformed: layers must use it as it is (see ``_AsIs``)."""

    def __init__(self, g):
        super().__init__(g.rowptr, g.col, g.edge_val, g.num_nodes)


@pytest.fixture(autouse=True)
def _as_is(monkeypatch):
    """Layers given a ``_Transformed`` skip their transform (and every cache)."""
    original = GraphInputMixin._graph

    def patched(self, fn, graph, edge_weight, num_nodes, transform, **kwargs):
        if isinstance(graph, _Transformed):
            return graph
        return original(self, fn, graph, edge_weight, num_nodes, transform, **kwargs)

    monkeypatch.setattr(GraphInputMixin, "_graph", patched)


def test_graph_input_with_grad_values(data):
    ei, w, x = data
    layer = _layer("gcn")
    weight = torch.nn.Parameter(w.clone())
    base = Graph.from_edge_index(ei, num_nodes=N)
    graph = base.with_values(weight[base.edge_perm])
    for _ in range(2):
        weight.grad = None
        out = layer(x, graph)
        out.pow(2).sum().backward()
        ref_w = weight.detach().clone().requires_grad_(True)
        ref = layer(x, _fresh_graph("gcn", ei, ref_w))
        ref.pow(2).sum().backward()
        assert torch.allclose(out, ref)
        assert torch.allclose(weight.grad, ref_w.grad)
        graph = base.with_values(weight[base.edge_perm])   # a new graph of the new values, as a user would


def test_routing_fallback_keeps_gradients(data):
    """A transform whose values are not a routing (max of duplicates) is recomputed per call."""
    ei, w, x = data
    dedupe_max = GraphTransform("test_dedupe_max", lambda g: g.remove_duplicates("max"))

    class Layer(GraphInputMixin, torch.nn.Module):
        def forward(self, x, ei, ew):
            return sg.spmm(self._graph("Layer", ei, ew, x.shape[0], dedupe_max), x, backend="reference")

    layer = Layer()
    weight = w.clone().requires_grad_(True)
    for _ in range(2):
        weight.grad = None
        layer(x, ei, weight).pow(2).sum().backward()
        ref_w = w.clone().requires_grad_(True)
        sg.spmm(Graph.from_edge_index(ei, ref_w, N).remove_duplicates("max"), x, backend="reference").pow(2).sum().backward()
        assert torch.allclose(weight.grad, ref_w.grad)
    (entry,) = _gi._CACHE.values()
    assert not entry.router.ok


@pytest.mark.parametrize("name", ["gcn", "gat"])
def test_graph_input_transform_cached_on_graph(data, name):
    ei, w, x = data
    layer = _layer(name)
    graph = Graph.from_edge_index(ei, w, N) if name == "gcn" else Graph.from_edge_index(ei, num_nodes=N)
    builds, outs = _builds_during(lambda: [layer(x, graph) for _ in range(3)])
    assert builds == 1
    assert torch.allclose(outs[0], _fresh(layer, x, ei, w if name == "gcn" else None))
    if name == "gcn":                               # with_values copies caches: the result must not be reused
        other = graph.with_values(graph.edge_val * 3.0 + 1.0)
        out = layer(x, other)
        ref = layer(x, _Transformed(gcn_normalized(Graph.from_edge_index(ei, w, N).with_values(other.edge_val))))
        assert torch.allclose(out, ref)
        assert torch.allclose(layer(x, graph), outs[0])


def test_entry_bound_keeps_the_first_residents(data):
    """Least hits go first, newest of those first: after 10 graphs in a cache of 4, the first
    three stay and the newest holds the last place (an LRU cache would hold the last four)."""
    ei, _, x = data
    layer = _layer("gcn")
    old = set_graph_cache_size(4)
    try:
        tensors = [ei.clone() for _ in range(10)]
        for t in tensors:
            layer(x, t)
        assert graph_cache_info()["entries"] == 4
        assert _builds_during(lambda: layer(x, tensors[-1]))[0] == 0
        assert _builds_during(lambda: layer(x, tensors[0]))[0] == 0
        assert _builds_during(lambda: layer(x, tensors[5]))[0] == 1
        assert graph_cache_info()["entries"] == 4
        set_graph_cache_size(0)
        assert graph_cache_info()["entries"] == 0
        assert _builds_during(lambda: [layer(x, tensors[1]) for _ in range(2)])[0] == 2
    finally:
        set_graph_cache_size(old)


def test_freed_tensor_entry_dropped(data):
    ei, _, x = data
    layer = _layer("gcn")
    tmp = ei.clone()
    layer(x, tmp)
    assert graph_cache_info()["entries"] == 1
    del tmp
    gc.collect()
    assert graph_cache_info()["entries"] == 0


def test_num_nodes_is_part_of_the_key(data):
    ei, _, x = data
    layer = _layer("sage")
    small = layer(x, ei)
    big_x = torch.cat([x, x[:5]])
    big = layer(big_x, ei)
    assert big.shape[0] == N + 5 and torch.allclose(big[:N], small)
    with pytest.raises(ValueError, match="out of range"):
        layer(x[:10], ei)


def test_inference_mode_tensors(data):
    ei, _, x = data
    layer = _layer("gcn")
    expected = _fresh(layer, x, ei)
    with torch.inference_mode():
        ei_inf = ei.clone()                         # no version counter: never cached
        assert torch.allclose(layer(x, ei_inf), expected)
        assert torch.allclose(layer(x, ei_inf), expected)
    assert graph_cache_info()["entries"] == 0


def test_cached_true_keeps_first_graph(data):
    ei, _, x = data
    layer = sgnn.GCNConv(8, 4, cached=True).double()
    first = layer(x, ei)
    ei2 = ei.clone()
    ei2[0] = (ei2[0] + 3) % N
    assert torch.allclose(layer(x, ei2), first)


@pytest.mark.parametrize("name", NAMES)
def test_default_backend_float32(data, name):
    ei, _, x = data
    x = x.float()
    layer = _layer(name, dtype=torch.float32, backend="auto")
    outs = [layer(x, ei) for _ in range(2)]
    expected = _fresh(layer, x, ei)
    assert torch.allclose(outs[1], expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(outs[0], outs[1])


def test_grad_edge_weight_is_checked_on_every_call(data):
    ei, w, x = data
    layer = _layer("gcn")
    layer(x, ei, w.clone().requires_grad_(True))
    with pytest.raises(ValueError, match="edge_weight"):
        layer(x, ei, w[:-1].clone().requires_grad_(True))


def test_grad_edge_weight_under_no_grad_and_inference_mode(data):
    ei, w, x = data
    layer = _layer("gcn")
    weight = torch.nn.Parameter(w.clone())
    expected = layer(x, _fresh_graph("gcn", ei, weight.detach()))
    with torch.inference_mode():                    # no routing probe possible: built per call, not cached
        assert torch.allclose(layer(x, ei, weight), expected)
    with torch.no_grad():
        assert torch.allclose(layer(x, ei, weight), expected)
    out = layer(x, ei, weight)
    out.sum().backward()
    assert torch.allclose(out, expected) and weight.grad is not None


def test_plain_function_transform(data):
    ei, w, x = data

    def loops_then_sym(g):
        return g.add_self_loops().normalize("sym")

    class Layer(GraphInputMixin, torch.nn.Module):
        def forward(self, x, ei, ew=None):
            return sg.spmm(self._graph("Layer", ei, ew, x.shape[0], loops_then_sym), x, backend="reference")

    layer = Layer()
    builds, outs = _builds_during(lambda: [layer(x, ei, w) for _ in range(3)])
    assert builds == 1
    assert torch.allclose(outs[-1], sg.spmm(loops_then_sym(Graph.from_edge_index(ei, w, N)), x))
    weight = w.clone().requires_grad_(True)
    layer(x, ei, weight).sum().backward()           # not a routing (normalised values): per-call rebuild
    ref_w = w.clone().requires_grad_(True)
    sg.spmm(loops_then_sym(Graph.from_edge_index(ei, ref_w, N)), x).sum().backward()
    assert torch.allclose(weight.grad, ref_w.grad)


# ---------------------------------------------------------------- the PyG input forms keep the fast paths
def _bipartite_ei():
    gen = torch.Generator().manual_seed(4)
    return torch.stack([torch.randint(0, 10, (40,), generator=gen), torch.randint(0, 7, (40,), generator=gen)])


def test_bipartite_cache_keys_on_num_src(data):
    """The same edge_index with 10 or 12 source rows is two graphs (num_src is in the key)."""
    _, _, x = data
    ei = _bipartite_ei()
    layer = sgnn.SAGEConv((8, 8), 4, backend="reference").double()
    x_src, x_dst = x[:12], x[12:19]
    builds, (ten, twelve) = _builds_during(lambda: (layer((x_src[:10], x_dst), ei), layer((x_src, x_dst), ei)))
    assert builds == 2 and graph_cache_info()["entries"] == 2
    graphs = {entry.graph.num_src: entry.graph for entry in _gi._CACHE.values()}
    assert set(graphs) == {10, 12} and all(g.num_nodes == 7 for g in graphs.values())
    assert _builds_during(lambda: [layer((x_src, x_dst), ei) for _ in range(2)])[0] == 0
    for rows, out in ((10, ten), (12, twelve)):
        fresh = layer((x_src[:rows], x_dst), Graph.from_edge_index(ei.clone(), num_nodes=7, num_src=rows))
        assert torch.allclose(out, fresh)


def test_sparse_adj_cached_by_identity_and_version(data):
    ei, w, x = data
    adj = torch.sparse_coo_tensor(ei.flip(0), w, (N, N)).coalesce()
    layer = _layer("gcn")
    builds, outs = _builds_during(lambda: [layer(x, adj) for _ in range(3)])
    assert builds == 1 and all(torch.equal(o, outs[0]) for o in outs)
    adj._values().mul_(2.0)                         # in place: the version moves, the graph is rebuilt
    builds, out = _builds_during(lambda: layer(x, adj))
    assert builds == 1 and not torch.allclose(out, outs[0])
    fresh = layer(x, torch.sparse_coo_tensor(adj.indices().clone(), adj.values().clone(), (N, N)))
    assert torch.allclose(out, fresh)


def test_batched_features_aggregate_in_one_spmm(data, monkeypatch):
    """[B, N, F] features run one SpMM over [N, B * F], not B of them."""
    from sparsegnn.nn import _inputs

    ei, _, x = data
    shapes = []
    original = _inputs.spmm
    monkeypatch.setattr(_inputs, "spmm", lambda g, h, *a, **k: shapes.append(tuple(h.shape)) or original(g, h, *a, **k))
    xb = torch.stack([x, 2 * x, -x])                # [3, N, 8]
    for name, width in (("gcn", 4), ("sage", 4), ("gin", 8)):
        layer = _layer(name)
        shapes.clear()
        out = layer(xb, ei)
        assert shapes == [(N, 3 * width)], (name, shapes)
        for b in range(3):
            assert torch.allclose(out[b], layer(xb[b], ei))


def test_plain_gat_runs_the_fused_op(data, monkeypatch):
    """Plain GATConv calls the fused attention op; edge features and returned attention take the
    unfused path (sddmm, edge softmax, multi-head spmm) with the same result."""
    from sparsegnn.nn import gat

    ei, _, x = data
    fused = []
    original = gat.gat_attention
    monkeypatch.setattr(gat, "gat_attention", lambda *a, **k: fused.append(1) or original(*a, **k))
    layer = _layer("gat")
    out = layer(x, ei)
    assert fused == [1]
    unfused, (_, alpha) = layer(x, ei, return_attention_weights=True)
    assert fused == [1] and alpha.shape[1] == 2
    assert torch.allclose(unfused, out)


def _count_host_builds(monkeypatch):
    built = []
    real = _gi._built_on_host

    def spy(graph, device):
        built.append(graph.device.type)
        return real(graph, device)
    monkeypatch.setattr(_gi, "_built_on_host", spy)
    return built


def test_built_on_host_carries_target_per_edge(data):
    """The host-built Graph arrives with the target per edge a build on the device would
    compute (here host to host: the same code path as to a GPU)."""
    ei, w, _ = data
    built = gcn_normalized(Graph.from_edge_index(ei, w, N))
    moved = _gi._built_on_host(built, torch.device("cpu"))
    fresh = gcn_normalized(Graph.from_edge_index(ei, w, N))
    assert torch.equal(moved.rowptr, fresh.rowptr) and torch.equal(moved.col, fresh.col)
    assert torch.equal(moved.cache.get("row"), fresh.row)


def test_built_on_host_carries_the_loop_record(data):
    """GAT's transform records which caller edges it kept (LOOP_INFO, read for edge_attr and
    attention weights); the host-built copy must arrive with it."""
    from sparsegnn.nn._graph_input import LOOP_INFO, pyg_self_looped_input

    ei, _, _ = data
    built = pyg_self_looped_input(Graph.from_edge_index(ei, None, N))
    moved = _gi._built_on_host(built, torch.device("cpu"))
    want, got = built.cache.get(LOOP_INFO), moved.cache.get(LOOP_INFO)
    assert got is not want and got.num_loops == want.num_loops
    for name in ("keep", "target", "kept", "into_loops", "into_target"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host builds serve graphs on a GPU")
def test_gat_with_edge_attr_and_attention_on_a_host_built_graph(data, monkeypatch):
    """GATConv with edge features and returned attention weights on a small GPU graph: the host
    build (a fresh process's first builds) gives what the device build gives."""
    from sparsegnn.formats import _host

    ei, _, x = data
    ei, x = ei.cuda(), x.float().cuda()
    edge_attr = torch.randn(ei.shape[1], 3, generator=torch.Generator().manual_seed(3)).cuda()
    built = _count_host_builds(monkeypatch)
    results = []
    for limit in (1 << 15, 0):
        monkeypatch.setattr(_host, "HOST_MAX_EDGES", limit)
        _host.reset_counts()
        clear_graph_cache()
        torch.manual_seed(0)
        layer = sgnn.GATConv(8, 4, heads=2, edge_dim=3).cuda()
        out, (att_index, alpha) = layer(x, ei.clone(), edge_attr, return_attention_weights=True)
        results.append((out, att_index, alpha))
        if limit:
            host_builds = len(built)
    assert host_builds >= 1 and len(built) == host_builds   # the first pass built on the host, the second not
    (ho, hi, ha), (do, di, da) = results
    assert torch.equal(hi, di)
    torch.testing.assert_close(ho, do, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ha, da, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host builds serve graphs on a GPU")
@pytest.mark.parametrize("name", NAMES)
def test_small_gpu_graph_built_on_host_equals_gpu_build(data, name, monkeypatch):
    """A small edge_index on the GPU is built on the host: same structure, derived forms and
    statistics as the build on the GPU, and the same layer output and gradients."""
    from sparsegnn.formats import _host
    from sparsegnn.tune.features import graph_stats_cached

    ei, w, x = data
    ei, w, x = ei.cuda(), w.float().cuda(), x.float().cuda()
    transform = {"gcn": gcn_normalized, "gat": self_looped, "agnn": self_looped}.get(name, _gi.identity)
    built = _count_host_builds(monkeypatch)
    _host.reset_counts()
    results = {}
    for where, limit in (("host", 1 << 15), ("device", 0)):
        monkeypatch.setattr(_host, "HOST_MAX_EDGES", limit)
        clear_graph_cache()
        before = len(built)
        graph = _gi.graph_from_edge_index(ei.clone(), w if transform.uses_values else None, N, transform)
        assert graph.device.type == "cuda"
        assert (len(built) > before) == (where == "host")
        parts = graph.transpose_parts()              # derived while this pass's rule holds
        layer = _layer(name, torch.float32, backend="auto").cuda()
        xr = x.clone().requires_grad_()
        out = layer(xr, ei.clone())
        out.square().sum().backward()
        results[where] = (graph, graph_stats_cached(graph), out.detach(), xr.grad, parts)
    (hg, hs, hout, hgrad, hparts), (dg, ds, dout, dgrad, dparts) = results["host"], results["device"]
    assert torch.equal(hg.rowptr, dg.rowptr) and torch.equal(hg.col, dg.col)
    assert torch.equal(hg.edge_perm, dg.edge_perm) if dg.edge_perm is not None else hg.edge_perm is None
    if dg.edge_val is not None:
        torch.testing.assert_close(hg.edge_val, dg.edge_val, rtol=1e-6, atol=1e-7)
    assert torch.equal(hg.row, dg.row)
    for got, want in zip(hparts, dparts):
        assert got.device.type == "cuda" and torch.equal(got, want)
    assert hs.num_edges == ds.num_edges and hs.deg_max == ds.deg_max
    assert abs(hs.deg_p99 - ds.deg_p99) < 1e-4 and abs(hs.local_frac - ds.local_frac) < 1e-6
    torch.testing.assert_close(hout, dout, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hgrad, dgrad, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host builds serve graphs on a GPU")
def test_host_build_limits(data, monkeypatch):
    """Above the limit, with weights that need grad, or weights on another device, no host build."""
    from sparsegnn.formats import _host

    ei, w, _ = data
    ei = ei.cuda()
    built = _count_host_builds(monkeypatch)
    _host.reset_counts()                            # so that only the limits below say no
    monkeypatch.setattr(_host, "HOST_MAX_EDGES", ei.shape[1] - 1)
    _gi.graph_from_edge_index(ei, None, N, gcn_normalized)
    monkeypatch.setattr(_host, "HOST_MAX_EDGES", 1 << 15)
    clear_graph_cache()
    wg = w.float().cuda().requires_grad_()
    _gi.graph_from_edge_index(ei, wg, N, gcn_normalized)
    assert built == []
    with pytest.raises(ValueError, match="one device"):
        _gi.graph_from_edge_index(ei, w.float(), N, gcn_normalized)