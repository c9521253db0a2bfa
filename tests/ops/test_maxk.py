"""MaxK (top-k per row, CBSR) and the aggregation of CBSR features.

The selection is checked against a brute-force oracle (per row: order by value descending,
NaN first, ties by column), the Triton kernel through the interpreter on CPU machines."""
import math

import pytest
import torch

import sparsegnn as sg
from sparsegnn import CBSR, Graph

from conftest import DEVICE, dense_adjacency


def _oracle(x: torch.Tensor, k: int):
    """Kept columns of every row, increasing: the k best by (larger value, lower column), NaN and
    +inf ranking as the largest float32, -inf as the smallest."""
    big = 3.4028234663852886e38
    out = []
    for row in x.float().double().tolist():
        row = [big if (math.isnan(v) or v > big) else (-big if v < -big else v) for v in row]
        rank = sorted(range(len(row)), key=lambda f: (-row[f], f))
        out.append(sorted(rank[:k]))
    return torch.tensor(out, dtype=torch.long)


def _inputs(n, f, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=gen)
    x[1] = 0.5                                     # a row of ties
    x[2, ::3] = 2.0                                # ties at the top
    x[3, : f // 2] = -0.0                          # signed zeros tie with +0
    x[3, f // 2:] = 0.0
    x[4] = x[4].round()                            # many small ties
    x[7, 0], x[7, 1] = 3e38, -3e38                 # hi - lo overflows fp32
    x[8] = (x[8] * 1e-3).round() * 1e-30           # ties among tiny values
    return x.to(dtype)


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("f,k", [(20, 1), (37, 5), (64, 64), (300, 31), (700, 40)])
def test_maxk_matches_the_oracle(backend, dtype, f, k):
    x = _inputs(9, f, dtype, seed=f + k)
    if dtype == torch.float32:
        x[5, 7] = float("nan")                     # NaN and +inf tie as the largest float
        x[5, 2] = float("inf")
        x[6, 3] = float("-inf")
    assert x.shape[0] == 9
    out = sg.maxk(x.to(DEVICE), k, backend=backend)
    want = _oracle(x, k)
    assert out.index.dtype == (torch.uint8 if f <= 256 else torch.int16)
    assert torch.equal(out.index.long().cpu(), want)
    assert torch.equal(out.values.cpu(), x.gather(1, want)) or torch.allclose(
        out.values.cpu().float(), x.gather(1, want).float(), equal_nan=True)
    assert out.k == k and out.num_cols == f and out.shape == (9, f)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("k", [8, 16, 64])
def test_maxk_with_many_ties_matches_the_oracle(dtype, k):
    """Integer-valued rows: the k-th value is tied in most rows (the bracket snaps to data
    values and the threshold can be its upper end).  The first three rows are ones where a
    version that took the lower end (k = 16) kept too many entries, found by a search over
    3000 such rows."""
    found = [torch.randn(1000, 256, generator=torch.Generator().manual_seed(seed))[row]
             for seed, row in ((0, 61), (1, 243), (2, 680))]
    x = torch.cat([torch.stack(found), torch.randn(29, 256, generator=torch.Generator().manual_seed(k))]).round()
    x = x.to(dtype)
    out = sg.maxk(x.to(DEVICE), k, backend="triton")
    assert torch.equal(out.index.long().cpu(), _oracle(x, k))


def test_maxk_dense_and_gradient():
    x = torch.randn(6, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    dense = sg.maxk(x, 4, dense=True)
    kept = _oracle(x.detach(), 4)
    mask = torch.zeros(6, 12, dtype=torch.bool).scatter_(1, kept, True)
    assert torch.equal(dense.detach(), torch.where(mask, x.detach(), torch.zeros(())))
    up = torch.randn(6, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    dense.backward(up)
    assert torch.equal(x.grad, torch.where(mask, up, torch.zeros(())))   # only the kept entries
    torch.autograd.gradcheck(lambda t: sg.maxk(t, 4).values, (x.detach().clone().requires_grad_(True),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("f,k", [(20, 1), (37, 5), (64, 64), (300, 31)])
def test_maxk_dense_on_triton_matches_the_oracle(dtype, f, k):
    """The dense form's one-pass mask (``kernels.maxk.maxk_keep_mask``): x at the oracle's kept
    entries, zeros elsewhere (a -inf left out is 0), ties as the CBSR form keeps them,
    from a strided x too; the gradient reaches the kept entries only."""
    x = _inputs(9, f, dtype, seed=f + 3 * k)
    if dtype == torch.float32:
        x[5, 7] = float("nan")
        x[5, 2] = float("inf")
        x[6, 3] = float("-inf")
    kept = torch.zeros(9, f, dtype=torch.bool).scatter_(1, _oracle(x, k), True)
    want = torch.where(kept, x, torch.zeros((), dtype=dtype))
    for given in (x, torch.cat([x, x], dim=1)[:, :f]):        # contiguous, and with a row stride of 2 f
        given = given.to(DEVICE).detach().requires_grad_(True)
        dense = sg.maxk(given, k, dense=True, backend="triton")
        assert dense.shape == (9, f) and dense.dtype == dtype
        assert torch.equal(dense.detach().cpu(), want) or torch.allclose(
            dense.detach().cpu().float(), want.float(), equal_nan=True)
        up = torch.randn(9, f, generator=torch.Generator().manual_seed(k)).to(dtype)
        (grad,) = torch.autograd.grad(dense, given, up.to(DEVICE))
        assert torch.equal(grad.cpu(), torch.where(kept, up, torch.zeros((), dtype=dtype)))


def test_maxk_triton_gradient_flows_to_the_kept_entries():
    x = torch.randn(10, 40, generator=torch.Generator().manual_seed(5)).to(DEVICE).requires_grad_(True)
    out = sg.maxk(x, 8, backend="triton")
    weights = torch.arange(80, dtype=torch.float32, device=DEVICE).view(10, 8)
    (out.values * weights).sum().backward()
    want = torch.zeros(10, 40).scatter_(1, out.index.long().cpu(), weights.cpu())
    assert torch.equal(x.grad.cpu(), want)


@pytest.mark.parametrize("call,message", [
    (lambda x: sg.maxk(x, 0), "k must be an int in"),
    (lambda x: sg.maxk(x, 13), "k must be an int in"),
    (lambda x: sg.maxk(x[0], 2), "2-D tensor"),
    (lambda x: sg.maxk(x.long(), 2), "floating tensor"),
    (lambda x: sg.maxk(x, 2, backend="cuda"), "backend must be one of"),
    (lambda x: sg.maxk(x.double(), 2, backend="triton"), "float32 / float16 / bfloat16"),
])
def test_maxk_rejects_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(4, 12))


def test_cbsr_validates_its_parts():
    values, index = torch.randn(3, 2), torch.tensor([[0, 2], [1, 3], [0, 1]], dtype=torch.uint8)
    c = CBSR(values, index, 4)
    c.check_index()
    assert torch.equal(c.to_dense()[1], torch.tensor([0.0, values[1, 0], 0.0, values[1, 1]]))
    with pytest.raises(ValueError, match="one shape"):
        CBSR(values, index[:, :1], 4)
    with pytest.raises(ValueError, match="integer"):
        CBSR(values, index.float(), 4)
    with pytest.raises(ValueError, match="in \\[1, num_cols"):
        CBSR(values, index, 1)
    with pytest.raises(ValueError, match="strictly increasing"):
        CBSR(values, torch.tensor([[2, 0], [1, 3], [0, 1]]), 4).check_index()
    with pytest.raises(ValueError, match="lie in"):
        CBSR(values, torch.tensor([[0, 4], [1, 3], [0, 1]]), 4).check_index()


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_of_cbsr_matches_dense_and_gradchecks(graph_case, reduce):
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w, num_nodes=n)
    x = torch.randn(n, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    c = sg.maxk(x, 3)
    adj = dense_adjacency(ei, n, w)
    if reduce == "mean":
        adj = adj / dense_adjacency(ei, n).sum(1, keepdim=True).clamp(min=1)
    assert torch.allclose(sg.spmm(g, c, reduce=reduce), adj @ c.to_dense(), atol=1e-12)
    values = c.values.detach().clone().requires_grad_(True)
    weight = g.edge_val.clone().double().requires_grad_(True)
    torch.autograd.gradcheck(
        lambda v, wt: sg.spmm(g, CBSR(v, c.index, 10), reduce=reduce, edge_weight=wt, backend="reference"),
        (values, weight))


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
def test_spmm_of_cbsr_on_triton_matches_float64(reduce, dtype, tol):
    """The CBSR kernels (atomic SpGEMM forward, sampled SSpMM backward) against float64 dense
    products on a graph with duplicates, self loops, empty rows and isolated nodes."""
    ei, w = sg.datasets.random_graph(40, 260, seed=3, num_isolated=2, num_empty_rows=4, num_self_loops=3,
                                     num_duplicates=5, weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=40).to(DEVICE)
    x = torch.randn(40, 48, generator=torch.Generator().manual_seed(8)).to(dtype).to(DEVICE).requires_grad_(True)
    c = sg.maxk(x, 6)
    out = sg.spmm(g, c, reduce=reduce, backend="triton")
    assert out.dtype == dtype
    adj = dense_adjacency(ei, 40, w)
    if reduce == "mean":
        adj = adj / dense_adjacency(ei, 40).sum(1, keepdim=True).clamp(min=1)
    want = adj @ c.to_dense().detach().double().cpu()
    assert float((out.detach().double().cpu() - want).norm() / want.norm()) < tol
    up = torch.randn(40, 48, generator=torch.Generator().manual_seed(9)).to(dtype)
    out.backward(up.to(DEVICE))
    grad_dense = adj.t() @ up.double()
    kept = c.index.long().cpu()
    want_grad = torch.zeros(40, 48, dtype=torch.float64).scatter_(1, kept, grad_dense.gather(1, kept))
    assert float((x.grad.double().cpu() - want_grad).norm() / want_grad.norm()) < tol


def test_spmm_of_cbsr_rejects_what_it_cannot_do():
    ei = torch.tensor([[0, 1], [1, 2]])
    c = sg.maxk(torch.randn(3, 4), 2)
    with pytest.raises(ValueError, match="reduce='sum' or 'mean'"):
        sg.spmm(ei, c, reduce="max")
    with pytest.raises(ValueError, match="exactly"):
        sg.spmm(ei, c, precision="tf32")
    with pytest.raises(ValueError, match="rows"):
        sg.spmm(Graph.from_edge_index(ei, num_nodes=5), c)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA CBSR kernel needs a GPU (and CuPy)")
@pytest.mark.parametrize("k,cols,edges,weighted,mean", [(5, 200, 4000, True, False), (32, 200, 4000, True, False),
                                                        (40, 200, 4000, True, False), (130, 200, 4000, True, False),
                                                        (1, 20, 30000, False, True), (31, 256, 30000, True, True),
                                                        (32, 256, 30000, False, False), (32, 33, 700, True, False)])
def test_cuda_cbsr_spgemm_matches_float64_and_is_deterministic(k, cols, edges, weighted, mean):
    """The shared-memory CUDA forward (rows heaviest first) against float64, run twice bit-equal:
    a hub, k below, at and above one warp's width, rows of ~100 edges (several batches), a source
    repeated in a row (equal columns in consecutive steps), edge weights or none, a mean's row
    scale, a kept inf (only the rows that read it may hold inf)."""
    from sparsegnn.kernels import cbsr_cuda
    from sparsegnn.ops._triton import plan_of
    from sparsegnn.ops.cbsr import _kernel_weights

    if not cbsr_cuda.available():
        pytest.skip("CuPy is not installed")
    ei, w = sg.datasets.random_graph(300, edges, seed=11, num_isolated=3, num_empty_rows=5, num_self_loops=4,
                                     num_duplicates=9, weighted=True)
    hub = torch.stack([torch.arange(300), torch.full((300,), 7)])
    dup = torch.tensor([[4, 4, 4, 9, 9], [2, 2, 2, 2, 2]])   # the same source thrice in a row
    ei, w = torch.cat([ei, hub, dup], 1), torch.cat([w, torch.rand(305) + 0.5])
    if not weighted:
        w = None
    g = Graph.from_edge_index(ei, w, num_nodes=300).to(DEVICE)
    h = torch.randn(300, cols, device=DEVICE)
    h[11, :3] = float("inf")   # a kept inf: must not leak NaN into rows that do not read it
    c = sg.maxk(h, k)
    plan = plan_of(g)
    weight, scale = _kernel_weights(g, g.edge_val, "mean" if mean else "sum")
    run = lambda: cbsr_cuda.spgemm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, weight, c.values,  # noqa: E731
                                            c.index, 300, cols, scale)
    out = run()
    assert torch.equal(out, run())
    adj = dense_adjacency(ei, 300, w)
    if mean:
        adj = adj / dense_adjacency(ei, 300).sum(1, keepdim=True).clamp(min=1)
    x = c.to_dense().double().cpu()
    reads_inf, inf_cols = adj[:, 11] != 0, torch.isinf(x[11])
    assert reads_inf.any() and inf_cols.sum() == min(k, 3)
    x[11, inf_cols] = 0.0
    want = adj @ x
    got = out.double().cpu()
    assert torch.isinf(got[reads_inf][:, inf_cols]).all() and torch.isfinite(got[~reads_inf]).all()
    assert torch.isfinite(got[:, ~inf_cols]).all()
    keep = ~(reads_inf[:, None] & inf_cols[None, :])
    assert float((got[keep] - want[keep]).norm() / want[keep].norm()) < 1e-6


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA CBSR kernels need a GPU (and CuPy)")
@pytest.mark.parametrize("k", [5, 32, 40, 130, 256])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_cuda_cbsr_sspmm_matches_float64(k, reduce):
    """The outer-product backward kernel (float4 atomics for k % 4 == 0, scalar ones else; a
    hub row; k above one warp's width) against float64, whatever the schedule would pick."""
    from sparsegnn.kernels import cbsr_cuda
    from sparsegnn.ops._triton import plan_of
    from sparsegnn.ops.cbsr import _kernel_weights

    if not cbsr_cuda.available():
        pytest.skip("CuPy is not installed")
    ei, w = sg.datasets.random_graph(300, 4000, seed=12, num_isolated=3, num_empty_rows=5, num_self_loops=4,
                                     num_duplicates=9, weighted=True)
    hub = torch.stack([torch.full((300,), 9), torch.arange(300)])
    ei, w = torch.cat([ei, hub], 1), torch.cat([w, torch.rand(300) + 0.5])
    g = Graph.from_edge_index(ei, w, num_nodes=300).to(DEVICE)
    c = sg.maxk(torch.randn(300, 256, device=DEVICE), k)
    up = torch.randn(300, 256, device=DEVICE)
    adj = dense_adjacency(ei, 300, w)
    if reduce == "mean":
        adj = adj / dense_adjacency(ei, 300).sum(1, keepdim=True).clamp(min=1)
    plan = plan_of(g)
    w, scale = _kernel_weights(g, g.edge_val, reduce)
    got = cbsr_cuda.sspmm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, w, up, c.index, 300, scale)
    want = (adj.t() @ up.double().cpu()).gather(1, c.index.long().cpu())
    assert float((got.double().cpu() - want).norm() / want.norm()) < 1e-6


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA CBSR kernels need a GPU (and CuPy)")
def test_cbsr_schedules_follow_k_and_deterministic_mode():
    """The forward runs the SpGEMM while 4 k <= F, the backward the atomic outer product while
    8 k <= F (or 4 k <= F with an L2-sized dvalues), and never under deterministic algorithms:
    then the gradient is bit-equal run to run and matches the atomic one to rounding."""
    from sparsegnn.kernels import cbsr_cuda
    from sparsegnn.ops.cbsr import backward_schedule, forward_schedule

    if not cbsr_cuda.available():
        pytest.skip("CuPy is not installed")
    x = torch.randn(300, 256, device=DEVICE, requires_grad=True)
    for k, fwd, bwd in ((32, "spgemm", "outer"), (64, "spgemm", "outer"), (65, "dense", "dense")):
        c = sg.maxk(x, k)
        assert forward_schedule(c.values, c.index, 256, "triton") == fwd
        assert backward_schedule(c.values, c.index, 256, x, "triton") == bwd
    c = sg.maxk(x, 32)
    star = Graph.from_edge_index(torch.stack([torch.arange(1, 4000) % 300, torch.zeros(3999, dtype=torch.long)]),
                                 num_nodes=300).to(DEVICE)          # one row of 3,999 edges: a warp's hub
    assert forward_schedule(c.values, c.index, 256, "triton", star) == "dense"
    assert backward_schedule(c.values, c.index, 256, x, "triton", star) == "dense"
    big = sg.maxk(torch.randn(200_000, 256, device=DEVICE), 64)         # dvalues of 51 MB: past L2
    assert backward_schedule(big.values, big.index, 256, x, "triton") == "dense"
    ei, w = sg.datasets.random_graph(300, 4000, seed=13, num_isolated=3, num_self_loops=4, num_duplicates=9,
                                     weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=300).to(DEVICE)
    up = torch.randn(300, 256, device=DEVICE)

    def grad_of_x():
        x.grad = None
        sg.spmm(g, sg.maxk(x, 32), reduce="mean", edge_weight=g.edge_val, backend="triton").backward(up)
        return x.grad.clone()

    atomic = grad_of_x()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        c = sg.maxk(x, 32)
        assert backward_schedule(c.values, c.index, 256, x, "triton") == "dense"
        first = grad_of_x()
        assert torch.equal(first, grad_of_x())
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.allclose(atomic, first, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA CBSR kernels need a GPU (and CuPy)")
@pytest.mark.parametrize("k", [32, 64])
@pytest.mark.parametrize("hub", [False, True])
def test_cbsr_forward_schedule_timed_on_an_invested_graph(fresh_store, monkeypatch, k, hub):
    """On a graph invested in, the tuner times the forward rule's schedule (the SpGEMM, or the
    dense product where a hub holds a warp) against the other; the other runs only when it is
    more than 3 % faster, the record names the schedule that runs, and whichever runs, the
    output and the gradient match the float64 reference (empty rows, self loops, duplicates,
    edge weights, mean)."""
    from sparsegnn.kernels import cbsr_cuda
    from sparsegnn.ops.cbsr import FORWARD_FAMILY, FORWARD_SCHEDULES, forward_schedule
    from sparsegnn.tune import autotune, set_timer
    from sparsegnn.tune.store import reset_stores

    if not cbsr_cuda.available():
        pytest.skip("CuPy is not installed")
    ei, w = sg.datasets.random_graph(300, 4000, seed=17, num_isolated=3, num_empty_rows=5, num_self_loops=4,
                                     num_duplicates=9, weighted=True)
    if hub:      # one row of 3,999 edges: the rule takes the dense product
        ei = torch.cat([ei, torch.stack([torch.arange(1, 4000) % 300, torch.zeros(3999, dtype=torch.long)])], 1)
        w = torch.cat([w, torch.rand(3999) + 0.5])
    rule = "dense" if hub else "spgemm"
    other = "spgemm" if hub else "dense"
    adj = dense_adjacency(ei, 300, w)
    adj = adj / dense_adjacency(ei, 300).sum(1, keepdim=True).clamp(min=1)
    up = torch.randn(300, 256, dtype=torch.float64)
    spgemm_calls = []
    real_spgemm = cbsr_cuda.spgemm_cbsr_cuda
    monkeypatch.setattr(cbsr_cuda, "spgemm_cbsr_cuda", lambda *a, **kw: spgemm_calls.append(1) or real_spgemm(*a, **kw))
    for other_ms, runs in ((0.5, other), (0.99, rule), (2.0, rule)):   # the other faster / within 3 % / slower
        monkeypatch.setenv("SPARSEGNN_TUNE_CACHE", str(fresh_store / f"{k}-{hub}-{other_ms}"))
        reset_stores()
        fast = FORWARD_SCHEDULES.index(other)
        set_timer(lambda run, cfg, other_ms=other_ms: other_ms if cfg.get("path") == fast else 1.0)
        g = Graph.from_edge_index(ei, w, num_nodes=300).to(DEVICE)
        x = torch.randn(300, 256, device=DEVICE, requires_grad=True)
        c = sg.maxk(x, k)
        assert forward_schedule(c.values, c.index, 256, "triton", g) == rule
        sg.spmm(g, c, reduce="mean", edge_weight=g.edge_val, backend="triton")   # decides (the timer runs nothing)
        spgemm_calls.clear()
        y = sg.spmm(g, c, reduce="mean", edge_weight=g.edge_val, backend="triton")
        assert bool(spgemm_calls) == (runs == "spgemm"), (other_ms, runs)
        y.backward(up.float().to(DEVICE))
        xd = x.detach().double().cpu().requires_grad_()
        kept = sg.maxk(x.detach(), k, dense=True).cpu() != 0
        ref = adj @ (xd * kept)
        ref.backward(up)
        assert float((y.double().cpu() - ref).norm() / ref.norm()) < 1e-6
        assert float((x.grad.double().cpu() - xd.grad).norm() / xd.grad.norm()) < 1e-6
        record = autotune.lookup(FORWARD_FAMILY, g, f"k{k}|mean|w1", 256, torch.float32, DEVICE)
        assert record is not None and FORWARD_SCHEDULES[record["config"]["path"]] == runs, (other_ms, record)


def _cbsr_linear_case(n, f_in, f_out, k, seed, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f_in, generator=g)
    x[:3] = 0.0                                     # rows of ties: the kept columns are the first k
    c = sg.maxk(x.to(device), k)
    w = torch.randn(f_out, f_in, generator=g).to(device)
    b = torch.randn(f_out, generator=g).to(device)
    return c, w, b


@pytest.mark.parametrize("k,f_in,f_out", [(3, 20, 7), (8, 64, 64)])
def test_cbsr_linear_matches_the_dense_linear_and_gradchecks(k, f_in, f_out):
    """X W^T + b of CBSR features against the dense map of the densified matrix (float64), and
    float64 gradcheck in values, weight and bias (the reference path on the CPU)."""
    from sparsegnn.ops.cbsr import cbsr_linear

    c, w, b = _cbsr_linear_case(30, f_in, f_out, k, seed=3, device="cpu")
    vals = c.values.double().requires_grad_()
    w64, b64 = w.double().requires_grad_(), b.double().requires_grad_()
    got = cbsr_linear(c.with_values(vals), w64, b64)
    dense = torch.zeros(30, f_in, dtype=torch.float64)
    for i in range(30):
        for s in range(k):
            dense[i, int(c.index[i, s])] = vals[i, s]
    torch.testing.assert_close(got, dense @ w64.t() + b64)
    assert torch.autograd.gradcheck(lambda v, ww, bb: cbsr_linear(c.with_values(v), ww, bb), (vals, w64, b64))


def test_cbsr_linear_rejects_bad_input():
    from sparsegnn.ops.cbsr import cbsr_linear

    c, w, b = _cbsr_linear_case(10, 16, 8, 4, seed=4, device="cpu")
    with pytest.raises(ValueError, match=r"cbsr_linear\(\): weight must be \[F_out, 16\]"):
        cbsr_linear(c, w.t(), b)
    with pytest.raises(ValueError, match=r"cbsr_linear\(\): bias must be \[8\]"):
        cbsr_linear(c, w, b[:3])
    with pytest.raises(ValueError, match=r"cbsr_linear\(\): x must be a CBSR"):
        cbsr_linear(c.to_dense(), w, b)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA root kernels need a GPU (and CuPy)")
@pytest.mark.parametrize("k,f_in,f_out", [(32, 256, 256), (5, 256, 256), (12, 64, 100), (64, 256, 260),
                                          (40, 200, 128), (1, 8, 4)])
def test_cuda_cbsr_root_kernels_match_float64(k, f_in, f_out):
    """The CUDA root forward and its sampled gradient (vector / scalar entry loads, one to three
    column tiles, partial tiles, k above a warp's width) against float64, whatever the schedule
    would pick; the forward bit-equal run to run, and the gradient too while at most two tiles add."""
    from sparsegnn.kernels import cbsr_cuda

    if not cbsr_cuda.available():
        pytest.skip("CuPy is not installed")
    n = 301                                              # not a multiple of the 4 rows a warp takes
    c, w, b = _cbsr_linear_case(n, f_in, f_out, k, seed=5)
    wt = w.t().contiguous()
    dense = c.to_dense().double()
    out = cbsr_cuda.cbsr_root_cuda(c.values, c.index, wt, b)
    want = dense @ w.double().t() + b.double()
    assert float((out.double() - want).norm() / want.norm()) < 1e-6
    assert torch.equal(out, cbsr_cuda.cbsr_root_cuda(c.values, c.index, wt, b))
    up = torch.randn(n, f_out, device=DEVICE)
    got, _ = cbsr_cuda.cbsr_root_grad_cuda(up, c.index, wt)
    want_g = (up.double() @ w.double()).gather(1, c.index.long())
    assert float((got.double() - want_g).norm() / want_g.norm()) < 1e-6
    if f_out <= 2 * cbsr_cuda.ROOT_TILE:
        assert torch.equal(got, cbsr_cuda.cbsr_root_grad_cuda(up, c.index, wt)[0])
    same, db = cbsr_cuda.cbsr_root_grad_cuda(up, c.index, wt, bias_grad=True)   # with the fused bias gradient
    torch.testing.assert_close(same, got, rtol=0, atol=0 if f_out <= 2 * cbsr_cuda.ROOT_TILE else 1e-5)
    torch.testing.assert_close(db.double(), up.double().sum(0), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA root kernels need a GPU (and CuPy)")
@pytest.mark.parametrize("n,f_in,f_out", [(5000, 256, 256), (70, 8, 12), (3000, 64, 384)])
def test_cuda_root_bias_gradient_is_one_launch_reused_by_streams_and_captures(n, f_in, f_out):
    """The root gradient's bias sum (the last block to arrive adds the blocks' partial rows)
    against float64, bit-equal run to run, on a second stream, and replayed from a CUDA graph
    (each replay zeroes a counter of the capture's own), and its kept per-stream counter reset by
    the last block (eager calls one after the other: a counter left non-zero would make no block
    the last and leave the sum unwritten); two captured graphs replayed at once on two streams
    with new gradients every round (each capture has counters of its own)."""
    from sparsegnn.kernels import cbsr_cuda

    if not cbsr_cuda.available():
        pytest.skip("CuPy is not installed")
    c, w, _ = _cbsr_linear_case(n, f_in, f_out, 4, seed=9)
    wt = w.t().contiguous()
    up = torch.randn(n, f_out, device=DEVICE)
    want = up.double().sum(0)
    _, db = cbsr_cuda.cbsr_root_grad_cuda(up, c.index, wt, bias_grad=True)
    torch.testing.assert_close(db.double(), want, rtol=1e-5, atol=1e-4)
    for _ in range(3):
        assert torch.equal(cbsr_cuda.cbsr_root_grad_cuda(up, c.index, wt, bias_grad=True)[1], db)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        other = cbsr_cuda.cbsr_root_grad_cuda(up, c.index, wt, bias_grad=True)[1]
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(other, db)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = cbsr_cuda.cbsr_root_grad_cuda(up, c.index, wt, bias_grad=True)[1]
    for scale in (1.0, 2.0, -0.5):
        up.mul_(scale)
        for _ in range(4):
            captured.fill_(float("nan"))
            graph.replay()
        torch.testing.assert_close(captured.double(), up.double().sum(0), rtol=1e-5, atol=1e-4)
    assert torch.equal(cbsr_cuda.cbsr_root_grad_cuda(up, c.index, wt, bias_grad=True)[1], captured)
    # a second capture, and both graphs replayed at once on two streams: each has its own counter
    up2 = torch.randn(n, f_out, device=DEVICE)
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph2):
        captured2 = cbsr_cuda.cbsr_root_grad_cuda(up2, c.index, wt, bias_grad=True)[1]
    # new gradients and NaN-filled results every round, each round checked: a shared counter (the
    # last block of one graph counting the other's arrivals) would sum partial rows not yet
    # written for these gradients, or leave a sum unwritten
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    for _ in range(20):
        up.copy_(torch.randn_like(up))
        up2.copy_(torch.randn_like(up2))
        captured.fill_(float("nan"))
        captured2.fill_(float("nan"))
        for side_stream, g in zip(streams, (graph, graph2)):
            side_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side_stream):
                g.replay()
        for side_stream in streams:
            torch.cuda.current_stream().wait_stream(side_stream)
        torch.testing.assert_close(captured.double(), up.double().sum(0), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(captured2.double(), up2.double().sum(0), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA densify kernel needs a GPU (and CuPy)")
@pytest.mark.parametrize("k,f", [(32, 256), (3, 30), (40, 200), (256, 256)])
def test_cuda_densify_equals_the_torch_scatter(k, f):
    """One-pass densify (maxk's backward, the root term's weight gradient) bit-equal to zeros +
    scatter, also for widths that are not a multiple of 4 and k = F."""
    from sparsegnn.kernels import cbsr_cuda

    if not cbsr_cuda.available():
        pytest.skip("CuPy is not installed")
    c = sg.maxk(torch.randn(1001, f, device=DEVICE), k)
    want = torch.zeros(1001, f, device=DEVICE).scatter_(1, c.index.long(), c.values)
    assert torch.equal(cbsr_cuda.densify_cuda(c.values, c.index, f), want)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA root kernels need a GPU (and CuPy)")
def test_cbsr_linear_on_the_gpu_takes_the_kernels_and_matches_autograd_of_the_dense_map():
    """cbsr_linear on CUDA runs the root kernels while 4 k <= F_in (dense past it); values,
    weight and bias gradients equal those of F.linear on the densified matrix."""
    from sparsegnn.ops.cbsr import cbsr_linear, root_schedule

    c, w, b = _cbsr_linear_case(500, 256, 256, 32, seed=6)
    assert root_schedule(c.values, c.index, w, "triton") == "cuda"
    wide = sg.maxk(torch.randn(10, 256, device=DEVICE), 65)
    assert root_schedule(wide.values, wide.index, w, "triton") == "dense"
    outs = []
    for fn in (lambda v, ww, bb: cbsr_linear(c.with_values(v), ww, bb),
               lambda v, ww, bb: torch.nn.functional.linear(c.with_values(v).to_dense(), ww, bb)):
        v, ww, bb = (t.detach().clone().requires_grad_() for t in (c.values, w, b))
        y = fn(v, ww, bb)
        y.backward(0.5 + y.detach().sin())
        outs.append((y.detach(), v.grad, ww.grad, bb.grad))
    for got, want in zip(outs[0], outs[1]):
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-4)


# ---------------------------------------------------------------- LayerNorm + MaxK, fused
def _ln64(x, w, b, eps=1e-5):
    return torch.nn.functional.layer_norm(x.double(), (x.shape[1],), w.double(), b.double(), eps)


def _check_selection(c, y64, k, tol):
    """``c`` keeps k entries of each row of ``y64`` (float64 LayerNorm output): its values match ``y64``
    there, and no dropped entry exceeds a kept one by more than ``tol`` (the fp32 ranking may order
    entries within rounding of each other differently)."""
    idx = c.index.long().cpu()
    assert idx.shape == (y64.shape[0], k) and bool((idx[:, 1:] > idx[:, :-1]).all())   # distinct, increasing
    kept = y64.gather(1, idx)
    scale = y64.abs().amax(1, keepdim=True).clamp_min(1.0)
    assert ((c.values.cpu().double() - kept).abs() <= tol * scale).all()
    dropped = y64.masked_fill(torch.zeros_like(y64, dtype=torch.bool).scatter_(1, idx, True), -float("inf"))
    assert (dropped.amax(1) <= kept.amin(1) + tol * scale[:, 0]).all()


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 8e-3)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("f,k", [(20, 1), (37, 5), (64, 64), (256, 32), (300, 31)])
def test_layer_norm_maxk_matches_float64(backend, dtype, tol, f, k):
    gen = torch.Generator().manual_seed(f * 7 + k)
    x = torch.randn(11, f, generator=gen) * 3 + 1
    x[1] = 0.1                                     # a constant row: y = bias (its mean must be exact)
    x[2] = x[2].round()                            # ties after normalising
    x[3] *= 1e4                                    # a wide row
    w, b = torch.randn(f, generator=gen), torch.randn(f, generator=gen) * 0.1
    x, w, b = x.to(dtype), w.to(dtype), b.to(dtype)
    c = sg.layer_norm_maxk(x.to(DEVICE), k, w.to(DEVICE), b.to(DEVICE), backend=backend)
    assert c.values.dtype == dtype and c.num_cols == f and c.k == k
    _check_selection(c, _ln64(x, w, b), k, tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("f,k,eps", [(37, 5, 1e-5), (256, 32, 1e-5), (64, 64, 1e-5), (40, 7, 0.3)])
def test_layer_norm_maxk_gradients_match_float64(f, k, eps, dtype, tol):
    """dx, dweight, dbias of the fused kernels against float64 autograd of LayerNorm at the kept columns
    (a row offset by 1e4 and a low-variance row, where eps weighs, among them)."""
    gen = torch.Generator().manual_seed(f + k)
    x = torch.randn(13, f, generator=gen) * 2 - 0.5
    x[4] += 1e4
    x[5] = 0.5 + 0.01 * torch.randn(f, generator=gen)
    w, b = torch.randn(f, generator=gen), torch.randn(f, generator=gen)
    up = torch.randn(13, k, generator=gen)
    x, w, b, up = x.to(dtype), w.to(dtype), b.to(dtype), up.to(dtype)
    leaves = [t.to(DEVICE).clone().requires_grad_(True) for t in (x, w, b)]
    c = sg.layer_norm_maxk(leaves[0], k, leaves[1], leaves[2], eps, backend="triton")
    (c.values * up.to(DEVICE)).sum().backward()
    ref = [t.detach().double().requires_grad_(True) for t in (x, w, b)]
    y = torch.nn.functional.layer_norm(ref[0], (f,), ref[1], ref[2], eps)
    (y.gather(1, c.index.long().cpu()) * up.double()).sum().backward()
    for got, want in zip(leaves, ref):
        assert got.grad.dtype == dtype
        torch.testing.assert_close(got.grad.cpu().double(), want.grad, rtol=tol, atol=tol * want.grad.abs().max())


def test_layer_norm_maxk_eps_and_once_differentiable():
    """eps reaches the kernel (a low-variance row); the backward is once differentiable (a double
    backward raises instead of silently dropping the second-order term)."""
    gen = torch.Generator().manual_seed(11)
    x = (0.5 + 0.01 * torch.randn(6, 40, generator=gen)).to(DEVICE).requires_grad_(True)
    w, b = torch.randn(40, generator=gen).to(DEVICE), torch.randn(40, generator=gen).to(DEVICE)
    for eps in (1e-5, 0.3):
        c = sg.layer_norm_maxk(x, 7, w, b, eps, backend="triton")
        _check_selection(c, _ln64(x.detach().cpu(), w.cpu(), b.cpu(), eps), 7, 2e-6)
    (gx,) = torch.autograd.grad(c.values.pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gx.sum().backward()


@pytest.mark.parametrize("programs", [1, 3, 13])
def test_layer_norm_maxk_backward_rows_per_program(programs):
    """The backward kernel's loop over rows ``pid, pid + P, ...`` and the sum of its ``P`` partial
    parameter gradients give the same result for any ``P``."""
    from sparsegnn.kernels.maxk import layer_norm_maxk_backward, layer_norm_maxk_select

    gen = torch.Generator().manual_seed(programs)
    x, w, b = torch.randn(13, 48, generator=gen), torch.randn(48, generator=gen), torch.randn(48, generator=gen)
    x, w, b = x.to(DEVICE), w.to(DEVICE), b.to(DEVICE)
    values, index, mean, rstd = layer_norm_maxk_select(x, w, b, 1e-5, 6, torch.uint8)
    up = torch.randn(13, 6, generator=gen).to(DEVICE)
    dx, dw, db = layer_norm_maxk_backward(up, index, x, w, mean, rstd, programs=programs)
    ref = [t.detach().double().cpu().requires_grad_(True) for t in (x, w, b)]
    y = torch.nn.functional.layer_norm(ref[0], (48,), ref[1], ref[2])
    (y.gather(1, index.long().cpu()) * up.double().cpu()).sum().backward()
    for got, want in zip((dx, dw, db), ref):
        torch.testing.assert_close(got.cpu().double(), want.grad, rtol=1e-5, atol=1e-5 * want.grad.abs().max())


@pytest.mark.parametrize("n,f,k,idx_dtype,dtype", [(13, 48, 6, torch.uint8, torch.float32),
                                                   (70, 256, 64, torch.uint8, torch.bfloat16),
                                                   (5, 300, 3, torch.int16, torch.float16),
                                                   (0, 32, 4, torch.uint8, torch.float32)])
def test_gather_kept_kernel_equals_torch_gather(n, f, k, idx_dtype, dtype):
    """The one-pass gather of MaxK's dense backward schedules equals ``gather`` on int64 columns
    then the cast, for several row counts (programs of many rows, a partial last one, none),
    index dtypes and a non-contiguous (column-sliced) dense operand."""
    from sparsegnn.kernels.maxk import gather_kept

    gen = torch.Generator().manual_seed(n + f + k)
    wide = torch.randn(n, f + 7, generator=gen).to(DEVICE)             # fp32, as the gradients are
    dense = wide[:, 3:3 + f]                                      # row stride f + 7
    index = torch.sort(torch.rand(n, f, generator=gen).argsort(1)[:, :k], 1).values.to(idx_dtype).to(DEVICE)
    got = gather_kept(dense, index, dtype)
    want = dense.gather(1, index.long()).to(dtype)
    assert got.dtype == dtype and got.shape == (n, k)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="does not match"):
        gather_kept(dense[:-1] if n else dense[:, :0], index if n else index[:, :1].expand(0, 1), dtype)


@pytest.mark.parametrize("n,f,k,idx_dtype,dtype", [(13, 48, 6, torch.uint8, torch.float32),
                                                   (70, 256, 64, torch.uint8, torch.bfloat16),
                                                   (5, 300, 3, torch.int16, torch.float32),
                                                   (0, 32, 4, torch.uint8, torch.float32)])
def test_gin_self_term_kernels_equal_torch_scatter_and_gather(n, f, k, idx_dtype, dtype):
    """GIN's self term from a CBSR in one pass each way: ``add_kept_`` equals
    ``scatter_add_`` of ``(1 + eps) values`` on int64 columns, and ``gather_kept`` with ``also``
    equals the two gathers summed, in float64 terms to fp32 rounding; sliced operands
    (row stride > width), several row counts, index dtypes, bf16 values into an fp32 result."""
    from sparsegnn.kernels.maxk import add_kept_, gather_kept

    gen = torch.Generator().manual_seed(3 * n + f + k)
    index = torch.sort(torch.rand(n, f, generator=gen).argsort(1)[:, :k], 1).values.to(idx_dtype).to(DEVICE)
    values = torch.randn(n, k, generator=gen).to(dtype).to(DEVICE)
    eps = torch.tensor([0.37]).to(DEVICE)
    wide = torch.randn(n, f + 5, generator=gen).to(DEVICE)
    out, before = wide[:, 2:2 + f], wide.clone()
    want = out.double().cpu().scatter_add(1, index.long().cpu(), values.double().cpu() * 1.37)
    assert add_kept_(out, values, index, eps) is out
    torch.testing.assert_close(out.double().cpu(), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(wide[:, :2], before[:, :2]) and torch.equal(wide[:, 2 + f:], before[:, 2 + f:])
    dense, also = torch.randn(n, f, generator=gen).to(DEVICE), torch.randn(n, f + 1, generator=gen)[:, 1:].to(DEVICE)
    got = gather_kept(dense, index, dtype, also, eps)
    cols = index.long().cpu()
    want = dense.double().cpu().gather(1, cols) + 1.37 * also.double().cpu().gather(1, cols)
    assert got.dtype == dtype and got.shape == (n, k)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double().cpu(), want, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="one-element eps"):
        gather_kept(dense, index, dtype, also, None)
    with pytest.raises(ValueError, match="do not match"):
        add_kept_(out, values[:, :-1] if k > 1 else values[:0], index, eps)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA CBSR kernels need a GPU (and CuPy)")
@pytest.mark.parametrize("k", [5, 32, 40])
def test_cuda_cbsr_kernels_with_gin_self_term_match_float64(k):
    """The SpGEMM with GIN's self term in its accumulator and the outer product with the self
    term's gradient, against float64 ``A X + (1 + eps) X`` and ``(A^T dY + (1 + eps) dY)`` sampled
    at the kept columns: empty rows and isolated nodes (their self term only), a hub, self loops,
    duplicate edges, edge weights, k below / above a warp."""
    from sparsegnn.kernels import cbsr_cuda
    from sparsegnn.ops._triton import plan_of
    from sparsegnn.ops.cbsr import _kernel_weights

    if not cbsr_cuda.available():
        pytest.skip("CuPy is not installed")
    ei, w = sg.datasets.random_graph(300, 4000, seed=13, num_isolated=4, num_empty_rows=6, num_self_loops=4,
                                     num_duplicates=9, weighted=True)
    hub = torch.stack([torch.arange(300), torch.full((300,), 7)])
    ei, w = torch.cat([ei, hub], 1), torch.cat([w, torch.rand(300) + 0.5])
    g = Graph.from_edge_index(ei, w, num_nodes=300).to(DEVICE)
    c = sg.maxk(torch.randn(300, 256, device=DEVICE), k)
    eps = torch.tensor([-0.6], device=DEVICE)
    plan = plan_of(g)
    weight, _ = _kernel_weights(g, g.edge_val, "sum")
    adj = dense_adjacency(ei, 300, w)
    x = c.to_dense().double().cpu()
    out = cbsr_cuda.spgemm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, weight, c.values, c.index, 300, 256,
                                     None, eps)
    want = adj @ x + 0.4 * x
    assert float((out.double().cpu() - want).norm() / want.norm()) < 1e-6
    up = torch.randn(300, 256, device=DEVICE)
    got = cbsr_cuda.sspmm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, weight, up, c.index, 300, None, eps)
    want = (adj.t() @ up.double().cpu() + 0.4 * up.double().cpu()).gather(1, c.index.long().cpu())
    assert float((got.double().cpu() - want).norm() / want.norm()) < 1e-6
    empty = (g.rowptr[1:] == g.rowptr[:-1]).cpu()
    assert empty.any()          # rows with no edges still get their self term
    torch.testing.assert_close(got.cpu()[empty].double(), want[empty], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="self term"):
        cbsr_cuda.spgemm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, weight, c.values, c.index, 300, 256,
                                   g.inv_degree(torch.float32), eps)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("k", [3, 41])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cbsr_aggregation_with_gin_self_term_matches_float64(backend, k, reduce, dtype):
    """The CBSR aggregation with GIN's self term (``gin_aggregate`` for a sum, ``spmm_cbsr``
    with ``self_eps`` for a mean, whose ``1 / deg`` must not scale the self term) against float64
    ``A' X + (1 + eps) X`` of the densified selection, forward and the gradients of the values,
    the edge values and eps.  At F = 160, k = 3 is a candidate of the CUDA kernels (forward by
    timing, backward the outer product; with the self term inside them for a sum, after them
    for a mean) and k = 41 (4 k > F) takes the dense product both ways with the one-pass
    self-term kernels.  float64 (the reference backend's) stays exact, on a GPU too: its self
    term by torch, not the fp32 Triton passes; the Triton backend refuses it."""
    from sparsegnn.ops.cbsr import spmm_cbsr
    from sparsegnn.ops.spmm import gin_aggregate

    if backend == "triton" and DEVICE != "cuda" and (k == 41 or dtype == torch.float64 or reduce == "mean"):
        pytest.skip("one Triton case through the interpreter is enough on the CPU")
    if backend == "triton" and dtype == torch.float64:     # not a Triton dtype: a clear error, nothing computed
        c = sg.maxk(torch.randn(60, 160, device=DEVICE, dtype=dtype), k)
        g = Graph.from_edge_index(torch.randint(0, 60, (2, 300), device=DEVICE), num_nodes=60)
        with pytest.raises(ValueError, match="backend='triton' supports float32"):
            gin_aggregate(g, c, torch.zeros(1, device=DEVICE, dtype=dtype), backend=backend)
        return
    ei, w = sg.datasets.random_graph(60, 500, seed=14, num_isolated=3, num_empty_rows=4, num_self_loops=3,
                                     num_duplicates=5, weighted=True)
    w = w.to(DEVICE, dtype).requires_grad_(True)
    g = Graph.from_edge_index(ei.to(DEVICE), w, num_nodes=60)
    h = torch.randn(60, 160, device=DEVICE, dtype=dtype, requires_grad=True)
    c = sg.maxk(h, k)
    eps = torch.tensor([0.25], device=DEVICE, dtype=dtype, requires_grad=True)
    if reduce == "sum":
        out = gin_aggregate(g, c, eps, backend=backend)
    else:
        out = spmm_cbsr(g, c, g.edge_val, "mean", backend, self_eps=eps)
    up = torch.randn(60, 160, device=DEVICE, dtype=dtype)
    grads = torch.autograd.grad((out * up).sum(), (h, w, eps))
    h64, w64, eps64 = (t.detach().double().cpu().requires_grad_(True) for t in (h, w, eps))
    x64 = sg.maxk(h64, k, dense=True)
    adj = torch.zeros(60, 60, dtype=torch.float64).index_put((ei[1], ei[0]), w64, accumulate=True)
    if reduce == "mean":
        adj = adj / dense_adjacency(ei, 60).sum(1, keepdim=True).clamp(min=1)
    ref = adj @ x64 + (1 + eps64) * x64
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out.double().cpu(), ref, rtol=tol, atol=tol)
    want = torch.autograd.grad((ref * up.double().cpu()).sum(), (h64, w64, eps64))
    for name, got, expect in zip(("x", "edge values", "eps"), grads, want):
        torch.testing.assert_close(got.double().cpu(), expect, rtol=10 * tol, atol=10 * tol, msg=name)
    bipartite = Graph.from_edge_index(torch.tensor([[0, 59], [1, 0]], device=DEVICE), num_nodes=2, num_src=60)
    with pytest.raises(ValueError, match="one row of x per target"):
        gin_aggregate(bipartite, c, eps, backend=backend)
    if DEVICE == "cuda":
        with pytest.raises(ValueError, match="one device"):
            gin_aggregate(g, c, eps.detach().cpu(), backend=backend)


