"""torch.compile readiness: the custom ops (opcheck, gradients), every model and layer under
``torch.compile(fullgraph=True)`` against eager, the clear errors, and no host syncs per call."""
import copy
import gc
import shutil

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import sparsegnn as sg
from sparsegnn import Graph, nn as sgnn
from sparsegnn.graph import graph_by_key
from sparsegnn.kernels import interpreting

from conftest import assert_compiled_step_matches_eager, compile_case, empty_graph, output_and_grads, rand_input

OPS = torch.ops.sparsegnn
N = 12


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _graph(weighted=True, dtype=torch.float64, n=N, edges=40, seed=1):
    """Empty rows, isolated nodes, self loops and duplicate edges (distinct random weights)."""
    ei, w = sg.datasets.random_graph(n, edges, seed=seed, num_isolated=1, num_empty_rows=2, num_self_loops=2,
                                     num_duplicates=3, weighted=True)
    return Graph.from_edge_index(ei, w.to(dtype) if weighted else None, num_nodes=n)


# ---------------------------------------------------------------- graph handle
def test_graph_keys_are_unique_and_looked_up_weakly():
    g = _graph()
    derived = [g.t(), g.with_values(None), g.to("cpu"), g.add_self_loops(), copy.deepcopy(g), copy.copy(g)]
    keys = {g.key} | {d.key for d in derived}
    assert len(keys) == 1 + len(derived)
    assert graph_by_key(g.key) is g and all(graph_by_key(d.key) is d for d in derived)
    key = g.add_self_loops().key                    # a temporary: freed at once
    gc.collect()
    with pytest.raises(ValueError, match=rf"sparsegnn: graph {key} was freed"):
        graph_by_key(key)


# ---------------------------------------------------------------- opcheck and gradients of every op
@pytest.mark.parametrize("make", [_graph, empty_graph], ids=["mixed", "no-edges"])
def test_opcheck_forward_ops(make):
    g = make()
    n, e = g.num_nodes, g.num_edges
    x = rand_input(n, 4)
    weight = g.edge_val.clone().requires_grad_(True)
    heads = rand_input(e, 2, seed=1).detach().abs().add(0.5).requires_grad_(True)
    cases = [(OPS.spmm, (x, w, g.key, reduce, "reference")) for reduce in ("sum", "mean", "max") for w in (None, weight)]
    cases += [(OPS.spmm, (x, heads, g.key, reduce, "reference")) for reduce in ("sum", "mean")]
    cases += [(OPS.sddmm, (x, rand_input(n, 4, seed=2), g.key, op, "reference")) for op in ("dot", "add", "mul")]
    cases += [(OPS.edge_softmax, (rand_input(*shape, seed=3), g.key, "reference")) for shape in ((e,), (e, 3))]
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_opcheck_backward_ops():
    g = _graph()
    n, e = g.num_nodes, g.num_edges
    x, dy = rand_input(n, 4, grad=False), rand_input(n, 4, seed=1, grad=False)
    out = OPS.spmm(x, g.edge_val, g.key, "max", "reference")
    y = OPS.edge_softmax(rand_input(e, 2, seed=2, grad=False), g.key, "reference")
    cases = [(OPS.spmm_transposed, (dy, w, g.key, reduce, "reference"))
             for reduce in ("sum", "mean") for w in (None, g.edge_val)]
    cases += [(OPS.spmm_weight_grad, (dy, x, g.key, heads, reduce, "reference"))
              for heads in (0, 2) for reduce in ("sum", "mean")]
    cases += [(OPS.spmm_max_backward, (dy, x, w, out, g.key)) for w in (None, g.edge_val)]
    cases += [(OPS.edge_sum, (rand_input(e, 3, grad=False), g.key, by_source)) for by_source in (False, True)]
    cases += [(OPS.edge_softmax_backward, (y, rand_input(e, 2, seed=4, grad=False), g.key, "reference"))]
    for op, args in cases:
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_custom_op_gradients(reduce):
    """gradcheck of the autograd formulas registered for the custom ops (float64)."""
    g = _graph()
    x, w = rand_input(N, 3), g.edge_val.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, w: OPS.spmm(x, w, g.key, reduce, "reference"), (x, w))
    assert torch.autograd.gradcheck(lambda x: OPS.spmm(x, None, g.key, reduce, "reference"), (x,))
    if reduce != "max":
        heads = rand_input(g.num_edges, 3, seed=5).detach().abs().add(0.5).requires_grad_(True)
        x6 = rand_input(N, 6, seed=6)
        assert torch.autograd.gradcheck(lambda x, w: OPS.spmm(x, w, g.key, reduce, "reference"), (x6, heads))


