"""GraphSAGE's map of CBSR features as one autograd node (``ops.spmm.sage_cbsr``) against the
float64 formula on the dense matrix, and against the composition it replaces."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.ops.cbsr import _SAGECBSR, cbsr_linear
from sparsegnn.ops.spmm import sage_cbsr

from conftest import DEVICE, dense_adjacency


def _case(n, f, f_out, k, seed, weighted=True, dtype=torch.float32):
    ei, w = sg.datasets.random_graph(n, 8 * n, seed=seed, num_isolated=3, num_empty_rows=4, num_self_loops=4,
                                     num_duplicates=7, weighted=True)
    hub = torch.stack([torch.arange(n) % n, torch.full((n,), 5)])         # one row of n edges
    ei, w = torch.cat([ei, hub], 1), torch.cat([w, torch.rand(n, generator=torch.Generator().manual_seed(seed))])
    w = w if weighted else None
    g = Graph.from_edge_index(ei, w, num_nodes=n).to(DEVICE)
    gen = torch.Generator().manual_seed(seed + 1)
    c = sg.maxk(torch.randn(n, f, generator=gen).to(DEVICE), k)
    values = c.values.to(dtype).detach().requires_grad_()
    wl = (torch.randn(f_out, f, generator=gen) / f ** 0.5).to(DEVICE, dtype).requires_grad_()
    wr = (torch.randn(f_out, f, generator=gen) / f ** 0.5).to(DEVICE, dtype).requires_grad_()
    b = torch.randn(f_out, generator=gen).to(DEVICE, dtype).requires_grad_()
    adj = dense_adjacency(ei, n, w)
    deg = dense_adjacency(ei, n).sum(1, keepdim=True)          # edges into each row, duplicates counted
    return g, c.with_values(values), wl, wr, b, (adj, deg)


def _want(c, wl, wr, b, adj, reduce, up):
    """Output and gradients (values, W_l, b, W_r) in float64 from the dense matrix."""
    x = c.to_dense().detach().double().cpu()
    a, deg = adj
    if reduce == "mean":
        a = a / deg.clamp(min=1)
    x = x.requires_grad_()
    wl64, wr64 = wl.detach().double().cpu().requires_grad_(), wr.detach().double().cpu().requires_grad_()
    b64 = b.detach().double().cpu().requires_grad_()
    out = (a @ x) @ wl64.t() + b64 + x @ wr64.t()
    out.backward(up.double().cpu())
    dvalues = x.grad.gather(1, c.index.long().cpu())
    return out.detach(), dvalues, wl64.grad, b64.grad, wr64.grad


def _grads(out, up, c, wl, wr, b):
    return torch.autograd.grad(out, (c.values, wl, b, wr), up)


@pytest.mark.parametrize("reduce", ["mean", "sum"])
@pytest.mark.parametrize("k,f,f_out", [(8, 64, 48), (32, 256, 256), (64, 256, 128)])
def test_sage_cbsr_matches_float64_as_one_node(reduce, k, f, f_out):
    """One autograd node on a Graph (empty rows, isolated nodes, self loops, duplicates, a hub,
    weighted); output and every gradient against float64 on the dense matrix."""
    n = 200
    g, c, wl, wr, b, adj = _case(n, f, f_out, k, seed=3)
    up = torch.randn(n, f_out, device=DEVICE)
    for _ in range(3):          # the first call decides and binds; the later ones reuse it
        out = sage_cbsr(g, c, wl, b, wr, reduce)
        assert type(out.grad_fn).__name__ == "_SAGECBSRBackward"
        got = _grads(out, up, c, wl, wr, b)
    want = _want(c, wl, wr, b, adj, reduce, up)
    for name, a, e in zip(("out", "dvalues", "dW_l", "db", "dW_r"), (out,) + got, want):
        err = float((a.detach().double().cpu() - e).norm() / e.norm().clamp(min=1e-30))
        assert err < 1e-5, (name, err)


def test_sage_cbsr_on_triton_matches_float64():
    """The Triton backend (the interpreter on CPU machines; on a GPU the CUDA root kernels and the
    outer product reducing into the root's dvalues), no bias, a sum."""
    n = 64
    g, c, wl, wr, _, adj = _case(n, 64, 32, 8, seed=4)
    up = torch.randn(n, 32, device=DEVICE)
    for _ in range(2):
        out = sage_cbsr(g, c, wl, None, wr, "sum", backend="triton")
        assert type(out.grad_fn).__name__ == "_SAGECBSRBackward"
        dvalues, dwl, dwr = torch.autograd.grad(out, (c.values, wl, wr), up)
    zero = torch.zeros(32, device=DEVICE, requires_grad=True)
    want = _want(c, wl, wr, zero, adj, "sum", up)
    for name, a, e in zip(("out", "dvalues", "dW_l", "dW_r"), (out, dvalues, dwl, dwr),
                          (want[0], want[1], want[2], want[4])):
        err = float((a.detach().double().cpu() - e).norm() / e.norm())
        assert err < 1e-5, (name, err)


def test_sage_cbsr_composes_where_the_graph_values_need_a_gradient():
    """Learnable edge values (or a non-Graph input) take the composition, which gives them their
    gradient; its results equal the fused node's."""
    n = 80
    g, c, wl, wr, b, _ = _case(n, 32, 16, 4, seed=5)
    up = torch.randn(n, 16, device=DEVICE)
    fused = sage_cbsr(g, c, wl, b, wr, "mean")
    assert isinstance(fused.grad_fn, _SAGECBSR._backward_cls)
    val = g.edge_val.detach().clone().requires_grad_()
    learn = g.with_values(val)
    composed = sage_cbsr(learn, c, wl, b, wr, "mean")
    assert not isinstance(composed.grad_fn, _SAGECBSR._backward_cls)
    torch.testing.assert_close(composed, fused, rtol=1e-5, atol=1e-5)
    got = torch.autograd.grad(composed, (c.values, wl, b, wr, val), up)
    want = torch.autograd.grad(fused, (c.values, wl, b, wr), up)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    assert float(got[4].abs().sum()) > 0
    plain = cbsr_linear(c, wr, b).addmm_(sg.spmm(g, c, reduce="mean"), wl.t())
    torch.testing.assert_close(plain, fused, rtol=1e-5, atol=1e-5)


def test_sage_cbsr_refuses_edge_values_changed_before_its_backward():
    """The node keeps the forward's edge values for its backward: changed in place in between,
    the backward raises (as autograd does for the composition), not a gradient of other values."""
    n = 60
    g, c, wl, wr, b, _ = _case(n, 32, 16, 4, seed=8)
    out = sage_cbsr(g, c, wl, b, wr, "sum")
    assert isinstance(out.grad_fn, _SAGECBSR._backward_cls)
    g.edge_val.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA CBSR kernels need a GPU (and CuPy)")
def test_sage_cbsr_gradient_is_reproducible_in_deterministic_mode():
    """Under deterministic algorithms (the dense aggregation backward, the root kernels' fixed
    order) the gradients are bit-equal run to run and match the atomic ones to rounding."""
    n = 300
    g, c, wl, wr, b, _ = _case(n, 256, 256, 32, seed=6)
    up = torch.randn(n, 256, device=DEVICE)

    def grads():
        return _grads(sage_cbsr(g, c, wl, b, wr, "mean"), up, c, wl, wr, b)

    atomic = grads()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        first = grads()
        assert all(torch.equal(a, e) for a, e in zip(first, grads()))
    finally:
        torch.use_deterministic_algorithms(False)
    for a, e in zip(atomic, first):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA CBSR kernels need a GPU (and CuPy)")
def test_cuda_sspmm_reduces_into_a_given_tensor():
    """``sspmm_cbsr_cuda(out=t)`` adds the products onto what ``t`` holds; a wrong ``out`` raises."""
    from sparsegnn.kernels import cbsr_cuda
    from sparsegnn.ops._triton import plan_of
    from sparsegnn.ops.cbsr import _kernel_weights

    if not cbsr_cuda.available():
        pytest.skip("CuPy is not installed")
    n = 300
    g, c, *_ = _case(n, 256, 8, 32, seed=7)
    up = torch.randn(n, 256, device=DEVICE)
    plan = plan_of(g)
    w, scale = _kernel_weights(g, g.edge_val, "mean")
    args = (g.rowptr, plan.rows_by_degree, plan.col32, w, up, c.index, n, scale)
    alone = cbsr_cuda.sspmm_cbsr_cuda(*args)
    start = torch.randn(n, 32, device=DEVICE)
    got = cbsr_cuda.sspmm_cbsr_cuda(*args, out=start.clone())
    torch.testing.assert_close(got, start + alone, rtol=1e-5, atol=1e-5)
    shifted = torch.empty(n * 32 + 1, device=DEVICE)[1:].view(n, 32)     # contiguous, 4 bytes off 16
    shifted.copy_(start)
    got = cbsr_cuda.sspmm_cbsr_cuda(*args, out=shifted)
    torch.testing.assert_close(got, start + alone, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="out must be"):
        cbsr_cuda.sspmm_cbsr_cuda(*args, out=torch.zeros(n, 31, device=DEVICE))
