"""First contact: the piece kernel against float64, the amortisation rule's counts per call
pattern (with a fake timer), and the layers' graph cache under cyclic access."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn.datasets import random_graph
from sparsegnn.tune import reuse

from conftest import DEVICE, dense_adjacency

triton = pytest.importorskip("triton")
from sparsegnn.kernels import spmm_pieces as pieces  # noqa: E402


def _hub_graph(n=30, seed=3):
    """Random edges with empty rows, isolated nodes, self loops, duplicates, plus a hub row."""
    ei, _ = random_graph(n, 90, seed=seed, num_isolated=2, num_empty_rows=3, num_self_loops=3, num_duplicates=5)
    hub = torch.stack([torch.arange(70) % (n - 2), torch.full((70,), 4)])
    return torch.cat([ei, hub], 1), n


def _tol(dtype):
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("values", ["none", "edge"])
def test_piece_kernel_matches_float64(dtype, reduce, values):
    ei, n = _hub_graph()
    gen = torch.Generator().manual_seed(7)
    w = torch.rand(ei.shape[1], generator=gen) + 0.5
    g = sg.Graph.from_edge_index(ei.to(DEVICE), w.to(DEVICE), num_nodes=n)
    x = torch.randn(n, 12, generator=gen, dtype=torch.float64).to(dtype)
    stored = torch.bincount(ei[1], minlength=n).clamp(min=1).to(torch.float64)
    ref = _rounded_reference(ei, n, x, w, values, reduce, stored)
    val = g.edge_val if values == "edge" else None
    # pieces of 1 edge (every row split), 5 (some), 1024 (none: the rule picks 64-1024), and
    # 1 or 8 rows side by side
    for chunk, rows in ((1, 8), (5, 8), (5, 1), (1024, 8)):
        cfg = dict(pieces.first_contact_config(n, g.num_edges, 12), chunk=chunk, ROWS=rows)
        out = pieces.spmm_pieces(g.rowptr, g.col, val, x.to(DEVICE), cfg, reduce)
        assert out.dtype == dtype and out.shape == (n, 12)
        err = float((out.double().cpu() - ref).abs().max())
        assert err <= _tol(dtype) * max(1.0, float(ref.abs().max())), (chunk, rows, err)


def _rounded_reference(ei, n, x, w, values, reduce, stored):
    """float64 result from the raw edge list, on the features as given (half features' rounding
    is the input's, not the kernel's)."""
    x64 = x.double().cpu()
    out = torch.zeros(n, x.shape[1], dtype=torch.float64)
    for e in range(ei.shape[1]):
        src, dst = int(ei[0, e]), int(ei[1, e])
        out[dst] += x64[src] * (float(w[e]) if values == "edge" else 1.0)
    return out / stored[:, None] if reduce == "mean" else out


def test_first_call_on_a_new_graph_plans_and_tunes_nothing(monkeypatch, fresh_store):
    """A new graph: the piece kernel, no plan, no decision, nothing timed; the result exact."""
    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    timed = []
    sg.tune.set_timer(lambda run, cfg: timed.append(cfg) or 1.0)
    ei, n = _hub_graph()
    x = torch.randn(n, 8, dtype=torch.float64)
    reuse.reset_reuse_counts()
    decisions = sg.tune.tuner_invocations()
    g = sg.Graph.from_edge_index(ei.to(DEVICE), num_nodes=n)
    xs = x.float().to(DEVICE).requires_grad_(True)
    out = sg.spmm(g, xs, backend="triton")
    out.backward(torch.ones_like(out))
    a = dense_adjacency(ei, n)
    assert torch.allclose(out.detach().double().cpu(), a @ x, atol=1e-5)
    assert torch.allclose(xs.grad.double().cpu(), a.T @ torch.ones(n, 8, dtype=torch.float64), atol=1e-5)
    counts = reuse.reuse_counts()
    assert counts["plans"] == 0 and counts["invested"] == 0 and counts["first_contact_calls"] == 2
    assert sg.tune.tuner_invocations() == decisions and timed == []
    assert "plan" not in g.cache and "signature" not in g.cache


def _calls_until_invested(g, x):
    for call in range(1, 100_000):
        sg.spmm(g, x, backend="triton")
        if reuse.invested(g):
            return call
    return None


def test_one_graph_reused_is_invested_in_when_the_rent_repays_it(monkeypatch, fresh_store):
    """Ski rental: invested on the call whose summed rent first reaches the investment."""
    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    monkeypatch.setattr(reuse, "INVEST_BASE_MS", 10.0)
    monkeypatch.setattr(reuse, "HOST_SAVED_MS", 0.0)
    monkeypatch.setattr(reuse, "GATHER_BYTES_PER_MS", 1e3)   # scaled so a tiny graph reaches it in a few calls
    sg.tune.set_timer(lambda run, cfg: 1.0)
    ei, n = _hub_graph()
    g = sg.Graph.from_edge_index(ei.to(DEVICE), num_nodes=n)
    x = torch.randn(n, 4, device=DEVICE)
    rent = reuse.rent_ms(g.num_edges, 4, 4)
    expected = -int(-reuse.investment_ms(g.num_edges) // rent)
    assert 3 <= expected <= 50
    reuse.reset_reuse_counts()
    assert _calls_until_invested(g, x) == expected
    counts = reuse.reuse_counts()
    assert counts["plans"] == 1 and counts["invested"] == 1
    assert counts["first_contact_calls"] == expected - 1 and counts["invested_calls"] == 1
    for _ in range(3):                                 # later calls: the plan and decision are kept
        sg.spmm(g, x, backend="triton")
    assert reuse.reuse_counts()["plans"] == 1


def test_no_investment_inside_a_capture(monkeypatch, fresh_store):
    """A call whose rent reaches the investment while host syncs are forbidden (a CUDA graph
    captured or warmed up for) stays on the first-contact path (investing reads sizes back to
    the host); the next eager call invests."""
    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    monkeypatch.setattr(reuse, "INVEST_BASE_MS", 10.0)
    monkeypatch.setattr(reuse, "HOST_SAVED_MS", 0.0)
    monkeypatch.setattr(reuse, "GATHER_BYTES_PER_MS", 1e3)
    g = sg.Graph.from_edge_index(_hub_graph()[0], num_nodes=30)
    due = -int(-reuse.investment_ms(g.num_edges) // reuse.rent_ms(g.num_edges, 4, 4))
    for _ in range(due - 1):
        assert not reuse.use(g, 4, 4)
    monkeypatch.setattr(reuse, "syncs_forbidden", lambda: True)
    assert not reuse.use(g, 4, 4) and not reuse.use(g, 4, 4) and not reuse.invested(g)
    monkeypatch.setattr(reuse, "syncs_forbidden", lambda: False)
    assert reuse.use(g, 4, 4) and reuse.invested(g)


def test_no_investment_where_syncs_are_forbidden_even_under_always(monkeypatch):
    """``always`` and a graph with a plan invest on their first eager call, not inside a capture
    or its warm-up."""
    monkeypatch.setenv("SPARSEGNN_INVEST", "always")
    g = sg.Graph.from_edge_index(_hub_graph()[0], num_nodes=30)
    monkeypatch.setattr(reuse, "syncs_forbidden", lambda: True)
    assert not reuse.use(g, 4, 4)
    monkeypatch.setattr(reuse, "syncs_forbidden", lambda: False)
    assert reuse.use(g, 4, 4)


@pytest.mark.parametrize("policy", ["auto", "never"])
def test_investing_invests_on_the_first_call_unless_the_policy_is_never(monkeypatch, policy):
    """Inside ``investing()`` (a replay about to record) a graph is invested in on its first
    call whatever rent it paid; not under ``never``, not for a transient graph, not where host
    syncs are forbidden; outside the block the rule applies again."""
    monkeypatch.setenv("SPARSEGNN_INVEST", policy)
    fresh = lambda: sg.Graph.from_edge_index(_hub_graph()[0], num_nodes=30)  # noqa: E731
    g, later, once, captured = fresh(), fresh(), fresh(), fresh()
    once.transient = True
    with reuse.investing():
        assert reuse.use(g, 4, 4) is (policy == "auto")
        assert not reuse.use(once, 4, 4)
        monkeypatch.setattr(reuse, "syncs_forbidden", lambda: True)
        assert not reuse.use(captured, 4, 4)
        monkeypatch.setattr(reuse, "syncs_forbidden", lambda: False)
    assert reuse.invested(g) is (policy == "auto")
    assert not reuse.use(later, 4, 4) and not reuse.use(captured, 4, 4)


def test_investing_reaches_the_backward(monkeypatch):
    """The backward of a forward run inside ``investing()`` invests too: autograd may run it on
    another thread, which the block's flag must reach."""
    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            seen.append(reuse.use(sg.Graph.from_edge_index(_hub_graph()[0], num_nodes=30), 4, 4))
            return grad

    x = torch.randn(3, device=DEVICE, requires_grad=True)
    with reuse.investing():
        torch.autograd.grad(Probe.apply(x).sum(), x)
    torch.autograd.grad(Probe.apply(x).sum(), x)
    assert seen == [True, False]


