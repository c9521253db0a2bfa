"""global_pool: sum / mean / max per graph against a Python loop over the graphs, gradients, errors.

The Triton kernels run in the CPU interpreter without a GPU (conftest sets TRITON_INTERPRET=1),
on small batches, against float64 loops that never call the code under test."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn.ops.pool import global_pool, resolve_backend

from conftest import DEVICE

CUDA = torch.cuda.is_available()


def loop_pool(x, ptr, reduce):
    """One graph at a time with plain torch reductions (empty graph -> zeros)."""
    rows = []
    for b in range(ptr.numel() - 1):
        part = x[int(ptr[b]):int(ptr[b + 1])]
        if part.shape[0] == 0:
            rows.append(torch.zeros(x.shape[1], dtype=x.dtype))
        elif reduce == "sum":
            rows.append(part.sum(0))
        elif reduce == "mean":
            rows.append(part.mean(0))
        else:
            rows.append(part.max(0).values)
    return torch.stack(rows)


def random_batch(seed, sizes=(3, 0, 1, 7, 0, 4, 2)):
    gen = torch.Generator().manual_seed(seed)
    ptr = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    x = torch.randn(int(ptr[-1]), 5, generator=gen, dtype=torch.float64)
    return x, ptr


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_matches_loop_forward_and_backward(reduce, backend):
    x, ptr = random_batch(0)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = global_pool(x1, ptr, reduce, backend=backend)
    expected = loop_pool(x2, ptr, reduce)
    assert out.shape == (ptr.numel() - 1, 5)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(x1.grad, x2.grad)


def test_empty_graphs_give_zeros_and_float32():
    x = torch.randn(4, 3)
    ptr = torch.tensor([0, 0, 4, 4])
    for reduce in ("sum", "mean", "max"):
        out = global_pool(x, ptr, reduce)
        assert out.dtype == torch.float32
        assert torch.equal(out[0], torch.zeros(3)) and torch.equal(out[2], torch.zeros(3))
    assert torch.equal(global_pool(torch.zeros(0, 2), torch.tensor([0, 0, 0]), "max"), torch.zeros(2, 2))


def test_max_of_negative_values_is_not_clamped_to_zero():
    x = torch.tensor([[-3.0], [-1.0], [-2.0]])
    assert global_pool(x, torch.tensor([0, 2, 3]), "max").flatten().tolist() == [-1.0, -2.0]


def test_on_a_batched_graph_ptr_and_exported():
    graphs = [sg.Graph.from_edge_index(torch.tensor([[0], [1]]), num_nodes=n) for n in (2, 3, 5)]
    batch = sg.Graph.batch(graphs)
    x = torch.arange(10, dtype=torch.float32).unsqueeze(1)
    assert sg.global_pool is global_pool and "global_pool" in sg.__all__
    assert sg.global_pool(x, batch.ptr, "sum").flatten().tolist() == [1.0, 9.0, 35.0]
    assert sg.global_pool(x, batch.ptr, "mean").flatten().tolist() == [0.5, 3.0, 7.0]


@pytest.mark.parametrize("args, message", [
    ((torch.randn(3, 2), torch.tensor([0, 3]), "min"), "reduce must be one of"),
    ((torch.randn(3), torch.tensor([0, 3])), "x must be 2-D"),
    ((torch.ones(3, 2, dtype=torch.int64), torch.tensor([0, 3])), "floating-point"),
    ((torch.randn(3, 2), torch.tensor([0, 2])), "must run from 0 to the 3 rows"),
    ((torch.randn(3, 2), torch.tensor([1, 3])), "must run from 0"),
    ((torch.randn(3, 2), torch.tensor([0, 2, 1, 3])), "non-decreasing"),
    ((torch.randn(3, 2), torch.tensor([0.0, 3.0])), "integer dtype"),
    ((torch.randn(3, 2), torch.tensor([[0, 3]])), "1-D"),
    ((torch.randn(3, 2), [0, 3]), "ptr must be a torch.Tensor"),
])
def test_errors(args, message):
    with pytest.raises(ValueError, match=r"global_pool\(\): .*" + message):
        global_pool(*args)


def test_bad_backend():
    with pytest.raises(ValueError, match=r"global_pool\(\): backend must be one of \('auto', 'reference', 'triton'\)"):
        global_pool(torch.randn(3, 2), torch.tensor([0, 3]), backend="cuda")



# ------------------------------------------------------------------ the Triton kernels
SIZES = (3, 0, 1, 19, 0, 8, 1, 33, 2)     # empty graphs, single nodes, graphs over BLOCK_N = 8 (and 16, 32)
SMALL = dict(BLOCK_N=8, BLOCK_F=16, num_warps=4)


def batch_of(sizes, feats, seed=0, dtype=torch.float32):
    """(x, ptr): seeded normal features, float64 values rounded to ``dtype`` and back."""
    gen = torch.Generator().manual_seed(seed)
    ptr = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    x = torch.randn(int(ptr[-1]), feats, generator=gen, dtype=torch.float64).to(dtype)
    return x, ptr


def loop_grad(x, ptr, reduce, dy):
    """dX of the pooling in float64, one graph at a time: dy_b on each row (sum), dy_b / n_b
    (mean), dy_b at the first row attaining the max of each column (max; argmax returns the first)."""
    x, dy = x.double().cpu(), dy.double().cpu()
    dx = torch.zeros_like(x)
    for b in range(ptr.numel() - 1):
        lo, hi = int(ptr[b]), int(ptr[b + 1])
        if hi == lo:
            continue
        if reduce == "sum":
            dx[lo:hi] = dy[b]
        elif reduce == "mean":
            dx[lo:hi] = dy[b] / (hi - lo)
        else:
            first = x[lo:hi].argmax(0)
            for f in range(x.shape[1]):
                dx[lo + int(first[f]), f] = dy[b, f]
    return dx


def triton_pool_and_grad(x, ptr, reduce, dy, **kw):
    xt = x.to(DEVICE, copy=True).requires_grad_()              # a fresh leaf (x itself stays untouched)
    out = global_pool(xt, ptr.to(DEVICE), reduce, backend="triton", **kw)
    out.backward(dy.to(DEVICE, out.dtype))
    return out.detach().cpu(), xt.grad.cpu()


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("config", ["small-blocks", "default"])
def test_triton_matches_float64_loop(reduce, config):
    """Forward and dX against float64 loops (F = 21: the last feature block is partial)."""
    from sparsegnn.kernels.pool import pool_backward, pool_forward

    x, ptr = batch_of(SIZES, 21, seed=1)
    dy = torch.randn(len(SIZES), 21, generator=torch.Generator().manual_seed(2))
    x64 = x.double().requires_grad_()
    want = loop_pool(x64, ptr, reduce)
    want.backward(dy.double())                        # autograd of the plain-torch loop
    if config == "default":
        got, grad = triton_pool_and_grad(x, ptr, reduce, dy)
    else:
        got, arg = pool_forward(x.to(DEVICE), ptr.to(DEVICE), reduce, config=SMALL)
        grad = pool_backward(dy.to(DEVICE), ptr.to(DEVICE), x.shape[0], reduce, arg, config=SMALL)
        got, grad = got.cpu(), grad.cpu()
    assert got.dtype == torch.float32 and got.shape == (len(SIZES), 21)
    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.double(), x64.grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad.double(), loop_grad(x, ptr, reduce, dy), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_triton_low_precision_accumulates_in_fp32(dtype, reduce):
    x, ptr = batch_of(SIZES, 20, seed=3, dtype=dtype)
    dy = torch.randn(len(SIZES), 20, generator=torch.Generator().manual_seed(4)).to(dtype)
    got, grad = triton_pool_and_grad(x, ptr, reduce, dy)
    want = loop_pool(x.double(), ptr, reduce)          # the rounded inputs, exactly, in float64
    assert got.dtype == dtype and grad.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3    # one rounding of the fp32 result
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    if reduce == "max":                                # a max is one of the inputs: exact
        assert torch.equal(got.double(), want)
    torch.testing.assert_close(grad.double(), loop_grad(x, ptr, reduce, dy), rtol=tol, atol=0)


def test_triton_max_ties_give_the_gradient_to_the_first_row():
    """Values in {0, 1, 2}: most columns tie.  Each dy[b, f] lands on exactly one row, the first
    maximal one, and sums to dy[b, f] over the graph; the reference (segment_reduce) splits ties
    evenly, so only the per-graph totals compare with it."""
    gen = torch.Generator().manual_seed(5)
    ptr = torch.tensor([0, *torch.tensor(SIZES).cumsum(0).tolist()])
    x = torch.randint(0, 3, (int(ptr[-1]), 18), generator=gen).float()
    dy = torch.rand(len(SIZES), 18, generator=gen) + 0.5                  # no zeros
    got, grad = triton_pool_and_grad(x, ptr, "max", dy)
    assert torch.equal(got, loop_pool(x, ptr, "max"))
    assert torch.equal(grad.double(), loop_grad(x, ptr, "max", dy))
    x_ref = x.clone().requires_grad_()
    global_pool(x_ref, ptr, "max", backend="reference").backward(dy)
    for b in range(len(SIZES)):
        lo, hi = int(ptr[b]), int(ptr[b + 1])
        part = grad[lo:hi]
        if hi == lo:
            continue
        assert ((part != 0).sum(0) == 1).all()                             # one entry per column
        rows = (part != 0).int().argmax(0)
        first = torch.stack([(x[lo:hi, f] == x[lo:hi, f].max()).nonzero()[0, 0] for f in range(18)])
        assert torch.equal(rows, first)
        torch.testing.assert_close(part.sum(0), dy[b])
        torch.testing.assert_close(part.sum(0), x_ref.grad[lo:hi].sum(0))
    assert (x_ref.grad != grad).any()            # ties really were split differently by the reference


def test_triton_max_of_negative_infinite_and_nan_columns():
    """-inf columns: max -inf, gradient to the graph's first row; NaN propagates (as in the
    reference) and its gradient goes to the first NaN row."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf, -3.0, 1.0], [-inf, nan, 2.0], [-inf, -1.0, nan], [-inf, nan, 5.0],
                      [-2.0, -2.0, -2.0]]).repeat_interleave(3, 0)         # 15 rows: graphs over BLOCK_N
    ptr = torch.tensor([0, 12, 12, 15])
    from sparsegnn.kernels.pool import pool_backward, pool_forward

    got, arg = pool_forward(x.to(DEVICE), ptr.to(DEVICE), "max", config=SMALL)
    want = global_pool(x, ptr, "max", backend="reference")
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    dy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    grad = pool_backward(dy.to(DEVICE), ptr.to(DEVICE), 15, "max", arg, config=SMALL).cpu()
    expected = torch.zeros(15, 3)
    expected[0, 0], expected[3, 1], expected[6, 2] = 1.0, 2.0, 3.0       # first -inf row, first NaN rows
    expected[12] = torch.tensor([7.0, 8.0, 9.0])                           # a 3-way tie of -2: the first
    assert torch.equal(grad, expected)


