"""Fused graph attention (GAT) against a float64 composition of gathers, softmax and sums.

The oracle is built from the raw edge list (not from the library's ops), so duplicate edges,
self loops, empty rows and isolated nodes are checked as the formula says.  On a CPU-only
machine the Triton kernels run in the interpreter (conftest sets TRITON_INTERPRET=1).
"""
import pytest
import torch
import torch.nn.functional as F

from sparsegnn import Graph, spmm
from sparsegnn.datasets import random_graph
from sparsegnn.kernels.attention import (GAT_SPACE, agnn_backward, agnn_candidates, agnn_forward, first_contact_config,
                                         gat_backward, gat_candidates, gat_forward)
from sparsegnn.ops.attention import agnn_attention, gat_attention

from conftest import DEVICE, GRAPH_CASES

TOL = {torch.float32: 1e-5, torch.bfloat16: 5e-3}
GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _oracle(ei, n, feat, a_src, a_dst, slope, mask=None, p=0.0):
    """float64 GAT aggregation over the raw edges ``ei`` (source row 0, target row 1)."""
    src, dst = ei[0].cpu(), ei[1].cpu()
    s = F.leaky_relu(a_dst[dst] + a_src[src], slope)                       # [E, H]
    m = torch.full((n, s.shape[1]), float("-inf"), dtype=s.dtype).scatter_reduce(0, dst[:, None].expand_as(s), s, "amax")
    ex = torch.exp(s - m[dst])
    z = torch.zeros(n, s.shape[1], dtype=s.dtype).index_add(0, dst, ex)
    alpha = ex / z[dst]
    if mask is not None:
        alpha = alpha * mask / (1 - p)
    out = torch.zeros_like(feat).index_add(0, dst, alpha[:, :, None] * feat[src])
    return out, alpha


