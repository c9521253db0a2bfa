"""Every op, forward and backward, against dense float64 formulas built from the raw edge list."""
import math

import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.ops import reference

from conftest import DEVICE, dense_adjacency


def _features(n, f, seed, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=gen, dtype=torch.float64).requires_grad_(requires_grad)


def _dense_max(ei, n, x, w):
    """Feature-wise max over incoming edges, zero for rows without edges (loop oracle)."""
    out = torch.zeros(n, x.shape[1], dtype=torch.float64)
    seen = [False] * n
    for e in range(ei.shape[1]):
        i, j = int(ei[1, e]), int(ei[0, e])
        msg = x[j] * (w[e] if w is not None else 1.0)
        out[i] = msg if not seen[i] else torch.maximum(out[i], msg)
        seen[i] = True
    return out


@pytest.fixture(params=[False, True], ids=["unweighted", "weighted"])
def weighted(request):
    return request.param


def test_spmm_sum_and_mean_forward(graph_case, weighted):
    _, n, ei, w = graph_case
    w = w.double() if weighted else None
    g = Graph.from_edge_index(ei, w, num_nodes=n)
    x = _features(n, 5, 0)
    a = dense_adjacency(ei, n, w)
    assert torch.allclose(sg.spmm(g, x, backend="reference"), a @ x)
    count = dense_adjacency(ei, n).sum(1, keepdim=True).clamp(min=1)
    assert torch.allclose(sg.spmm(g, x, reduce="mean", backend="reference"), (a @ x) / count)


def test_spmm_max_forward(graph_case, weighted):
    _, n, ei, w = graph_case
    w = w.double() if weighted else None
    x = _features(n, 4, 1)
    out = sg.spmm(Graph.from_edge_index(ei, w, num_nodes=n), x, reduce="max", backend="reference")
    assert torch.allclose(out, _dense_max(ei, n, x, w))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_spmm_gradcheck(graph_case, reduce):
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, num_nodes=n)
    x = _features(n, 3, 2, requires_grad=True)
    weight = (w.double() if w.numel() else torch.zeros(0, dtype=torch.float64)).clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, w: sg.spmm(g, x, reduce=reduce, edge_weight=w), (x, weight))
    assert torch.autograd.gradcheck(lambda x: sg.spmm(g, x, reduce=reduce), (x,))


def test_spmm_backward_uses_transpose_on_directed_graph():
    # A path 0 -> 1 -> 2: A is not symmetric, so A^T dY differs from A dY.
    ei = torch.tensor([[0, 1], [1, 2]])
    x = torch.eye(3, dtype=torch.float64, requires_grad=True)
    sg.spmm(ei, x).sum(1)[2].backward()
    assert x.grad[:, 0].tolist() == [0.0, 1.0, 0.0]  # only node 1 feeds node 2


def test_spmm_chunking_matches_unchunked(monkeypatch, weighted):
    ei, w = sg.datasets.random_graph(50, 400, seed=9, num_duplicates=20, num_empty_rows=5, weighted=True)
    w = w.double() if weighted else None
    x = _features(50, 6, 3)
    a = dense_adjacency(ei, 50, w)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 7 * 6)  # 7 edges per chunk: rows span chunks
    g = Graph.from_edge_index(ei, w, num_nodes=50)
    assert torch.allclose(sg.spmm(g, x), a @ x)
    assert torch.allclose(sg.spmm(g, x, reduce="max"), _dense_max(ei, 50, x, w))
    xs = _features(50, 6, 4)
    dense_dot = (x[ei[1]] * xs[ei[0]]).sum(-1)
    assert torch.allclose(sg.sddmm(ei, x, xs), dense_dot)


@pytest.mark.parametrize("op", ["dot", "add", "mul"])
def test_sddmm_forward_and_gradcheck(graph_case, op):
    _, n, ei, _ = graph_case
    g = Graph.from_edge_index(ei, num_nodes=n)
    a, b = _features(n, 4, 5, True), _features(n, 4, 6, True)
    out = sg.sddmm(g, a, b, op)
    tgt, src = g.row, g.col  # graph order
    expected = {"dot": (a[tgt] * b[src]).sum(-1), "add": a[tgt] + b[src], "mul": a[tgt] * b[src]}[op]
    assert torch.allclose(out, expected)
    assert torch.autograd.gradcheck(lambda a, b: sg.sddmm(g, a, b, op), (a, b))


