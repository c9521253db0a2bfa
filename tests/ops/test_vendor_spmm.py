"""The exact SpMM sum's vendor choice (``ops._triton._with_vendor``): where the tuner times
cuSPARSE (here torch's CSR product on whatever device the tests run) faster than our bound
kernel, the forward and the backward on the transpose take it, and the results still equal
the float64 reference."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from benchmarks.harness import _chosen_config
from sparsegnn.ops import _triton
from sparsegnn.ops._triton import VENDOR_FAMILY, spmm_detail, vendor_applies
from sparsegnn.tune import lookup, set_timer

from conftest import DEVICE, dense_adjacency


def _vendor_faster(run, cfg):
    """A fake timer: cuSPARSE wins the vendor decision, every other config ties."""
    return 0.5 if cfg == {"path": 1} else 1.0


def _small_case(monkeypatch, seed):
    """``(edge_index, weight, graph, x)``: a weighted 30-node graph and [30, 8] features, with
    the vendor's work floor off and the fake timer that makes cuSPARSE win."""
    monkeypatch.setattr(_triton, "VENDOR_MIN_WORK", 0)
    set_timer(_vendor_faster)
    ei, w = sg.datasets.random_graph(30, 200, seed=seed, weighted=True)
    return ei, w, Graph.from_edge_index(ei, w, num_nodes=30).to(DEVICE), torch.randn(30, 8, device=DEVICE)


