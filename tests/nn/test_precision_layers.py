"""``precision=`` on the layers and models: the reduced-precision aggregation runs (on the
tiles path of ``ops.tiles``) and stays within tf32 / bf16 error of the exact layer, gradients
included; bad values are refused by name.  Triton kernels run in the interpreter without a GPU."""
import copy

import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph, nn as sgnn
from sparsegnn.kernels import interpreting
from sparsegnn.ops import attention, tiles as tile_ops

from conftest import DEVICE

needs_triton = pytest.mark.skipif(not torch.cuda.is_available() and not interpreting(),
                                  reason="needs CUDA or TRITON_INTERPRET=1")

LAYERS = {
    "GCNConv": lambda p: sgnn.GCNConv(12, 10, precision=p),
    "GCNConv-mean": lambda p: sgnn.GCNConv(12, 10, aggr="mean", normalize=False, precision=p),
    "SAGEConv": lambda p: sgnn.SAGEConv(12, 10, precision=p),
    "GINConv": lambda p: sgnn.GINConv(torch.nn.Linear(12, 10), train_eps=True, precision=p),
    "AGNNConv": lambda p: sgnn.AGNNConv(precision=p),
    "GCN": lambda p: sgnn.GCN(12, 3, hidden=16, dropout=0.0, precision=p),
    "AGNN": lambda p: sgnn.AGNN(12, 3, hidden=16, dropout=0.0, precision=p),
    "GraphSAGE": lambda p: sgnn.GraphSAGE(12, 3, hidden=16, dropout=0.0, precision=p),
}


def _data(n=30):
    ei, w = sg.datasets.random_graph(n, 140, seed=4, num_isolated=2, num_empty_rows=3, num_self_loops=3,
                                     num_duplicates=4, weighted=True)
    x = torch.randn(n, 12, generator=torch.Generator().manual_seed(6))
    return Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE), x.to(DEVICE)


def _set_backend(model, backend):
    for module in model.modules():
        if hasattr(module, "backend"):
            module.backend = backend


def _run(model, x, graph):
    model.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_(True)
    out = model(xg, graph)
    (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    grads["x"] = xg.grad.clone()
    return out.detach(), grads


def _rel(a, b):
    return float((a.double() - b.double()).norm()) / max(float(b.double().norm()), 1e-6)


#: name -> (state dict, output, gradients) of the exact layer: computed by the first precision's
#: test (seeded), shared with the other's (the interpreted exact run was half of each test's time).
_EXACT = {}


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("precision,tol", [("tf32", 5e-3), ("bf16", 2e-2)])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_at_reduced_precision_matches_the_exact_layer(name, precision, tol, fresh_store, monkeypatch):
    from sparsegnn.tune import set_timer

    # a tuner that finds the tiles fastest, so the reduced path runs (the exact call is the
    # default pick of a precision: tests/ops/test_precision.py)
    set_timer(lambda run, cfg: 0.5 if cfg.get("path") == 1 else 1.0)
    calls = []
    real = tile_ops._precise_sum
    monkeypatch.setattr(tile_ops, "_precise_sum", lambda *a: calls.append(a[3]) or real(*a))
    if "AGNN" in name:     # the three-pass form (the tuner may keep the fused exact one: tested below)
        monkeypatch.setattr(attention, "_agnn_path", lambda *a: 1)
    graph, x = _data()
    if name not in _EXACT:                                # the exact layer's run, once per layer
        torch.manual_seed(0)
        exact = LAYERS[name]("ieee").to(DEVICE)
        _set_backend(exact, "triton")
        want, want_grads = _run(exact, x, graph)
        assert not calls                                  # the exact layer never takes the reduced path
        _EXACT[name] = copy.deepcopy(exact.state_dict()), want, want_grads
    state, want, want_grads = _EXACT[name]
    reduced = LAYERS[name](precision).to(DEVICE)
    reduced.load_state_dict(copy.deepcopy(state))
    _set_backend(reduced, "triton")
    got, grads = _run(reduced, x, graph)
    assert calls and set(calls) == {precision}            # forward and backward both did
    assert _rel(got, want) <= tol, name
    assert grads.keys() == want_grads.keys()
    for key in want_grads:
        assert _rel(grads[key], want_grads[key]) <= 2 * tol, (name, key)


@pytest.mark.parametrize("make,layer", [
    (lambda: sgnn.GCNConv(4, 4, precision="fp8"), "GCNConv"),
    (lambda: sgnn.SAGEConv(4, 4, precision="half"), "SAGEConv"),
    (lambda: sgnn.GINConv(torch.nn.Linear(4, 4), precision=None), "GINConv"),
    (lambda: sgnn.AGNNConv(precision="tf16"), "AGNNConv"),
    (lambda: sgnn.GCN(4, 2, precision="fp64"), "GCNConv"),
])
def test_layer_precision_is_checked(make, layer):
    with pytest.raises(ValueError, match=rf"{layer}\(\): precision must be one of"):
        make()


def test_layer_precision_on_the_cpu_backend_is_exact():
    """No tensor cores off the Triton backend: the same result as the exact layer."""
    torch.manual_seed(0)
    exact = sgnn.GCN(12, 3, hidden=16, dropout=0.0, backend="reference")
    reduced = sgnn.GCN(12, 3, hidden=16, dropout=0.0, backend="reference", precision="bf16")
    reduced.load_state_dict(exact.state_dict())
    graph, x = _data()
    graph, x = graph.to("cpu"), x.cpu()
    assert torch.equal(exact(x, graph), reduced(x, graph))


@needs_triton
@pytest.mark.parametrize("precision,tol", [("tf32", 5e-3), ("bf16", 2e-2)])
def test_agnn_reduced_precision_both_paths_and_the_tuned_one_match_float64(precision, tol, monkeypatch):
    """Every path the ``"agnn_tc"`` decision can pick (fused exact, three passes at
    ``precision``), and the tuned call itself, against the float64 reference."""
    graph, x = _data()
    beta = torch.tensor([0.7], device=DEVICE)
    want = sg.agnn_attention(graph.to("cpu"), x.cpu().double(), beta.cpu().double(), backend="reference")
    tuned = sg.agnn_attention(graph, x, beta, backend="triton", precision=precision)
    assert _rel(tuned.cpu(), want) <= tol
    for path in (0, 1):
        monkeypatch.setattr(attention, "_agnn_path", lambda *a, p=path: p)
        out = sg.agnn_attention(graph, x, beta, backend="triton", precision=precision)
        assert _rel(out.cpu(), want) <= (1e-5 if path == 0 else tol), path
