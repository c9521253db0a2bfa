"""``spmm``'s shortest path: an eager no-grad call on an invested graph goes straight to the
launch an earlier call bound (``ops._triton.bound_call``).  Checked against float64 oracles,
and that everything the full path decides still decides: checks, gradients, backends, values,
store resets, deterministic mode, the investment counts."""
import importlib

import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.ops import _triton
from sparsegnn.tune import reuse, store

from conftest import DEVICE, GRAPH_CASES

spmm_module = importlib.import_module("sparsegnn.ops.spmm")


def _rel(out, ref):
    return float((out.detach().cpu().double() - ref).norm() / ref.norm().clamp_min(1e-30))


def _oracle(g: Graph, x: torch.Tensor, reduce: str) -> torch.Tensor:
    """float64 ``reduce_{j -> i} w_ji x_j`` by dense masks (0 for rows without edges)."""
    row, col = g.row.cpu(), g.col.cpu()
    w = torch.ones(g.num_edges, dtype=torch.float64) if g.edge_val is None else g.edge_val.detach().cpu().double()
    msg = w[:, None] * x.detach().cpu().double()[col]
    if reduce == "max":
        return torch.zeros(g.num_nodes, x.shape[1], dtype=torch.float64).scatter_reduce_(
            0, row[:, None].expand_as(msg), msg, "amax", include_self=False)
    out = torch.zeros(g.num_nodes, x.shape[1], dtype=torch.float64).index_add_(0, row, msg)
    if reduce == "mean":
        out = out / torch.bincount(row, minlength=g.num_nodes).clamp(min=1)[:, None]
    return out


def _graph(weighted: bool, case: int = 0) -> Graph:
    _, n, ei, _ = GRAPH_CASES[case]      # empty rows, self loops, duplicates, odd and even degrees
    g = Graph.from_edge_index(ei, num_nodes=n)
    if weighted:
        g = g.with_values(torch.rand(g.num_edges, generator=torch.Generator().manual_seed(1)) + 0.5)
    return g.to(DEVICE)


def _launches_taken(monkeypatch) -> list:
    """Records the calls that ``spmm`` ran by a bound launch (``_bound_call`` gave a result)."""
    taken = []
    real = spmm_module._bound_call

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        if out is not None:
            taken.append(args)
        return out

    monkeypatch.setattr(spmm_module, "_bound_call", spy)
    return taken