def test_layer_norm_maxk_parameter_gradients_do_not_share_storage():
    """The fused backward sums dw and db in one reduction; the two gradients that autograd keeps
    as ``weight.grad`` and ``bias.grad`` must still be separate tensors (an in-place resize or a
    save of one must not reach the other)."""
    norm = torch.nn.LayerNorm(40).to(DEVICE)
    x = torch.randn(9, 40, device=DEVICE)
    sg.layer_norm_maxk(x, 5, norm.weight, norm.bias, backend="triton").values.sum().backward()   # the fused kernels
    w, b = norm.weight.grad, norm.bias.grad
    assert w is not None and b is not None
    assert w.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


def test_layer_norm_maxk_fuses_only_the_parameter_dtypes_layer_norm_takes():
    """fp32 parameters with a half / bf16 x fuse (as F.layer_norm takes them); other mixes go to the
    composition, where F.layer_norm accepts or refuses them itself."""
    import sys

    mk = sys.modules["sparsegnn.ops.maxk"]
    x = torch.randn(4, 16, device=DEVICE)
    p32, p64 = torch.ones(16, device=DEVICE), torch.ones(16, device=DEVICE, dtype=torch.float64)
    if not mk._triton_runs(x):
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    assert mk._fused_runs(x, 4, p32, p32) and mk._fused_runs(x.bfloat16(), 4, p32, p32)
    assert mk._fused_runs(x.bfloat16(), 4, p32.bfloat16(), p32.bfloat16())
    assert not mk._fused_runs(x, 4, p64, p64) and not mk._fused_runs(x, 4, p32.bfloat16(), p32.bfloat16())
    assert not mk._fused_runs(x, 4, p32, p32.bfloat16()) and not mk._fused_runs(x, 4, p32, None)