def _rel(a, b, floor=1e-30):
    """``|a - b| / max(|b|, floor)`` (norms); ``floor`` (the inputs' unit scale) for gradients that are 0 in exact
    arithmetic (a row whose edges all weigh the same) and a few ulps here."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp(min=floor)) if b.numel() else 0.0


def _inputs(n, heads, channels, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen).to(dtype) for shape in ((n, heads, channels), (n, heads), (n, heads))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("heads,channels", [(1, 3), (8, 8), (3, 5)])
@pytest.mark.parametrize("case", GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def test_fused_gat_matches_oracle(case, heads, channels, dtype):
    _, n, ei, _ = case
    g = Graph.from_edge_index(ei, num_nodes=n).to(DEVICE)
    feat, a_src, a_dst = [t.to(DEVICE).requires_grad_() for t in _inputs(n, heads, channels, dtype, n + heads)]
    out = gat_attention(g, feat, a_src, a_dst, 0.2, backend="triton")
    assert out.dtype == dtype and out.shape == (n, heads, channels)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    grads = torch.autograd.grad(out, (feat, a_src, a_dst), go.to(DEVICE), allow_unused=True)
    ref_in = [t.detach().double().cpu().requires_grad_() for t in (feat, a_src, a_dst)]
    ref, _ = _oracle(ei, n, *ref_in, 0.2)
    assert _rel(out, ref) < TOL[dtype]
    if ei.shape[1] == 0:
        assert all(float(gr.abs().max()) == 0 for gr in grads if gr is not None and gr.numel())
        return
    ref_grads = torch.autograd.grad(ref, ref_in, go.double())
    for name, got, want in zip(("feat", "a_src", "a_dst"), grads, ref_grads):
        assert _rel(got, want, floor=1.0) < GRAD_TOL[dtype], name   # unit-scale inputs


def _hub_graph():
    """A few rows of ~100 edges among short ones, so row loops take many steps."""
    ei, _ = random_graph(60, 300, seed=5, num_empty_rows=3, num_self_loops=4, num_duplicates=5)
    hub = torch.stack([torch.arange(60), torch.full((60,), 7)])
    return torch.cat([ei, hub, hub[:, :40].flip(0)], dim=1), 60


@pytest.mark.parametrize("config_index", range(len(gat_candidates(60, 400, 2, 4)) + 2))
def test_every_gat_candidate_is_correct(config_index):
    ei, n = _hub_graph()
    g = Graph.from_edge_index(ei, num_nodes=n).to(DEVICE)
    # the candidates the tuner may pick, an extreme of the search space, and the config of a
    # graph met for the first time
    candidates = gat_candidates(n, g.num_edges, 2, 4) + [
        {"BLOCK_E": max(GAT_SPACE["BLOCK_E"]), "ROWS": max(GAT_SPACE["ROWS"]), "num_warps": 1},
        first_contact_config("gat", 2, 4)]
    config = candidates[config_index]
    assert all(config[k] in GAT_SPACE[k] for k in config if not k.startswith("SUM_"))
    feat, a_src, a_dst = [t.to(DEVICE) for t in _inputs(n, 2, 4, torch.float32, 3)]
    out, lse = gat_forward(g.rowptr, g.col, feat, a_src, a_dst, 0.2, 0.0, None, config)
    ref_in = [t.double().cpu().requires_grad_() for t in (feat, a_src, a_dst)]
    ref, _ = _oracle(ei, n, *ref_in, 0.2)
    assert _rel(out, ref) < 1e-5
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = gat_backward(g.rowptr, g.transpose_parts(), feat, a_src, a_dst, lse, out, go.to(DEVICE), 0.2, 0.0,
                         None, config)
    for got, want in zip(grads, torch.autograd.grad(ref, ref_in, go.double())):
        assert _rel(got, want) < 1e-5


def _one_hot_case(heads, p, seed):
    """Features ``feat[j, h, c] = [c == j]``: the output then shows every kept edge weight."""
    ei, _ = random_graph(48, 400, seed=9, num_self_loops=4)
    ei = torch.unique(ei, dim=1)                                  # no duplicates: one weight per (i, j)
    n = 48
    g = Graph.from_edge_index(ei, num_nodes=n).to(DEVICE)
    feat = torch.eye(n)[:, None, :].repeat(1, heads, 1).to(DEVICE).requires_grad_()
    gen = torch.Generator().manual_seed(seed)
    a_src, a_dst = [torch.randn(n, heads, generator=gen).to(DEVICE).requires_grad_() for _ in range(2)]
    return ei, n, g, feat, a_src, a_dst


@pytest.mark.parametrize("heads", [1, 4])
def test_attention_dropout_keeps_scaled_weights_and_backward_uses_the_same_mask(heads):
    p = 0.4
    ei, n, g, feat, a_src, a_dst = _one_hot_case(heads, p, seed=2)
    torch.manual_seed(123)
    out = gat_attention(g, feat, a_src, a_dst, 0.2, dropout=p, backend="triton")
    _, alpha = _oracle(ei, n, feat.detach().double().cpu(), a_src.detach().double().cpu(),
                       a_dst.detach().double().cpu(), 0.2)
    got = out.detach().double().cpu()[ei[1], :, ei[0]]                  # [E, H]: weight of edge j -> i
    kept = got != 0
    # every entry is either dropped or alpha / (1 - p)
    assert torch.allclose(got[kept], (alpha / (1 - p))[kept], rtol=1e-5, atol=1e-7)
    frac = float(kept.double().mean())
    assert abs(frac - (1 - p)) < 0.08, frac
    # the backward drops the same edges: compare with the oracle under the recovered mask
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    grads = torch.autograd.grad(out, (feat, a_src, a_dst), go.to(DEVICE))
    ref_in = [t.detach().double().cpu().requires_grad_() for t in (feat, a_src, a_dst)]
    ref, _ = _oracle(ei, n, *ref_in, 0.2, mask=kept.double(), p=p)
    assert _rel(out, ref) < 1e-5
    for got_g, want in zip(grads, torch.autograd.grad(ref, ref_in, go.double())):
        assert _rel(got_g, want) < 1e-5
    # the same seed reproduces the mask; another draw differs
    torch.manual_seed(123)
    again = gat_attention(g, feat, a_src, a_dst, 0.2, dropout=p, backend="triton")
    assert torch.equal(again, out)
    other = gat_attention(g, feat, a_src, a_dst, 0.2, dropout=p, backend="triton")
    assert not torch.equal(other, out)


def test_gat_attention_errors():
    g = Graph.from_edge_index(torch.tensor([[0, 1], [1, 0]]))
    feat, a = torch.randn(2, 2, 3), torch.randn(2, 2)
    with pytest.raises(ValueError, match=r"gat_attention\(\): feat must be \[N, heads, channels\]"):
        gat_attention(g, feat[:, 0], a, a)
    with pytest.raises(ValueError, match=r"gat_attention\(\): alpha_src must have shape"):
        gat_attention(g, feat, a[:, :1], a)
    with pytest.raises(ValueError, match=r"alpha_dst must have feat's dtype"):
        gat_attention(g, feat, a, a.double())
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        gat_attention(g, feat, a, a, dropout=1.0)
    with pytest.raises(ValueError, match=r"feat has 3 rows but the graph has 2 nodes"):
        gat_attention(g, torch.randn(3, 2, 3), torch.randn(3, 2), torch.randn(3, 2))


def test_reference_path_matches_oracle_with_edge_index():
    ei, _ = random_graph(30, 120, seed=4, num_empty_rows=2, num_self_loops=3, num_duplicates=4)
    feat, a_src, a_dst = _inputs(30, 2, 3, torch.float64, 5)
    out = gat_attention(ei, feat, a_src, a_dst, 0.1, backend="reference")
    assert _rel(out, _oracle(ei, 30, feat, a_src, a_dst, 0.1)[0]) < 1e-12


def _agnn_core(ei, n, q, v, beta):
    """float64 ``sum_{j -> i} softmax_i(beta <q_i, q_j>) v_j`` over the raw edges."""
    src, dst = ei[0].cpu(), ei[1].cpu()
    s = beta * (q[dst] * q[src]).sum(-1)
    m = torch.full((n,), float("-inf"), dtype=s.dtype).scatter_reduce(0, dst, s, "amax")
    ex = torch.exp(s - m[dst])
    alpha = ex / torch.zeros(n, dtype=s.dtype).index_add(0, dst, ex)[dst]
    return torch.zeros_like(v).index_add(0, dst, alpha[:, None] * v[src])


def _agnn_oracle(ei, n, x, beta):
    """AGNN propagation over the raw edges: softmax_i(beta cos(x_i, x_j)) x_j."""
    return _agnn_core(ei, n, x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12), x, beta)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def test_fused_agnn_matches_oracle(case, dtype):
    _, n, ei, _ = case
    g = Graph.from_edge_index(ei, num_nodes=n).to(DEVICE)
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, 13, generator=gen).to(dtype).to(DEVICE).requires_grad_()
    beta = torch.tensor([0.7], dtype=dtype, device=DEVICE, requires_grad=True)
    out = agnn_attention(g, x, beta, backend="triton")
    assert out.dtype == dtype and out.shape == x.shape
    go = torch.randn(out.shape, generator=gen).to(dtype)
    grads = torch.autograd.grad(out, (x, beta), go.to(DEVICE), allow_unused=True)
    ref_in = [t.detach().double().cpu().requires_grad_() for t in (x, beta)]
    ref = _agnn_oracle(ei, n, *ref_in)
    assert _rel(out, ref) < TOL[dtype]
    if ei.shape[1] == 0:                                     # no edges: zero output, zero gradients
        assert all(gr is None or gr.numel() == 0 or float(gr.abs().max()) == 0 for gr in grads)
        return
    for got, want in zip(grads, torch.autograd.grad(ref, ref_in, go.double())):
        assert _rel(got, want, floor=1.0) < GRAD_TOL[dtype]   # unit-scale inputs


@pytest.mark.parametrize("config_index", range(len(agnn_candidates(60, 400, 6)) + 1))
def test_every_agnn_candidate_is_correct(config_index):
    ei, n = _hub_graph()
    g = Graph.from_edge_index(ei, num_nodes=n).to(DEVICE)
    config = (agnn_candidates(n, g.num_edges, 6) + [first_contact_config("agnn", 1, 6)])[config_index]
    assert all(config[k] in GAT_SPACE[k] for k in config)
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    nrm = x.norm(dim=-1).clamp_min(1e-12)
    beta = torch.tensor([1.3], device=DEVICE)
    out, lse = agnn_forward(g.rowptr, g.col, x / nrm[:, None], nrm, beta, config)
    assert _rel(out, _agnn_oracle(ei, n, x.double().cpu(), 1.3)) < 1e-5
    # the transposed pass with this config, completed as the op does (row part: an SpMM with
    # ds as edge weights), against the oracle's gradients of q = x/|x|, nrm = |x| and beta
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    q = x / nrm[:, None]
    dq, dnrm, dbeta, ds = agnn_backward(g.transpose_parts(), q, nrm, beta, lse, out, go, config)
    dq = dq + 1.3 * spmm(g, q, edge_weight=ds)
    qr = q.double().cpu().requires_grad_()
    nr = nrm.double().cpu().requires_grad_()
    br = torch.tensor([1.3], dtype=torch.float64, requires_grad=True)
    want = torch.autograd.grad(_agnn_core(ei, n, qr, qr * nr[:, None], br), (qr, nr, br), go.double().cpu())
    for got, ref in zip((dq, dnrm, dbeta.sum().reshape(1)), want):
        assert _rel(got, ref, floor=1.0) < 1e-5


def test_agnn_attention_errors():
    g = Graph.from_edge_index(torch.tensor([[0, 1], [1, 0]]))
    with pytest.raises(ValueError, match=r"agnn_attention\(\): x must be \[N, features\]"):
        agnn_attention(g, torch.randn(2), torch.ones(1))
    with pytest.raises(ValueError, match=r"agnn_attention\(\): beta must be a one-element tensor"):
        agnn_attention(g, torch.randn(2, 3), torch.ones(2))
    with pytest.raises(ValueError, match=r"x has 3 rows but the graph has 2 nodes"):
        agnn_attention(g, torch.randn(3, 3), torch.ones(1))


def _small_hub_graph():
    """``_hub_graph``'s cases on 16 nodes (empty rows, self loops, duplicates, a hub row of 24
    edges): ``opcheck`` runs each op a dozen times, and the interpreter's cost grows with the rows."""
    ei, _ = random_graph(16, 60, seed=5, num_empty_rows=3, num_self_loops=3, num_duplicates=4)
    hub = torch.stack([torch.arange(16), torch.full((16,), 7)])
    return torch.cat([ei, hub, hub[:, :8].flip(0)], dim=1), 16


