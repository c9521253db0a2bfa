"""The CPU backend's per-call fast path: the prepared SpMM runner cached per graph, the tuner's
decision memoised on the graph, and the scalar-accumulator lane kernels' edge cases
(odd degrees, empty rows, infinities and NaNs), against float64 oracles."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.kernels import cpu as cpu_kernels
from sparsegnn.ops import _cpu

from conftest import DEVICE, GRAPH_CASES

pytestmark = pytest.mark.skipif(not cpu_kernels.numba_available(), reason="the CPU backend needs numba")

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _rel(out, ref):
    return float((out.detach().double() - ref).norm() / ref.norm().clamp_min(1e-30))


def _mixed():
    _, n, ei, _ = GRAPH_CASES[0]            # empty rows, self loops, duplicates, odd and even degrees
    return Graph.from_edge_index(ei, num_nodes=n), n


def _dense(g: Graph, w: torch.Tensor) -> torch.Tensor:
    return torch.zeros(g.num_nodes, g.num_src, dtype=torch.float64).index_put_(
        (g.row, g.col), w.double(), accumulate=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("width", [3, 8, 16, 24, 64, 100])     # 8 / 16 / 64: the exact-width kernels
@pytest.mark.parametrize("threads", [1, 2])
def test_runner_matches_the_float64_oracle(dtype, width, threads, monkeypatch):
    g, n = _mixed()
    monkeypatch.setattr(cpu_kernels, "parallel", lambda work: threads > 1)
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(n, width, generator=gen, dtype=torch.float64).to(dtype)
    w = (torch.rand(g.num_edges, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    bounds = cpu_kernels.chunk_bounds(g.rowptr, 5)
    a, ones = _dense(g, w), _dense(g, torch.ones(g.num_edges))
    deg = ones.sum(1, keepdim=True).clamp(min=1)
    for val, mean, ref in ((w, False, a @ x.double()), (None, False, ones @ x.double()),
                           (w, True, (a @ x.double()) / deg), (None, True, (ones @ x.double()) / deg)):
        run = cpu_kernels.spmm_sum_runner(bounds, g.rowptr, g.col, val, dtype, width, mean)
        out = run(x)
        assert out.dtype == dtype and out.shape == (n, width)
        assert _rel(out, ref) < TOL[dtype]
        assert torch.equal(out, cpu_kernels.spmm_sum(bounds, g.rowptr, g.col, val, x, mean=mean))
    for val in (w, None):
        expected, expected_arg = cpu_kernels.spmm_max(bounds, g.rowptr, g.col, val, x, with_arg=True)
        out, arg = cpu_kernels.spmm_max_runner(bounds, g.rowptr, g.col, val, dtype, width, True)(x)
        assert torch.equal(out, expected) and torch.equal(arg, expected_arg) and arg.dtype == expected_arg.dtype
        assert torch.equal(cpu_kernels.spmm_max_runner(bounds, g.rowptr, g.col, val, dtype, width)(x), expected)


def test_runner_outputs_are_fresh_tensors():
    g, n = _mixed()
    x = torch.randn(n, 16, requires_grad=True)
    run = cpu_kernels.spmm_sum_runner(cpu_kernels.chunk_bounds(g.rowptr, 4), g.rowptr, g.col, None, torch.float32, 16)
    first, second = run(x), run(x)
    assert not first.requires_grad and torch.equal(first, second)
    first.add_(1.0)                                   # writable, and not shared with the next result
    assert not torch.equal(first, second)
    assert first.data_ptr() != second.data_ptr()


@pytest.mark.parametrize("width", [16, 24])                  # the exact-width kernel and the general one
def test_runner_repeat_calls_and_strided_features_match_the_oracle(width):
    """After its first call the runner calls Numba's compiled entry directly (no type dispatch):
    later calls with new features, and features that are not contiguous (which take the
    dispatcher again), still equal the oracle."""
    g, n = _mixed()
    w = torch.rand(g.num_edges, dtype=torch.float64) + 0.5
    a = _dense(g, w)
    run = cpu_kernels.spmm_sum_runner(cpu_kernels.chunk_bounds(g.rowptr, 4), g.rowptr, g.col, w.float(),
                                      torch.float32, width)
    for seed in range(4):
        x = torch.randn(n, width, generator=torch.Generator().manual_seed(seed))
        if seed == 2:                                 # column-major storage: x.is_contiguous() is False
            x = x.t().contiguous().t()
            assert not x.is_contiguous()
        assert _rel(run(x), a @ x.double()) < TOL[torch.float32]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_cached_runner_follows_the_weights(reduce, monkeypatch):
    """The runner cached on the graph is rebuilt for other weights and after an in-place update."""
    monkeypatch.setattr(_cpu, "_decide", lambda *args, **kwargs: _cpu.NUMBA)
    g, n = _mixed()
    x = torch.randn(n, 16, dtype=torch.float64)
    ones = _dense(g, torch.ones(g.num_edges)).sum(1, keepdim=True).clamp(min=1)

    def expected(graph, w):
        if reduce == "max":
            return sg.spmm(graph, x, "max", edge_weight=w, backend="reference").double()
        return _dense(graph, w) @ x / (ones if reduce == "mean" else 1.0)

    w = torch.rand(g.num_edges, dtype=torch.float64) + 0.5
    for _ in range(2):
        assert _rel(sg.spmm(g, x, reduce, edge_weight=w, backend="cpu"), expected(g, w)) < 1e-10
    assert sum(1 for key in g.cache if isinstance(key, tuple) and key[0] == "cpu_runner") == 1
    with torch.no_grad():
        w.mul_(2.0)                                   # same tensor, new version
    assert _rel(sg.spmm(g, x, reduce, edge_weight=w, backend="cpu"), expected(g, w)) < 1e-10
    other = torch.rand(g.num_edges, dtype=torch.float64)
    assert _rel(sg.spmm(g, x, reduce, edge_weight=other, backend="cpu"), expected(g, other)) < 1e-10
    gw = g.with_values(torch.rand(g.num_edges, dtype=torch.float64))   # shares the structure's cache
    assert _rel(sg.spmm(gw, x, reduce, backend="cpu"), expected(gw, gw.edge_val)) < 1e-10


def test_gradients_through_the_fast_path(monkeypatch):
    monkeypatch.setattr(_cpu, "_decide", lambda *args, **kwargs: _cpu.NUMBA)
    g, n = _mixed()
    x = torch.randn(n, 24, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(g.num_edges, dtype=torch.float64) + 0.5).requires_grad_(True)
    out = sg.spmm(g, x, "mean", edge_weight=w, backend="cpu")
    ref_x, ref_w = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    ref = sg.spmm(g, ref_x, "mean", edge_weight=ref_w, backend="reference")
    grad = torch.randn_like(out)
    got, want = torch.autograd.grad(out, (x, w), grad), torch.autograd.grad(ref, (ref_x, ref_w), grad)
    assert _rel(out, ref.detach()) < 1e-10
    for a, b in zip(got, want):
        assert _rel(a, b) < 1e-10


def test_transient_graphs_cache_no_runner_or_decision():
    g, n = _mixed()
    t = Graph(g.rowptr, g.col, None, g.num_nodes, transient=True)
    x = torch.randn(n, 16)
    out = sg.spmm(t, x, backend="cpu")
    assert _rel(out, _dense(g, torch.ones(g.num_edges)) @ x.double()) < 1e-5
    assert not [key for key in t.cache if isinstance(key, tuple) and key[0] in ("cpu_runner", "cpu_plan", "call")]


def test_decision_is_memoised_on_the_graph_until_the_store_is_reset(monkeypatch):
    from sparsegnn import tune
    from sparsegnn.tune import store

    calls = []
    real = tune.decide

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(tune, "decide", counting)
    ei = torch.randint(0, 200, (2, 1500), generator=torch.Generator().manual_seed(4))
    g = Graph.from_edge_index(ei, num_nodes=200)
    x = torch.randn(200, 8)
    first = sg.spmm(g, x, backend="cpu")
    for _ in range(3):
        assert torch.allclose(sg.spmm(g, x, backend="cpu"), first, atol=1e-5)
    assert calls == [_cpu.DECISION_OP]
    store.reset_stores()
    sg.spmm(g, x, backend="cpu")
    assert calls == [_cpu.DECISION_OP, _cpu.DECISION_OP]


@pytest.mark.parametrize("width", [8, 16, 64])
def test_sum_and_max_propagate_infinities_and_nans_like_the_reference(width):
    """Odd and even degrees (the sum's edge pairs and its single-edge tail), empty rows."""
    g, n = _mixed()
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(n, width, generator=gen)
    x[1, 0], x[2, 1], x[3, 2] = float("inf"), float("-inf"), float("nan")
    w = torch.rand(g.num_edges, generator=gen) + 0.5
    bounds = cpu_kernels.chunk_bounds(g.rowptr, 3)
    msg = x.index_select(0, g.col) * w.unsqueeze(1)
    ref = torch.zeros(n, width).index_add_(0, g.row, msg)
    out = cpu_kernels.spmm_sum(bounds, g.rowptr, g.col, w, x)
    finite = ref.isfinite()
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.isposinf(), ref.isposinf()) and torch.equal(out.isneginf(), ref.isneginf())
    assert torch.allclose(out[finite], ref[finite], rtol=1e-5, atol=1e-5)
    peak = torch.full((n, width), -float("inf")).scatter_reduce(0, g.row.unsqueeze(1).expand_as(msg), msg, "amax")
    peak[g.rowptr.diff() == 0] = 0
    got = cpu_kernels.spmm_max(bounds, g.rowptr, g.col, w, x)
    clean = ~peak.isnan()         # rows with a NaN message left out (scatter_reduce's amax propagates it)
    assert torch.equal(got[clean], peak[clean])


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weights", ["none", "graph", "explicit"])
def test_repeat_calls_take_the_memoised_path_with_the_same_results_and_errors(reduce, weights, monkeypatch):
    """The second call of a signature skips the checks (``spmm_call`` memo) and gives what the
    first gave, gradients included; other shapes still go through them and fail as before."""
    import importlib

    spmm_module = importlib.import_module("sparsegnn.ops.spmm")
    taken = []
    real = spmm_module._memoised_linear
    monkeypatch.setattr(spmm_module, "_memoised_linear", lambda *a: taken.append(1) or real(*a))
    g, n = _mixed()
    weighted = weights != "none"
    values = torch.rand(g.num_edges, dtype=torch.float64) + 0.5
    if weights == "graph":
        g = g.with_values(values)
    given = values if weights == "explicit" else None
    w = values if weighted else torch.ones(g.num_edges, dtype=torch.float64)
    ones = _dense(g, torch.ones(g.num_edges)).sum(1, keepdim=True).clamp(min=1)
    x = torch.randn(n, 16, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(n, 16, dtype=torch.float64)
    ref = _dense(g, w) @ x.detach() / (ones if reduce == "mean" else 1.0)
    ref_grad = (_dense(g, w) / (ones if reduce == "mean" else 1.0)).T @ grad
    for call in range(3):
        taken.clear()
        out = sg.spmm(g, x, reduce, edge_weight=given)
        assert len(taken) == min(call, 1)         # the first call checks, later ones take the memo
        assert _rel(out, ref) < 1e-12
        (gx,) = torch.autograd.grad(out, x, grad)
        assert _rel(gx, ref_grad) < 1e-12
        with torch.no_grad():
            assert _rel(sg.spmm(g, x, reduce, edge_weight=given), ref) < 1e-12
        assert len(taken) == min(call, 1) + 1     # the no-grad call took it too
    with pytest.raises(ValueError, match=r"spmm\(\)"):
        sg.spmm(g, torch.randn(n + 1, 16, dtype=torch.float64), reduce, edge_weight=given)
    with pytest.raises(ValueError, match=r"spmm\(\): edge_weight has"):
        sg.spmm(g, x, reduce, edge_weight=values[1:])
    if weighted:                                 # values changed in place before the backward: caught
        out = sg.spmm(g, x, reduce, edge_weight=given)
        with torch.no_grad():
            values.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(out, x, grad)


def test_memoised_path_gives_learnable_graph_values_their_gradient():
    g, n = _mixed()
    w = (torch.rand(g.num_edges, dtype=torch.float64) + 0.5).requires_grad_(True)
    gw = g.with_values(w)
    x = torch.randn(n, 8, dtype=torch.float64)
    sg.spmm(gw, x)                               # memoises the signature
    out = sg.spmm(gw, x)
    (gw_grad,) = torch.autograd.grad(out.sum(), w)
    ref_w = w.detach().clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(sg.spmm(g, x, edge_weight=ref_w, backend="reference").sum(), ref_w)
    assert _rel(gw_grad, ref) < 1e-12


def test_graph_values_on_another_device_are_refused():
    """``with_values`` copies the checked-signature memo: values it accepts must be on the
    graph's device, or a memoised call would skip the device check."""
    g, _ = _mixed()
    with pytest.raises(ValueError, match=r"Graph.with_values\(\): edge_val must be on the graph's device"):
        g.with_values(torch.ones(g.num_edges, device="meta"))


def test_bound_spmm_keeps_one_entry_per_signature_across_store_resets():
    """The Triton path binds its config once per graph / variant / width / dtype / device and
    rebuilds that entry in place when the decision stores are reset (no entry per generation)."""
    from sparsegnn.tune import store

    g, n = _mixed()
    g = g.with_values(torch.rand(g.num_edges) + 0.5)
    ref = _dense(g, g.edge_val) @ torch.randn(n, 8, generator=torch.Generator().manual_seed(0)).double()
    g = g.to(DEVICE)
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    for _ in range(3):
        assert _rel(sg.spmm(g, x, backend="triton").cpu(), ref) < 1e-5
        store.reset_stores()
    assert sum(1 for k in g.cache if k[0] == "spmm_run") == 1


def test_bound_spmm_follows_values_swapped_through_data(monkeypatch):
    """``w.data = ...`` keeps the values tensor and its version but moves its storage: the
    bound launch holds the old address, so it is bound again, and the result follows."""
    from sparsegnn.ops import _triton

    g, n = _mixed()
    g = g.to(DEVICE).with_values(
        (torch.rand(g.num_edges, generator=torch.Generator().manual_seed(3)) + 0.5).to(DEVICE))
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    sg.spmm(g, x, backend="triton")
    binds = []
    bind = _triton._bound_spmm
    monkeypatch.setattr(_triton, "_bound_spmm", lambda *a: binds.append(1) or bind(*a))
    sg.spmm(g, x, backend="triton")
    assert binds == []                               # a repeat call: the bound launch
    version = g.edge_val._version
    g.edge_val.data = g.edge_val.data * 2
    assert g.edge_val._version == version
    out = sg.spmm(g, x, backend="triton")
    assert binds == [1]
    assert _rel(out.cpu(), _dense(g.to("cpu"), g.edge_val.cpu()) @ x.cpu().double()) < 1e-5


def test_backward_spmm_binds_the_permuted_values_once():
    """The backward's ``A^T dY`` reads the graph's values permuted once per version: its launch
    is bound like the forward's (one entry on the transpose, reused every step), stays exact,
    and is rebuilt after an in-place update of the values."""
    g, n = _mixed()
    g = g.with_values(torch.rand(g.num_edges, dtype=torch.float64) + 0.5).to(DEVICE)
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(n, 8, generator=gen, dtype=torch.float64)
    dy = torch.randn(n, 8, generator=gen, dtype=torch.float64)
    for step in range(3):
        if step == 2:
            with torch.no_grad():
                g.edge_val.mul_(2.0)         # a version bump: the permuted copy must follow
        x = x0.to(DEVICE).float().requires_grad_()
        sg.spmm(g, x, backend="triton").backward(dy.to(DEVICE).float())
        want = _dense(g.to("cpu"), g.edge_val.cpu()).t() @ dy
        assert _rel(x.grad.cpu(), want) < 1e-5, step
    entries = [k for k in g.t().cache if k[0] == "spmm_run"]
    assert len(entries) == 1 and entries[0][1][-1] is True
