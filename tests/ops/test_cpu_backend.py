"""The CPU backend (Numba kernels and torch.sparse candidates) against float64 oracles.

Every candidate the CPU tuner can pick is forced in turn; every dtype the backend claims
(float32, float64 natively, bfloat16 through float32) is checked, forward and backward.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.kernels import cpu as cpu_kernels
from sparsegnn.ops import _cpu, reference

from conftest import DEVICE, dense_adjacency

pytestmark = pytest.mark.skipif(not cpu_kernels.numba_available(), reason="the CPU backend needs numba")

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = list(TOL)


def _rel(out, ref):
    return float((out.detach().double() - ref.detach()).norm() / ref.detach().norm().clamp_min(1e-30))


@pytest.fixture(params=[0, 1, 2], ids=["numba", "torch-sparse", "torch-sparse-reduce"])
def forced_impl(request, monkeypatch):
    """Force the tuner's pick to one candidate (a learned or timed choice may pick any)."""
    config = (_cpu.NUMBA, _cpu.TORCH, _cpu.TORCH_REDUCE)[request.param]
    monkeypatch.setattr(_cpu, "_decide", lambda *args, **kwargs: config)
    return request.param


def _dense_max(ei, n, x, w):
    out = torch.zeros(n, x.shape[1], dtype=torch.float64)
    seen = [False] * n
    for e in range(ei.shape[1]):
        i, j = int(ei[1, e]), int(ei[0, e])
        msg = x[j].double() * (float(w[e]) if w is not None else 1.0)
        out[i] = msg if not seen[i] else torch.maximum(out[i], msg)
        seen[i] = True
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_spmm_every_candidate_matches_the_float64_oracle(graph_case, forced_impl, dtype, reduce):
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(3)
    x64 = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    w64 = torch.rand(ei.shape[1], generator=gen, dtype=torch.float64) + 0.5
    x = x64.to(dtype).requires_grad_(True)
    weight = g.to_graph_order(w64).to(dtype).requires_grad_(True)
    w_used = w64.to(dtype).double()          # the oracle sees the rounded inputs
    xr = x.detach().double()
    out = sg.spmm(g, x, reduce, edge_weight=weight, backend="cpu")
    assert out.dtype == dtype
    if reduce == "max":
        expected = _dense_max(ei, n, xr, w_used)
    else:
        a = dense_adjacency(ei, n, w_used)
        expected = a @ xr
        if reduce == "mean":
            expected = expected / dense_adjacency(ei, n).sum(1, keepdim=True).clamp(min=1)
    if expected.abs().sum() == 0:
        assert torch.equal(out.double(), expected)
        return
    assert _rel(out, expected) < TOL[dtype]
    # gradients against the reference backend computed in float64 on the same rounded inputs
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    gx, gw = torch.autograd.grad(out, (x, weight), grad.to(dtype))
    x_ref = xr.clone().requires_grad_(True)
    w_ref = weight.detach().double().requires_grad_(True)
    out_ref = sg.spmm(g, x_ref, reduce, edge_weight=w_ref, backend="reference")
    rx, rw = torch.autograd.grad(out_ref, (x_ref, w_ref), grad)
    assert _rel(gx, rx) < TOL[dtype]
    assert _rel(gw, rw) < TOL[dtype] or rw.abs().sum() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_spmm_without_weights_and_with_the_graph_values(graph_case, forced_impl, dtype):
    _, n, ei, w = graph_case
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(n, 3, generator=gen, dtype=dtype)
    for weighted in (False, True):
        g = Graph.from_edge_index(ei, w.to(dtype) if weighted else None, num_nodes=n)
        expected = dense_adjacency(ei, n, w if weighted else None) @ x.double()
        out = sg.spmm(g, x, backend="cpu")
        assert torch.allclose(out.double(), expected, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["dot", "add", "mul"])