def test_syncs_are_forbidden_while_capturing_or_in_error_mode(monkeypatch):
    """A captured step's eager warm-up (``capture_warmup``, syncs allowed) may invest; a capture
    and the sync debug mode ``"error"`` (a replay's warm-up) may not."""
    from sparsegnn import _streams

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    with _streams.capture_warmup():
        assert not reuse.syncs_forbidden()
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 1)     # "warn": syncs still run
    assert not reuse.syncs_forbidden()
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 2)
    assert reuse.syncs_forbidden()
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert reuse.syncs_forbidden()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)     # never initialises CUDA itself
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: pytest.fail("initialised CUDA"))
    assert not reuse.syncs_forbidden()


def test_graphs_in_rotation_and_new_graphs_invest_nothing(monkeypatch, fresh_store):
    """100 graphs in rotation, and a new graph every call, at sizes that never repay: no plan,
    no decision, no timing, whatever the number of calls."""
    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    timed = []
    sg.tune.set_timer(lambda run, cfg: timed.append(cfg) or 1.0)
    graphs = [sg.Graph.from_edge_index(random_graph(12, 30, seed=s)[0].to(DEVICE), num_nodes=12) for s in range(100)]
    x = torch.randn(12, 4, device=DEVICE)
    reuse.reset_reuse_counts()
    decisions = sg.tune.tuner_invocations()
    for _ in range(2):
        for g in graphs:
            sg.spmm(g, x, backend="triton")
    for s in range(20):
        sg.spmm(sg.Graph.from_edge_index(random_graph(12, 30, seed=1000 + s)[0].to(DEVICE), num_nodes=12), x,
                backend="triton")
    counts = reuse.reuse_counts()
    assert counts["graphs"] == 120 and counts["invested"] == 0 and counts["plans"] == 0
    assert counts["first_contact_calls"] == 220 and counts["translations"] == 0
    assert sg.tune.tuner_invocations() == decisions and timed == []


