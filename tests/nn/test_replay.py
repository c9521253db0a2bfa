"""The reference models' forward / backward replayed from CUDA graphs (``sparsegnn.nn.replay``):
same outputs and gradients as the eager model, fresh draws of dropout, and an eager fallback (or
an error) wherever a replay would read stale memory.  The replay itself needs CUDA; the API and
the CPU behaviour are checked everywhere."""
import contextlib
import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.datasets import random_graph
from sparsegnn.nn.replay import Replay, replay_state

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")

MODELS = {
    "gcn": lambda f, c, **kw: sg.nn.GCN(f, c, dropout=0.0, **kw),
    "sage": lambda f, c, **kw: sg.nn.GraphSAGE(f, c, hidden=32, num_layers=2, dropout=0.0, **kw),
    "gin": lambda f, c, **kw: sg.nn.GIN(f, c, hidden=32, num_layers=2, dropout=0.0, **kw),
    "gat": lambda f, c, **kw: sg.nn.GAT(f, c, hidden=4, heads=2, dropout=0.0, **kw),
    "agnn": lambda f, c, **kw: sg.nn.AGNN(f, c, hidden=16, num_layers=3, dropout=0.0, **kw),
    # MaxK's CBSR path (selection, LayerNorm fused into the next selection, CBSR aggregation and
    # root term) and the ReLU twin of the same structure
    "maxk-sage": lambda f, c, **kw: sg.nn.MaxKGNN(f, c, conv="sage", hidden=32, num_layers=2, k=8, dropout=0.0, **kw),
    "maxk-gcn": lambda f, c, **kw: sg.nn.MaxKGNN(f, c, conv="gcn", hidden=32, num_layers=2, k=8, dropout=0.0, **kw),
    "maxk-gin": lambda f, c, **kw: sg.nn.MaxKGNN(f, c, conv="gin", hidden=32, num_layers=2, k=4, dropout=0.0, **kw),
    "maxk-relu": lambda f, c, **kw: sg.nn.MaxKGNN(f, c, conv="sage", hidden=32, num_layers=2, dropout=0.0,
                                                  nonlinearity="relu", **kw),
}


def _graph(device):
    ei, _ = random_graph(60, 300, seed=3, num_isolated=3, num_empty_rows=4, num_self_loops=5, num_duplicates=6)
    return Graph.from_edge_index(ei, num_nodes=60).to(device)


def _pair(name, device, seed=0):
    torch.manual_seed(seed)
    model = MODELS[name](12, 5).to(device)
    ref = copy.deepcopy(model)
    ref.replay = False
    return model, ref


def _step(model, x, g, w):
    out = model(x, g)
    (out * w).sum().backward()
    return out.detach().clone()


def _cuda_pair(name):
    """(model, eager copy, graph, x, w) on the GPU."""
    model, ref = _pair(name, "cuda")
    return model, ref, _graph("cuda"), torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda")


def _steps(models, x, g, w, n):
    for _ in range(n):
        for m in models:
            _step(m, x, g, w)


def test_replay_mode_is_checked_and_copies_start_afresh():
    with pytest.raises(ValueError, match=r"replay\(\): mode"):
        Replay("yes")
    model = sg.nn.GCN(8, 3, replay=False)
    assert model.replay is False
    assert copy.deepcopy(model).replay is False and pickle.loads(pickle.dumps(model)).replay is False
    assert replay_state(model) == "off" and replay_state(torch.nn.Linear(2, 2)) == "none"
    model.replay = None
    assert model.replay is None and not model._replay.recorded and replay_state(model) == "waiting"
    assert sorted(model.state_dict()) == ["conv1.bias", "conv1.lin.weight", "conv2.bias", "conv2.lin.weight"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cpu_models_run_eagerly(name):
    g = _graph("cpu")
    model, ref = _pair(name, "cpu")
    x = torch.randn(60, 12)
    for _ in range(4):
        assert torch.equal(model(x, g), ref(x, g))
    assert not model._replay.recorded


@cuda
@pytest.mark.parametrize("name", sorted(MODELS))
def test_replay_matches_eager_through_training_steps(name):
    """Four optimiser steps (the parameters change in place between replays): outputs and
    every gradient equal the eager model's, and the forward was recorded on the third call."""
    g = _graph("cuda")
    model, ref = _pair(name, "cuda")
    x = torch.randn(60, 12, device="cuda")
    w = torch.randn(60, 5, device="cuda") * 0.01           # small steps: GIN's sums stay finite
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (model, ref)]
    for step in range(5):
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        out, want = _step(model, x, g, w), _step(ref, x, g, w)
        assert out.isfinite().all()
        assert torch.allclose(out, want, rtol=1e-4, atol=1e-5), (name, step)
        for (pn, p), q in zip(model.named_parameters(), ref.parameters()):
            assert (p.grad is None) == (q.grad is None), pn
            if p.grad is not None:
                assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5), (name, step, pn)
        for opt in opts:
            opt.step()
    assert model._replay.recorded, model._replay.failed
    assert model._replay.rec.generation == 3 and replay_state(model) == "recorded, 3 replays"