def test_triton_backward_writes_every_row_and_zeros_rows_of_no_graph():
    """``pool_backward`` overwrites an output full of NaN: graphs' rows get their gradient, the
    rows past ptr[B] (possible on a GPU, where ptr is not checked) get zeros."""
    from sparsegnn.kernels.pool import pool_backward, pool_forward

    x, ptr = batch_of(SIZES, 17, seed=6)
    n = x.shape[0]
    dy = torch.randn(len(SIZES), 17, generator=torch.Generator().manual_seed(7))
    for reduce in ("sum", "mean", "max"):
        _, arg = pool_forward(x.to(DEVICE), ptr.to(DEVICE), reduce, config=SMALL)
        out = torch.full((n + 11, 17), float("nan"), device=DEVICE)
        grad = pool_backward(dy.to(DEVICE), ptr.to(DEVICE), n + 11, reduce, arg, config=SMALL, out=out).cpu()
        assert torch.equal(grad[n:], torch.zeros(11, 17))
        torch.testing.assert_close(grad[:n].double(), loop_grad(x, ptr, reduce, dy), rtol=1e-6, atol=1e-7)


def test_triton_int32_ptr_strided_x_and_expanded_grad():
    x, ptr = batch_of(SIZES, 6, seed=8)
    xt = x.t().contiguous().t().to(DEVICE).requires_grad_()                  # column-major: stride (1, N)
    assert xt.stride(1) != 1
    out = global_pool(xt, ptr.to(DEVICE, torch.int32), "mean", backend="triton")
    torch.testing.assert_close(out.detach().cpu().double(), loop_pool(x.double(), ptr, "mean"), rtol=1e-5, atol=1e-6)
    out.sum().backward()                                                   # dy expanded: stride (0, 0)
    torch.testing.assert_close(xt.grad.cpu().double(), loop_grad(x, ptr, "mean", torch.ones(len(SIZES), 6)))