@pytest.mark.slow
def test_fused_attention_custom_ops_pass_opcheck():
    ei, n = _small_hub_graph()
    g = Graph.from_edge_index(ei, num_nodes=n).to(DEVICE)
    feat, a_src, a_dst = [t.to(DEVICE).requires_grad_() for t in _inputs(n, 2, 3, torch.float32, 8)]
    seed = torch.tensor([5], device=DEVICE)
    half = [t.detach().bfloat16().requires_grad_() for t in (feat, a_src, a_dst)]
    for args in ((feat, a_src, a_dst, None, g.key, 0.2, 0.0), (feat, a_src, a_dst, seed, g.key, 0.2, 0.3),
                 (*half, None, g.key, 0.2, 0.0)):
        torch.library.opcheck(torch.ops.sparsegnn.gat_attention, args)
    x = torch.randn(n, 5, device=DEVICE)
    nrm = x.norm(dim=-1).clamp_min(1e-12)
    q = (x / nrm[:, None]).requires_grad_()
    beta = torch.tensor([0.8], device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.sparsegnn.agnn_attention, (q, nrm.requires_grad_(), beta, g.key))


@pytest.mark.slow
def test_fused_attention_compiles_without_graph_breaks():
    import torch._dynamo

    ei, n = _hub_graph()
    g = Graph.from_edge_index(ei, num_nodes=n).to(DEVICE)
    feat, a_src, a_dst = [t.to(DEVICE).requires_grad_() for t in _inputs(n, 2, 3, torch.float32, 8)]
    x = torch.randn(n, 5, device=DEVICE, requires_grad=True)
    beta = torch.tensor([0.8], device=DEVICE, requires_grad=True)

    def f(feat, a_src, a_dst, x, beta):
        return (gat_attention(g, feat, a_src, a_dst, 0.2, backend="triton").square().sum()
                + agnn_attention(g, x, beta, backend="triton").square().sum())

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = compiled(feat, a_src, a_dst, x, beta)
    want = f(feat, a_src, a_dst, x, beta)
    assert torch.allclose(got, want, rtol=1e-5)
    inputs = (feat, a_src, a_dst, x, beta)
    for a, b in zip(torch.autograd.grad(got, inputs), torch.autograd.grad(want, inputs)):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="must be a sparsegnn.Graph"):
        torch.compile(lambda f_, s, d: gat_attention(ei, f_, s, d), fullgraph=True, backend="aot_eager")(
            feat, a_src, a_dst)
    torch._dynamo.reset()