def test_sddmm_edge_index_returns_caller_order():
    ei, _ = sg.datasets.random_graph(12, 40, seed=4, num_duplicates=3)
    a, b = _features(12, 3, 7), _features(12, 3, 8)
    out = sg.sddmm(ei, a, b)
    assert torch.allclose(out, (a[ei[1]] * b[ei[0]]).sum(-1))  # edge e of the caller's list


def _dense_softmax(ei, n, scores):
    out = torch.empty_like(scores)
    for i in range(n):
        idx = (ei[1] == i).nonzero().flatten()
        if idx.numel():
            out[idx] = torch.softmax(scores[idx], dim=0)
    return out


@pytest.mark.parametrize("heads", [None, 3])
def test_edge_softmax_forward_and_gradcheck(graph_case, heads):
    _, n, ei, _ = graph_case
    shape = (ei.shape[1],) if heads is None else (ei.shape[1], heads)
    scores = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 3
    out = sg.edge_softmax(ei, scores, num_nodes=n)  # caller's edge order
    assert torch.allclose(out, _dense_softmax(ei, n, scores))
    g = Graph.from_edge_index(ei, num_nodes=n)
    s = g.to_graph_order(scores).clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: sg.edge_softmax(g, s), (s,))


def test_edge_softmax_sums_to_one_per_target():
    ei, _ = sg.datasets.random_graph(30, 200, seed=2, num_empty_rows=4, num_self_loops=3)
    g = Graph.from_edge_index(ei, num_nodes=30)
    y = sg.edge_softmax(g, torch.randn(g.num_edges) * 50)  # large scores: needs the max shift
    sums = torch.zeros(30).index_add_(0, g.row, y)
    has_edges = g.in_degree() > 0
    assert torch.allclose(sums[has_edges], torch.ones(int(has_edges.sum())), atol=1e-5)
    assert not torch.isnan(y).any()


def test_ops_accept_torch_sparse():
    ei, w = sg.datasets.random_graph(10, 30, seed=1, weighted=True)
    a = dense_adjacency(ei, 10, w).float()
    x = torch.randn(10, 4)
    assert torch.allclose(sg.spmm(a.to_sparse_csr(), x), a @ x, atol=1e-5)
    assert torch.allclose(sg.spmm(a.to_sparse(), x), a @ x, atol=1e-5)


def test_half_precision_reference_accumulates_in_fp32():
    ei, w = sg.datasets.random_graph(20, 200, seed=1, weighted=True)
    x = torch.randn(20, 8)
    a = dense_adjacency(ei, 20, w)
    for dtype in (torch.bfloat16, torch.float16):
        out = sg.spmm(ei, x.to(dtype), edge_weight=w)
        assert out.dtype == dtype
        ref = a @ x.to(dtype).double()
        assert ((out.double() - ref).norm() / ref.norm()) < 5e-3


