"""Structure work of small graphs on a GPU runs on the host (formats/_host.py): same results
as on the device, results on the device, and the plan's move keeps every field."""
import pytest
import torch

from sparsegnn.formats import _host
from sparsegnn.formats.csr import coo_to_csr, permute_edges, transpose_csr
from sparsegnn.formats.plan import build_row_plan
from sparsegnn.tune.features import graph_stats


def _graph(device="cpu", n=300, seed=0):
    """A random graph with empty rows, a hub, self loops and duplicate edges."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (2000,), generator=g)
    dst = torch.randint(0, n // 2, (2000,), generator=g)           # rows >= n/2 empty but the hub's
    hub = torch.full((400,), n - 1)
    src, dst = torch.cat([src, torch.arange(400), src[:50]]), torch.cat([dst, hub, dst[:50]])
    rowptr, col, _ = coo_to_csr(dst, src, n)
    return rowptr.to(device), col.to(device)


def _assert_plans_equal(a, b):
    """Every field of two RowPlans (the lazily built lists through their properties)."""
    from dataclasses import fields

    names = [f.name for f in fields(a) if not f.name.startswith("_")] + ["rows_by_degree", "row32", "short_desc"]
    for name in names:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu()), name
        else:
            assert x == y, name
    for degree in (0, 3, 40, 1 << 20):            # the heavy-row lists too (host-built while cold)
        (hx, lx), (hy, ly) = a.heavy_rows(degree), b.heavy_rows(degree)
        assert lx == ly and hx.dtype == hy.dtype and hx.device == hy.device and torch.equal(hx, hy), degree


def test_row_plan_to_keeps_every_field():
    rowptr, col = _graph()
    plan = build_row_plan(rowptr, col, 32)
    _ = plan.rows_by_degree
    moved = plan.to(torch.device("cpu"))
    assert moved is not plan and moved._by_degree is not None and moved._row32 is None
    _assert_plans_equal(plan, moved)
    assert plan.heavy_rows(7)[1] == moved.heavy_rows(7)[1]


def test_cpu_graphs_are_not_routed():
    rowptr, col = _graph()
    assert not _host.small_on_gpu(col, col.numel(), "test")


def test_host_calls_per_kind_are_bounded(monkeypatch):
    """Small graphs on a GPU take the host path for their kind's first HOST_CALLS calls only
    (then the device's kernels are worth loading), and never above HOST_MAX_EDGES edges."""
    from types import SimpleNamespace

    on_gpu = SimpleNamespace(is_cuda=True)               # only the device flag is read
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)   # CPU builds of torch
    monkeypatch.setattr(_host, "_CALLS", type(_host._CALLS)())
    answers = [_host.small_on_gpu(on_gpu, 100, "a") for _ in range(_host.HOST_CALLS + 2)]
    assert answers == [True] * _host.HOST_CALLS + [False, False]
    assert _host.small_on_gpu(on_gpu, 100, "b")          # counted per kind
    assert not _host.small_on_gpu(on_gpu, _host.HOST_MAX_EDGES + 1, "c")
    assert not _host.small_on_gpu(on_gpu, 100, "c", num_nodes=_host.HOST_MAX_EDGES + 1)   # nodes bound too
    assert not _host.small_on_gpu(on_gpu, 0, "c")
    _host.reset_counts()
    assert _host.small_on_gpu(on_gpu, 100, "a")
    # once a kind has run on the device (a graph above the bound), its small graphs stay there
    assert not _host.small_on_gpu(on_gpu, _host.HOST_MAX_EDGES + 1, "a")
    assert not _host.small_on_gpu(on_gpu, 100, "a")
    assert _host.small_on_gpu(on_gpu, 100, "b")          # other kinds keep their host calls


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the routing serves graphs on a GPU")
@pytest.mark.parametrize("chunk", [4, 32, 1024])
def test_routed_structure_work_equals_device_work(monkeypatch, chunk):
    rowptr, col = _graph("cuda")
    _host.reset_counts()
    routed = (build_row_plan(rowptr, col, chunk), transpose_csr(rowptr, col, rowptr.numel() - 1))
    row = torch.repeat_interleave(torch.arange(rowptr.numel() - 1, device="cuda"), rowptr[1:] - rowptr[:-1])
    stats, stats_no_row = graph_stats(rowptr, col, row), graph_stats(rowptr, col)
    vals = torch.randn(col.numel(), 3, device="cuda", requires_grad=True)
    permuted = permute_edges(vals, routed[1][2])
    assert dict(_host._CALLS) == {"row_plan": 1, "transpose": 1, "stats": 2, "permute": 1}   # all on the host
    assert permuted.is_cuda and permuted.requires_grad
    monkeypatch.setattr(_host, "HOST_MAX_EDGES", 0)
    assert torch.equal(permuted, permute_edges(vals, routed[1][2])) and stats_no_row == stats
    plan, parts = build_row_plan(rowptr, col, chunk), transpose_csr(rowptr, col, rowptr.numel() - 1)
    assert all(t.is_cuda for t in routed[1]) and routed[0].col32.is_cuda and routed[0].row32.is_cuda
    _assert_plans_equal(routed[0], plan)
    for got, want in zip(routed[1], parts):
        assert torch.equal(got, want)
    want = graph_stats(rowptr, col, row)
    for name, value in want.as_dict().items():
        assert getattr(stats, name) == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_permute_edges_is_indexing_with_gradients():
    vals = torch.randn(7, 2, dtype=torch.float64, requires_grad=True)
    perm = torch.tensor([3, 0, 6, 6, 1])
    out = permute_edges(vals, perm)
    assert torch.equal(out, vals.detach()[perm])
    out.sum().backward()
    assert vals.grad[:, 0].tolist() == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 2.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the routing serves graphs on a GPU")
def test_no_host_routing_under_sync_debug_mode():
    """A synchronisation debug mode (a replay's recording warm-up sets "error") keeps the work
    on the device: the host path would synchronise.  Having run there, the kind stays there."""
    _host.reset_counts()
    vals, perm = torch.randn(50, device="cuda"), torch.randperm(50, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = permute_edges(vals, perm)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    # ran on the device, whose kernels are loaded now: the kind's host calls are over
    assert _host._CALLS["permute"] == _host.HOST_CALLS and torch.equal(out, vals[perm])