def test_triton_edge_shapes():
    for reduce in ("sum", "mean", "max"):
        x = torch.zeros(0, 4, device=DEVICE, requires_grad=True)
        out = global_pool(x, torch.tensor([0, 0, 0], device=DEVICE), reduce, backend="triton")
        assert torch.equal(out.cpu(), torch.zeros(2, 4))
        out.sum().backward()
        assert x.grad.shape == (0, 4)
        x = torch.randn(3, 0, device=DEVICE, requires_grad=True)
        assert global_pool(x, torch.tensor([0, 3], device=DEVICE), reduce, backend="triton").shape == (1, 0)
        assert global_pool(torch.randn(0, 2, device=DEVICE), torch.tensor([0], device=DEVICE), reduce,
                           backend="triton").shape == (0, 2)


def test_triton_without_grad_skips_the_arg():
    from sparsegnn.kernels.pool import pool_forward

    x, ptr = batch_of((2, 3), 4)
    assert pool_forward(x.to(DEVICE), ptr.to(DEVICE), "max", need_arg=False)[1] is None
    with torch.no_grad():
        out = global_pool(x.to(DEVICE, copy=True).requires_grad_(), ptr.to(DEVICE), "max", backend="triton")
    assert torch.equal(out.cpu(), loop_pool(x, ptr, "max"))


