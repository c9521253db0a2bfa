"""Rectangular (bipartite) graphs: M sources, N targets, as sampled mini-batch blocks have.

Every op on every backend against dense float64 formulas built from the raw edge list
(``A[i, j]`` = summed weight of the edges ``j -> i``, an ``N x M`` matrix).
"""
import pytest
import torch
import torch.nn.functional as F

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.ops.attention import gat_attention

from conftest import DEVICE

BACKENDS = ["reference", "cpu", "triton"]


def _bipartite(num_src, num_dst, num_edges, seed, duplicates=4):
    """Edges j -> i with j < num_src, i < num_dst; some targets without edges, some sources
    unused, a few duplicate edges, and "self loops" i -> i (same index on both sides)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, max(num_src - 3, 1), (num_edges,), generator=gen)      # last sources unused
    dst = torch.randint(0, max(num_dst - 2, 1), (num_edges,), generator=gen)      # last targets empty
    ei = torch.stack([src, dst])
    ei = torch.cat([ei, ei[:, :duplicates], torch.arange(3).repeat(2, 1)], dim=1)
    w = torch.rand(ei.shape[1], generator=gen, dtype=torch.float64) + 0.5
    return ei, w


def _dense(ei, num_dst, num_src, w=None):
    a = torch.zeros(num_dst, num_src, dtype=torch.float64)
    w = torch.ones(ei.shape[1], dtype=torch.float64) if w is None else w.double()
    for e in range(ei.shape[1]):
        a[int(ei[1, e]), int(ei[0, e])] += w[e]
    return a


def _dense_max(ei, num_dst, x, w):
    out = torch.zeros(num_dst, x.shape[1], dtype=torch.float64)
    seen = [False] * num_dst
    for e in range(ei.shape[1]):
        i, j = int(ei[1, e]), int(ei[0, e])
        msg = x[j].double() * float(w[e])
        out[i] = msg if not seen[i] else torch.maximum(out[i], msg)
        seen[i] = True
    return out


def _device(backend):
    """The CPU backend runs on CPU tensors; the others on the test device (the GPU where there is one)."""
    return "cpu" if backend == "cpu" else DEVICE


def _case(shape, num_edges, seed, backend):
    """``(edge_index, weights, graph on the backend's device, num_src, num_dst)`` of a bipartite test graph."""
    num_src, num_dst = shape
    ei, w = _bipartite(num_src, num_dst, num_edges, seed)
    return ei, w, Graph.from_edge_index(ei, num_nodes=num_dst, num_src=num_src).to(_device(backend)), num_src, num_dst


@pytest.fixture(params=[(30, 11), (9, 25)], ids=["more-sources", "more-targets"])
def shape(request):
    return request.param


def test_graph_keeps_both_sizes_and_transposes(shape):
    num_src, num_dst = shape
    ei, w = _bipartite(num_src, num_dst, 60, 0)
    g = Graph.from_edge_index(ei, w, num_nodes=num_dst, num_src=num_src)
    assert (g.num_nodes, g.num_src, g.shape, g.is_bipartite) == (num_dst, num_src, (num_dst, num_src), True)
    assert g.rowptr.numel() == num_dst + 1
    dense = _dense(ei, num_dst, num_src, w)
    assert torch.equal(g.to_dense(torch.float64), dense)
    assert torch.equal(g.to_torch_sparse_csr(torch.float64).to_dense(), dense)
    t = g.t()
    assert (t.num_nodes, t.num_src) == (num_src, num_dst)
    assert torch.equal(t.to_dense(torch.float64), dense.T)
    assert "num_src=" in repr(g)
    # the same graph from a rectangular adj_t (COO and CSR) and from CSR arrays
    adj = dense.to_sparse()
    for built in (Graph.from_torch_sparse(adj), Graph.from_torch_sparse(adj.to_sparse_csr()),
                  Graph.from_csr(g.rowptr, g.col, g.edge_val, num_src=num_src)):
        assert built.shape == (num_dst, num_src)
        assert torch.allclose(built.to_dense(torch.float64), dense)


def test_graph_transformations_keep_the_sources(shape):
    num_src, num_dst = shape
    ei, w = _bipartite(num_src, num_dst, 60, 1)
    g = Graph.from_edge_index(ei, w, num_nodes=num_dst, num_src=num_src)
    looped = g.add_self_loops(fill_value=2.0)
    expected = _dense(ei, num_dst, num_src, w)
    k = min(num_src, num_dst)
    for i in range(k):           # loops i -> i for i < min(N, M): existing ones merged (summed)
        has = bool(((ei[0] == i) & (ei[1] == i)).any())
        expected[i, i] = expected[i, i] if has else 2.0
    assert looped.shape == g.shape
    assert torch.allclose(looped.to_dense(torch.float64), expected)
    assert int(((looped.row == looped.col) & (looped.row < k)).sum()) == k
    assert g.remove_self_loops().shape == g.shape
    assert not bool((g.remove_self_loops().row == g.remove_self_loops().col).any())
    dedup = g.remove_duplicates()
    assert dedup.shape == g.shape and torch.allclose(dedup.to_dense(torch.float64), g.to_dense(torch.float64))
    assert g.with_values(None).shape == g.shape and g.to("cpu").shape == g.shape
    row_norm = g.normalize("row").to_dense(torch.float64)
    deg = g.to_dense(torch.float64).sum(1, keepdim=True)
    assert torch.allclose(row_norm, torch.where(deg > 0, g.to_dense(torch.float64) / deg.clamp_min(1e-30), 0.0),
                          atol=1e-6)


def test_bipartite_errors():
    ei = torch.tensor([[0, 4], [1, 0]])
    with pytest.raises(ValueError, match=r"edge_index\[0\] \(sources\)"):
        Graph.from_edge_index(ei, num_nodes=2, num_src=3)
    with pytest.raises(ValueError, match=r"edge_index\[1\] \(targets\)"):
        Graph.from_edge_index(ei, num_nodes=1, num_src=5)
    g = Graph.from_edge_index(ei, num_nodes=2, num_src=5)
    with pytest.raises(ValueError, match=r"mode='sym' needs a square graph"):
        g.normalize("sym")
    with pytest.raises(ValueError, match=r"x has 2 rows but the graph has 5 source nodes \(bipartite\)"):
        sg.spmm(g, torch.randn(2, 3))
    with pytest.raises(ValueError, match=r"b has 2 rows but the graph has 5 source nodes"):
        sg.sddmm(g, torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(ValueError, match=r"bipartite graphs cannot be batched"):
        Graph.batch([g, g])
    from sparsegnn.ops.attention import agnn_attention
    with pytest.raises(ValueError, match=r"agnn_attention\(\): needs a square graph"):
        agnn_attention(g, torch.randn(5, 3), torch.ones(1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_spmm_forward_and_backward(shape, backend, reduce):
    ei, w, g, num_src, num_dst = _case(shape, 70, 2, backend)
    gen = torch.Generator().manual_seed(5)
    x64 = torch.randn(num_src, 6, generator=gen, dtype=torch.float64)
    dtype = torch.float64 if backend == "reference" else torch.float32
    x = x64.to(dtype).to(_device(backend)).requires_grad_()
    weight = g.to_graph_order(w.to(_device(backend))).to(dtype).requires_grad_()
    out = sg.spmm(g, x, reduce, edge_weight=weight, backend=backend)
    assert out.shape == (num_dst, 6)

    # oracle in float64 with autograd over the dense matrix built from the raw edge list
    xr = x.detach().double().cpu().requires_grad_()
    wr = w.to(dtype).double().requires_grad_()
    if reduce == "max":
        ref = _dense_max(ei, num_dst, x.detach().double().cpu(), wr.detach())
    else:
        a = torch.zeros(num_dst, num_src, dtype=torch.float64).index_put((ei[1], ei[0]), wr, accumulate=True)
        ref = a @ xr
        if reduce == "mean":
            count = _dense(ei, num_dst, num_src).sum(1, keepdim=True).clamp(min=1)
            ref = ref / count
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert (out.detach().double().cpu() - ref.detach()).norm() <= tol * ref.detach().norm().clamp_min(1)
    if reduce == "max":
        return    # max gradients: the square-graph tests cover the arg-max rules; shapes here
    grad = torch.randn(num_dst, 6, generator=gen, dtype=torch.float64)
    gx, gw = torch.autograd.grad(out, (x, weight), grad.to(dtype).to(_device(backend)))
    rx, rw = torch.autograd.grad(ref, (xr, wr), grad.to(dtype).double())
    assert gx.shape == (num_src, 6)
    assert (gx.double().cpu() - rx).norm() <= tol * rx.norm().clamp_min(1)
    assert (g.to_input_order(gw).double().cpu() - rw).norm() <= tol * rw.norm().clamp_min(1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_spmm_max_gradient_shapes(shape, backend):
    ei, w, g, num_src, num_dst = _case(shape, 70, 3, backend)
    x = torch.randn(num_src, 4, device=_device(backend), requires_grad=True)
    out = sg.spmm(g, x, "max", backend=backend)
    (gx,) = torch.autograd.grad(out.sum(), x)
    # each output entry of a non-empty row sends exactly one unit to the source it came from
    nonempty = int((g.in_degree() > 0).sum())
    assert gx.shape == (num_src, 4) and torch.allclose(gx.sum(0), torch.full((4,), float(nonempty), device=_device(backend)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["dot", "add", "mul"])
def test_sddmm_and_softmax(shape, backend, op):
    ei, w, g, num_src, num_dst = _case(shape, 50, 4, backend)
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(num_dst, 5, generator=gen, dtype=torch.float64)
    b = torch.randn(num_src, 5, generator=gen, dtype=torch.float64)
    dtype = torch.float64 if backend == "reference" else torch.float32
    ad, bd = (t.to(dtype).to(_device(backend)).requires_grad_() for t in (a, b))
    out = sg.sddmm(g, ad, bd, op, backend=backend)
    ar, br = a.clone().requires_grad_(), b.clone().requires_grad_()
    row, col = g.row.cpu(), g.col.cpu()
    pairs = {"dot": lambda: (ar[row] * br[col]).sum(-1), "add": lambda: ar[row] + br[col],
             "mul": lambda: ar[row] * br[col]}
    ref = pairs[op]()
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert torch.allclose(out.detach().double().cpu(), ref.detach(), atol=tol, rtol=tol)
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    ga, gb = torch.autograd.grad(out, (ad, bd), grad.to(dtype).to(_device(backend)))
    ra, rb = torch.autograd.grad(ref, (ar, br), grad)
    assert gb.shape == (num_src, 5)
    assert torch.allclose(ga.double().cpu(), ra, atol=1e-5) and torch.allclose(gb.double().cpu(), rb, atol=1e-5)
    if op == "dot":   # softmax over each target's incoming edges
        soft = sg.edge_softmax(g, out.detach(), backend=backend)
        expect = torch.zeros_like(ref)
        for i in range(num_dst):
            sel = row == i
            if sel.any():
                expect[sel] = torch.softmax(ref.detach()[sel], 0)
        assert torch.allclose(soft.double().cpu(), expect, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gat_attention(shape, backend):
    ei, w, g, num_src, num_dst = _case(shape, 60, 7, backend)
    gen = torch.Generator().manual_seed(8)
    heads, channels = 2, 3
    feat = torch.randn(num_src, heads, channels, generator=gen, dtype=torch.float64)
    a_src = torch.randn(num_src, heads, generator=gen, dtype=torch.float64)
    a_dst = torch.randn(num_dst, heads, generator=gen, dtype=torch.float64)
    dtype = torch.float64 if backend == "reference" else torch.float32
    inputs = [t.to(dtype).to(_device(backend)).requires_grad_() for t in (feat, a_src, a_dst)]
    out = gat_attention(g, *inputs, negative_slope=0.2, backend=backend)
    assert out.shape == (num_dst, heads, channels)
    # oracle: dense per-head attention matrix from the raw edge list (duplicates as separate edges)
    refs = [t.clone().requires_grad_() for t in (feat, a_src, a_dst)]
    fr, sr, dr = refs
    scores = F.leaky_relu(dr[ei[1]] + sr[ei[0]], 0.2)                        # [E, H]
    rows = []
    for i in range(num_dst):
        sel = (ei[1] == i).nonzero().flatten()
        alpha = torch.softmax(scores[sel], 0)                                  # [k, H]
        rows.append((alpha.unsqueeze(-1) * fr[ei[0, sel]]).sum(0))             # zeros for k = 0
    full = torch.stack(rows)
    assert torch.allclose(out.detach().double().cpu(), full.detach(), atol=1e-5)
    grad = torch.randn(num_dst, heads, channels, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, inputs, grad.to(dtype).to(_device(backend)))
    want = torch.autograd.grad(full, refs, grad)
    for gt, wt in zip(got, want):
        assert gt.shape == wt.shape
        assert torch.allclose(gt.double().cpu(), wt, atol=1e-5)


def test_spmm_custom_op_on_a_bipartite_graph():
    ei, _ = _bipartite(12, 5, 30, 9)
    g = Graph.from_edge_index(ei, num_nodes=5, num_src=12).to(DEVICE)
    x = torch.randn(12, 4, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.sparsegnn.spmm, (x, None, g.key, "sum", "auto"))
    torch.library.opcheck(torch.ops.sparsegnn.spmm_transposed, (torch.randn(5, 4, device=DEVICE), None, g.key,
                                                                "sum", "auto"))
