"""MaxK-GNN layers, model, training options, the k sweep and the real-suite node datasets (CPU)."""
import copy
import json
import math

import pytest
import torch

import sparsegnn as sg
from sparsegnn.cli import main
from sparsegnn.datasets import default_data_dir, load, load_real_node_dataset
from sparsegnn.datasets.real_nodes import SUBSTITUTE_DIM, stratified_split
from sparsegnn.nn import GCNConv, GINConv, MaxKGCNConv, MaxKGINConv, MaxKGNN, MaxKSAGEConv, SAGEConv
from benchmarks.maxk_sweep import main as sweep_main, maxk_sweep
from sparsegnn.training import build_model, train_node_classifier

from conftest import DEVICE

DATA = default_data_dir()
needs_real = pytest.mark.skipif(DATA is None or not (DATA / "real" / "lastfm.npz").is_file(),
                                reason="no shared datasets folder with real/ (set SPARSEGNN_DATA)")

N, F_IN, F_OUT, K = 23, 12, 5, 4


def _edges(seed=0):
    """Random edges with self loops, a duplicate edge and isolated nodes (21, 22)."""
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N - 2, (2, 70), generator=gen)
    extra = torch.tensor([[3, 3, 5, 7], [3, 4, 5, 4]])          # loops 3->3, 5->5; 3->4 duplicated below
    return torch.cat([ei, extra, torch.tensor([[3], [4]])], dim=1)


#: (layer, linear_first): SAGE, GCN and GIN with MaxK on the input; GCN and GIN in the paper's placement
KINDS = [("sage", False), ("gcn", False), ("gin", False), ("gcn", True), ("gin", True)]


def _pair(kind, linear_first=False, f_in=F_IN, f_out=F_OUT, k=K, dtype=torch.float64, device="cpu"):
    """(MaxK layer, reference) in ``dtype`` on ``device``.  ``reference(x, graph, edge_weight)`` computes the layer's
    output with the plain layers and the dense ``maxk``, from parameters of its own (copied from the
    MaxK layer; ``reference.params`` maps the MaxK layer's parameter names to them).

    MaxK on the input: the plain layer on ``maxk(x, dense=True)``.  ``linear_first`` (GCN / GIN, the
    paper's Eq. 3): the plain layer with an identity map on ``maxk(lin(x), dense=True)``."""
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(f_in, 8), torch.nn.ReLU(), torch.nn.Linear(8, f_out))
    if not linear_first:
        if kind == "sage":
            plain, mk = SAGEConv(f_in, f_out), MaxKSAGEConv(f_in, f_out, k)
        elif kind == "gcn":
            plain, mk = GCNConv(f_in, f_out), MaxKGCNConv(f_in, f_out, k)
        else:
            plain = GINConv(mlp, eps=0.3, train_eps=True)
            mk = MaxKGINConv(copy.deepcopy(mlp), k, eps=0.0, train_eps=True)
        plain, mk = plain.to(device=device, dtype=dtype), mk.to(device=device, dtype=dtype)
        assert set(mk.state_dict()) == set(plain.state_dict())
        mk.load_state_dict(plain.state_dict())

        def on_selected(dense, graph, edge_weight=None):
            return plain(dense, graph, edge_weight=edge_weight)
        return mk, _reference(k, on_selected, lambda x: x, dict(plain.named_parameters()))
    if kind == "gcn":
        mk = MaxKGCNConv(f_in, f_out, k, linear_first=True).to(device=device, dtype=dtype)
        assert set(mk.state_dict()) == set(GCNConv(f_in, f_out).state_dict())
        torch.nn.init.uniform_(mk.bias, -0.5, 0.5)                # a nonzero bias
        lin, bias = copy.deepcopy(mk.lin), mk.bias.detach().clone().requires_grad_(True)
        aggregate = GCNConv(f_out, f_out, bias=False).to(device=device, dtype=dtype)
        with torch.no_grad():
            aggregate.lin.weight.copy_(torch.eye(f_out, dtype=dtype, device=device))
        aggregate.lin.weight.requires_grad_(False)

        def on_selected(dense, graph, edge_weight=None):
            return aggregate(dense, graph, edge_weight=edge_weight) + bias
        return mk, _reference(k, on_selected, lin, {"lin.weight": lin.weight, "bias": bias})
    mk = MaxKGINConv(mlp, k, eps=0.3, train_eps=True, linear_first=True).to(device=device, dtype=dtype)
    assert set(mk.state_dict()) == set(GINConv(copy.deepcopy(mlp), train_eps=True).state_dict())
    mlp_ref = copy.deepcopy(mk.nn)
    plain = GINConv(torch.nn.Identity(), eps=0.3, train_eps=True).to(device=device, dtype=dtype)

    def on_selected(dense, graph, edge_weight=None):
        return plain(dense, graph, edge_weight=edge_weight)
    params = {"eps": plain.eps, **{f"nn.{n}": p for n, p in mlp_ref.named_parameters()}}
    return mk, _reference(k, on_selected, mlp_ref, params)


def _reference(k, on_selected, select_from, params):
    """``reference(x, graph, edge_weight)`` = ``on_selected(maxk(select_from(x), dense=True), ...)``;
    ``reference.on_selected`` applies the plain layer to an already selected dense matrix."""
    def reference(x, graph, edge_weight=None):
        return on_selected(sg.maxk(select_from(x), k, dense=True), graph, edge_weight)
    reference.on_selected, reference.params = on_selected, params
    return reference


def _graph_arg(form, ei, weight):
    if form == "graph":
        return sg.Graph.from_edge_index(ei, num_nodes=N), None
    if form == "weighted_graph":
        return sg.Graph.from_edge_index(ei, weight, num_nodes=N), None
    if form == "edge_index":
        return ei, weight
    return torch.sparse_coo_tensor(ei.flip(0), weight, (N, N)).coalesce(), None       # adj_t[target, source]


def _selected(mk, x):
    """The tensor a MaxK layer selects from: ``x``, or with ``linear_first`` its linear map's output."""
    if not getattr(mk, "linear_first", False):
        return x
    return mk.lin(x) if isinstance(mk, MaxKGCNConv) else mk.nn(x)