def test_custom_op_gradients_sddmm_softmax():
    g = _graph()
    a, b = rand_input(N, 3, seed=7), rand_input(N, 3, seed=8)
    for op in ("dot", "add", "mul"):
        assert torch.autograd.gradcheck(lambda a, b: OPS.sddmm(a, b, g.key, op, "reference"), (a, b))
    for shape in ((g.num_edges,), (g.num_edges, 2)):
        s = rand_input(*shape, seed=9)
        assert torch.autograd.gradcheck(lambda s: OPS.edge_softmax(s, g.key, "reference"), (s,))


def test_custom_ops_match_the_eager_functions():
    g = _graph()
    x, w = rand_input(N, 4), g.edge_val.clone().requires_grad_(True)
    for reduce in ("sum", "mean", "max"):
        ours = OPS.spmm(x, w, g.key, reduce, "auto")
        eager = sg.spmm(g, x, reduce, edge_weight=w)
        assert torch.equal(ours, eager)
        for got, want in zip(torch.autograd.grad(ours.square().sum(), (x, w)),
                             torch.autograd.grad(eager.square().sum(), (x, w))):
            assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_opcheck_triton_backend_in_interpreter():
    if not torch.cuda.is_available() and not interpreting():
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = _graph(dtype=torch.float32, n=6, edges=12).to(device)
    x = torch.randn(6, 4, device=device, requires_grad=True)
    torch.library.opcheck(OPS.spmm, (x, g.edge_val.clone().requires_grad_(True), g.key, "sum", "triton"))
    torch.library.opcheck(OPS.edge_softmax, (torch.randn(g.num_edges, device=device, requires_grad=True), g.key,
                                             "triton"))


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_opcheck_spmm_precise_in_interpreter(reduce):
    """The reduced-precision SpMM op (the exact call, tiles or reduced rows picked by the tuner), both directions."""
    if not torch.cuda.is_available() and not interpreting():
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = _graph(dtype=torch.float32, n=6, edges=12).to(device)
    w = g.edge_val.clone().requires_grad_(True)
    for transposed in (False, True):
        x = torch.randn(6, 8, device=device, requires_grad=True)
        for precision in ("tf32", "bf16"):
            torch.library.opcheck(OPS.spmm_precise, (x, w, g.key, reduce, precision, transposed, "triton"),
                                  atol=2e-2, rtol=2e-2)
    x = torch.randn(6, 8, device=device, dtype=torch.float64)
    for weight in (None, g.edge_val):       # against the exact ops in float64
        w64 = None if weight is None else weight.double()
        for transposed, exact in ((False, OPS.spmm), (True, OPS.spmm_transposed)):
            got = OPS.spmm_precise(x.float(), weight, g.key, reduce, "tf32", transposed, "triton")
            want = exact(x, w64, g.key, reduce, "reference")
            torch.testing.assert_close(got.double(), want, atol=1e-2, rtol=1e-2)


# ---------------------------------------------------------------- models and layers under torch.compile
def _models():
    return {
        "GCN": lambda: sgnn.GCN(8, 3, hidden=16, dropout=0.0),
        "AGNN": lambda: sgnn.AGNN(8, 3, hidden=16, dropout=0.0),
        "GraphSAGE": lambda: sgnn.GraphSAGE(8, 3, hidden=16, dropout=0.0),
        "GIN": lambda: sgnn.GIN(8, 3, hidden=16, dropout=0.0),
        "GAT": lambda: sgnn.GAT(8, 3, hidden=4, heads=2, dropout=0.0),
        "GCNConv": lambda: sgnn.GCNConv(8, 4),
        "GCNConv-wide": lambda: sgnn.GCNConv(8, 12, normalize=False),
        "SAGEConv-mean": lambda: sgnn.SAGEConv(8, 4),
        "SAGEConv-max": lambda: sgnn.SAGEConv(8, 4, aggr="max"),
        "GINConv": lambda: sgnn.GINConv(torch.nn.Linear(8, 4), train_eps=True),
        "AGNNConv": lambda: sgnn.AGNNConv(),
        "GATConv": lambda: sgnn.GATConv(8, 4, heads=2),
    }