def test_invest_policy_is_checked(monkeypatch):
    monkeypatch.setenv("SPARSEGNN_INVEST", "sometimes")
    with pytest.raises(ValueError, match="SPARSEGNN_INVEST"):
        reuse.policy()


def test_layer_cache_keeps_hitting_under_cyclic_access():
    """More graphs in rotation than the cache holds: residents keep hitting (LRU would miss all)."""
    from sparsegnn.nn import GCNConv
    from sparsegnn.nn._graph_input import clear_graph_cache, graph_cache_info, set_graph_cache_size

    layer = GCNConv(4, 4)
    x = torch.randn(20, 4)
    edge_indices = [random_graph(20, 60, seed=s)[0] for s in range(24)]
    clear_graph_cache()
    old = set_graph_cache_size(16)
    try:
        for t in edge_indices:
            layer(x, t)
        before = graph_cache_info()
        for _ in range(3):
            for t in edge_indices:
                layer(x, t)
        after = graph_cache_info()
        assert after["entries"] == 16 and after["bytes"] > 0
        assert after["hits"] - before["hits"] >= 3 * 15
        assert after["misses"] - before["misses"] <= 3 * 9
    finally:
        set_graph_cache_size(old)
        clear_graph_cache()


def test_layer_cache_byte_bound():
    from sparsegnn.nn import GCNConv
    from sparsegnn.nn._graph_input import clear_graph_cache, graph_cache_info, set_graph_cache_size

    layer = GCNConv(4, 4)
    x = torch.randn(20, 4)
    edge_indices = [random_graph(20, 60, seed=s)[0] for s in range(10)]
    clear_graph_cache()
    layer(x, edge_indices[0])
    one = graph_cache_info()["bytes"]
    old = set_graph_cache_size(max_bytes=3 * one + one // 2)
    try:
        for t in edge_indices:
            layer(x, t)
        info = graph_cache_info()
        assert info["entries"] == 3 and info["bytes"] <= info["max_bytes"]
    finally:
        set_graph_cache_size(max_bytes=4 << 30)
        set_graph_cache_size(old)
        clear_graph_cache()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are only detectable on a GPU")
def test_first_contact_path_does_not_sync(monkeypatch):
    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    ei, n = _hub_graph()
    ei = ei.cuda()
    x = torch.randn(n, 32, device="cuda", requires_grad=True)
    sg.spmm(sg.Graph.from_edge_index(ei, num_nodes=n), x).sum().backward()   # kernels loaded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        g = sg.Graph.from_edge_index(ei, num_nodes=n)
        out = sg.spmm(g, x)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    a = dense_adjacency(ei.cpu(), n)
    assert torch.allclose(out.detach().double().cpu(), a @ x.detach().double().cpu(), atol=1e-4)


@pytest.mark.parametrize("weighted", [False, True])
def test_remaining_self_loops_without_a_sort_match_the_edge_list(weighted):
    """GCN's loops (PyG's add_remaining_self_loops) built in place: every loop removed, one per
    node weighing the node's last loop in input order (or 1), against the raw edge list."""
    from sparsegnn.nn._graph_input import _loops_remaining

    n = 14
    ei, _ = random_graph(n, 70, seed=5, num_self_loops=7, num_duplicates=5, num_isolated=2, num_empty_rows=2)
    ei = torch.cat([ei, torch.tensor([[3, 3], [3, 3]])], 1)          # node 3: several loops
    w = torch.rand(ei.shape[1], generator=torch.Generator().manual_seed(2)) + 0.5 if weighted else None
    g = sg.Graph.from_edge_index(ei, w, num_nodes=n)
    looped = _loops_remaining(1.0)(g)
    want = torch.zeros(n, n, dtype=torch.float64)
    loop_w = torch.ones(n, dtype=torch.float64)
    for e in range(ei.shape[1]):
        src, dst = int(ei[0, e]), int(ei[1, e])
        value = 1.0 if w is None else float(w[e])
        if src == dst:
            loop_w[dst] = value                                     # the last one in input order wins
        else:
            want[dst, src] += value
    want += torch.diag(loop_w)
    assert looped.num_edges == int((ei[0] != ei[1]).sum()) + n
    assert (looped.rowptr[1:] >= looped.rowptr[:-1]).all()
    assert torch.equal(looped.to_dense(torch.float64), want)


@pytest.mark.parametrize("op", ["gat", "agnn"])
def test_attention_on_new_graphs_runs_one_config_whatever_the_degree(monkeypatch, op):
    """Graphs of mean degree 2 and 40, met once each: the same launch config (one compiled
    variant per width, nothing new to load for a new graph), nothing decided or timed, and the
    result equal to the float64 reference path's."""
    from sparsegnn.kernels import attention as kernels
    from sparsegnn.ops.attention import agnn_attention, gat_attention

    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    seen = []
    forward = kernels.gat_forward if op == "gat" else kernels.agnn_forward
    name = "gat_forward" if op == "gat" else "agnn_forward"

    def spy(*args):
        seen.append(dict(args[-2]))
        return forward(*args)

    monkeypatch.setattr(kernels, name, spy)
    decisions = sg.tune.tuner_invocations()
    gen = torch.Generator().manual_seed(0)
    for n, e in ((200, 400), (60, 2400)):
        ei = torch.randint(0, n, (2, e), generator=gen)
        g = sg.Graph.from_edge_index(ei.to(DEVICE), num_nodes=n)
        if op == "gat":
            feat = torch.randn(n, 2, 4, generator=gen, dtype=torch.float64)
            a_src, a_dst = torch.randn(n, 2, generator=gen, dtype=torch.float64), torch.randn(n, 2, generator=gen,
                                                                                           dtype=torch.float64)
            run = lambda backend, dt: gat_attention(g, feat.to(DEVICE, dt), a_src.to(DEVICE, dt),  # noqa: E731
                                                    a_dst.to(DEVICE, dt), backend=backend)
        else:
            x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
            beta = torch.tensor([0.7], dtype=torch.float64)
            run = lambda backend, dt: agnn_attention(g, x.to(DEVICE, dt), beta.to(DEVICE, dt),  # noqa: E731
                                                     backend=backend)
        out = run("triton", torch.float32)
        ref = run("reference", torch.float64)
        assert torch.allclose(out.double().cpu(), ref.cpu(), atol=1e-5, rtol=1e-5)
    assert len(seen) == 2 and seen[0] == seen[1] == kernels.first_contact_config(op, *((2, 4) if op == "gat" else (1, 6)))
    assert sg.tune.tuner_invocations() == decisions


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("values", ["none", "edge"])
def test_backward_on_a_new_graph_pushes_without_a_transpose(monkeypatch, reduce, values):
    """The backward of a first call: ``A'^T g`` by the push kernel (no transpose built), equal to
    float64; once the transpose is cached (or the graph invested in) the transpose's kernels."""
    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    ei, n = _hub_graph(seed=11)
    gen = torch.Generator().manual_seed(3)
    w = torch.rand(ei.shape[1], generator=gen) + 0.5
    g = sg.Graph.from_edge_index(ei.to(DEVICE), w.to(DEVICE) if values == "edge" else None, num_nodes=n)
    x = torch.randn(n, 10, generator=gen, dtype=torch.float64)
    go = torch.randn(n, 10, generator=gen, dtype=torch.float64)
    a = dense_adjacency(ei, n, w if values == "edge" else None)
    if reduce == "mean":
        a = a / torch.bincount(ei[1], minlength=n).clamp(min=1).double()[:, None]
    for step in range(2):
        xs = x.float().to(DEVICE).requires_grad_(True)
        out = sg.spmm(g, xs, reduce=reduce, backend="triton")
        out.backward(go.float().to(DEVICE))
        assert ("transpose" in g.cache) == (step == 1)
        assert torch.allclose(xs.grad.double().cpu(), a.T @ go, atol=1e-4), step
        g.transpose_parts()       # a transpose built by someone else: the next backward uses it


def test_a_reused_graph_builds_its_transpose_after_a_few_pushes(monkeypatch):
    """Pushes serve a graph's first ``PUSH_CALLS`` calls; a graph that keeps coming back gets its
    transpose (a push costs more than the transpose's kernel on a reused graph)."""
    from sparsegnn.ops import _triton

    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    monkeypatch.setattr(_triton, "PUSH_CALLS", 3)
    ei, n = _hub_graph(seed=12)
    g = sg.Graph.from_edge_index(ei.to(DEVICE), num_nodes=n)
    built = []
    for _ in range(3):
        xs = torch.randn(n, 6).to(DEVICE).requires_grad_(True)
        sg.spmm(g, xs, backend="triton").sum().backward()
        built.append("transpose" in g.cache)
    assert built == [False, True, True]          # calls: forward 1, push 2; forward 3, transpose


def test_backward_pushes_with_strided_and_expanded_weights(monkeypatch):
    """The piece and push kernels read per-edge weights by position: an expanded gradient
    (SDDMM's backward after ``.sum()``) and a strided edge weight give the reference's results."""
    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    ei, n = _hub_graph(seed=13)
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(n, 8, generator=gen), torch.randn(n, 8, generator=gen)
    w2 = torch.rand(ei.shape[1], 3, generator=gen) + 0.5
    grads = {}
    for backend in ("triton", "reference"):
        g = sg.Graph.from_edge_index(ei.to(DEVICE), num_nodes=n)
        bs = b.clone().to(DEVICE).requires_grad_(True)          # a new leaf per backend
        sg.sddmm(g, a.to(DEVICE), bs, "dot", backend=backend).sum().backward()
        xs = a.clone().to(DEVICE).requires_grad_(True)
        out = sg.spmm(g, xs, edge_weight=w2.to(DEVICE)[:, 1], backend=backend)
        out.pow(2).sum().backward()
        grads[backend] = (bs.grad.cpu(), xs.grad.cpu(), out.detach().cpu())
    for got, want in zip(grads["triton"], grads["reference"]):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_capture_warmup_is_seen_by_other_threads():
    """The autograd engine runs a CUDA backward on its own thread: the warm-up mark is
    process-wide, so that thread sees it too."""
    import threading

    from sparsegnn._streams import capture_warmup, in_capture_warmup

    seen = []
    probe = lambda: seen.append(in_capture_warmup())   # noqa: E731
    with capture_warmup():
        worker = threading.Thread(target=probe)
        worker.start()
        worker.join()
    worker = threading.Thread(target=probe)
    worker.start()
    worker.join()
    assert seen == [True, False]


def test_no_push_while_warming_up_for_a_capture(monkeypatch):
    """Inside a capture's warm-up (``_streams.capture_warmup``) the backward builds the
    transpose: what is recorded is replayed for good."""
    from sparsegnn._streams import capture_warmup, in_capture_warmup

    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    ei, n = _hub_graph(seed=14)
    g = sg.Graph.from_edge_index(ei.to(DEVICE), num_nodes=n)
    assert not in_capture_warmup()
    with capture_warmup():
        assert in_capture_warmup()
        xs = torch.randn(n, 4).to(DEVICE).requires_grad_(True)
        sg.spmm(g, xs, backend="triton").sum().backward()
    assert not in_capture_warmup() and "transpose" in g.cache


def test_the_tuner_times_nothing_where_syncs_are_forbidden(monkeypatch):
    """A replay's warm-up runs under sync debug mode "error": the tuner treats it as a capture
    (a provisional pick, nothing timed or stored), like the amortisation rule."""
    from sparsegnn.tune import autotune

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    assert not autotune._capturing()
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 2)
    assert autotune._capturing()