@cuda
@pytest.mark.parametrize("name", ["sage", "maxk-gin-dense"])
def test_a_graph_that_falls_due_for_investment_during_the_recording_records(monkeypatch, name):
    """The amortisation rule says "invest now" on a call inside the recording or the warm-up
    before it (syncs forbidden there): the recording still succeeds (investing reads sizes back
    to the host, so it waits for an eager call).  MaxK GIN with 4 k > hidden aggregates through
    the dense SpMM, which consults the rule."""
    from sparsegnn.tune import reuse

    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    monkeypatch.setattr(reuse, "investment_ms", lambda edges: 0.0 if reuse.syncs_forbidden() else float("inf"))
    monkeypatch.setattr(reuse, "investing", contextlib.nullcontext)     # no investment before recording
    model, ref = _invest_pair(name)
    g, x, w = _graph("cuda"), torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda")
    for _ in range(4):
        out, want = _step(model, x, g, w), _step(ref, x, g, w)
        assert torch.allclose(out, want, rtol=1e-4, atol=1e-5)
    assert model._replay.recorded, model._replay.failed
    assert reuse.calls(g) > 0 and not reuse.invested(g)


def _invest_pair(name):
    if name == "sage":
        return _pair(name, "cuda")
    torch.manual_seed(0)
    model = sg.nn.MaxKGNN(12, 5, conv="gin", hidden=32, num_layers=2, k=16, dropout=0.0).cuda()
    ref = copy.deepcopy(model)
    ref.replay = False
    return model, ref


@cuda
@pytest.mark.parametrize("policy", ["auto", "never"])
@pytest.mark.parametrize("name", ["sage", "maxk-gin-dense"])
def test_a_recording_invests_in_its_graphs_before_it_captures(monkeypatch, name, policy):
    """Three calls with one signature prove reuse, and a replay keeps the kernels it captures:
    the graphs are invested in (an eager forward and backward under ``reuse.investing``) on the
    recording call, before the capture, so it captures tuned kernels; under ``never`` nothing is
    invested, no investing step runs, and the recording still succeeds.  The replayed steps
    match eager ones either way."""
    from sparsegnn.tune import reuse

    monkeypatch.setenv("SPARSEGNN_INVEST", policy)
    entered, investing = [], reuse.investing

    def counted():
        entered.append(model._replay.rec is None)          # entered before anything is captured
        return investing()

    monkeypatch.setattr(reuse, "investing", counted)
    model, ref = _invest_pair(name)
    g, x, w = _graph("cuda"), torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda")
    for step in range(5):
        out = _step(model, x, g, w)
        assert reuse.invested(g) is (policy == "auto" and step >= 2)    # the third call records
        assert torch.allclose(out, _step(ref, x, g, w), rtol=1e-4, atol=1e-5)
    assert model._replay.recorded, model._replay.failed
    assert entered == ([True, True] if policy == "auto" else [])     # a second pass: the first invested
    assert ("plan" in g.cache) is (policy == "auto")