MODELS = _models()


@pytest.mark.parametrize("name", list(MODELS))
def test_compiled_matches_eager(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    graph, x = compile_case()
    assert_compiled_step_matches_eager(model, x, graph)


@pytest.mark.parametrize("name", ["GCNConv", "SAGEConv-max", "GATConv", "AGNNConv"])
def test_compiled_triton_backend_matches_eager(name):
    """The Triton kernels behind the custom ops (in the interpreter without a GPU)."""
    if not torch.cuda.is_available() and not interpreting():
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = MODELS[name]().to(device)
    model.backend = "triton"
    graph, x = compile_case(12)
    graph, x = graph.to(device), x.to(device)
    sgnn.prepare(model, x, graph)
    out_eager, grads_eager = output_and_grads(model, x, graph)
    out, grads = output_and_grads(model, x, graph, torch.compile(model, fullgraph=True, backend="aot_eager"))
    torch.testing.assert_close(out, out_eager, rtol=1e-5, atol=1e-6)
    for key in grads_eager:
        torch.testing.assert_close(grads[key], grads_eager[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.parametrize("name", ["GCN", "AGNN"])
def test_compiled_reduced_precision_matches_eager(name, monkeypatch):
    """``precision="tf32"`` under torch.compile: the spmm_precise op, same kernels as eager.
    AGNN compiles its three-pass form; eager is held to it (its tuner may pick the fused one)."""
    if not torch.cuda.is_available() and not interpreting():
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from sparsegnn.ops import attention

    monkeypatch.setattr(attention, "_agnn_path", lambda *a: 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    make = {"GCN": sgnn.GCN, "AGNN": sgnn.AGNN}[name]
    model = make(8, 3, hidden=16, dropout=0.0, backend="triton", precision="tf32").to(device)
    graph, x = compile_case(12)
    graph, x = graph.to(device), x.to(device)
    sgnn.prepare(model, x, graph)
    out_eager, grads_eager = output_and_grads(model, x, graph)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out, grads = output_and_grads(model, x, graph, compiled)
    torch.testing.assert_close(out, out_eager, rtol=1e-5, atol=1e-6)
    for key in grads_eager:
        torch.testing.assert_close(grads[key], grads_eager[key], rtol=1e-5, atol=1e-6, msg=key)
    if name == "GCN":      # the traced program holds the reduced-precision op
        explanation = torch._dynamo.explain(model)(x, graph)
        code = "\n".join(str(gm.graph) for gm in explanation.graphs)
        assert "spmm_precise" in code and explanation.graph_break_count == 0


def _inductor_matches_eager(model, x, graph, rtol, atol):
    """The model compiled whole (inductor) gives its eager output and parameter gradients."""
    sgnn.prepare(model, x, graph)
    out_eager, grads_eager = output_and_grads(model, x, graph)
    out, grads = output_and_grads(model, x, graph, torch.compile(model, fullgraph=True))
    torch.testing.assert_close(out, out_eager, rtol=rtol, atol=atol)
    for key in grads_eager:
        torch.testing.assert_close(grads[key], grads_eager[key], rtol=rtol, atol=atol, msg=key)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor on the CPU needs a C++ compiler")
@pytest.mark.parametrize("name", ["GCNConv", "SAGEConv-max"])
def test_inductor_on_cpu_matches_eager(name):
    """Inductor runs the custom ops as extern kernels, trusting their fake shapes and strides."""
    torch.manual_seed(0)
    model = MODELS[name]()
    graph, x = compile_case()
    _inductor_matches_eager(model, x, graph, rtol=1e-5, atol=1e-6)


def test_no_graph_breaks_in_any_model():
    graph, x = compile_case()
    for name, make in MODELS.items():
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = sgnn.prepare(make(), x, graph)
        explanation = torch._dynamo.explain(model)(x, graph)
        assert explanation.graph_break_count == 0, (name, explanation.break_reasons)
        assert explanation.graph_count == 1, name


def test_ops_compile_into_one_graph_with_custom_ops():
    """The compiled program holds the sparsegnn ops, not the graph's tensors."""
    graph, x = compile_case()
    model = sgnn.prepare(sgnn.GCNConv(8, 4), x, graph)
    seen = []

    def backend(gm, inputs):
        seen.append(gm)
        return gm

    torch.compile(model, fullgraph=True, backend=backend)(x, graph)
    (gm,) = seen
    targets = [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
    assert any("sparsegnn.spmm" in t for t in targets)
    placeholders = [node.name for node in gm.graph.nodes if node.op == "placeholder"]
    assert len(placeholders) == 4, placeholders     # x, the weight, the bias and the edge values
    assert sum(p.endswith("_graph_edge_val") for p in placeholders) == 1, placeholders


def test_compiled_function_of_ops_follows_the_graph_argument():
    """Each Graph is a guarded constant: another Graph recompiles, the first one reuses its code."""
    def fn(x, g, w):
        h = sg.spmm(g, x, reduce="mean")
        alpha = sg.edge_softmax(g, sg.sddmm(g, h, x, "dot") * w)
        return sg.spmm(g, h, edge_weight=alpha, reduce="sum")

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    graphs = [compile_case()[0], Graph.from_edge_index(torch.randint(0, 30, (2, 90), generator=torch.Generator().manual_seed(3)),
                                                num_nodes=30)]
    x = torch.randn(30, 5)
    for g in graphs + graphs:
        w = torch.rand(g.num_edges)
        xc, xe = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        out, ref = compiled(xc, g, w), fn(xe, g, w)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad)


def test_graph_edge_values_that_require_grad_get_gradients():
    """Identity transforms (GIN, SAGE) aggregate with the Graph's own edge_val: gradients flow to it."""
    graph, x = compile_case()
    values = torch.nn.Parameter(graph.edge_val.clone())
    g = graph.with_values(values)
    conv = sgnn.GINConv(torch.nn.Linear(8, 4))
    conv(x, g).sum().backward()
    expected = values.grad.clone()
    values.grad = None
    torch.compile(conv, fullgraph=True, backend="aot_eager")(x, g).sum().backward()
    torch.testing.assert_close(values.grad, expected)


def test_dynamic_shapes_compile():
    torch.manual_seed(0)
    model = sgnn.GraphSAGE(8, 3, hidden=16, dropout=0.0)
    graph, x = compile_case()
    sgnn.prepare(model, x, graph)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    torch.testing.assert_close(compiled(x, graph), model(x, graph))


# ---------------------------------------------------------------- clear errors
def _compile_error(fn, *args):
    with pytest.raises((ValueError, torch._dynamo.exc.Unsupported)) as info:
        torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    return str(info.value)


def test_edge_index_under_compile_says_to_pass_a_graph():
    graph, x = compile_case()
    edge_index = graph.edge_index()
    message = _compile_error(sgnn.SAGEConv(8, 4), x, edge_index)
    assert "must be a sparsegnn.Graph" in message and "Graph.from_edge_index" in message
    message = _compile_error(lambda x, ei: sg.spmm(ei, x), x, edge_index)
    assert "spmm(): under torch.compile the graph must be a sparsegnn.Graph" in message


def test_unprepared_graph_under_compile_says_to_run_eagerly_first():
    graph, x = compile_case()
    model = sgnn.GCN(8, 3, dropout=0.0)
    message = _compile_error(model, x, graph)
    assert "not built yet" in message and "sparsegnn.nn.prepare(model, x, graph)" in message
    sgnn.prepare(model, x, graph)                    # now it compiles
    torch.testing.assert_close(torch.compile(model, fullgraph=True, backend="aot_eager")(x, graph), model(x, graph))


def test_grad_values_with_normalisation_are_refused_under_compile():
    graph, x = compile_case()
    g = graph.with_values(torch.nn.Parameter(graph.edge_val.clone()))
    conv = sgnn.GCNConv(8, 4)
    conv(x, g)
    assert "must not require grad" in _compile_error(conv, x, g)


def test_prepare_leaves_gradients_and_mode_alone():
    graph, x = compile_case()
    model = sgnn.GCN(8, 3)
    model.train()
    rng = torch.get_rng_state()
    assert sgnn.prepare(model, x, graph) is model
    assert model.training and all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)     # evaluation mode: no dropout draws
    assert model.conv1._cached_graph is not None


# ---------------------------------------------------------------- no host syncs in the hot path
#: aten ops that wait for the device (a Python scalar or a data-dependent shape).
SYNCING = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "equal", "unique", "_unique",
           "_unique2", "unique_consecutive", "unique_dim", "bincount"}


class _SyncRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if name in SYNCING:
            self.calls.append(name)
        if name in ("index", "index_put", "index_put_") and any(
                isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (args[1] or ()) if t is not None):
            self.calls.append(f"{name}(bool mask)")
        if name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3:
            self.calls.append("repeat_interleave without output_size")
        return func(*args, **(kwargs or {}))


def _hot_calls(g, backend):
    """Every op variant, forward and backward."""
    x = torch.randn(g.num_nodes, 6, dtype=torch.float32, device=g.device, requires_grad=True)
    w = g.edge_val.float().clone().requires_grad_(True)
    heads = torch.rand(g.num_edges, 2, device=g.device, requires_grad=True)
    s = torch.randn(g.num_edges, 2, device=g.device, requires_grad=True)
    outs = [sg.spmm(g, x, reduce, edge_weight=weight, backend=backend)
            for reduce in ("sum", "mean", "max") for weight in (None, w)]
    outs.append(sg.spmm(g, x, edge_weight=heads, backend=backend))
    outs += [sg.sddmm(g, x, x, op, backend=backend) for op in ("dot", "add", "mul")]
    outs.append(sg.edge_softmax(g, s, backend=backend))
    outs += [OPS.spmm(x, w, g.key, "max", backend), OPS.sddmm(x, x, g.key, "mul", backend),
             OPS.edge_softmax(s, g.key, backend)]
    sum(o.float().square().sum() for o in outs).backward()


def test_no_host_sync_after_the_first_call():
    g = _graph(dtype=torch.float32)
    _hot_calls(g, "reference")                      # builds the transpose, row, mean scales once
    with _SyncRecorder() as recorder:
        _hot_calls(g, "reference")
    assert recorder.calls == []


def test_sync_recorder_sees_a_sync():
    with _SyncRecorder() as recorder:
        x = torch.randn(5)
        x[x > 0].sum().item()
    assert "index(bool mask)" in recorder.calls and "_local_scalar_dense" in recorder.calls


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_cuda_sync_after_the_first_call():
    g = _graph(dtype=torch.float32, n=200, edges=1500).to("cuda")
    for backend in ("triton", "reference"):
        _hot_calls(g, backend)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            _hot_calls(g, backend)
        finally:
            torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------- decisions while a CUDA graph is captured
def test_decide_under_capture_takes_the_zero_shot_pick(tmp_path, monkeypatch):
    from sparsegnn.tune import autotune, decide, set_timer
    from sparsegnn.tune.store import reset_stores

    class Ranker:                                    # a cost model that prefers the last candidate
        def rank(self, stats, num_feats, elem_size, candidates):
            return list(reversed(range(len(candidates))))

    monkeypatch.setenv("SPARSEGNN_TUNE_CACHE", str(tmp_path))
    monkeypatch.setenv("SPARSEGNN_TUNE", "exhaustive")
    reset_stores()
    timed = []
    set_timer(lambda run, cfg: timed.append(cfg) or (0.5 if cfg["A"] == 2 else 1.0))
    try:
        g = _graph()
        cands = [{"A": 1}, {"A": 2}, {"A": 3}]
        args = ("toy", g, "cap", 16, torch.float32, "cpu", cands, lambda c: None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        monkeypatch.setattr(autotune, "load_model", lambda *_: None)
        assert decide(*args) == {"A": 1}             # no model: the heuristic
        monkeypatch.setattr(autotune, "load_model", lambda device=None: Ranker() if device == "cpu" else None)
        assert decide(*args) == {"A": 3}             # the model's zero-shot pick, the decision device's weights
        assert timed == []                           # nothing timed during capture
        assert autotune.lookup("toy", g, "cap", 16, torch.float32, "cpu") is None   # nor stored
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        assert decide(*args) == {"A": 2}             # decided properly once capture is over
        assert len(timed) == 3
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        assert decide(*args) == {"A": 2}             # and memoised
    finally:
        set_timer(None)
        reset_stores()


# ---------------------------------------------------------------- GPU: inductor
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["GCN", "GAT", "AGNN"])
def test_inductor_on_cuda_matches_eager(name):
    torch.manual_seed(0)
    graph, x = compile_case(200)
    graph, x = graph.to("cuda"), x.cuda()
    model = MODELS[name]().cuda()
    _inductor_matches_eager(model, x, graph, rtol=1e-4, atol=1e-5)
