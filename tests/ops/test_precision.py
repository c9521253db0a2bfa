"""``precision="tf32" | "bf16"`` is a permission, never a penalty (``ops/tiles.py``): the exact
call is the default and a candidate of every decision, reduced candidates are timed with their
conversions and must beat it by ``REDUCED_MARGIN``, and a call whose pick is exact runs (and
memoises) the exact path."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
import importlib

from sparsegnn.ops import tiles
from sparsegnn.tune import set_timer

spmm_module = importlib.import_module("sparsegnn.ops.spmm")

from conftest import DEVICE
from sparsegnn.datasets import random_graph


def _graph(seed: int = 0, n: int = 60, e: int = 400):
    ei, w = random_graph(n, e, seed=seed, num_isolated=2, num_empty_rows=3, num_self_loops=4, num_duplicates=5)
    return Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE), n


def _timer(times: dict, seen: list):
    """A fake timer: ``times[path]`` ms (1.0 for paths not named); records what was timed
    (configs of other families, the row kernels', take 1.0 and are not recorded)."""
    def timer(run, cfg):
        if "path" not in cfg:
            return 1.0
        seen.append(dict(cfg))
        return times.get(cfg["path"], 1.0)
    return timer


def test_a_graph_not_invested_in_gets_the_exact_call(monkeypatch, fresh_store):
    """First contact: nothing decided or timed, the result bit-equal to the exact call's."""
    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    seen = []
    set_timer(_timer({1: 0.1}, seen))
    g, n = _graph(1)
    x = torch.randn(n, 32).to(DEVICE)
    for precision in ("tf32", "bf16"):
        out = sg.spmm(g, x, backend="triton", precision=precision)
        assert torch.equal(out, sg.spmm(g, x, backend="triton"))
    assert seen == []


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_a_reduced_kernel_within_the_margin_keeps_the_exact_call(precision, fresh_store):
    seen = []
    set_timer(_timer({0: 1.0, 1: 1.0 - tiles.REDUCED_MARGIN / 2}, seen))
    g, n = _graph(2)
    x = torch.randn(n, 32).to(DEVICE).requires_grad_()
    out = sg.spmm(g, x, backend="triton", precision=precision)
    assert {"path": 0} in seen and any(c["path"] == 1 for c in seen)      # both were timed
    assert torch.equal(out, sg.spmm(g, x, backend="triton"))
    # the pick is memoised as the exact call: the next call makes no decision and times nothing
    timed = len(seen)
    out.sum().backward()
    again = sg.spmm(g, x.detach(), backend="triton", precision=precision)
    assert g.cache.get("call", spmm_module._call_key("sum", "triton", precision, x, None))[0] == "exact"
    assert len(seen) == timed and torch.equal(again, out.detach())


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_a_faster_reduced_kernel_is_picked(precision, fresh_store):
    seen = []
    set_timer(_timer({0: 1.0, 1: 0.5}, seen))
    g, n = _graph(3)
    x64 = torch.randn(n, 32, dtype=torch.float64)
    out = sg.spmm(g, x64.float().to(DEVICE), backend="triton", precision=precision)
    want = g.to_dense(torch.float64).cpu() @ x64
    exact = sg.spmm(g, x64.float().to(DEVICE), backend="triton")
    assert float((out.double().cpu() - want).norm()) <= 1e-2 * float(want.norm())
    if precision == "bf16":     # the features were rounded: not the exact result
        assert not torch.equal(out, exact)


def test_bf16_on_fp32_features_is_timed_with_its_rounding(fresh_store):
    """The timed call of a reduced candidate takes the caller's fp32 features and returns fp32:
    the rounding (and the result's conversion) is part of what is timed."""
    seen_inputs = []
    real = tiles._run_sum

    def timer(run, cfg):
        if "path" not in cfg:     # the row kernels' own decisions
            return 1.0
        out = run(cfg)
        seen_inputs.append((cfg["path"], out.dtype))
        return 0.5 if cfg["path"] == 4 else 1.0
    set_timer(timer)
    g, n = _graph(4)
    x = torch.randn(n, 48).to(DEVICE)
    out = sg.spmm(g, x, backend="triton", precision="bf16")
    assert {p for p, _ in seen_inputs} >= {0, 1, 4, 5}
    assert all(dtype == torch.float32 for _, dtype in seen_inputs)
    # path 4 won: the row kernel on the bf16-rounded features, result in fp32
    rounded = real(g, x, None, "bf16", {"path": 4})
    want = sg.spmm(g, x.to(torch.bfloat16).float(), backend="triton")
    assert out.dtype == torch.float32 and torch.allclose(rounded, want, rtol=1e-2, atol=1e-2)
    assert torch.equal(out, rounded)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bf16_rows_round_the_features_and_path_5_keeps_the_sums(dtype, fresh_store):
    """Paths 4 and 5 round the features to bf16 and accumulate in fp32.  Path 5 writes the sums
    in the features' dtype: the float64 product of the rounded features up to fp32 (fp16)
    rounding (a bf16 result reads ~2^-9 off).  Path 4's result went through bf16: every entry
    is a bf16 value, within bf16 rounding of path 5's."""
    g, n = _graph(5)
    x = torch.randn(n, 40, generator=torch.Generator().manual_seed(3)).to(dtype).to(DEVICE)
    for weight in (None, torch.rand(g.num_edges, generator=torch.Generator().manual_seed(4)).to(DEVICE) + 0.5):
        kept = tiles._run_sum(g, x, weight, "bf16", {"path": 5})
        rounded = tiles._run_sum(g, x, weight, "bf16", {"path": 4})
        dense = Graph(g.rowptr, g.col, weight, g.num_nodes).to_dense(torch.float64).cpu()
        want = dense @ x.to(torch.bfloat16).double().cpu()
        tol = 1e-6 if dtype == torch.float32 else 6e-4
        assert kept.dtype == rounded.dtype == dtype
        assert float((kept.double().cpu() - want).norm()) <= tol * float(want.norm())
        assert torch.equal(rounded, rounded.to(torch.bfloat16).to(dtype))
        assert torch.allclose(rounded.double(), kept.double(), rtol=2 ** -7, atol=1e-6)


@pytest.mark.parametrize("measured, picked", [
    # (GPU ms, host ms) of the exact call and of a tile config -> the pick's path
    (((1.0, 0.03), (0.5, 0.04)), 1),        # the exact call is GPU-bound: the faster kernel wins
    (((0.010, 0.030), (0.005, 0.020)), 0),  # host-bound: nothing issued behind it is faster
    (((0.015, 0.012), (0.010, 0.030)), 0),  # faster on the GPU, but its host time makes it slower
    (((1.0, 0.03), (0.95, 0.04)), 0),       # within the margin
])
def test_an_eager_decision_ranks_by_the_calls_cost(measured, picked, monkeypatch, fresh_store):
    """``decide(eager=True)``: a candidate costs the largest of its GPU and host ms and the
    first candidate's host ms; ``keep_first`` keeps the first unless beaten by the margin."""
    from sparsegnn.tune import autotune

    by_path = {0: measured[0], 1: measured[1]}
    monkeypatch.setattr(autotune, "autotune_enabled", lambda *a, **k: True)
    monkeypatch.setattr(autotune, "_time_pairs", lambda run, configs, *a, **k: [by_path[c["path"]] for c in configs])
    g, _ = _graph(5)
    config = autotune.decide("eager_cost_test", g, "d", 32, torch.float32, "cpu", [{"path": 0}, {"path": 1}],
                             lambda cfg: None, ranked=False, eager=True, keep_first=tiles.REDUCED_MARGIN)
    assert config == {"path": picked}


def test_the_exact_candidate_is_timed_as_the_exact_call_runs(monkeypatch, fresh_store):
    """Path 0's timed run is ``spmm``'s exact call: the caller's own weights (the graph's values,
    so its bound launch) and reduce, not a detached or scaled copy."""
    from sparsegnn.ops import _dispatch

    seen = []
    real = _dispatch.aggregate
    monkeypatch.setattr(_dispatch, "aggregate", lambda backend, graph, x, weight, reduce, *a: seen.append(
        (weight, reduce)) or real(backend, graph, x, weight, reduce, *a))

    def timer(run, cfg):
        if cfg.get("path") == 0:
            seen.clear()
            run(cfg)
            timed.extend(seen)
        return 1.0
    timed = []
    set_timer(timer)
    g, n = _graph(6)
    sg.spmm(g, torch.randn(n, 32).to(DEVICE), "mean", backend="triton", precision="tf32")
    assert timed and all(w is g.edge_val and reduce == "mean" for w, reduce in timed)


@pytest.mark.parametrize("given", [False, True])
def test_a_mean_on_a_reduced_pick_builds_its_tile_launch_once(given, monkeypatch, fresh_store):
    """The mean's weights ``w / deg`` are the same tensor call after call, so the tile launch
    (and its tile values) built from them is reused."""
    built = []
    real = tiles._tile_launch
    monkeypatch.setattr(tiles, "_tile_launch", lambda *a: built.append(1) or real(*a))
    set_timer(lambda run, cfg: 0.5 if cfg.get("path") == 1 else 1.0)
    g, n = _graph(7)
    x = torch.randn(n, 32).to(DEVICE)
    w = (torch.rand(g.num_edges) + 0.5).to(DEVICE) if given else None
    outs = [sg.spmm(g, x, "mean", edge_weight=w, backend="triton", precision="tf32") for _ in range(4)]
    assert len(built) == 1
    assert all(torch.equal(o, outs[0]) for o in outs)


def test_a_precision_pick_is_made_again_after_the_stores_reset(fresh_store, tmp_path, monkeypatch):
    """The memoised pick carries the decision stores' generation: after ``reset_stores`` (here
    onto an empty cache) the next call decides again, and the exact call then wins."""
    from sparsegnn.tune.store import reset_stores

    seen = []
    set_timer(_timer({0: 1.0, 1: 0.5}, seen))
    g, n = _graph(8)
    x = torch.randn(n, 32).to(DEVICE)
    key = spmm_module._call_key("sum", "triton", "tf32", x, None)
    sg.spmm(g, x, backend="triton", precision="tf32")
    assert g.cache.get("call", key)[0] == "precise"
    monkeypatch.setenv("SPARSEGNN_TUNE_CACHE", str(tmp_path / "other"))
    reset_stores()
    set_timer(_timer({0: 1.0, 1: 2.0}, seen))
    out = sg.spmm(g, x, backend="triton", precision="tf32")
    assert g.cache.get("call", key)[0] == "exact" and torch.equal(out, sg.spmm(g, x, backend="triton"))


def test_keep_first_times_the_first_candidate_even_off_the_shortlist(monkeypatch, fresh_store):
    """A ranked family whose model leaves the first candidate off its shortlist still times it
    when ``keep_first`` asks to compare against it."""
    from sparsegnn.tune import autotune

    class Backwards:
        def rank(self, stats, num_feats, elem, candidates):
            return list(range(len(candidates)))[::-1]

    timed = []
    monkeypatch.setattr(autotune, "load_model", lambda *_: Backwards())
    monkeypatch.setattr(autotune, "autotune_enabled", lambda *a, **k: True)
    monkeypatch.setattr(autotune, "_time_pairs", lambda run, configs, *a, **k: [
        timed.append(c["i"]) or ((1.0, 0.0) if c["i"] == 0 else (0.95, 0.0)) for c in configs])
    monkeypatch.setenv("SPARSEGNN_TUNE", "shortlist")
    g, _ = _graph(9)
    config = autotune.decide("keep_first_test", g, "d", 32, torch.float32, "cpu", [{"i": i} for i in range(6)],
                             lambda cfg: None, keep_first=0.1)
    assert 0 in timed and config == {"i": 0}


def test_row_configs_are_timed_with_the_result_dtype_they_write(fresh_store):
    """The row kernel's config for bf16 features with an fp32 result (path 5, the packed path)
    is timed writing fp32 and decided apart from the bf16-result one: a config's speed depends on
    the result's dtype."""
    from sparsegnn.ops._triton import aggregate, sum_rows_into

    written = []
    set_timer(lambda run, cfg: written.append(run(cfg).dtype) or 1.0)
    g, n = _graph(6)
    x = torch.randn(n, 32, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).to(DEVICE)
    out = sum_rows_into(g, x, None, torch.empty(n, 32, device=DEVICE))
    assert written and set(written) == {torch.float32}
    written.clear()
    plain = aggregate(g, x, None)
    assert written and set(written) == {torch.bfloat16}            # its own decision, timed with bf16
    assert torch.allclose(plain.float(), out, rtol=1e-2, atol=1e-2)


def test_the_precision_choice_is_timed_warm(monkeypatch, fresh_store):
    """The ``"spmm_tc"`` candidates are ways of making one call, timed as back-to-back calls
    run (``decide``'s ``warm``): an exact gather from an L2 the call before left warm is not
    charged a cold read."""
    import sparsegnn.tune as tune
    from sparsegnn.ops.tiles import TC_FAMILY

    asked = []
    real = tune.decide
    monkeypatch.setattr(tune, "decide", lambda op, *a, **k: asked.append((op, k.get("warm", False))) or real(op, *a, **k))
    set_timer(_timer({0: 1.0, 1: 0.5}, []))
    g, n = _graph(5)
    sg.spmm(g, torch.randn(n, 32).to(DEVICE), backend="triton", precision="tf32")
    assert (TC_FAMILY, True) in asked and all(warm for op, warm in asked if op == TC_FAMILY)