@cuda
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_a_precision_model_records_its_timed_pick(monkeypatch, precision):
    """A precision mode picks between the exact and the tensor-core kernels on the call after
    the graph is invested in: that call is the recording's second investing pass (eager, timed),
    not its warm-up, where syncs raise and a timing would fail the recording."""
    from sparsegnn.tune import reuse

    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    torch.manual_seed(0)
    model = sg.nn.GCN(12, 5, dropout=0.0, precision=precision).cuda()
    ref = copy.deepcopy(model)
    ref.replay = False
    g, x, w = _graph("cuda"), torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda")
    tol = 2e-2 if precision == "bf16" else 5e-3
    reuse.reset_reuse_counts()
    for _ in range(5):
        out, want = _step(model, x, g, w), _step(ref, x, g, w)
        assert torch.allclose(out, want, rtol=tol, atol=tol)
    assert model._replay.recorded and model._replay.failed is None
    # the GCN normalises a graph with self loops of its own: that one is invested in
    counts = reuse.reuse_counts()
    assert counts["invested"] >= 1 and counts["plans"] >= 1


@cuda
def test_buffers_are_restored_when_the_recording_is_refused():
    """Over budget, the investing and warm-up calls' updates of BatchNorm's running statistics
    are undone: the refused call updates them once, as an eager call does."""
    model, ref, g, x, w = _cuda_pair("gcn")
    for m in (model, ref):
        m.norm = torch.nn.BatchNorm1d(5).cuda()
        m._forward = (lambda base, m: lambda x, g: m.norm(base(x, g)))(m._forward, m)
    model._replay = Replay(None, budget=0)
    _steps((model, ref), x, g, w, 4)
    assert replay_state(model) == "refused"
    assert int(model.norm.num_batches_tracked) == int(ref.norm.num_batches_tracked) == 4
    assert torch.allclose(model.norm.running_mean, ref.norm.running_mean, rtol=1e-5, atol=1e-6)


@cuda
def test_gradients_accumulate_across_replays():
    """No zero_grad between two steps: the gradients add up (a replay returns fresh tensors,
    not the graph's buffers that the next replay overwrites)."""
    model, ref, g, x, w = _cuda_pair("gcn")
    _steps((model, ref), x, g, w, 5)
    assert model._replay.recorded
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)