@pytest.mark.parametrize("weighted", [True, False])
def test_spmm_on_the_vendor_path_matches_float64_forward_and_backward(graph_case, weighted, fresh_store, monkeypatch):
    name, n, ei, w = graph_case
    monkeypatch.setattr(_triton, "VENDOR_MIN_WORK", 0)
    set_timer(_vendor_faster)
    g = Graph.from_edge_index(ei, w if weighted else None, num_nodes=n).to(DEVICE)
    x64 = torch.randn(n, 12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    up64 = torch.randn(n, 12, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    a = dense_adjacency(ei, n, w if weighted else None)
    applies = vendor_applies(g, x64.float(), g.edge_val, "sum")
    assert applies == (0 < g.num_edges <= n * n)       # duplicate edges beyond N^2 stay with ours
    for _ in range(2):                                   # the first call decides, the second reuses
        x = x64.float().to(DEVICE).requires_grad_(True)
        out = sg.spmm(g, x, backend="triton")
        out.backward(up64.float().to(DEVICE))
        assert float((out.detach().double().cpu() - a @ x64).abs().max()) <= 1e-5 * max(1.0, float((a @ x64).abs().max()))
        want_grad = a.T @ up64
        assert float((x.grad.double().cpu() - want_grad).abs().max()) <= 1e-5 * max(1.0, float(want_grad.abs().max()))
    record = lookup(VENDOR_FAMILY, g, spmm_detail(g.edge_val, "sum"), 12, torch.float32, g.device)
    chosen = _chosen_config(g, "spmm", 12, torch.float32)   # what `sparsegnn bench` rows report
    if applies:
        assert record is not None and record["config"] == {"path": 1}
        transposed = lookup(VENDOR_FAMILY, g.t(), spmm_detail(g.t().edge_val, "sum"), 12, torch.float32, g.device)
        assert transposed is not None and transposed["config"] == {"path": 1}   # the backward took it too
        assert chosen["kernel"] == "cusparse" and chosen["config"]
    else:
        assert record is None
        assert "kernel" not in chosen


def test_vendor_is_not_timed_for_half_features_small_work_or_other_reductions(fresh_store, monkeypatch):
    ei, w = sg.datasets.random_graph(30, 200, seed=5, weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=30).to(DEVICE)
    x = torch.randn(30, 8, device=DEVICE)
    assert not vendor_applies(g, x, g.edge_val, "sum")                  # 200 x 8 edge-features: too small
    monkeypatch.setattr(_triton, "VENDOR_MIN_WORK", 0)
    assert vendor_applies(g, x, g.edge_val, "sum") and vendor_applies(g, x, None, "sum")
    assert not vendor_applies(g, x.bfloat16(), g.edge_val, "sum")
    assert not vendor_applies(g, x, g.edge_val, "mean") and not vendor_applies(g, x, g.edge_val, "max")
    assert not vendor_applies(g, x, torch.rand(g.num_edges, 2, device=DEVICE), "sum")   # multi-head
    set_timer(_vendor_faster)
    out = sg.spmm(g, x.bfloat16(), backend="triton")
    assert lookup(VENDOR_FAMILY, g, spmm_detail(g.edge_val, "sum"), 8, torch.bfloat16, g.device) is None
    ref = dense_adjacency(ei, 30, w).float() @ x.bfloat16().float().cpu()
    assert torch.allclose(out.float().cpu(), ref, rtol=2e-2, atol=2e-2)


def test_in_place_update_of_the_graph_values_rebuilds_the_vendor_csr(fresh_store, monkeypatch):
    _, _, g, x = _small_case(monkeypatch, seed=6)
    first = sg.spmm(g, x, backend="triton")
    with torch.no_grad():
        g.edge_val.mul_(3.0)                    # an optimiser step on a learnable edge weight
    second = sg.spmm(g, x, backend="triton")
    assert torch.allclose(second.cpu(), 3 * first.cpu(), rtol=1e-5, atol=1e-5)
    assert lookup(VENDOR_FAMILY, g, spmm_detail(g.edge_val, "sum"), 8, torch.float32, g.device)["config"] == {"path": 1}


def test_deterministic_mode_keeps_our_bit_reproducible_kernel(fresh_store, monkeypatch):
    ei, w, g, x = _small_case(monkeypatch, seed=7)
    ref = dense_adjacency(ei, 30, w) @ x.double().cpu()
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not vendor_applies(g, x, g.edge_val, "sum")
        out = sg.spmm(g, x, backend="triton")
        assert lookup(VENDOR_FAMILY, g, spmm_detail(g.edge_val, "sum"), 8, torch.float32, g.device) is None
    finally:
        torch.use_deterministic_algorithms(previous)
    assert torch.allclose(out.double().cpu(), ref, rtol=1e-5, atol=1e-5)
    again = sg.spmm(g, x, backend="triton")            # deterministic mode off again: the vendor decision is taken
    assert lookup(VENDOR_FAMILY, g, spmm_detail(g.edge_val, "sum"), 8, torch.float32, g.device)["config"] == {"path": 1}
    assert torch.allclose(again.double().cpu(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vendor_gpu_ms, picked", [(0.008, 0), (0.5, 1)], ids=["host-bound", "gpu-bound"])
def test_vendor_decision_counts_host_time(fresh_store, monkeypatch, vendor_gpu_ms, picked):
    """The vendor decision is timed as eager calls make them: cuSPARSE, faster on the GPU
    (8 us against our 10 us) but 30 us of host a call against our 10 us, loses where the call
    is host-bound; where its GPU time decides (0.5 against 1.0 ms) it wins."""
    from sparsegnn.tune import autotune

    monkeypatch.setattr(_triton, "VENDOR_MIN_WORK", 0)
    ours_gpu = 0.010 if picked == 0 else 1.0
    asked_host = []

    def fake_pairs(run, configs, device=None, protocol=None, host=False, warm=False):
        asked_host.append(host)
        return [((vendor_gpu_ms, 0.030) if cfg == {"path": 1} else (ours_gpu, 0.010)) for cfg in configs]

    monkeypatch.setattr(autotune, "_time_pairs", fake_pairs)
    set_timer(lambda run, cfg: pytest.fail("timed outside _time_pairs"))    # timing enabled off the GPU
    ei, w = sg.datasets.random_graph(30, 200, seed=8, weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=30).to(DEVICE)
    x = torch.randn(30, 8, device=DEVICE)
    out = sg.spmm(g, x, backend="triton")
    record = lookup(VENDOR_FAMILY, g, spmm_detail(g.edge_val, "sum"), 8, torch.float32, g.device)
    assert record["config"] == {"path": picked}
    assert asked_host and all(asked_host[-1:])          # the vendor decision asked for host times
    ref = dense_adjacency(ei, 30, w) @ x.double().cpu()
    assert torch.allclose(out.double().cpu(), ref, rtol=1e-5, atol=1e-5)