def test_sddmm_forward_backward(graph_case, dtype, op):
    _, n, ei, _ = graph_case
    g = Graph.from_edge_index(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(n, 4, generator=gen, dtype=torch.float64).to(dtype).requires_grad_(True)
    b = torch.randn(n, 4, generator=gen, dtype=torch.float64).to(dtype).requires_grad_(True)
    out = sg.sddmm(g, a, b, op, backend="cpu")
    a64, b64 = a.detach().double().requires_grad_(True), b.detach().double().requires_grad_(True)
    ref = reference.sddmm(g.row, g.col, a64, b64, op)
    if ref.numel() == 0:
        assert out.shape == ref.shape
        return
    assert _rel(out, ref) < TOL[dtype]
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    ga, gb = torch.autograd.grad(out, (a, b), grad.to(dtype))
    ra, rb = torch.autograd.grad(ref, (a64, b64), grad)
    assert _rel(ga, ra) < TOL[dtype] and _rel(gb, rb) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", [0, 3])
def test_edge_softmax_forward_backward(graph_case, dtype, heads):
    _, n, ei, _ = graph_case
    g = Graph.from_edge_index(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(6)
    shape = (g.num_edges, heads) if heads else (g.num_edges,)
    s = (3 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype).requires_grad_(True)
    out = sg.edge_softmax(g, s, backend="cpu")
    s64 = s.detach().double().requires_grad_(True)
    ref = reference.edge_softmax(g.row, n, s64)
    if ref.numel() == 0:
        return
    assert _rel(out, ref) < TOL[dtype]
    grad = torch.randn(shape, generator=gen, dtype=torch.float64)
    (gs,) = torch.autograd.grad(out, (s,), grad.to(dtype))
    (rs,) = torch.autograd.grad(ref, (s64,), grad)
    assert _rel(gs, rs) < TOL[dtype] * (4 if dtype == torch.bfloat16 else 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_multi_head_spmm_forward_backward(graph_case, dtype):
    _, n, ei, _ = graph_case
    g = Graph.from_edge_index(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(n, 3, 2, generator=gen, dtype=dtype, requires_grad=True)
    w = torch.rand(g.num_edges, 3, generator=gen, dtype=dtype, requires_grad=True)
    out = sg.spmm(g, x, edge_weight=w, backend="cpu")
    x64, w64 = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    ref = torch.stack([reference.spmm_sum(g.row, g.col, n, x64[:, h], w64[:, h]) for h in range(3)], 1)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    gx, gw = torch.autograd.grad(out, (x, w), grad.to(dtype))
    if g.num_edges == 0:    # no edge: no gradient anywhere
        assert not gx.any() and gw.numel() == 0
        return
    rx, rw = torch.autograd.grad(ref, (x64, w64), grad)
    assert torch.allclose(gx.double(), rx, atol=1e-5) and torch.allclose(gw.double(), rw, atol=1e-5)


def test_auto_picks_the_cpu_backend_and_explicit_cpu_is_checked(monkeypatch):
    from sparsegnn.ops import _dispatch

    x = torch.randn(3, 2)
    assert _dispatch.choose_backend("spmm", "auto", x) == "cpu"
    assert _dispatch.choose_backend("spmm", "auto", x.to(torch.bfloat16)) == "cpu"
    with pytest.raises(ValueError, match=r"spmm\(\): backend='cpu' needs floating-point"):
        _dispatch.choose_backend("spmm", "cpu", torch.ones(3, 2, dtype=torch.int64))
    monkeypatch.setattr(_dispatch, "numba_available", lambda: False)
    assert _dispatch.choose_backend("spmm", "auto", x) == "reference"
    with pytest.raises(ValueError, match="needs the numba package"):
        _dispatch.choose_backend("spmm", "cpu", x)


def test_chunk_bounds_cover_every_row_once_and_balance_work():
    deg = torch.tensor([0, 0, 500, 1, 1, 1, 0, 3, 2, 0] * 50)
    rowptr = torch.cat([torch.zeros(1, dtype=torch.int64), deg.cumsum(0)])
    b = cpu_kernels.chunk_bounds(rowptr, 16)
    assert int(b[0]) == 0 and int(b[-1]) == deg.numel()
    assert bool((b[1:] > b[:-1]).all()) and b.numel() <= 17
    work = (deg + 1).cumsum(0)
    per_chunk = torch.tensor([int(work[e - 1]) - (int(work[s - 1]) if s else 0) for s, e in zip(b[:-1], b[1:])])
    # no chunk holds more than its share plus one row
    assert int(per_chunk.max()) <= int(work[-1]) // 16 + int((deg + 1).max())
    assert cpu_kernels.chunk_bounds(torch.zeros(1, dtype=torch.int64), 8).tolist() == [0]


def test_thread_count_follows_torch_and_small_work_runs_on_one_thread(monkeypatch):
    import numba

    # the Numba kernel forced: the tuner may pick MKL on a machine of many cores (the GPU host's 16)
    monkeypatch.setattr(_cpu, "_decide", lambda *args, **kwargs: _cpu.NUMBA)
    before = torch.get_num_threads()
    ei = torch.randint(0, 1000, (2, 20_000), generator=torch.Generator().manual_seed(2))
    big = torch.randn(1000, cpu_kernels.SERIAL_WORK // 20_000 + 1)
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            torch.set_num_threads(threads)
            g = Graph.from_edge_index(ei, num_nodes=1000)
            out = sg.spmm(g, big, backend="cpu")
            assert torch.allclose(out, sg.spmm(g, big, backend="reference"), atol=1e-4)
            assert ("cpu_bounds", threads) in g.cache
            assert cpu_kernels.parallel(20_000 * big.shape[1]) == (threads > 1)
            if threads > 1:
                assert numba.get_num_threads() == threads
            assert not cpu_kernels.parallel(20_000)           # one column: the calling thread only
            small = sg.spmm(g, big[:, :1], backend="cpu")
            assert torch.allclose(small, out[:, :1], atol=1e-4)
    finally:
        torch.set_num_threads(before)


def test_a_decision_is_made_once_per_structure():
    from sparsegnn.tune import lookup, tuner_invocations

    ei = torch.randint(0, 300, (2, 3000), generator=torch.Generator().manual_seed(8))
    x = torch.randn(300, 8)
    g1 = Graph.from_edge_index(ei, num_nodes=300)
    before = tuner_invocations()
    out1 = sg.spmm(g1, x)
    assert tuner_invocations() == before + 1
    record = lookup(_cpu.DECISION_OP, g1, f"sum|val0|h0|t{torch.get_num_threads()}", 8, torch.float32, x.device)
    assert record is not None and record["config"] in (_cpu.NUMBA, _cpu.TORCH, _cpu.TORCH_REDUCE) and record["ms"] > 0
    g2 = Graph.from_edge_index(ei, num_nodes=300)        # same structure, new object
    out2 = sg.spmm(g2, x)
    assert tuner_invocations() == before + 1
    assert torch.allclose(out1, out2, atol=1e-5)


def test_dropout_keeps_the_right_fraction_and_scales():
    torch.manual_seed(0)
    x = torch.ones(200_000, requires_grad=True)
    out = sg.dropout(x, 0.3)
    kept = out != 0
    assert abs(float(kept.float().mean()) - 0.7) < 0.005
    assert torch.allclose(out[kept], torch.full_like(out[kept], 1 / 0.7))
    (g,) = torch.autograd.grad(out, (x,), torch.full_like(out, 2.0))
    assert torch.equal(g, torch.where(kept, torch.tensor(2 / 0.7), torch.tensor(0.0)))
    # different calls draw different masks; the same seed repeats them
    assert not torch.equal(sg.dropout(x, 0.3) != 0, kept)
    torch.manual_seed(0)
    assert torch.equal(sg.dropout(x, 0.3) != 0, kept)


def test_dropout_edge_cases_and_other_paths():
    x = torch.randn(50, 4)
    assert sg.dropout(x, 0.0) is x and sg.dropout(x, 0.9, training=False) is x
    assert torch.equal(sg.dropout(x, 1.0), torch.zeros_like(x))
    half = sg.dropout(x.to(torch.bfloat16), 0.5)          # torch's path: still inverted dropout
    assert set(torch.unique(half.float() / x.to(torch.bfloat16).float()).round(decimals=2).tolist()) <= {0.0, 2.0}
    with pytest.raises(ValueError, match=r"dropout\(\): p must be in \[0, 1\]"):
        sg.dropout(x, 1.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_gat_and_agnn_cpu_paths_match_the_reference(dtype):
    gen = torch.Generator().manual_seed(9)
    n = 30
    ei = torch.randint(0, n, (2, 150), generator=gen)
    g = Graph.from_edge_index(ei, num_nodes=n)
    feat = torch.randn(n, 2, 3, generator=gen, dtype=dtype, requires_grad=True)
    a_src = torch.randn(n, 2, generator=gen, dtype=dtype, requires_grad=True)
    a_dst = torch.randn(n, 2, generator=gen, dtype=dtype, requires_grad=True)
    outs = [sg.gat_attention(g, feat, a_src, a_dst, 0.2, 0.0, backend=b) for b in ("cpu", "reference")]
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    grads = [torch.autograd.grad(o, (feat, a_src, a_dst), torch.ones_like(o)) for o in outs]
    for p, q in zip(*grads):
        assert torch.allclose(p, q, atol=1e-5)
    x = torch.randn(n, 5, generator=gen, dtype=dtype, requires_grad=True)
    beta = torch.tensor([0.7], dtype=dtype, requires_grad=True)
    outs = [sg.agnn_attention(g, x, beta, backend=b) for b in ("cpu", "reference")]
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    grads = [torch.autograd.grad(o, (x, beta), torch.ones_like(o)) for o in outs]
    for p, q in zip(*grads):
        assert torch.allclose(p, q, atol=1e-4)


def test_gat_attention_dropout_on_cpu_drops_whole_edges():
    torch.manual_seed(1)
    n = 20
    ei = torch.stack([torch.arange(n).repeat(4), torch.arange(n).repeat_interleave(4)])
    g = Graph.from_edge_index(ei, num_nodes=n)
    feat = torch.ones(n, 1, 1)
    zeros = torch.zeros(n, 1)
    out = sg.gat_attention(g, feat, zeros, zeros, 0.2, 0.5, backend="cpu")
    # every target averages 4 ones; kept edges weigh 1/4 / 0.5 each: out = 0.5 * kept count
    kept = out.flatten() / 0.5
    assert torch.allclose(kept, kept.round()) and bool((kept <= 4).all())
    assert 0.3 < float(kept.mean()) / 4 < 0.7
    assert torch.allclose(F.dropout(feat, 0.0), feat)


def test_only_the_cpu_backends_candidates_are_timed_on_the_cpu(monkeypatch):
    from sparsegnn.tune import autotune

    monkeypatch.delenv("SPARSEGNN_TUNE", raising=False)
    monkeypatch.delenv("SPARSEGNN_AUTOTUNE", raising=False)
    assert autotune.autotune_enabled("cpu", "cpu_spmm")
    monkeypatch.setenv("TRITON_INTERPRET", "1")     # Triton kernels on CPU tensors: interpreter, never timed
    if not torch.cuda.is_available():
        assert not autotune.autotune_enabled("cpu", "spmm")
    monkeypatch.setenv("SPARSEGNN_TUNE", "off")
    assert not autotune.autotune_enabled("cpu", "cpu_spmm")


def test_dropout_op_passes_opcheck_and_compiles_to_the_same_masks():
    from sparsegnn.ops.dropout import _dropout_op

    x = torch.randn(40, 7, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(_dropout_op, (x, torch.tensor([12345]), 0.3))
    torch.manual_seed(3)
    eager = sg.dropout(x, 0.3)
    compiled_fn = torch.compile(lambda t: sg.dropout(t, 0.3), backend="aot_eager", fullgraph=True)
    torch.manual_seed(3)
    compiled = compiled_fn(x)
    assert torch.equal(eager, compiled)
    (g_eager,) = torch.autograd.grad(eager.sum(), x)
    (g_comp,) = torch.autograd.grad(compiled.sum(), x)
    assert torch.equal(g_eager, g_comp)


# ---------------------------------------------------------------------------- lane kernels
# Widths that make ``lanes_for`` pick every generated lane count, with and without a scalar rest
# (3: rest only; 24 -> 8 x 3; 100 -> 16 x 6 + 4; 130 -> 64 x 2 + 2).
LANE_WIDTHS = (3, 8, 16, 24, 64, 100, 130)


def test_lane_widths_cover_every_generated_lane_count():
    from sparsegnn.kernels import _lanes_gen

    for kernel in ("spmm_sum", "spmm_max", "spmm_max_grad"):
        assert {cpu_kernels.lanes_for(w, kernel) for w in LANE_WIDTHS} == set(_lanes_gen.LANES[kernel])
        assert {cpu_kernels.lanes_for(w, kernel, torch.float64) for w in LANE_WIDTHS} == {8}
    assert {cpu_kernels.lanes_dividing(w, "sddmm_dot", torch.float32) for w in LANE_WIDTHS} == {None, 8, 16, 64}
    assert any(w % cpu_kernels.lanes_for(w) for w in LANE_WIDTHS if w >= 8)   # a rest after lane blocks
    assert cpu_kernels.lanes_for(64) == 64 and cpu_kernels.lanes_for(16) == 16 and cpu_kernels.lanes_for(7) == 8


def test_the_generated_lane_module_is_current():
    from sparsegnn.kernels import _lanes_gen

    assert _lanes_gen.TARGET.read_text() == _lanes_gen.generate(), \
        "run: python -m sparsegnn.kernels._lanes_gen"


@pytest.fixture
def mixed_graph():
    from conftest import GRAPH_CASES

    _, n, ei, _ = GRAPH_CASES[0]
    return Graph.from_edge_index(ei, num_nodes=n), ei, n


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("width", LANE_WIDTHS)
@pytest.mark.parametrize("threads", [1, 2])
def test_lane_kernels_match_the_float64_oracle(mixed_graph, dtype, width, threads, monkeypatch):
    """spmm sum / mean (with and without values), max with its arg, sddmm dot: serial and
    parallel drivers, every lane count, against dense float64 computations."""
    g, ei, n = mixed_graph
    monkeypatch.setattr(cpu_kernels, "parallel", lambda work: threads > 1)
    gen = torch.Generator().manual_seed(width)
    x64 = torch.randn(n, width, generator=gen, dtype=torch.float64)
    w64 = torch.rand(g.num_edges, generator=gen, dtype=torch.float64) + 0.5
    x, w = x64.to(dtype), w64.to(dtype)
    bounds = cpu_kernels.chunk_bounds(g.rowptr, 5)
    a = torch.zeros(n, n, dtype=torch.float64).index_put_((g.row, g.col), w.double(), accumulate=True)
    ones = torch.zeros(n, n, dtype=torch.float64).index_put_((g.row, g.col), torch.ones(g.num_edges, dtype=torch.float64),
                                                             accumulate=True)
    xr = x.double()
    tol = TOL[dtype]
    assert _rel(cpu_kernels.spmm_sum(bounds, g.rowptr, g.col, w, x), a @ xr) < tol
    assert _rel(cpu_kernels.spmm_sum(bounds, g.rowptr, g.col, None, x), ones @ xr) < tol
    mean = cpu_kernels.spmm_sum(bounds, g.rowptr, g.col, w, x, mean=True)
    assert _rel(mean, (a @ xr) / ones.sum(1, keepdim=True).clamp(min=1)) < tol
    out, arg = cpu_kernels.spmm_max(bounds, g.rowptr, g.col, w, x, with_arg=True)
    msg = x.index_select(0, g.col) * w.unsqueeze(1)                  # rounded messages, as the kernel sees them
    expected = torch.full((n, width), -float("inf"), dtype=dtype).scatter_reduce(
        0, g.row.unsqueeze(1).expand_as(msg), msg, "amax")
    deg = g.rowptr.diff()
    expected[deg == 0] = 0
    assert torch.equal(out, expected)
    # arg: the first edge (in graph order) whose message equals the max; E for empty rows
    hit = msg == expected.index_select(0, g.row)
    first = torch.full((n, width), g.num_edges, dtype=torch.int64)
    edge_ids = torch.arange(g.num_edges).unsqueeze(1).expand_as(msg)
    first = first.scatter_reduce(0, g.row.unsqueeze(1).expand_as(msg),
                                 torch.where(hit, edge_ids, g.num_edges), "amin")
    assert torch.equal(arg.long(), first)
    # the max's input gradient over the transpose: dX[col e, f] += w_e g[i, f] for e = arg[i, f]
    grad = torch.randn(n, width, generator=gen, dtype=torch.float64).to(dtype)
    valid = first < g.num_edges
    edge = first.clamp(max=g.num_edges - 1)
    contrib = torch.where(valid, grad.double() * w.double()[edge], 0.0)
    expected_dx = torch.zeros(n, width, dtype=torch.float64).scatter_add_(0, g.col[edge], contrib)
    gt = g.t()
    dx = cpu_kernels.spmm_max_grad(cpu_kernels.chunk_bounds(gt.rowptr, 5), gt.rowptr, gt.col, g.transpose_parts()[2],
                                   w, arg, grad)
    assert _rel(dx, expected_dx) < tol
    b64 = torch.randn(n, width, generator=gen, dtype=torch.float64)
    dots = cpu_kernels.sddmm(bounds, g.rowptr, g.col, x, b64.to(dtype), "dot")
    assert _rel(dots, (xr.index_select(0, g.row) * b64.to(dtype).double().index_select(0, g.col)).sum(1)) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("heads,channels", [(2, 8), (2, 16), (1, 64), (4, 3), (3, 24), (1, 100)])
@pytest.mark.parametrize("threads", [1, 2])
def test_per_head_lane_kernels_match_the_float64_oracle(mixed_graph, dtype, heads, channels, threads, monkeypatch):
    g, ei, n = mixed_graph
    monkeypatch.setattr(cpu_kernels, "parallel", lambda work: threads > 1)
    gen = torch.Generator().manual_seed(heads * 100 + channels)
    width = heads * channels
    x = torch.randn(n, width, generator=gen, dtype=torch.float64).to(dtype)
    b = torch.randn(n, width, generator=gen, dtype=torch.float64).to(dtype)
    w = (torch.rand(g.num_edges, heads, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    bounds = cpu_kernels.chunk_bounds(g.rowptr, 5)
    out = cpu_kernels.spmm_sum(bounds, g.rowptr, g.col, w, x)
    msg = x.double().index_select(0, g.col).view(-1, heads, channels) * w.double().unsqueeze(2)
    expected = torch.zeros(n, heads, channels, dtype=torch.float64).index_add_(0, g.row, msg).view(n, width)
    assert _rel(out, expected) < TOL[dtype]
    dots = cpu_kernels.sddmm(bounds, g.rowptr, g.col, x, b, "dot", heads)
    ref = (x.double().index_select(0, g.row) * b.double().index_select(0, g.col)).view(-1, heads, channels).sum(2)
    assert dots.shape == (g.num_edges, heads) and _rel(dots, ref) < TOL[dtype]


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
def test_non_finite_scores_and_messages_and_empty_widths_agree_across_backends(backend):
    """A NaN score makes its target's softmax NaN (as ``torch.softmax`` does), and so does a
    target whose scores are all -inf; other targets are untouched.  A max over messages that are
    all -inf is -inf; only a target without edges gets 0.  A dot product over 0 features is 0."""
    nan, inf = float("nan"), float("inf")
    dev = DEVICE if backend == "triton" else "cpu"    # Triton: the GPU's kernels, else the interpreter
    # targets: 0 <- {1, 2} (a NaN score), 1 <- {0, 2} (finite), 2 <- {0, 1} (all -inf), 3: no edges
    ei = torch.tensor([[1, 2, 0, 2, 0, 1], [0, 0, 1, 1, 2, 2]], device=dev)
    scores = torch.tensor([nan, 1.0, 0.0, math.log(3.0), -inf, -inf], device=dev)
    alpha = sg.edge_softmax(ei, scores, num_nodes=4, backend=backend).cpu()
    assert alpha[:2].isnan().all() and alpha[4:].isnan().all()
    assert torch.allclose(alpha[2:4], torch.tensor([0.25, 0.75]))
    x = torch.tensor([[-inf, 1.0], [-inf, 2.0], [5.0, -inf], [7.0, 7.0]], device=dev)
    out = sg.spmm(Graph.from_edge_index(ei, num_nodes=4), x, reduce="max", backend=backend).cpu()
    expected = torch.tensor([[5.0, 2.0], [5.0, 1.0], [-inf, 2.0], [0.0, 0.0]])
    assert torch.equal(out, expected)
    empty = torch.ones(4, 0, device=dev)
    assert torch.equal(sg.sddmm(ei, empty, empty, backend=backend).cpu(), torch.zeros(6))