@cuda
@pytest.mark.parametrize("mixed", [False, True])
def test_gradients_are_fresh_copies_that_the_next_replay_leaves_alone(mixed):
    """Each replayed backward hands out fresh gradient tensors (also for a model whose
    parameters differ in dtype): the same values as eager, and the gradients a user keeps from
    one step are not overwritten by the next replay."""
    model, ref, g, x, w = _cuda_pair("gcn")
    if mixed:
        for m in (model, ref):
            m.extra = torch.nn.Parameter(torch.ones((), device="cuda", dtype=torch.float64))
            m._forward = (lambda base, m: lambda x, g: base(x, g) * m.extra.float())(m._forward, m)
    kept = []
    for _ in range(5):
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        _step(model, x, g, w)
        _step(ref, x, g, w)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)
        kept.append([(p.grad, p.grad.clone()) for p in model.parameters()])
        w = w * 1.5                     # a new dY: the next step's gradients differ
    rec = model._replay.rec
    assert rec is not None and rec.generation == 3
    static = {t.untyped_storage().data_ptr() for t in rec.grads}
    assert not static & {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    for step in kept:
        for grad, copy_ in step:
            assert torch.equal(grad, copy_)


@cuda
def test_no_replay_under_functorch_transforms():
    """A call inside ``torch.func.grad`` never takes the replay (its tensors are functorch's)."""
    model, _, g, x, w = _cuda_pair("gcn")
    seen = []

    def f(xx):
        seen.append(model._replay._active(model, x))
        return xx.sum()

    torch.func.grad(f)(x)
    assert seen == [False] and model._replay._active(model, x)


@cuda
def test_a_call_on_a_side_stream_runs_eagerly():
    model, _, g, x, w = _cuda_pair("gcn")
    _steps((model,), x, g, w, 4)
    gen = model._replay.rec.generation
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _step(model, x, g, w)
    torch.cuda.current_stream().wait_stream(side)
    assert model._replay.rec.generation == gen
    _step(model, x, g, w)
    assert model._replay.rec.generation == gen + 1


@cuda
@pytest.mark.parametrize("name", ["gcn", "maxk-sage"])
def test_dropout_draws_new_masks_on_every_replay(name):
    """Dense dropout (GCN) and MaxK's dropout on the kept values."""
    g = _graph("cuda")
    torch.manual_seed(0)
    model = (sg.nn.GCN(12, 5, dropout=0.5) if name == "gcn"
             else sg.nn.MaxKGNN(12, 5, conv="sage", hidden=32, num_layers=2, k=8, dropout=0.5)).cuda()
    x = torch.randn(60, 12, device="cuda")
    outs = [_step(model, x, g, torch.ones(60, 5, device="cuda")) for _ in range(5)]
    assert model._replay.recorded
    assert not torch.equal(outs[3], outs[4]) and not torch.equal(outs[2], outs[3])


@cuda
def test_a_second_forward_before_the_backward_runs_eagerly():
    """Two forwards, then one backward through both: the second may not overwrite the first's
    recorded activations, so it runs eagerly; outputs and gradients stay exact."""
    model, ref, g, x, w = _cuda_pair("sage")
    _steps((model, ref), x, g, w, 3)
    for m in (model, ref):
        m.zero_grad(set_to_none=True)
    gen = model._replay.rec.generation
    a1, a2 = model(x, g), model(x, g)
    assert model._replay.rec.generation == gen + 1       # the first replayed, the second did not
    b1, b2 = ref(x, g), ref(x, g)
    (a1 * w + a2 * w * 2).sum().backward()
    (b1 * w + b2 * w * 2).sum().backward()
    assert torch.allclose(a1, b1, rtol=1e-4, atol=1e-5) and torch.allclose(a2, b2, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)


@cuda
def test_the_backward_of_an_overwritten_forward_raises():
    model, _, g, x, w = _cuda_pair("gcn")
    _steps((model,), x, g, w, 3)
    loss = (model(x, g) * w).sum()
    loss.backward(retain_graph=True)
    _step(model, x, g, w)                                 # a new replay overwrites the activations
    with pytest.raises(RuntimeError, match="overwritten"):
        loss.backward()


@cuda
def test_what_a_recording_depends_on_falls_back_or_re_records():
    """A new x, a replaced parameter, a hook, eval mode, no_grad and an in-place change of the
    graph's values each give the eager result (a changed signature warms up and records anew)."""
    g = _graph("cuda")
    g = g.with_values(torch.rand(g.num_edges, device="cuda") + 0.5)
    model, ref = _pair("gcn", "cuda")
    x, w = torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda")

    def check(xx):
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        assert torch.allclose(_step(model, xx, g, w), _step(ref, xx, g, w), rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)

    for _ in range(3):
        check(x)
    first = model._replay.rec
    check(x.clone())                                      # another x: eager
    assert model._replay.rec is first
    with torch.no_grad():
        g.edge_val.mul_(1.5)                              # in-place values: a new signature
    for _ in range(3):
        check(x)
    assert model._replay.rec is not first and model._replay.rec.generation == 1
    handle = model.conv1.register_forward_hook(lambda *a: None)
    gen = model._replay.rec.generation
    check(x)
    assert model._replay.rec.generation == gen            # hooked: eager
    handle.remove()
    model.eval(), ref.eval()
    with torch.no_grad():
        assert torch.allclose(model(x, g), ref(x, g), rtol=1e-4, atol=1e-5)
    model.train(), ref.train()
    assert model._replay.rec.generation == gen            # eval / no_grad: eager
    model.conv2.lin.weight = torch.nn.Parameter(ref.conv2.lin.weight.detach().clone())
    check(x)
    assert not model._replay.recorded                     # a replaced parameter: eager, recording dropped


def test_deterministic_mode_is_part_of_the_signature():
    """The ops pick other schedules under ``torch.use_deterministic_algorithms`` (no atomics):
    a recording made without it must not replay with it, so the mode is one of the settings."""
    import weakref

    from sparsegnn.nn.replay import _model_state

    model = sg.nn.GCN(8, 3)
    before = _model_state(model, weakref.WeakKeyDictionary())
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(not was)
    try:
        after = _model_state(model, weakref.WeakKeyDictionary())
    finally:
        torch.use_deterministic_algorithms(was)
    assert before[0] == after[0] and before[1] != after[1]
    assert _model_state(model, weakref.WeakKeyDictionary())[1] == before[1]


def test_the_default_budget_is_a_share_of_the_device_memory(monkeypatch):
    """Auto mode replays forwards up to 1/64 of the device's memory, never less than 512 MiB;
    a budget given is checked."""
    from types import SimpleNamespace

    from sparsegnn.nn import replay

    for total, want in ((141 << 30, (141 << 30) // 64), (80 << 30, (80 << 30) // 64), (16 << 30, 512 << 20)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, t=total: SimpleNamespace(total_memory=t))
        assert replay.default_budget(torch.device("cuda", 0)) == want
    assert Replay().budget is None and Replay(budget=1 << 20).budget == 1 << 20
    for bad in (-1, True):
        with pytest.raises(ValueError, match="budget"):
            Replay(budget=bad)


@cuda
def test_over_budget_signatures_are_not_recorded():
    model, _, g, x, w = _cuda_pair("gcn")
    model._replay = Replay(None, budget=0)
    _steps((model,), x, g, w, 5)
    assert not model._replay.recorded and replay_state(model) == "refused"
    model._replay = Replay(True, budget=0)                # True: any size
    _steps((model,), x, g, w, 3)
    assert model._replay.recorded


@cuda
def test_a_whole_step_capture_records_the_model_only_once():
    """CapturedStep warms up on a side stream and captures the step itself: the model's own
    replay stays out of it, and the captured step trains."""
    from sparsegnn.capture import CapturedStep

    g = _graph("cuda")
    torch.manual_seed(0)
    model = sg.nn.GCN(12, 5, dropout=0.0).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)
    x, y = torch.randn(60, 12, device="cuda"), torch.randint(0, 5, (60,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, g), y)
        loss.backward()
        opt.step()
        return loss

    captured = CapturedStep(step, warmup=3, optimizer=opt, inputs=(x, y))
    losses = [float(captured()) for _ in range(30)]
    assert not model._replay.recorded and captured.captured
    assert losses[-1] < losses[0]


class _Plain(torch.nn.Module):
    """A hand-written model: forward(x, graph, scale=...)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(12, 5)

    def forward(self, x, graph, scale=1.0):
        return sg.spmm(graph, self.lin(x)) * scale


class _SyncsWhenCaptured(torch.nn.Module):
    """Runs eagerly, but a capture of its forward fails (a host sync only while capturing)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(12, 5)

    def forward(self, x, graph):
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.current_stream().synchronize()
        return F.dropout(sg.spmm(graph, self.lin(x)), 0.5, self.training)


@cuda
def test_a_failed_recording_leaves_dropout_working_in_the_eager_fallback():
    """The capture fails inside ``capture_end``, which left torch's generator marked as
    capturing: the eager fallback's dropout then raised "Offset increment outside graph capture"."""
    from sparsegnn.nn.replay import enable_replay

    g, x = _graph("cuda"), torch.randn(60, 12, device="cuda")
    model = enable_replay(_SyncsWhenCaptured().cuda())
    with pytest.warns(RuntimeWarning, match="recording the forward as a CUDA graph failed"):
        for _ in range(4):
            model(x, g).sum().backward()
    assert replay_state(model).startswith("failed")
    out = model(x, g)                                     # eager, with a fresh dropout mask
    assert out.shape == (60, 5) and bool(out.isfinite().all())
    assert torch.rand(3, device="cuda").shape == (3,)
    # and the thread is back on its stream: a model wrapped afterwards records as usual
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    plain = enable_replay(_Plain().cuda())
    for _ in range(3):
        plain(x, g).sum().backward()
    assert plain.forward.state.recorded, plain.forward.state.failed


def test_enable_replay_wraps_any_module_and_survives_copies():
    from sparsegnn.nn.replay import ReplayedForward, enable_replay

    g, x = _graph("cpu"), torch.randn(60, 12)
    model = _Plain()
    want = model(x, g, scale=2.0)
    assert enable_replay(model) is model and isinstance(model.__dict__["forward"], ReplayedForward)
    assert torch.equal(model(x, g, scale=2.0), want)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert other.forward.module is other and not other.forward.state.recorded
        assert torch.allclose(other(x, g, scale=2.0), want)
    enable_replay(model, False)
    assert "forward" not in model.__dict__ and torch.equal(model(x, g, scale=2.0), want)
    with pytest.raises(ValueError, match=r"enable_replay\(\): mode"):
        enable_replay(model, "on")


@cuda
def test_a_wrapped_module_with_keyword_arguments_replays_exactly():
    """A hand-written forward with a plain keyword: replayed after two calls, equal to eager;
    another keyword value is another signature (eager until it is recorded in turn)."""
    from sparsegnn.nn.replay import enable_replay

    g = _graph("cuda")
    torch.manual_seed(0)
    model = _Plain().cuda()
    ref = copy.deepcopy(model)
    enable_replay(model)
    x, w = torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda")
    for scale in (2.0, 2.0, 2.0, 3.0, 2.0):
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        a, b = model(x, g, scale=scale), ref(x, g, scale=scale)
        (a * w).sum().backward()
        (b * w).sum().backward()
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    assert model.forward.state.recorded, model.forward.state.failed
    assert model.forward.state.rec.generation == 2


@cuda
@pytest.mark.parametrize("name", ["gcn", "sage", "gin", "gat"])
def test_accelerated_pyg_models_replay_like_ours(name):
    """PyG's models converted by accelerate replay (edge_index input): same outputs and
    gradients as the converted model without replay."""
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    g = _graph("cuda")
    ei = g.edge_index().contiguous()
    torch.manual_seed(0)
    cls = {"gcn": pyg_nn.GCN, "sage": pyg_nn.GraphSAGE, "gin": pyg_nn.GIN, "gat": pyg_nn.GAT}[name]
    pyg = cls(12, 16, num_layers=2, out_channels=5).cuda()
    model = sg.nn.accelerate(pyg)
    ref = sg.nn.accelerate(pyg, replay=False)
    assert isinstance(model.__dict__.get("forward"), sg.nn.replay.ReplayedForward)
    assert "forward" not in ref.__dict__
    x, w = torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda") * 0.01
    for _ in range(4):
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        a, b = model(x, ei), ref(x, ei)
        (a * w).sum().backward()
        (b * w).sum().backward()
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert (p.grad is None) == (q.grad is None)
            if p.grad is not None:
                assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert model.forward.state.recorded, model.forward.state.failed


@cuda
def test_a_loop_that_keeps_the_last_output_alive_records():
    """``out = model(x, g)`` in a loop keeps the previous step's autograd graph alive (and with
    it the parameters' gradient accumulators on the default stream) while the next call records:
    the recording must not reach into that stream, and dropout keeps drawing on the default
    generator afterwards."""
    g = _graph("cuda")
    torch.manual_seed(0)
    model = sg.nn.GCN(12, 5, dropout=0.5).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(60, 12, device="cuda"), torch.randint(0, 5, (60,), device="cuda")
    out = None
    for _ in range(6):
        opt.zero_grad()
        out = model(x, g)
        F.cross_entropy(out, y).backward()
        opt.step()
    assert model._replay.recorded, model._replay.failed
    assert torch.rand(4, device="cuda").isfinite().all() and out.isfinite().all()


@cuda
def test_settings_parameters_and_moves_change_the_signature():
    """A module's plain setting (dropout rate, a submodule's train/eval flag), a parameter's
    requires_grad and an in-place change of x: each is honoured (eager or re-recorded, never
    the stale recording); moving the model drops its recording."""
    model, ref, g, x, w = _cuda_pair("gcn")

    def check():
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        return _step(model, x, g, w), _step(ref, x, g, w)

    for _ in range(3):
        check()
    gen = model._replay.rec.generation
    x.mul_(2.0)                                           # the features in place: read by the replay
    a, b = check()
    assert model._replay.rec.generation == gen + 1 and torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    model.dropout = ref.dropout = 0.9
    a, _ = check()
    assert model._replay.rec.generation == gen + 1        # a new setting: eager, so dropout 0.9 applies
    assert (a == 0).float().mean() < 1.0
    model.dropout = ref.dropout = 0.0
    model.conv1.bias.requires_grad_(False)
    ref.conv1.bias.requires_grad_(False)
    a, b = check()
    assert model._replay.rec.generation == gen + 1 and model.conv1.bias.grad is None
    assert torch.allclose(model.conv1.lin.weight.grad, ref.conv1.lin.weight.grad, rtol=1e-4, atol=1e-5)
    model.conv1.bias.requires_grad_(True)
    ref.conv1.bias.requires_grad_(True)
    model.conv2.eval(), ref.conv2.eval()
    check()
    assert model._replay.rec.generation == gen + 1        # a submodule's mode: eager
    model.conv2.train(), ref.conv2.train()
    check()
    assert model._replay.rec.generation == gen + 2        # back to the recorded signature
    model.cuda()
    assert not model._replay.recorded


class _Shifted(sg.nn.GCN):
    """A subclass whose forward adds to the replayed forward."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.shift = torch.nn.Parameter(torch.ones(5))

    def forward(self, x, graph):
        return super().forward(x, graph) + self.shift


@cuda
def test_a_subclass_forward_runs_once_around_the_replay():
    torch.manual_seed(0)
    model = _Shifted(12, 5, dropout=0.0).cuda()
    ref = copy.deepcopy(model)
    ref.replay = False
    g, x, w = _graph("cuda"), torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda")
    for _ in range(4):
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        assert torch.allclose(_step(model, x, g, w), _step(ref, x, g, w), rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert model._replay.recorded, model._replay.failed


@cuda
def test_double_backward_raises_a_clear_error():
    model, _, g, x, w = _cuda_pair("gcn")
    _steps((model,), x, g, w, 3)
    loss = (model(x, g) * w).sum()
    with pytest.raises(RuntimeError, match="replay=False"):
        torch.autograd.grad(loss, list(model.parameters()), create_graph=True)


@cuda
def test_a_recorded_edge_index_graph_outlives_the_graph_cache():
    """accelerate's layers build their Graph from edge_index through a process-wide cache; the
    recording keeps the Graphs it read, so clearing the cache (or evicting them) between steps
    leaves the replay exact.  An inference-mode edge_index runs eagerly."""
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    from sparsegnn.nn import _graph_input

    g = _graph("cuda")
    ei = g.edge_index().contiguous()
    torch.manual_seed(0)
    pyg = pyg_nn.GCN(12, 16, num_layers=2, out_channels=5).cuda()
    model, ref = sg.nn.accelerate(pyg), sg.nn.accelerate(pyg, replay=False)
    x, w = torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda")
    for step in range(6):
        if step >= 3:
            _graph_input.clear_graph_cache()
            torch.randn(1 << 20, device="cuda")       # reuse freed memory, if any
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        a, b = model(x, ei), ref(x, ei)
        (a * w).sum().backward()
        (b * w).sum().backward()
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), step
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5), step
    assert model.forward.state.rec.generation == 4
    with torch.inference_mode():
        frozen = ei.clone()
    assert torch.allclose(model(x, frozen), ref(x, frozen), rtol=1e-4, atol=1e-5)
    assert model.forward.state.rec.generation == 4


def test_the_model_state_sees_hooks_settings_and_tied_parameters():
    """What a recording is keyed on besides its arguments (CPU: no CUDA needed to build it):
    every parameter once (tied ones too), None under any module hook or global hook, and a
    different settings tuple after a dropout rate, a submodule's mode or the TF32 flag changes."""
    import weakref

    from sparsegnn.nn.replay import _model_state

    model = sg.nn.GraphSAGE(12, 5, hidden=16, num_layers=2)
    watched = weakref.WeakKeyDictionary()
    params, settings = _model_state(model, watched)
    assert params == tuple(model.parameters())
    model.dropout = 0.25
    assert _model_state(model, watched)[1] != settings
    model.dropout = 0.5
    assert _model_state(model, watched)[1] == settings
    model.norms[0].eval()
    assert _model_state(model, watched)[1] != settings
    model.norms[0].train()
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not old
        assert _model_state(model, watched)[1] != settings
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    handle = model.convs[0].register_forward_pre_hook(lambda *a: None)
    assert _model_state(model, watched) is None
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert _model_state(model, watched) is None
    finally:
        handle.remove()
    tied = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    tied[1].weight = tied[0].weight
    assert len(_model_state(tied, weakref.WeakKeyDictionary())[0]) == 3   # shared weight once


def test_enable_replay_does_not_stack_and_restores_an_override():
    from sparsegnn.nn.replay import ReplayedForward, enable_replay

    model = _Plain()
    custom = lambda x, graph, scale=1.0: model.lin(x) * scale  # noqa: E731 - an instance override
    model.forward = custom
    enable_replay(model)
    enable_replay(model, True)
    wrapper = model.__dict__["forward"]
    assert isinstance(wrapper, ReplayedForward) and wrapper.forward is custom and wrapper.state.mode is True
    enable_replay(model, False)
    assert model.__dict__["forward"] is custom


@cuda
def test_recordings_and_captured_steps_keep_no_memory_per_model():
    """Replay recordings and captured steps run their side work on the library's one side stream
    per device: a new stream per recording kept a cuBLAS workspace (32 MB on the H100) until the
    process ended, so CUDA memory grew with every recorded model (64 MB a benchmark case)."""
    import gc

    from sparsegnn._streams import side_stream
    from sparsegnn.capture import CapturedStep

    assert side_stream() is side_stream()

    def record_and_capture():
        model, _, g, x, w = _cuda_pair("gcn")
        _steps([model], x, g, w, 4)
        assert model._replay.recorded
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            opt.zero_grad(set_to_none=False)
            loss = (model(x, g) * w).sum()
            loss.backward()
            opt.step()
            return loss

        captured = CapturedStep(step, warmup=2, optimizer=opt)
        for _ in range(3):
            captured()
        assert captured.captured

    def allocated():
        gc.collect()
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    record_and_capture()                  # the first: workspaces and streams made once
    before = allocated()
    for _ in range(3):
        record_and_capture()
    assert allocated() - before < 8 * 2 ** 20


@cuda
def test_inputs_that_never_repeat_make_auto_mode_give_up():
    """A new graph every call (a DataLoader's batches): after CHURN_LIMIT calls in a row with a
    new signature, auto mode stops computing signatures; a graph then repeated is not recorded;
    setting replay again starts afresh and records it."""
    from sparsegnn.nn.replay import CHURN_LIMIT

    torch.manual_seed(0)
    model = MODELS["gcn"](12, 5).cuda()
    graphs = [Graph.from_edge_index(random_graph(60, 300, seed=s)[0], num_nodes=60).to("cuda")
              for s in range(CHURN_LIMIT + 1)]
    x, w = torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda")
    for g in graphs[:CHURN_LIMIT - 1]:
        _step(model, x, g, w)
    assert replay_state(model) == "waiting"
    _step(model, x, graphs[CHURN_LIMIT - 1], w)
    assert replay_state(model) == "gave up: inputs never repeat"
    _steps([model], x, graphs[-1], w, 4)
    assert not model._replay.recorded
    model.replay = None
    _steps([model], x, graphs[-1], w, 4)
    assert model._replay.recorded



@cuda
def test_turning_deterministic_mode_on_after_a_recording_runs_deterministic_kernels():
    """A model recorded with atomic schedules (MaxK's outer-product backward) runs eagerly once
    deterministic mode is on, is recorded again after two calls, and then gives the same
    gradients on every replay."""
    model, ref = _pair("maxk-gin", "cuda")
    g, x, w = _graph("cuda"), torch.randn(60, 12, device="cuda"), torch.randn(60, 5, device="cuda")
    _steps((model,), x, g, w, 4)
    first = model._replay.rec
    assert first is not None
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        grads = []
        for _ in range(5):
            model.zero_grad(set_to_none=True)
            _step(model, x, g, w)
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        assert model._replay.rec is not None and model._replay.rec is not first
        for later in grads[3:]:                       # the new recording's replays
            assert all(torch.equal(a, b) for a, b in zip(grads[2], later))
    finally:
        torch.use_deterministic_algorithms(False)
