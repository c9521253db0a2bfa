"""The Triton CSR SpMM against the float64 dense oracle.

On a CPU-only machine conftest.py sets TRITON_INTERPRET=1, so the same kernel code runs in
Triton's interpreter; on a GPU it is compiled.  Inputs stay tiny for the interpreter.
"""
import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.kernels.spmm_csr import spmm_csr

from conftest import DEVICE, dense_adjacency

TOL = {torch.float32: 1e-5, torch.bfloat16: 5e-3, torch.float16: 5e-3}


def _rel_err(out, ref):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return float((out - ref).norm() / ref.norm().clamp(min=1e-30)) if ref.numel() else 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("num_feats", [1, 37, 130])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_spmm_csr_kernel_matches_dense(graph_case, dtype, num_feats, weighted):
    _, n, ei, w = graph_case
    g = Graph.from_edge_index(ei, w if weighted else None, num_nodes=n).to(DEVICE)
    x = torch.randn(n, num_feats, generator=torch.Generator().manual_seed(n + num_feats)).to(dtype)
    poisoned = torch.full((n, num_feats), float("nan"), dtype=dtype, device=DEVICE)  # every element must be written
    out = spmm_csr(g.rowptr, g.col, g.edge_val, x.to(DEVICE), out=poisoned)
    assert out.dtype == dtype and out.shape == (n, num_feats)
    assert not torch.isnan(out).any()
    ref = dense_adjacency(ei, n, w if weighted else None) @ x.double()  # oracle on the rounded inputs
    assert _rel_err(out, ref) < TOL[dtype]


def test_spmm_csr_kernel_noncontiguous_input():
    ei, w = sg.datasets.random_graph(30, 120, seed=11, num_empty_rows=3, weighted=True)
    g = Graph.from_edge_index(ei, w, num_nodes=30).to(DEVICE)
    wide = torch.randn(30, 40)
    x = wide[:, ::2]  # stride 2 in features
    out = spmm_csr(g.rowptr, g.col, g.edge_val, x.to(DEVICE))
    assert _rel_err(out, dense_adjacency(ei, 30, w) @ x.double()) < 1e-5


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_triton_backend_forward_backward(reduce):
    ei, w = sg.datasets.random_graph(35, 150, seed=12, num_isolated=2, num_empty_rows=3,
                                     num_self_loops=4, num_duplicates=5, weighted=True)
    a = dense_adjacency(ei, 35, w)
    if reduce == "mean":
        a = a / dense_adjacency(ei, 35).sum(1, keepdim=True).clamp(min=1)
    x = torch.randn(35, 20, generator=torch.Generator().manual_seed(0))
    g = Graph.from_edge_index(ei, w, num_nodes=35).to(DEVICE)
    xd = x.to(DEVICE).requires_grad_(True)
    out = sg.spmm(g, xd, reduce=reduce, backend="triton")
    upstream = torch.randn(35, 20, generator=torch.Generator().manual_seed(1))
    out.backward(upstream.to(DEVICE))
    assert _rel_err(out.detach(), a @ x.double()) < 1e-5
    assert _rel_err(xd.grad, a.T @ upstream.double()) < 1e-5  # A^T: the graph is directed


def test_auto_backend_choice():
    from sparsegnn.ops._dispatch import choose_backend

    x = torch.randn(3, 2, device=DEVICE)
    expected = "triton" if DEVICE == "cuda" else "reference"
    assert choose_backend("spmm", "auto", x) == expected
    assert choose_backend("spmm", "auto", x.double()) == "reference"