# ---------------------------------------------------------------- validation
def _g():
    return Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sg.spmm(_g(), torch.randn(4, 2)), "x has 4 rows but the graph has 3 nodes"),
        (lambda: sg.spmm(_g(), torch.randn(3)), "must be 2-D"),
        (lambda: sg.spmm(_g(), torch.ones(3, 2, dtype=torch.int64)), "floating-point"),
        (lambda: sg.spmm(_g(), torch.randn(3, 2), reduce="prod"), "reduce must be one of"),
        (lambda: sg.spmm(_g(), torch.randn(3, 2), edge_weight=torch.ones(2)), "edge_weight has 2 entries"),
        (lambda: sg.spmm(_g(), torch.randn(3, 2), backend="cuda"), "backend must be one of"),
        (lambda: sg.spmm(torch.tensor([[0, 3], [1, 0]]), torch.randn(3, 2)), "out of range"),
        (lambda: sg.spmm(torch.tensor([[0, -1], [1, 0]]), torch.randn(3, 2)), "negative"),
        (lambda: sg.spmm(torch.tensor([[0.0], [1.0]]), torch.randn(3, 2)), "integer dtype"),
        (lambda: sg.spmm("graph", torch.randn(3, 2)), "must be a Graph"),
        (lambda: sg.sddmm(_g(), torch.randn(3, 2), torch.randn(3, 3)), "same feature width"),
        (lambda: sg.sddmm(_g(), torch.randn(3, 2), torch.randn(3, 2), op="sub"), "op must be one of"),
        (lambda: sg.sddmm(_g(), torch.randn(3, 2), torch.randn(3, 2).double()), "same dtype"),
        (lambda: sg.edge_softmax(_g(), torch.randn(4)), "scores has 4 entries"),
        (lambda: sg.edge_softmax(_g(), torch.randn(3, 2, 2)), "1 to 2 dimensions"),
    ],
)
def test_ops_reject_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CPU and CUDA tensors together")
def test_ops_reject_mixed_devices():
    with pytest.raises(ValueError, match="one device"):
        sg.spmm(_g(), torch.randn(3, 2, device="cuda"))


def test_triton_backend_needs_cuda_or_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"spmm\(\): backend='triton' needs CUDA tensors"):
        sg.spmm(_g(), torch.randn(3, 2), backend="triton")


@pytest.mark.parametrize("op", ["spmm", "sddmm"])
def test_autograd_node_only_when_a_gradient_is_needed(op):
    ei, w = sg.datasets.random_graph(20, 80, seed=4, weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=20)
    x = torch.randn(20, 5, dtype=torch.float64)
    run = (lambda t: sg.spmm(g, t)) if op == "spmm" else (lambda t: sg.sddmm(g, t, x))
    assert run(x).grad_fn is None
    with_grad = run(x.clone().requires_grad_(True))
    assert with_grad.grad_fn is not None
    with torch.no_grad():
        assert run(x.clone().requires_grad_(True)).grad_fn is None
    assert torch.equal(with_grad.detach(), run(x))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_multi_head_spmm_matches_per_head_forward_backward(backend):
    """x [N, H, C] with edge weights [E, H] (GAT): every head at once equals a loop over heads."""
    ei, _ = sg.datasets.random_graph(30, 120, seed=2, num_self_loops=2, num_duplicates=3, num_empty_rows=2)
    g = Graph.from_edge_index(ei, num_nodes=30).to(DEVICE)
    heads, channels = 3, 4
    dtype = torch.float64 if backend == "reference" else torch.float32
    x = torch.randn(30, heads, channels, dtype=torch.float64, device=DEVICE)
    a = torch.rand(g.num_edges, heads, dtype=torch.float64, device=DEVICE) + 0.5
    xr, ar = x.clone().requires_grad_(), a.clone().requires_grad_()
    ref = torch.stack([sg.spmm(g, xr[:, h], edge_weight=ar[:, h], backend="reference") for h in range(heads)], 1)
    gx_ref, ga_ref = torch.autograd.grad((ref ** 2).sum(), (xr, ar))
    xt, at = x.to(dtype).requires_grad_(), a.to(dtype).requires_grad_()
    out = sg.spmm(g, xt, edge_weight=at, backend=backend)
    assert out.shape == (30, heads, channels)
    gx, ga = torch.autograd.grad((out ** 2).sum(), (xt, at))
    for got, want in ((out, ref), (gx, gx_ref), (ga, ga_ref)):
        assert float((got.double() - want).norm() / want.norm()) < 1e-5
    with pytest.raises(ValueError, match="spmm\\(\\): x of shape"):
        sg.spmm(g, xt, edge_weight=at[:, :2])