@pytest.mark.parametrize("kind, linear_first", KINDS)
def test_dense_path_equals_the_cbsr_path(kind, linear_first, monkeypatch):
    """A layer that aggregates the dense selection (``dense_path``: an eager call on a small graph
    on the GPU; forced here) computes what its CBSR path does, gradients included; the dense path
    draws dropout over all columns, so the kept values are dropped at the layer's rate."""
    import sparsegnn.nn.maxk as nnmaxk

    ei = _edges(5)
    weight = torch.rand(ei.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(6)) + 0.5
    mk, _ = _pair(kind, linear_first)
    x = torch.randn(N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    up = torch.randn(N, F_OUT, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    results = []
    for dense in (False, True):
        monkeypatch.setattr(nnmaxk, "aggregates_dense", lambda *args, dense=dense: dense)
        assert mk.dense_path(x, ei) is dense
        xx = x.clone().requires_grad_(True)
        out = mk(xx, ei, weight if kind != "gin" else None)
        grads = torch.autograd.grad((out * up).sum(), [xx, *mk.parameters()])
        results.append((out.detach(), grads))
    (out_c, grads_c), (out_d, grads_d) = results
    torch.testing.assert_close(out_d, out_c, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_d, grads_c):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(nnmaxk, "aggregates_dense", lambda *args: True)
    mk.dropout = 0.5
    c = mk.activate(torch.randn(4000, 16, dtype=torch.float64), dense=True)
    assert c.shape == (4000, 16) and int((c != 0).sum(1).max()) <= K
    assert abs(float((c != 0).sum()) / (4000 * K) - 0.5) < 0.03          # half the kept entries survive
    assert not mk.dense_path(sg.maxk(x, K), ei)                             # a CBSR input stays CBSR


def test_maxkgnn_on_the_dense_path_equals_the_fused_cbsr_path(monkeypatch):
    """MaxK-GNN whose convs aggregate densely runs LayerNorm unfused (the next conv selects from
    its output); the model's output and gradients are those of the CBSR path."""
    import sparsegnn.nn.maxk as nnmaxk

    torch.manual_seed(0)
    g = sg.Graph.from_edge_index(_edges(), num_nodes=N)
    model = MaxKGNN(F_IN, 3, conv="sage", hidden=32, num_layers=3, k=5, dropout=0.0).double().train()
    with torch.no_grad():
        for norm in model.norms:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0.0, 0.3)
    x = torch.randn(N, F_IN, dtype=torch.float64)
    results = []
    for dense in (False, True):
        monkeypatch.setattr(nnmaxk, "aggregates_dense", lambda *args, dense=dense: dense)
        out = model(x, g)
        results.append((out.detach(), torch.autograd.grad(out.square().sum(), list(model.parameters()))))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-10, atol=1e-12)
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.skipif(DEVICE != "cuda", reason="the dense path is taken by eager calls on the GPU")
def test_eager_calls_on_a_small_graph_take_the_dense_path(monkeypatch):
    """``aggregates_dense``: an eager CUDA call on a small graph on the default stream; not on the
    CPU, with another backend, past the size limits or with an unknown edge count, on a side
    stream, while investing or warming up a capture.  An eager MaxK SAGE
    step then runs no CBSR aggregation (the node would raise), and matches the CBSR path."""
    import sparsegnn.nn.maxk as nnmaxk
    from sparsegnn._streams import capture_warmup
    from sparsegnn.ops.maxk import DENSE_EAGER_EDGE_ELEMENTS, DENSE_EAGER_ELEMENTS, aggregates_dense
    from sparsegnn.tune import reuse

    x = torch.randn(1000, 256, device="cuda")
    assert aggregates_dense(x, 10_000) and aggregates_dense(x, 10_000, "triton")
    assert not aggregates_dense(x.cpu(), 10_000) and not aggregates_dense(x, 10_000, "reference")
    assert not aggregates_dense(x, DENSE_EAGER_EDGE_ELEMENTS // 256 + 1) and not aggregates_dense(x, -1)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):       # where PyTorch's capture recipe warms up
        assert not aggregates_dense(x, 10_000)
    torch.cuda.current_stream().wait_stream(side)
    assert not aggregates_dense(torch.empty(DENSE_EAGER_ELEMENTS // 256 + 1, 256, device="cuda"), 10)
    with reuse.investing():
        assert not aggregates_dense(x, 10_000)
    with capture_warmup():
        assert not aggregates_dense(x, 10_000)
    torch.manual_seed(0)
    g = sg.Graph.from_edge_index(_edges(), num_nodes=N).to("cuda")
    model = MaxKGNN(F_IN, 3, conv="sage", hidden=64, num_layers=2, k=8, dropout=0.0, replay=False).cuda()
    xs = torch.randn(N, F_IN, device="cuda")
    with reuse.investing():
        want = model(xs, g)
    sage_cbsr = nnmaxk.sage_cbsr
    monkeypatch.setattr(nnmaxk, "sage_cbsr", lambda *args: pytest.fail("the CBSR node ran"))
    got = model(xs, g)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(nnmaxk, "sage_cbsr", sage_cbsr)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA-graph capture needs a GPU")
def test_a_capture_after_a_default_stream_warmup_on_a_small_graph_says_how_to_warm_up(monkeypatch):
    """Warm-up steps on the default stream take the dense path on a small graph (whose SpMM, on
    a graph not yet invested in, builds no work plan), so no plan exists when ``torch.cuda.graph``
    records the CBSR kernels: the capture raises an error that says to warm up on a side stream
    (not a bare CUDA error from the plan's read-back), and the same steps warmed up on a side
    stream then capture."""
    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    ei = torch.randint(0, 1500, (2, 12000), generator=torch.Generator().manual_seed(2))
    g = sg.Graph.from_edge_index(ei, num_nodes=1500).to("cuda")
    model = MaxKGNN(32, 5, conv="sage", hidden=64, k=8, dropout=0.0, replay=False).to("cuda")
    x = torch.randn(1500, 32, device="cuda")
    for _ in range(2):
        model(x, g).sum().backward()
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="side stream"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            model(x, g).sum().backward()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(x, g).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        out = model(x, g)
    captured.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA-graph capture needs a GPU")
@pytest.mark.parametrize("conv", ["sage", "gcn"])
def test_a_manual_capture_after_a_side_stream_warmup_records_the_cbsr_path(conv, monkeypatch):
    """PyTorch's capture recipe on a small graph: eager warm-up steps on a side stream (where the
    layers take the CBSR kernels, not the eager dense path), then ``torch.cuda.graph`` around
    forward and backward: the capture records the CBSR kernels (no dense selection runs inside
    it) and its replay on new features matches an eager step on the same path."""
    import sparsegnn.nn.maxk as nnmaxk

    torch.manual_seed(0)
    ei = torch.randint(0, 2000, (2, 20000), generator=torch.Generator().manual_seed(1))
    g = sg.Graph.from_edge_index(ei, num_nodes=2000).to("cuda")
    model = MaxKGNN(64, 7, conv=conv, hidden=128, k=16, dropout=0.0, replay=False).to("cuda")
    x = torch.randn(2000, 64, device="cuda")
    params = list(model.parameters())

    def step():
        out = model(x, g)
        return out, torch.autograd.grad(out.square().sum(), params)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    dense_select = nnmaxk.dense_select
    monkeypatch.setattr(nnmaxk, "dense_select", lambda *args: pytest.fail("the dense path ran in the capture"))
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        out, grads = step()
    monkeypatch.setattr(nnmaxk, "dense_select", dense_select)
    with torch.no_grad():
        x.normal_()                                 # the replay reads new features
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                   # the reference on the captured path
        want, want_grads = step()
    torch.cuda.current_stream().wait_stream(side)
    captured.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4 * float(b.abs().max()) + 1e-6)


@pytest.mark.parametrize("kind, linear_first", KINDS)
@pytest.mark.parametrize("form", ["graph", "weighted_graph", "edge_index", "adj_t"])
def test_layer_equals_plain_layer_on_dense_maxk(kind, linear_first, form):
    ei = _edges()
    weight = torch.rand(ei.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(2)) + 0.5
    graph, edge_weight = _graph_arg(form, ei, weight)
    mk, reference = _pair(kind, linear_first)
    x = torch.randn(N, F_IN, dtype=torch.float64, requires_grad=True)
    out = mk(x, graph, edge_weight)
    assert out.shape == (N, F_OUT) and out.dtype == torch.float64
    x_ref = x.detach().clone().requires_grad_(True)
    ref = reference(x_ref, graph, edge_weight)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    # the same gradients for x and for every parameter
    w = torch.randn(N, F_OUT, dtype=torch.float64)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-12, atol=1e-12)
    params = dict(mk.named_parameters())
    assert set(params) == set(reference.params)
    for name, p in params.items():
        torch.testing.assert_close(p.grad, reference.params[name].grad, rtol=1e-12, atol=1e-12, msg=name)
    if not linear_first:            # the gradient reaches x at the kept positions only
        kept = sg.maxk(x.detach(), K, dense=True) != 0
        assert bool((x.grad[~kept] == 0).all()) and bool((x.grad[kept] != 0).any())


@pytest.mark.parametrize("kind", ["gcn", "gin"])
def test_linear_first_layers_select_from_the_linear_output(kind):
    """GCN / GIN with ``linear_first`` keep k entries per row of lin(x): the rows aggregated over a
    graph of self loops only have at most k nonzeros (GCN: before the bias), at lin(x)'s top k."""
    mk, _ = _pair(kind, linear_first=True)
    loops = torch.arange(N).repeat(2, 1)
    x = torch.randn(N, F_IN, dtype=torch.float64)
    with torch.no_grad():
        out = mk(x, loops)
        if kind == "gcn":
            out = out - mk.bias
        kept = sg.maxk(_selected(mk, x), K, dense=True) != 0
    assert int((out != 0).sum(1).max()) <= K
    assert bool((out[~kept] == 0).all()) and bool((out[kept] != 0).all())


@pytest.mark.parametrize("kind, linear_first", [("sage", False), ("gcn", False), ("gcn", True)])
def test_edge_weight_gradient_matches_dense(kind, linear_first):
    ei = _edges(3)
    mk, reference = _pair(kind, linear_first)
    x = torch.randn(N, F_IN, dtype=torch.float64)
    w1 = (torch.rand(ei.shape[1], dtype=torch.float64) + 0.5).requires_grad_(True)
    w2 = w1.detach().clone().requires_grad_(True)
    mk(x, ei, w1).square().sum().backward()
    reference(x, ei, w2).square().sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind, linear_first", [("gcn", False), ("gcn", True), ("gin", True)])
def test_gradcheck_gcn_gin(kind, linear_first):
    torch.manual_seed(0)
    ei = _edges(4)
    mk, _ = _pair(kind, linear_first)
    x = torch.randn(N, F_IN, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: mk(t, ei), (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind, linear_first", KINDS)
def test_dropout_acts_on_kept_values_only(kind, linear_first):
    g = sg.Graph.from_edge_index(_edges(), num_nodes=N)
    mk, reference = _pair(kind, linear_first)
    mk.dropout = 0.5
    mk.train()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    y = _selected(mk, x).detach()
    torch.manual_seed(7)
    out = mk(x, g)
    torch.manual_seed(7)                                        # the same draw, made by hand
    c = sg.maxk(y, K)
    dropped = c.with_values(sg.dropout(c.values, 0.5, True))
    dense = dropped.to_dense()
    torch.testing.assert_close(out, reference.on_selected(dense, g), rtol=1e-12, atol=1e-12)
    zeroed = (dropped.values == 0).sum()
    assert 0 < int(zeroed) < c.values.numel()                   # some kept values dropped, not all
    assert int((dense != 0).sum()) == c.values.numel() - int(zeroed)  # nothing outside the kept entries
    mk.eval()
    torch.testing.assert_close(mk(x, g), reference(x, g), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["gcn", "gin"])
@pytest.mark.parametrize("linear_first", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_relu_twins_equal_the_plain_layers_on_relu(kind, linear_first, training):
    """``k=None`` (the ReLU baseline's layers): ``dropout(relu(.))`` dense where MaxK would be, with
    the same dropout draw as made by hand, and a nonzero GIN epsilon taken into account."""
    torch.manual_seed(3)
    g = sg.Graph.from_edge_index(_edges(), num_nodes=N)
    x = torch.randn(N, F_IN, dtype=torch.float64)
    if kind == "gcn":
        twin = MaxKGCNConv(F_IN, F_OUT, None, dropout=0.4, linear_first=linear_first).double()
        torch.nn.init.uniform_(twin.bias, -0.5, 0.5)
        if linear_first:
            aggregate = GCNConv(F_OUT, F_OUT, bias=False).double()
            with torch.no_grad():
                aggregate.lin.weight.copy_(torch.eye(F_OUT, dtype=torch.float64))
            expected = lambda h: aggregate(h, g) + twin.bias                    # noqa: E731
        else:
            plain = GCNConv(F_IN, F_OUT).double()
            plain.load_state_dict(twin.state_dict())
            expected = lambda h: plain(h, g)                                    # noqa: E731
        selected = twin.lin(x) if linear_first else x
    else:
        twin = MaxKGINConv(torch.nn.Linear(F_IN, F_OUT), None, dropout=0.4, eps=0.7, train_eps=True,
                           linear_first=linear_first).double()
        plain = GINConv(torch.nn.Identity() if linear_first else copy.deepcopy(twin.nn), eps=0.7).double()
        if not linear_first:        # GINConv re-initialises its nn: the twin's parameters, copied back
            plain.nn.load_state_dict(twin.nn.state_dict())
        expected = lambda h: plain(h, g)                                        # noqa: E731
        selected = twin.nn(x) if linear_first else x
    twin.train(training)
    torch.manual_seed(11)
    out = twin(x, g)
    torch.manual_seed(11)                                       # the same dropout draw, made by hand
    h = sg.dropout(torch.relu(selected), 0.4, training)
    with torch.no_grad():
        torch.testing.assert_close(out, expected(h), rtol=1e-12, atol=1e-12)
    if training:
        assert bool((h == 0).sum() > (torch.relu(selected) == 0).sum())    # some values were dropped


@pytest.mark.parametrize("linear_first", [False, True])
def test_gin_self_term_under_autocast(linear_first):
    """The self term added from the kept entries keeps the aggregate's dtype under autocast (bf16),
    where eps (float32) would promote it."""
    g = sg.Graph.from_edge_index(_edges(), num_nodes=N)
    torch.manual_seed(0)
    conv = MaxKGINConv(torch.nn.Linear(F_IN, F_IN), K, eps=0.5, train_eps=True, linear_first=linear_first,
                       backend="reference")     # (the CPU backend's MKL product has no bf16)
    x = torch.randn(N, F_IN)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = conv(x.bfloat16(), g)
    assert out.shape == (N, F_IN) and bool(torch.isfinite(out.float()).all())
    out.float().sum().backward()
    assert conv.eps.grad is not None and bool(torch.isfinite(conv.eps.grad).all())


def test_linear_first_is_refused_for_sage():
    with pytest.raises(ValueError, match=r"MaxKGNN\(\): linear_first places MaxK after GCN's / GIN's"):
        MaxKGNN(F_IN, 3, conv="sage", linear_first=True)
    with pytest.raises(ValueError, match=r"build_model\(\): maxk_linear_first is for gcn / gin"):
        build_model("sage", 10, 3, maxk=8, maxk_linear_first=True)
    with pytest.raises(ValueError, match=r"maxk_sweep\(\): linear_first is for gcn / gin"):
        maxk_sweep(load("cora"), "sage", [8], epochs=1, linear_first=True, progress=False)


def test_layer_errors():
    g = sg.Graph.from_edge_index(_edges(), num_nodes=N)
    with pytest.raises(ValueError, match=r"MaxKSAGEConv\(\): k must be an int in \[1, 12\]"):
        MaxKSAGEConv(F_IN, F_OUT, 13)
    with pytest.raises(ValueError, match=r"MaxKGCNConv\(\): k must be"):
        MaxKGCNConv(F_IN, F_OUT, 0)
    with pytest.raises(ValueError, match=r"MaxKSAGEConv\(\): aggr must be"):
        MaxKSAGEConv(F_IN, F_OUT, K, aggr="max")
    with pytest.raises(ValueError, match=r"MaxKGINConv\(\): dropout must be in \[0, 1\)"):
        MaxKGINConv(torch.nn.Linear(F_IN, 2), K, dropout=1.0)
    with pytest.raises(ValueError, match=r"MaxKGCNConv\(\): add_self_loops=True needs normalize=True"):
        MaxKGCNConv(F_IN, F_OUT, K, normalize=False)
    with pytest.raises(ValueError, match=r"MaxKSAGEConv\(\): x has 11 features but in_channels = 12"):
        MaxKSAGEConv(F_IN, F_OUT, K)(torch.randn(N, 11), g)
    with pytest.raises(ValueError, match=r"MaxKGCNConv\(\): k must be an int in \[1, 5\]"):
        MaxKGCNConv(F_IN, F_OUT, 6, linear_first=True)           # k selects from the linear map's output
    with pytest.raises(ValueError, match=r"MaxKSAGEConv\(\): k must be an int"):
        MaxKSAGEConv(F_IN, F_OUT, None)                          # only GCN / GIN have ReLU twins
    with pytest.raises(ValueError, match=r"MaxKGINConv\(\): the selected features have width 3, fewer than k = 4"):
        MaxKGINConv(torch.nn.Linear(3, 2), K)(torch.randn(N, 3), g)
    with pytest.raises(ValueError, match=r"MaxKGINConv\(\): the selected features have width 2, fewer than k = 4"):
        MaxKGINConv(torch.nn.Linear(F_IN, 2), K, linear_first=True)(torch.randn(N, F_IN), g)   # nn's output
    with pytest.raises(ValueError, match=r"MaxKSAGEConv\(\): the graph has 23 source nodes but the source features"):
        MaxKSAGEConv(F_IN, F_OUT, K)(torch.randn(N - 1, F_IN), g)
    with pytest.raises(ValueError, match="bipartite"):
        MaxKSAGEConv(F_IN, F_OUT, K)((torch.randn(N, F_IN), torch.randn(N, F_IN)), g)


# ---------------------------------------------------------------- MaxKGNN
@pytest.mark.parametrize("conv", ["sage", "gcn", "gin"])
@pytest.mark.parametrize("nonlinearity", ["maxk", "relu"])
def test_maxkgnn_forward_backward(conv, nonlinearity):
    torch.manual_seed(0)
    g = sg.Graph.from_edge_index(_edges(), num_nodes=N)
    model = MaxKGNN(F_IN, 3, conv=conv, hidden=16, num_layers=2, k=4, nonlinearity=nonlinearity)
    x = torch.randn(N, F_IN)
    out = model(x, g)
    assert out.shape == (N, 3)
    out.logsumexp(1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    other = MaxKGNN(F_IN, 3, conv=conv, hidden=16, num_layers=2, k=4,
                    nonlinearity="relu" if nonlinearity == "maxk" else "maxk")
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    other_shapes = {k: v.shape for k, v in other.state_dict().items()}
    assert ("lin_in.bias" in shapes) == (nonlinearity == "relu")      # MaxK's lin_in has no bias
    shapes.pop("lin_in.bias", None), other_shapes.pop("lin_in.bias", None)
    assert shapes == other_shapes


def test_maxkgnn_first_selection_starts_from_the_data():
    """On row-normalised bag-of-words features (Cora's and Citeseer's form) the units that MaxK's first
    selection keeps depend on the node: its ``lin_in`` has no bias.  A bias drawn as torch's default
    draws it (as wide as one weight) outweighs ``W x``, an average of ~30 weights, and nearly every
    node then keeps the same units (the ReLU model, which keeps its bias, shows it).
    ``reset_parameters`` re-draws the weights and adds no bias."""
    torch.manual_seed(0)
    n, f, words, hidden, k = 400, 2000, 30, 64, 8
    x = torch.zeros(n, f).scatter_(1, torch.rand(n, f).argsort(1)[:, :words], 1.0 / words)
    model = MaxKGNN(f, 3, hidden=hidden, k=k)
    relu = MaxKGNN(f, 3, hidden=hidden, nonlinearity="relu")
    assert model.lin_in.bias is None and relu.lin_in.bias is not None

    def kept_units(lin):
        with torch.no_grad():
            return lin(x).topk(k, dim=1).indices.unique().numel()

    assert kept_units(model.lin_in) >= 0.9 * hidden
    assert kept_units(relu.lin_in) < hidden / 2          # the drawn bias: the same few units everywhere
    weight = model.lin_in.weight.detach().clone()
    model.reset_parameters()
    assert not torch.equal(weight, model.lin_in.weight) and model.lin_in.bias is None
    assert kept_units(model.lin_in) >= 0.9 * hidden


@pytest.mark.parametrize("conv, linear_first", KINDS)
def test_maxkgnn_is_the_papers_stack(conv, linear_first):
    """MaxK model == lin_in, then per layer the plain conv on maxk(h, k, dense=True) or (linear_first,
    after lin_in's ReLU) the layer's linear map, dense maxk, the plain aggregation; each layer then
    LayerNorm; then lin_out.  The ReLU model is the same stack with relu for maxk."""
    torch.manual_seed(0)
    g = sg.Graph.from_edge_index(_edges(), num_nodes=N)
    kw = dict(conv=conv, hidden=16, num_layers=3, k=5, linear_first=linear_first)
    relu = MaxKGNN(F_IN, 3, nonlinearity="relu", **kw).double().eval()
    mk = MaxKGNN(F_IN, 3, nonlinearity="maxk", **kw).double().eval()
    with torch.no_grad():           # MaxK's lin_in has no bias: the shared stack below uses none either
        relu.lin_in.bias.zero_()
    missing, unexpected = mk.load_state_dict(relu.state_dict(), strict=False)
    assert not missing and unexpected == ["lin_in.bias"]
    if conv == "gin":               # the authors' GIN learns epsilon; GIN-0 otherwise
        assert isinstance(mk.convs[0].eps, torch.nn.Parameter) == linear_first
    x = torch.randn(N, F_IN, dtype=torch.float64)
    identity_gcn = GCNConv(16, 16, bias=False).double()
    with torch.no_grad():
        identity_gcn.lin.weight.copy_(torch.eye(16, dtype=torch.float64))

    def stack(sigma, convs):
        h = relu.lin_in(x)
        if not linear_first:
            for plain_conv, norm in zip(convs, relu.norms):
                h = norm(plain_conv(sigma(h), g))
            return relu.lin_out(h)
        h = torch.relu(h)
        for layer, norm in zip(relu.convs, relu.norms):
            if conv == "gcn":
                h = identity_gcn(sigma(layer.lin(h)), g) + layer.bias
            else:
                h = GINConv(torch.nn.Identity(), eps=float(layer.eps)).double()(sigma(layer.nn(h)), g)
            h = norm(h)
        return relu.lin_out(h)

    # MaxK on the input: the plain convs of the ReLU model (SAGEConv, GCNConv, GINConv) on the dense maxk
    with torch.no_grad():
        torch.testing.assert_close(mk(x, g), stack(lambda t: sg.maxk(t, 5, dense=True), relu.convs),
                                   rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(relu(x, g), stack(torch.relu, relu.convs), rtol=1e-10, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("conv", ["sage", "gin"])
def test_maxkgnn_fuses_layer_norm_and_maxk_between_convs(conv, monkeypatch):
    """On the Triton backend (the interpreter without a GPU) the LayerNorm before a MaxK conv and the
    conv's selection run as one ``layer_norm_maxk``, once per conv but the first; output and parameter
    gradients equal the unfused stack (each norm, then the conv selecting on its own)."""
    import sparsegnn.nn.models as models

    import sparsegnn.nn.maxk as nnmaxk

    calls = []
    fused = models.layer_norm_maxk
    monkeypatch.setattr(models, "layer_norm_maxk", lambda *a, **kw: calls.append(kw) or fused(*a, **kw))
    monkeypatch.setattr(nnmaxk, "aggregates_dense", lambda *args: False)     # the CBSR path on a GPU too
    torch.manual_seed(0)
    g = sg.Graph.from_edge_index(_edges(), num_nodes=N).to(DEVICE)
    model = MaxKGNN(F_IN, 3, conv=conv, hidden=32, num_layers=3, k=5, dropout=0.0, backend="triton").to(DEVICE).train()
    with torch.no_grad():               # LayerNorm's affine parameters away from their initial 1 / 0
        for norm in model.norms:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0.0, 0.3)
    x = torch.randn(N, F_IN, device=DEVICE)
    out = model(x, g)
    assert len(calls) == 2 and all(kw["backend"] == "triton" for kw in calls)
    h = model.lin_in(x)
    for layer, norm in zip(model.convs, model.norms):
        h = norm(layer(h, g))
    want = model.lin_out(h)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    up = torch.randn_like(out)
    params = list(model.parameters())
    got_grads = torch.autograd.grad((out * up).sum(), params)
    want_grads = torch.autograd.grad((want * up).sum(), params)
    for got, ref in zip(got_grads, want_grads):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()) + 1e-7)
    calls.clear()
    MaxKGNN(F_IN, 3, conv=conv, hidden=32, k=5, nonlinearity="relu", backend="triton").to(DEVICE)(x, g)
    MaxKGNN(F_IN, 3, conv=conv, hidden=32, k=5, norm=False, backend="triton").to(DEVICE)(x, g)
    assert calls == []
    seen = []                           # a hooked norm runs as a module (the hook sees it), the other fuses
    model.norms[0].register_forward_hook(lambda *args: seen.append(1))
    torch.testing.assert_close(model(x, g), want, rtol=1e-5, atol=1e-5)
    assert seen == [1] and len(calls) == 1


def test_maxk_layers_take_a_selected_cbsr():
    """A CBSR x (selected already) is the layer's input after selection: only dropout is left to do."""
    torch.manual_seed(0)
    g = sg.Graph.from_edge_index(_edges(), num_nodes=N)
    x = torch.randn(N, F_IN)
    c = sg.maxk(x, K)
    for layer in (MaxKSAGEConv(F_IN, F_OUT, K), MaxKGCNConv(F_IN, F_OUT, K),
                  MaxKGINConv(torch.nn.Linear(F_IN, F_OUT), K)):
        layer.eval()
        torch.testing.assert_close(layer(c, g), layer(x, g))
        layer.dropout = 0.5             # training: the CBSR's values get the layer's dropout, same draw
        layer.train()
        torch.manual_seed(3)
        dropped = layer(c, g)
        torch.manual_seed(3)
        torch.testing.assert_close(dropped, layer(x, g))
        layer.eval()
        assert not torch.allclose(dropped, layer(c, g))
    with pytest.raises(ValueError, match=r"MaxKSAGEConv\(\): the CBSR x keeps k = 4 entries a row, the layer k = 3"):
        MaxKSAGEConv(F_IN, F_OUT, 3)(c, g)
    with pytest.raises(ValueError, match=r"MaxKGCNConv\(\): the CBSR x has 12 columns but in_channels = 13"):
        MaxKGCNConv(F_IN + 1, F_OUT, K)(c, g)
    with pytest.raises(ValueError, match=r"MaxKGCNConv\(\): a CBSR x .* its linear map's output \(linear_first\)"):
        MaxKGCNConv(F_IN, F_OUT, K, linear_first=True)(c, g)
    with pytest.raises(ValueError, match=r"MaxKGINConv\(\): a CBSR x .* is a ReLU twin \(k=None\)"):
        MaxKGINConv(torch.nn.Identity(), None)(c, g)


def test_maxkgnn_errors():
    with pytest.raises(ValueError, match=r"MaxKGNN\(\): k must be an int in \[1, hidden = 16\]"):
        MaxKGNN(4, 2, hidden=16, k=17)
    with pytest.raises(ValueError, match=r"MaxKGNN\(\): conv must be"):
        MaxKGNN(4, 2, conv="gat")
    with pytest.raises(ValueError, match=r"MaxKGNN\(\): nonlinearity must be"):
        MaxKGNN(4, 2, nonlinearity="gelu")
    assert MaxKGNN(4, 2, hidden=16, k=17, nonlinearity="relu").k is None      # k is unused with relu


# ---------------------------------------------------------------- training and CLI
def test_build_model_maxk_options():
    model = build_model("sage", 10, 3, maxk=32)
    assert isinstance(model, MaxKGNN) and model.k == 32 and model.conv == "sage"
    assert model.lin_in.out_features == 256 and len(model.convs) == 3 and model.dropout == 0.5
    assert isinstance(model.convs[0], MaxKSAGEConv)
    base = build_model("GCN", 10, 3, hidden=64, dropout=0.2, maxk="relu")
    assert base.nonlinearity == "relu" and isinstance(base.convs[0], GCNConv) and base.dropout == 0.2
    paper = MaxKGNN(10, 3, conv="gcn", hidden=64, nonlinearity="relu", linear_first=True)
    assert isinstance(paper.convs[0], MaxKGCNConv) and paper.convs[0].k is None   # its ReLU twin
    with pytest.raises(ValueError, match=r"build_model\(\): maxk is available for the models sage, gcn, gin"):
        build_model("gat", 10, 3, maxk=8)
    for bad in (0, 257, True, 2.0, "8"):
        with pytest.raises(ValueError, match=r"build_model\(\): maxk must be an int in \[1, hidden = 256\]"):
            build_model("sage", 10, 3, maxk=bad)
    with pytest.raises(ValueError, match=r"hidden = 16\]"):
        build_model("gin", 10, 3, hidden=16, maxk=32)
    with pytest.raises(ValueError, match=r"precision='ieee'"):
        build_model("sage", 10, 3, precision="tf32", maxk=8)
    data = load("cora")                                          # maxk compiles (tests/nn/test_maxk_compile.py)
    result = train_node_classifier(data, "sage", epochs=2, hidden=32, maxk=8, compile="default",
                                   compile_backend="aot_eager", progress=False)
    assert result.maxk == 8 and result.compile == "default" and len(result.losses) == 2
    with pytest.raises(ValueError, match=r"compile='capture' replays CUDA graphs and needs a CUDA device"):
        train_node_classifier(data, "sage", epochs=1, maxk=8, compile="capture")


def test_train_node_classifier_maxk_learns():
    result = train_node_classifier(load("cora"), "gin", epochs=30, hidden=64, maxk=8, progress=False)
    assert result.maxk == 8 and result.losses[-1] < result.losses[0]
    assert result.best_val_acc > 0.5                             # 7 classes: chance is ~0.14 (0.80 measured)


def test_cli_train_maxk(capsys):
    argv = ["train", "--model", "sage", "--maxk", "8", "--hidden", "32", "--epochs", "2", "--device", "cpu", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["maxk"] == 8 and summary["model"] == "sage" and 0 <= summary["test_acc"] <= 1
    assert main(["train", "--epochs", "1", "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["maxk"] is None
    argv = ["train", "--model", "sage", "--maxk", "8", "--hidden", "32", "--epochs", "2", "--device", "cpu",
            "--compile", "default", "--compile-backend", "aot_eager", "--json"]
    assert main(argv) == 0                                       # maxk compiles
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["maxk"] == 8 and summary["compile"] == "default" and 0 <= summary["test_acc"] <= 1
    argv = ["train", "--model", "gcn", "--maxk", "8", "--maxk-linear-first", "--hidden", "32", "--epochs", "2",
            "--device", "cpu", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["maxk"] == 8 and summary["maxk_linear_first"] is True


def test_cli_matmul_precision(monkeypatch, capsys, tmp_path):
    """``--matmul-precision high`` holds while ``train`` / ``maxk-sweep`` run (TF32 GEMMs) and the previous
    setting comes back after; ``--nproc`` refuses it (its workers are other processes)."""
    import benchmarks.maxk_sweep as sweep_module
    import sparsegnn.training as training

    seen = []
    real_train = training.train_node_classifier

    def spy(*args, **kwargs):
        seen.append(torch.get_float32_matmul_precision())
        return real_train(*args, **kwargs)

    monkeypatch.setattr(training, "train_node_classifier", spy)
    monkeypatch.setattr(sweep_module, "train_node_classifier", spy)
    before = torch.get_float32_matmul_precision()
    argv = ["train", "--model", "sage", "--maxk", "8", "--hidden", "32", "--epochs", "1", "--device", "cpu", "--json"]
    assert main(argv + ["--matmul-precision", "high"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["matmul_precision"] == "high"
    assert main(argv) == 0
    assert seen == ["high", before] and torch.get_float32_matmul_precision() == before
    assert main(["train", "--nproc", "2", "--matmul-precision", "high", "--device", "cpu"]) == 2
    assert "--matmul-precision do not apply with --nproc" in capsys.readouterr().err
    seen.clear()
    assert sweep_main(["--ks", "4", "--hidden", "16", "--epochs", "1", "--device", "cpu",
                 "--matmul-precision", "high", "--out", str(tmp_path)]) == 0
    assert seen == ["high", "high"] and torch.get_float32_matmul_precision() == before
    assert "matmul precision high" in capsys.readouterr().out


def test_build_model_maxk_linear_first():
    model = build_model("gcn", 10, 3, hidden=32, maxk=8, maxk_linear_first=True)
    assert model.linear_first and all(conv.linear_first and conv.k == 8 for conv in model.convs)
    base = build_model("gin", 10, 3, hidden=32, maxk="relu", maxk_linear_first=True)
    assert base.linear_first and all(conv.linear_first and conv.k is None for conv in base.convs)
    with pytest.raises(ValueError, match=r"build_model\(\): maxk_linear_first places MaxK"):
        build_model("gcn", 10, 3, maxk_linear_first=True)


@pytest.mark.parametrize("extra, message", [
    (["--model", "gat", "--maxk", "8"], "--maxk needs --model sage, gcn, gin"),
    (["--model", "agnn", "--maxk", "8"], "--maxk needs --model"),
    (["--model", "sage", "--maxk", "8", "--minibatch"], "drop --minibatch"),
    (["--model", "sage", "--maxk", "8", "--precision", "tf32"], "drop --precision"),
    (["--model", "sage", "--maxk", "0"], "--maxk must be in [1, hidden = 256], got 0"),
    (["--model", "sage", "--maxk", "257"], "--maxk must be in [1, hidden = 256], got 257"),
    (["--model", "gcn", "--maxk", "64", "--hidden", "32"], "--maxk must be in [1, hidden = 32], got 64"),
    (["--model", "gcn", "--maxk-linear-first"], "--maxk-linear-first places MaxK in MaxK-GNN's model; pass --maxk"),
    (["--model", "sage", "--maxk", "8", "--maxk-linear-first"], "--maxk-linear-first is for --model gcn / gin"),
    (["--model", "gcn", "--nproc", "2", "--maxk-linear-first"], "--maxk-linear-first"),
])
def test_cli_train_maxk_bad_combinations(capsys, extra, message):
    assert main(["train", "--epochs", "1", "--device", "cpu", *extra]) == 2
    assert message in capsys.readouterr().err


def test_cli_maxk_sweep(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["--dataset", "cora", "--model", "sage", "--ks", "4,8", "--epochs", "2", "--runs", "2",
            "--hidden", "32", "--device", "cpu", "--out", str(out)]
    assert sweep_main(argv) == 0
    result = json.loads((out / "maxk_sweep.json").read_text())
    rows = result["rows"]
    assert [r["config"] for r in rows] == ["relu", "k=4", "k=8"] and [r["k"] for r in rows] == [None, 4, 8]
    assert result["meta"]["dataset"] == "cora" and result["meta"]["runs"] == 2 and result["meta"]["epochs"] == 2
    assert result["meta"]["hidden"] == 32 and result["meta"]["device"].startswith("cpu")
    for r in rows:
        assert r["seeds"] == [0, 1] and len(r["test_acc_at_best_val_per_seed"]) == 2
        assert r["test_acc_at_best_val"] == pytest.approx(sum(r["test_acc_at_best_val_per_seed"]) / 2)
        assert r["mean_epoch_ms"] > 0 and 0 <= r["test_acc"] <= 1
        assert r["speedup"] == pytest.approx(rows[0]["mean_epoch_ms"] / r["mean_epoch_ms"])
    table = [line for line in (out / "maxk_sweep.md").read_text().splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in table[1:]] == ["relu", "4", "8"]      # header + one row each
    assert "| relu |" in capsys.readouterr().out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "maxk_sweep.png").stat().st_size > 0


def test_cli_maxk_sweep_bad_ks(tmp_path, capsys):
    argv = ["--ks", "8,64", "--hidden", "32", "--epochs", "1", "--device", "cpu", "--out", str(tmp_path)]
    assert sweep_main(argv) == 2
    assert "every k must be in [1, hidden = 32], got [64]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep_main(["--ks", "0,8"])
    assert not (tmp_path / "maxk_sweep.json").exists()


# ---------------------------------------------------------------- real-suite node datasets
def test_stratified_split():
    y = torch.tensor([0] * 10 + [1] * 5 + [2] * 1)
    train, val, test = stratified_split(y, seed=3)
    assert bool((train.int() + val.int() + test.int() == 1).all())
    assert [int(train[y == c].sum()) for c in range(3)] == [6, 3, 1]
    assert [int(val[y == c].sum()) for c in range(3)] == [2, 1, 0]
    assert torch.equal(stratified_split(y, seed=3)[0], train) and not torch.equal(stratified_split(y, seed=4)[0], train)


def test_real_loader_errors(tmp_path):
    with pytest.raises(ValueError, match=r"load_real_node_dataset\(\): 'lastfm': missing .*lastfm\.npz"):
        load_real_node_dataset("lastfm", data_dir=tmp_path)
    with pytest.raises(ValueError, match=r"load_real_node_dataset\(\): unknown dataset 'roadnet-pa-excerpt'"):
        load_real_node_dataset("roadnet-pa-excerpt", data_dir=tmp_path)
    with pytest.raises(ValueError, match=r"load\(\): root is for raw Planetoid files"):
        load("deezer", root=str(tmp_path))


@needs_real
def test_real_node_dataset_lastfm_substitute_features():
    data = load("lastfm")                                        # found through default_data_dir()
    n = 7624
    assert data.name == "lastfm" and data.graph.num_nodes == n and data.num_classes == 18
    assert data.x.shape == (n, SUBSTITUTE_DIM + 1) and data.x.dtype == torch.float32
    torch.testing.assert_close(data.x[:, -1], torch.log1p(data.graph.in_degree().float()))
    assert abs(float(data.x[:, :-1].mean())) < 0.02 and abs(float(data.x[:, :-1].std()) - 1) < 0.02
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask]).int()
    assert bool((masks.sum(0) == 1).all())
    assert int(data.train_mask.sum()) == pytest.approx(0.6 * n, abs=18)
    for c in range(18):                                          # every class in the training set, stratified
        in_class = int((data.y == c).sum())
        assert int(data.train_mask[data.y == c].sum()) == round(0.6 * in_class)
    again = load_real_node_dataset("lastfm", data_dir=DATA)
    assert torch.equal(again.x, data.x) and torch.equal(again.train_mask, data.train_mask)
    other = load_real_node_dataset("lastfm", seed=1)
    assert torch.equal(other.x, data.x) and not torch.equal(other.train_mask, data.train_mask)


@needs_real
def test_real_node_dataset_twitch_own_features_and_training():
    data = load("twitch")
    assert data.x.shape == (7126, 3170) and data.num_classes == 2
    torch.testing.assert_close(data.x.sum(1), torch.ones(7126))   # row-normalised binary features
    result = train_node_classifier(data, "sage", epochs=2, hidden=16, maxk=4, progress=False)
    assert math.isfinite(result.losses[-1]) and 0 <= result.test_acc_at_best_val <= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA CBSR kernels need a GPU")
@pytest.mark.parametrize("kind, linear_first", KINDS)
@pytest.mark.parametrize("path", ["cbsr", "dense"])
def test_layers_on_the_gpu_match_the_plain_layers(kind, linear_first, path, monkeypatch):
    """fp32 on the GPU at MaxK-GNN's sizes (256 wide, k = 32: the CUDA SpGEMM / SSpMM schedules, or
    the dense path this small graph takes in eager calls): the layer against the plain layers on
    the same selection (the selected tensor is computed by the same kernels in both, so the kept
    entries agree), forward and gradients."""
    import sparsegnn.nn.maxk as nnmaxk

    monkeypatch.setattr(nnmaxk, "aggregates_dense", lambda *args: path == "dense")
    gen = torch.Generator().manual_seed(5)
    n, f_in = 3000, 64
    ei = torch.randint(0, n, (2, 40000), generator=gen).cuda()
    graph = sg.Graph.from_edge_index(ei, num_nodes=n)
    f_out = 256
    mk, reference = _pair(kind, linear_first, f_in=256 if not linear_first else f_in, f_out=f_out, k=32,
                          dtype=torch.float32, device="cuda")
    width = 256 if not linear_first else f_in
    x = torch.randn(n, width, device="cuda", generator=torch.Generator("cuda").manual_seed(6), requires_grad=True)
    out = mk(x, graph)
    x_ref = x.detach().clone().requires_grad_(True)
    ref = reference(x_ref, graph)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
    for name, p in mk.named_parameters():
        torch.testing.assert_close(p.grad, reference.params[name].grad, rtol=1e-4, atol=1e-3, msg=name)