@pytest.fixture
def full_path(monkeypatch):
    """Counts the calls that take the full Triton path (``_spmm_triton``)."""
    taken = []
    real = _triton._spmm_triton
    monkeypatch.setattr(_triton, "_spmm_triton", lambda *a, **k: taken.append(1) or real(*a, **k))
    return taken


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("weighted", [False, True])
def test_repeat_no_grad_calls_take_the_bound_launch(reduce, weighted, full_path, fresh_store):
    g = _graph(weighted)
    x = torch.randn(g.num_src, 24, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    want = _oracle(g, x, reduce)
    outs = [sg.spmm(g, x, reduce, backend="triton") for _ in range(4)]
    assert len(full_path) == 1                      # the first call binds; the others take its launch
    for out in outs:
        assert out.shape == (g.num_nodes, 24) and out.dtype == x.dtype
        assert _rel(out, want) < 1e-5
    assert outs[1].data_ptr() != outs[2].data_ptr()  # a fresh result each call


def test_the_checks_still_run_after_a_bound_launch(full_path, fresh_store):
    g = _graph(True)
    x = torch.randn(g.num_src, 8).to(DEVICE)
    sg.spmm(g, x, backend="triton")
    with pytest.raises(ValueError, match=r"spmm\(\): x has \d+ rows"):
        sg.spmm(g, torch.randn(g.num_src + 1, 8).to(DEVICE), backend="triton")
    with pytest.raises(ValueError, match=r"spmm\(\): x of shape \[N, H, C\] needs edge_weight"):
        sg.spmm(g, torch.randn(g.num_src, 2, 4).to(DEVICE), backend="triton")
    with pytest.raises(ValueError, match=r"spmm\(\): reduce must be one of"):
        sg.spmm(g, x, "min", backend="triton")
    with pytest.raises(ValueError, match=r"spmm\(\): backend must be one of"):
        sg.spmm(g, x, backend="cuda")
    with pytest.raises(ValueError, match=r"spmm\(\)"):      # no device index, like host tensors
        sg.spmm(g, torch.empty(g.num_src, 8, device="meta"), backend="triton")


def test_calls_that_need_a_gradient_take_the_autograd_path(full_path, fresh_store):
    g = _graph(True)
    x = torch.randn(g.num_src, 8, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    sg.spmm(g, x, backend="triton")
    xg = x.clone().requires_grad_(True)
    out = sg.spmm(g, xg, backend="triton")
    assert out.grad_fn is not None and len(full_path) == 2
    dy = torch.randn(g.num_nodes, 8, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    (gx,) = torch.autograd.grad(out, xg, dy)
    a = torch.zeros(g.num_nodes, g.num_src, dtype=torch.float64).index_put_(
        (g.row.cpu(), g.col.cpu()), g.edge_val.cpu().double(), accumulate=True)
    assert _rel(gx, a.T @ dy.cpu().double()) < 1e-5
    learnable = g.with_values(g.edge_val.clone().requires_grad_(True))
    sg.spmm(learnable, x, backend="triton")
    assert sg.spmm(learnable, x, backend="triton").grad_fn is not None   # the graph's values need one


def test_other_backends_and_precisions_do_not_take_the_bound_launch(monkeypatch, fresh_store):
    g = _graph(True)
    x = torch.randn(g.num_src, 8).to(DEVICE)
    sg.spmm(g, x, backend="triton")
    taken = _launches_taken(monkeypatch)
    want = _oracle(g, x, "sum")
    assert _rel(sg.spmm(g, x, backend="reference"), want) < 1e-5
    assert _rel(sg.spmm(g, x, edge_weight=g.edge_val, backend="triton"), want) < 1e-5
    assert _rel(sg.spmm(g, x, backend="triton", precision="tf32"), want) < 1e-2
    if not x.is_cuda:                        # "auto" on host tensors: the CPU backend
        sg.spmm(g, x)
    assert taken == []
    sg.spmm(g, x, backend="triton")
    assert len(taken) == 1


def test_the_bound_launch_follows_the_graph_values(full_path, fresh_store):
    g = _graph(True)
    x = torch.randn(g.num_src, 16, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    sg.spmm(g, x, backend="triton")
    with torch.no_grad():
        g.edge_val.mul_(3.0)                  # a new version: bound again
    assert _rel(sg.spmm(g, x, backend="triton"), _oracle(g, x, "sum")) < 1e-5
    g.edge_val.data = g.edge_val.data * 0.5   # same version, another address: bound again
    assert _rel(sg.spmm(g, x, backend="triton"), _oracle(g, x, "sum")) < 1e-5
    assert len(full_path) == 3
    other = g.with_values(torch.rand(g.num_edges, generator=torch.Generator().manual_seed(5)).to(DEVICE) + 0.5)
    assert _rel(sg.spmm(other, x, backend="triton"), _oracle(other, x, "sum")) < 1e-5
    assert len(full_path) == 4                # another graph's values: not this graph's launch


def test_store_resets_and_deterministic_mode_bind_again(full_path, fresh_store):
    g = _graph(True, case=1)
    x = torch.randn(g.num_src, 8).to(DEVICE)
    sg.spmm(g, x, backend="triton")
    store.reset_stores()
    sg.spmm(g, x, backend="triton")
    assert len(full_path) == 2                # a new generation of decisions: the full path
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        out = sg.spmm(g, x, backend="triton")
        assert len(full_path) == 3            # another mode: another launch (cuSPARSE may not run)
        assert _rel(out, _oracle(g, x, "sum")) < 1e-5
    finally:
        torch.use_deterministic_algorithms(was)


def test_bound_calls_count_as_invested_calls(fresh_store):
    g = _graph(False)
    x = torch.randn(g.num_src, 8).to(DEVICE)
    sg.spmm(g, x, backend="triton")
    before, calls = reuse.reuse_counts()["invested_calls"], reuse.calls(g)
    for _ in range(5):
        sg.spmm(g, x, backend="triton")
    assert reuse.reuse_counts()["invested_calls"] - before == 5 and reuse.calls(g) - calls == 5


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_a_precision_whose_pick_is_the_exact_call_takes_its_launch_too(precision, full_path, fresh_store,
                                                                         monkeypatch):
    """A reduced precision is a permission: where its pick is the exact call it runs as fast
    as the exact call, on the same bound launch (and a reduced pick never takes it)."""
    from sparsegnn.tune import set_timer

    exact_wins = lambda run, cfg: 1.0 if "path" not in cfg else (0.5 if cfg["path"] == 0 else 1.0)  # noqa: E731
    set_timer(exact_wins)
    g = _graph(True)
    x = torch.randn(g.num_src, 32, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    sg.spmm(g, x, backend="triton", precision=precision)     # decides: the exact call
    taken, launches = len(full_path), _launches_taken(monkeypatch)
    outs = [sg.spmm(g, x, backend="triton", precision=precision) for _ in range(3)]
    assert len(full_path) == taken and len(launches) == 3
    for out in outs:
        assert torch.equal(out, sg.spmm(g, x, backend="triton"))
    store.reset_stores()                                     # a new generation: decided (looked up) again
    launches.clear()
    sg.spmm(g, x, backend="triton", precision=precision)
    assert launches == [] and len(full_path) == taken + 1
    sg.spmm(g, x, backend="triton", precision=precision)
    assert len(launches) == 1
    set_timer(lambda run, cfg: 1.0 if "path" not in cfg else (0.5 if cfg["path"] != 0 else 1.0))
    g = _graph(True, case=1)                                 # another graph: a reduced kernel wins
    x = torch.randn(g.num_src, 32, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    sg.spmm(g, x, backend="triton")                          # (its exact launch exists, not to be taken)
    reduced = sg.spmm(g, x, backend="triton", precision=precision)
    assert g.cache.get("call", spmm_module._call_key("sum", "triton", precision, x, None))[0] == "precise"
    launches.clear()
    again = sg.spmm(g, x, backend="triton", precision=precision)
    assert launches == [] and torch.equal(again, reduced)    # the reduced kernel, not the exact launch
    assert _rel(again, _oracle(g, x, "sum")) < 2e-2


def _picks(tf32_ms: float, bf16_only_ms: float):
    """A fake timer for the precision family: the exact call 1.0 ms, the tensor-core and packed
    paths (1, 3) ``tf32_ms``, the bf16 row paths (4, 5) ``bf16_only_ms``; other families 1.0."""
    def timer(run, cfg):
        if "path" not in cfg:
            return 1.0
        return 1.0 if cfg["path"] == 0 else bf16_only_ms if cfg["path"] in (4, 5) else tf32_ms
    return timer


def test_one_precision_s_exact_launch_does_not_serve_another(full_path, fresh_store, monkeypatch):
    """tf32 picks the exact call, bf16 a bf16 row path, on one graph: bf16's calls never take
    the launch kept for tf32."""
    from sparsegnn.tune import set_timer

    set_timer(_picks(tf32_ms=2.0, bf16_only_ms=0.5))
    g = _graph(True)
    x = torch.randn(g.num_src, 32, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    exact = sg.spmm(g, x, backend="triton")
    for _ in range(2):
        assert torch.equal(sg.spmm(g, x, backend="triton", precision="tf32"), exact)
    launches = _launches_taken(monkeypatch)
    assert torch.equal(sg.spmm(g, x, backend="triton", precision="tf32"), exact) and len(launches) == 1
    launches.clear()
    outs = [sg.spmm(g, x, backend="triton", precision="bf16") for _ in range(3)]
    key = spmm_module._call_key("sum", "triton", "bf16", x, None)
    assert g.cache.get("call", key)[0] == "precise" and launches == []
    for out in outs:
        assert not torch.equal(out, exact) and _rel(out, _oracle(g, x, "sum")) < 2e-2   # rounded to bf16


def test_a_new_generation_decides_a_precision_again_before_taking_a_launch(full_path, fresh_store, tmp_path,
                                                                          monkeypatch):
    """After a reset onto other stores, a precision whose old pick was the exact call decides
    again, even when the exact call's launch was bound anew in the new generation."""
    from sparsegnn.tune import set_timer

    set_timer(_picks(tf32_ms=2.0, bf16_only_ms=2.0))
    g = _graph(True)
    x = torch.randn(g.num_src, 32, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    for _ in range(2):
        sg.spmm(g, x, backend="triton", precision="tf32")
    monkeypatch.setenv("SPARSEGNN_TUNE_CACHE", str(tmp_path / "other"))
    store.reset_stores()
    set_timer(_picks(tf32_ms=0.5, bf16_only_ms=2.0))
    sg.spmm(g, x, backend="triton")                          # the exact launch, bound in the new generation
    launches = _launches_taken(monkeypatch)
    for _ in range(2):
        sg.spmm(g, x, backend="triton", precision="tf32")
    assert launches == []
    assert g.cache.get("call", spmm_module._call_key("sum", "triton", "tf32", x, None))[0] == "precise"


def test_graphs_without_a_bound_launch_are_not_looked_up(monkeypatch, fresh_store):
    """A transient graph (a mini-batch) and a small batch of small graphs never have a bound
    launch: their calls skip the lookup, and the results are the full path's."""
    from sparsegnn.datasets import random_graph
    from sparsegnn.ops import _triton as triton_ops

    looked = []
    real = triton_ops._run_key
    monkeypatch.setattr(triton_ops, "_run_key", lambda *a: looked.append(1) or real(*a))
    _, n, ei, _ = GRAPH_CASES[0]
    transient = Graph.from_edge_index(ei, num_nodes=n).to(DEVICE)
    transient.transient = True                  # as the sampler's mini-batches are made
    x = torch.randn(n, 8).to(DEVICE)
    looked.clear()
    for _ in range(3):
        assert _rel(sg.spmm(transient, x, backend="triton"), _oracle(transient, x, "sum")) < 1e-5
    assert looked == []
    parts = [random_graph(12, 30, seed=s)[0] for s in range(3)]
    batch = Graph.batch([Graph.from_edge_index(ei, num_nodes=12) for ei in parts]).to(DEVICE)
    xb = torch.randn(batch.num_nodes, 8).to(DEVICE)
    for _ in range(3):
        assert _rel(sg.spmm(batch, xb, backend="triton"), _oracle(batch, xb, "sum")) < 1e-5
    assert looked == []