def test_layer_norm_maxk_backward_checks_shapes():
    from sparsegnn.kernels.maxk import layer_norm_maxk_backward

    x, w, r = torch.randn(4, 8), torch.ones(8), torch.ones(4)
    index = torch.arange(5, dtype=torch.uint8).repeat(4, 1)
    with pytest.raises(ValueError, match=r"layer_norm_maxk_backward\(\): shapes do not match"):
        layer_norm_maxk_backward(torch.randn(4, 3), index, x, w, r, r)


def test_layer_norm_maxk_composes_where_it_does_not_fuse(monkeypatch):
    """Without affine parameters, past the fused limits or in float64 it is LayerNorm then maxk
    (float64 gradcheck of that composition); the fused kernels are not called there."""
    import sys

    mk = sys.modules["sparsegnn.ops.maxk"]      # (the package attribute ``ops.maxk`` is the function)
    calls = []
    monkeypatch.setattr(mk._LayerNormMaxK, "apply", lambda *a: calls.append(a) or (_ for _ in ()).throw(AssertionError))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 12, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(12, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(12, dtype=torch.float64, generator=gen, requires_grad=True)
    torch.autograd.gradcheck(lambda t, u, v: sg.layer_norm_maxk(t, 4, u, v).values, (x, w, b))
    no_affine = sg.layer_norm_maxk(x.detach().float().to(DEVICE), 4, None, None, backend="triton")
    _check_selection(no_affine, torch.nn.functional.layer_norm(x.detach(), (12,)), 4, 2e-6)
    wide = torch.randn(3, 1100, generator=gen)
    ones = torch.ones(1100)
    _check_selection(sg.layer_norm_maxk(wide.to(DEVICE), 3, ones.to(DEVICE), ones.to(DEVICE) * 0, backend="triton"),
                     _ln64(wide, ones, ones * 0), 3, 2e-6)
    assert calls == []


@pytest.mark.parametrize("call,message", [
    (lambda x, w: sg.layer_norm_maxk(x[0], 2, w, w), "2-D tensor"),
    (lambda x, w: sg.layer_norm_maxk(x, 0, w, w), r"k must be an int in \[1, F = 6\]"),
    (lambda x, w: sg.layer_norm_maxk(x, 2, w[:5], w), r"weight must have shape \[F\] = \[6\]"),
    (lambda x, w: sg.layer_norm_maxk(x, 2, w, w[:5]), r"bias must have shape \[F\] = \[6\]"),
    (lambda x, w: sg.layer_norm_maxk(x.long(), 2, w, w), "floating tensor"),
])
def test_layer_norm_maxk_rejects_bad_input(call, message):
    with pytest.raises(ValueError, match=r"layer_norm_maxk\(\): .*" + message):
        call(torch.randn(4, 6), torch.ones(6))


@pytest.mark.skipif(DEVICE != "cuda", reason="a Reddit-width case for the compiled kernels")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 8e-3)], ids=["fp32", "bf16"])
def test_layer_norm_maxk_on_the_gpu_at_width_256(dtype, tol):
    """20,000 x 256, k = 32: more rows than the backward's programs (each loops over rows); values,
    selection and the three gradients against float64."""
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(20_000, 256, generator=gen) * 2 + 0.5).to(dtype)
    w, b = (torch.randn(256, generator=gen) * 0.3 + 1).to(dtype), (torch.randn(256, generator=gen) * 0.1).to(dtype)
    leaves = [t.cuda().requires_grad_(True) for t in (x, w, b)]
    c = sg.layer_norm_maxk(leaves[0], 32, leaves[1], leaves[2])
    _check_selection(c, _ln64(x, w, b), 32, tol)
    up = torch.randn(20_000, 32, generator=gen).to(dtype)
    (c.values * up.cuda()).sum().backward()
    ref = [t.double().requires_grad_(True) for t in (x, w, b)]
    y = torch.nn.functional.layer_norm(ref[0], (256,), ref[1], ref[2])
    (y.gather(1, c.index.long().cpu()) * up.double()).sum().backward()
    for got, want in zip(leaves, ref):
        err = (got.grad.cpu().double() - want.grad).norm() / want.grad.norm()
        assert err < (1e-5 if dtype == torch.float32 else 1e-2), err