def test_multi_head_mean_and_max_weights():
    """[E, H] weights with reduce='mean' scale every head by 1/deg; 'max' takes [E] weights only."""
    ei, _ = sg.datasets.random_graph(20, 70, seed=3, num_self_loops=2, num_duplicates=3, num_empty_rows=2)
    g = Graph.from_edge_index(ei, num_nodes=20)
    x = torch.randn(20, 6, dtype=torch.float64)
    w = torch.rand(g.num_edges, 2, dtype=torch.float64) + 0.5
    out = sg.spmm(g, x, reduce="mean", edge_weight=w)
    per_head = [sg.spmm(g, x[:, 3 * h:3 * h + 3], reduce="mean", edge_weight=w[:, h]) for h in range(2)]
    assert torch.allclose(out, torch.cat(per_head, 1))
    with pytest.raises(ValueError, match=r"spmm\(\): reduce='max' takes edge_weight of shape \[E\]"):
        sg.spmm(g, x, reduce="max", edge_weight=w)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_input_gradient_follows_in_place_updates_of_the_graph_values(backend):
    """A learnable edge weight stepped in place between backward passes: dX = A^T dY must use
    the current values (the backward caches the permuted values per version)."""
    ei, w = sg.datasets.random_graph(20, 80, seed=21, num_empty_rows=2, num_duplicates=3, weighted=True)
    graph = Graph.from_edge_index(ei, w, num_nodes=20).to(DEVICE)
    values = torch.nn.Parameter(graph.edge_val.clone())
    g = graph.with_values(values)
    x = torch.randn(20, 5, device=DEVICE, requires_grad=True)
    for scale in (1.0, 10.0):
        with torch.no_grad():
            values.mul_(scale)                              # an optimiser-style in-place step
        x.grad = None
        sg.spmm(g, x, backend=backend).sum().backward()
        perm_back = torch.empty_like(graph.edge_perm)
        perm_back[graph.edge_perm] = torch.arange(graph.num_edges, device=graph.edge_perm.device)
        a = dense_adjacency(ei, 20, values.detach().cpu()[perm_back.cpu()])
        want = a.t() @ torch.ones(20, 5, dtype=torch.float64)
        assert torch.allclose(x.grad.double().cpu(), want, rtol=1e-5, atol=1e-5), scale


def test_torch_sparse_inputs_and_per_edge_values():
    """Per-edge values follow a CSR tensor's or a coalesced COO tensor's entries; an uncoalesced
    COO tensor means the matrix with its duplicates summed (torch's meaning), so it aggregates
    as that matrix but is refused where per-edge values would not line up with its entries."""
    index = torch.tensor([[2, 1, 1, 1], [1, 2, 0, 0]])              # A[1, 0] entered twice
    coo = torch.sparse_coo_tensor(index, torch.tensor([1.0, 2.0, 3.0, 4.0]), (3, 3))
    assert not coo.is_coalesced()
    x = torch.randn(3, 4, dtype=torch.float64)
    dense = torch.tensor([[0.0, 0.0, 0.0], [7.0, 0.0, 2.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(sg.spmm(coo, x), dense @ x)
    assert sg.Graph.from_torch_sparse(coo).num_edges == 3
    for call in (lambda: sg.edge_softmax(coo, torch.zeros(4)), lambda: sg.sddmm(coo, x, x),
                 lambda: sg.spmm(coo, x, edge_weight=torch.ones(4, dtype=torch.float64))):
        with pytest.raises(ValueError, match="not coalesced"):
            call()
    # coalesced COO (row-major entries (1, 0), (1, 2), (2, 1)) and CSR with its own entry order
    # ((1, 2), (1, 0), (2, 1): columns unsorted): per-edge values line up with the entries
    alpha = sg.edge_softmax(coo.coalesce(), torch.tensor([0.0, math.log(3.0), 5.0]))
    assert torch.allclose(alpha, torch.tensor([0.25, 0.75, 1.0]))
    csr = torch.sparse_csr_tensor(torch.tensor([0, 0, 2, 3]), torch.tensor([2, 0, 1]), torch.ones(3), (3, 3))
    alpha = sg.edge_softmax(csr, torch.tensor([math.log(3.0), 0.0, 5.0]))
    assert torch.allclose(alpha, torch.tensor([0.75, 0.25, 1.0]))