def test_pool_config_blocks():
    from sparsegnn.kernels.pool import pool_config

    for n, b, f in [(1, 1, 1), (2500, 100, 64), (10 ** 6, 1, 512), (50, 1000, 300), (8, 8, 5), (0, 3, 7)]:
        cfg = pool_config(n, b, f)
        bn, bf = cfg["BLOCK_N"], cfg["BLOCK_F"]
        assert bn & (bn - 1) == 0 and bf & (bf - 1) == 0 and 8 <= bn <= 64 and 16 <= bf <= 128
        assert bn * bf <= 4096 and cfg["num_warps"] in (2, 4, 8)
    assert pool_config(2500, 100, 64)["BLOCK_N"] == 32          # molecules of 25 nodes: one chunk each
    assert pool_config(10 ** 6, 10 ** 4, 512)["BLOCK_F"] == 128  # enough programs: wide feature blocks
    assert pool_config(10 ** 6, 1, 512)["BLOCK_F"] == 32         # few graphs: narrower blocks, more programs


def test_backend_resolution(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")          # CPU tensors resolve to Triton only in the interpreter
    x = torch.randn(4, 3)
    assert resolve_backend("auto", x) == "reference"                     # CPU: the reference
    assert resolve_backend("reference", x) == "reference"
    assert resolve_backend("triton", x) == "triton"                      # CPU through the interpreter
    with pytest.raises(ValueError, match=r"global_pool\(\): backend='triton' supports float32"):
        global_pool(x.double(), torch.tensor([0, 4]), backend="triton")
    huge = torch.empty(2 ** 31, 1, dtype=torch.float16, device="meta")     # no memory: shapes only
    assert resolve_backend("triton", huge, "sum") == "triton"
    with pytest.raises(ValueError, match=r"global_pool\(\): backend='triton' with reduce='max' needs fewer than 2\^31"):
        resolve_backend("triton", huge, "max")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"global_pool\(\): backend='triton' needs CUDA tensors"):
        global_pool(x, torch.tensor([0, 4]), backend="triton")


@pytest.mark.skipif(not CUDA, reason="auto takes Triton on CUDA only")
def test_auto_takes_triton_on_cuda():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert resolve_backend("auto", torch.randn(2, 2, device="cuda", dtype=dtype)) == "triton"
    assert resolve_backend("auto", torch.randn(2, 2, device="cuda", dtype=torch.float64)) == "reference"


def test_triton_under_torch_compile_matches_eager():
    """``"triton"`` runs its kernels outside the traced graph, ``"auto"`` traces the reference."""
    x, ptr = batch_of(SIZES, 5, seed=9)
    x, ptr = x.to(DEVICE), ptr.to(DEVICE)
    for backend in ("triton", "auto"):
        fn = torch.compile(lambda x_, p: global_pool(x_, p, "max", backend=backend), backend="eager")
        xt = x.clone().requires_grad_()
        out = fn(xt, ptr)
        out.backward(torch.ones_like(out))
        torch.testing.assert_close(out.detach().cpu().double(), loop_pool(x.cpu().double(), ptr.cpu(), "max"))
        torch.testing.assert_close(xt.grad.cpu().double(), loop_grad(x, ptr.cpu(), "max", torch.ones(len(SIZES), 5)))


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_triton_forward_and_backward_capture_in_a_cuda_graph(reduce):
    """No host sync (sync debug mode "error" on an eager step), and a captured forward + backward
    replayed on new inputs gives the float64 loop's values."""
    x, ptr = batch_of(SIZES, 40, seed=10)
    x, ptr = x.to("cuda", copy=True).requires_grad_(), ptr.cuda()
    dy = torch.randn(len(SIZES), 40, device="cuda")

    def step():
        x.grad = None
        out = global_pool(x, ptr, reduce)
        out.backward(dy)
        return out, x.grad

    step()                                                     # compiles the kernels
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, grad = step()
    new_x = torch.randn(x.shape, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        x.copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu().double(), loop_pool(new_x.double(), ptr.cpu(), reduce), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.cpu().double(), loop_grad(new_x, ptr.cpu(), reduce, dy.cpu()), rtol=1e-6, atol=1e-7)