@pytest.mark.parametrize("variant", ["sum", "mean", "gin"])
@pytest.mark.parametrize("k", [5, 41])
def test_bound_cbsr_aggregation_repeats_match_float64_and_follow_the_values(fresh_store, monkeypatch, variant, k):
    """A repeat eager CBSR aggregation runs the form the first call resolved (``ops.cbsr._Bound``:
    no schedule derived again) and still matches float64 forward and backward, on a graph with
    duplicates, self loops, empty rows and isolated nodes; an in-place update of the edge
    values, and a new generation of decision stores, make it resolve again (nothing stale).
    On a GPU, k = 5 of F = 160 takes the CUDA kernels, k = 41 the dense product; on the CPU
    (Triton's interpreter) the dense product."""
    from sparsegnn.ops import cbsr
    from sparsegnn.ops.cbsr import spmm_cbsr
    from sparsegnn.ops.spmm import gin_aggregate
    from sparsegnn.tune.store import reset_stores

    if DEVICE != "cuda" and k == 41:
        pytest.skip("one width through the interpreter is enough on the CPU")
    n, f = 60, 160 if DEVICE == "cuda" else 24
    k = min(k, f // 4)
    ei, w = sg.datasets.random_graph(n, 500, seed=21, num_isolated=3, num_empty_rows=4, num_self_loops=3,
                                     num_duplicates=5, weighted=True)
    g = Graph.from_edge_index(ei.to(DEVICE), w.to(DEVICE), num_nodes=n)
    eps = torch.tensor([0.25], device=DEVICE)
    derived = []
    real_schedule = cbsr.forward_schedule
    monkeypatch.setattr(cbsr, "forward_schedule", lambda *a, **kw: derived.append(1) or real_schedule(*a, **kw))

    def call(seed):
        h = torch.randn(n, f, generator=torch.Generator().manual_seed(seed)).to(DEVICE).requires_grad_(True)
        c = sg.maxk(h, k)
        if variant == "gin":
            out = gin_aggregate(g, c, eps, backend="triton")
        else:
            out = spmm_cbsr(g, c, g.edge_val, variant, "triton")
        up = torch.randn(n, f, generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE)
        out.backward(up)
        src, dst = g.edge_index().cpu()     # the graph's (CSR) order, which edge_val follows
        adj = torch.zeros(n, n, dtype=torch.float64).index_put((dst, src), g.edge_val.double().cpu(), accumulate=True)
        if variant == "mean":
            adj = adj / dense_adjacency(ei, n).sum(1, keepdim=True).clamp(min=1)
        h64 = h.detach().double().cpu().requires_grad_(True)
        x64 = sg.maxk(h64, k, dense=True)
        ref = adj @ x64 + ((1 + eps.double().cpu()) * x64 if variant == "gin" else 0)
        ref.backward(up.double().cpu())
        torch.testing.assert_close(out.detach().double().cpu(), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(h.grad.double().cpu(), h64.grad, rtol=1e-5, atol=1e-5)

    call(1)
    assert any(slot == "cbsr_run" for slot, _ in g.cache), list(g.cache)
    derived.clear()
    call(2)
    assert not derived                      # the bound form ran: no schedule derived
    with torch.no_grad():
        g.edge_val.mul_(-1.5)               # in place: a new version of the values
    call(3)
    assert derived                          # resolved again for the new values
    derived.clear()
    call(4)
    assert not derived
    reset_stores()                          # a new generation of decisions
    call(5)
    assert derived


def test_bound_cbsr_aggregation_is_kept_only_once_its_schedule_is_decided(monkeypatch):
    """A schedule chosen while the graph was not invested in is the rule's, untimed: a graph
    invested by that call's own aggregation keeps no bound form until a later call decides
    (else the untimed choice would run for good).  Simulated on any machine: the SpGEMM made a
    candidate, the decision stubbed to the dense product, the graph invested only after it."""
    from sparsegnn.ops import cbsr

    n, f = 30, 24
    ei, w = sg.datasets.random_graph(n, 150, seed=5, num_empty_rows=2, num_duplicates=3, weighted=True)
    g = Graph.from_edge_index(ei.to(DEVICE), w.to(DEVICE), num_nodes=n)
    invested = iter([False])            # at the first decision only: not invested yet
    monkeypatch.setattr(cbsr, "_cbsr_kernel_fits", lambda *a: True)
    monkeypatch.setattr(cbsr, "forward_schedule", lambda *a: "dense")
    monkeypatch.setattr(cbsr, "_timed_forward_schedule", lambda *a, **kw: "dense")
    real_invested = cbsr.reuse_invested
    monkeypatch.setattr(cbsr, "reuse_invested", lambda graph: next(invested, real_invested(graph)))
    c = sg.maxk(torch.randn(n, f, device=DEVICE), 4)
    want = dense_adjacency(g.edge_index().cpu(), n, g.edge_val) @ c.to_dense().double().cpu()
    for kept in (False, True):
        out = cbsr.spmm_cbsr(g, c, g.edge_val, "sum", "triton")
        torch.testing.assert_close(out.double().cpu(), want, rtol=1e-5, atol=1e-5)
        assert any(slot == "cbsr_run" for slot, _ in g.cache) == kept


@pytest.mark.parametrize("variant", ["sum", "gin"])
def test_bound_cbsr_aggregation_does_not_keep_its_graph_alive(variant):
    """The bound form lives in the graph's cache and holds none of the graph: the graph (and its
    device memory) goes with its last reference, no cycle collection needed."""
    import gc
    import weakref

    from sparsegnn.ops.spmm import gin_aggregate

    n, f = 40, 160 if DEVICE == "cuda" else 24
    ei, _ = sg.datasets.random_graph(n, 300, seed=6, num_empty_rows=2, num_self_loops=2)
    g = Graph.from_edge_index(ei.to(DEVICE), num_nodes=n)
    eps = torch.tensor([0.5], device=DEVICE)
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):
            h = torch.randn(n, f, device=DEVICE, requires_grad=True)
            c = sg.maxk(h, 5)
            out = gin_aggregate(g, c, eps, backend="triton") if variant == "gin" else sg.spmm(g, c, backend="triton")
            out.sum().backward()
        assert any(slot == "cbsr_run" for slot, _ in g.cache)
        ref = weakref.ref(g)
        del g, out, c, h
        assert ref() is None
    finally:
        gc.enable()