def test_a_work_plan_is_never_built_inside_a_capture(monkeypatch):
    """``plan_of`` reads row lengths back to the host on a graph's first planned call: inside a
    CUDA-graph capture that call raises an error saying how to warm up (instead of the capture
    failing on the read-back); a plan built before the capture is returned there as it is."""
    from types import SimpleNamespace

    from sparsegnn.ops import _triton

    def on_gpu(graph):
        return SimpleNamespace(device=torch.device("cuda", 0), cache=graph.cache, row_plan=graph.row_plan,
                               num_nodes=graph.num_nodes, num_edges=graph.num_edges, volatile=graph.volatile)

    ei = _hub_graph()[0]
    g = sg.Graph.from_edge_index(ei, num_nodes=30)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="side stream"):
        _triton.plan_of(on_gpu(g))
    with pytest.raises(RuntimeError, match="volatile"):        # keeps no plan: no warm-up helps
        _triton.plan_of(on_gpu(sg.Graph(g.rowptr, g.col, num_nodes=30, volatile=True)))
    cpu = sg.Graph.from_edge_index(ei, num_nodes=30)          # a host graph: nothing to capture
    assert _triton.plan_of(cpu) is cpu.cache.get("plan")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    plan = _triton.plan_of(on_gpu(g))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert _triton.plan_of(on_gpu(g)) is plan
    chunk = _triton._kernels().configs.spmm_chunk(g.num_nodes, g.num_edges)
    built = sg.Graph.from_edge_index(ei, num_nodes=30)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    row_plan = built.row_plan(chunk)                          # the public row plan, built before
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert _triton.plan_of(on_gpu(built)) is row_plan
