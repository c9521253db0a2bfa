"""NaN and infinities have one meaning on every backend and dtype: PyG's.

A NaN message makes its row's sum, mean and max NaN (``scatter_reduce(..., "amax")`` propagates
it; a ``>`` comparison would skip it); +inf and -inf follow IEEE arithmetic (``inf - inf`` is NaN,
a row of -inf messages has max -inf); rows without edges give 0.  The oracle below computes that
in float64 with torch's scatter ops from the raw edge list; every backend and every CPU kernel
candidate must match it, NaN for NaN.
"""
import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.kernels import triton_available
from sparsegnn.ops import _cpu

SPECIALS = (float("nan"), float("inf"), float("-inf"))


def _case(seed: int, width: int, weighted: bool):
    """A graph with an empty row, a row of one edge, duplicate edges, and features (and weights)
    salted with NaN, +inf and -inf."""
    gen = torch.Generator().manual_seed(seed)
    n = 9
    num_edges = 30
    src = torch.randint(0, n, (num_edges,), generator=gen)
    dst = torch.randint(1, n, (num_edges,), generator=gen)          # row 0 stays empty
    dst[:3] = torch.tensor([1, 1, 2])
    src[:3] = torch.tensor([4, 4, 5])                               # a duplicate edge into row 1
    edge_index = torch.stack([src, dst])
    x = torch.randn(n, width, generator=gen, dtype=torch.float64)
    spots = torch.rand(n, width, generator=gen) < 0.2
    picks = torch.randint(0, 3, (n, width), generator=gen)
    for k, value in enumerate(SPECIALS):
        x[spots & (picks == k)] = value
    x[3] = float("-inf")                                            # rows fed only by node 3 give -inf
    weight = None
    if weighted:
        weight = torch.rand(num_edges, generator=gen, dtype=torch.float64) + 0.5
        weight[5], weight[6], weight[7] = float("inf"), 0.0, float("nan")
    return edge_index, n, x, weight


def _oracle(edge_index, n, x, weight, reduce):
    """PyG's aggregation in float64: ``scatter_reduce`` over the messages ``w_e x[src e]``."""
    src, dst = edge_index
    msg = x[src] * (1.0 if weight is None else weight[:, None])
    index = dst[:, None].expand_as(msg)
    if reduce == "max":
        out = torch.zeros(n, x.shape[1], dtype=x.dtype).scatter_reduce(0, index, msg, "amax", include_self=False)
        return out
    out = torch.zeros(n, x.shape[1], dtype=x.dtype).index_add_(0, dst, msg)
    if reduce == "mean":
        out = out / torch.bincount(dst, minlength=n).clamp(min=1).to(x.dtype)[:, None]
    return out


def _same(got, want, dtype):
    got = got.double()
    want = want.to(dtype).double()   # the oracle rounded as the result was
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (got, want)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


WIDTHS = (1, 2, 3, 4, 8, 16, 17)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_spmm_nonfinite_matches_pyg(backend, dtype, reduce):
    for seed, width in enumerate(WIDTHS):
        for weighted in (False, True):
            edge_index, n, x, weight = _case(seed, width, weighted)
            want = _oracle(edge_index, n, x.to(dtype).double(), None if weight is None else weight.to(dtype).double(),
                           reduce)
            graph = Graph.from_edge_index(edge_index, num_nodes=n)
            w = None if weight is None else weight.to(dtype)[graph.edge_perm]
            got = sg.spmm(graph, x.to(dtype), reduce=reduce, edge_weight=w, backend=backend)
            _same(got, want, dtype)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_cpu_candidate_agrees_on_nonfinite(dtype, reduce):
    """Each kernel the CPU tuner may pick (Numba: prepared runner and one-shot; torch CSR), and
    the max's arg-tracking pass used under autograd, give the same NaN / inf pattern."""
    for seed, width in enumerate(WIDTHS):
        for weighted in (False, True):
            edge_index, n, x, weight = _case(100 + seed, width, weighted)
            x = x.to(dtype)
            want = _oracle(edge_index, n, x.double(), None if weight is None else weight.double(), reduce)
            for transient in (False, True):
                graph = Graph.from_edge_index(edge_index, num_nodes=n)
                graph.transient = transient
                w = None if weight is None else weight.to(dtype)[graph.edge_perm]
                impls = _cpu._IMPLS if reduce == "sum" else _cpu._IMPLS[:2]
                for impl in impls:
                    _same(impl(graph, x, w, reduce), want, dtype)
                if reduce == "max":
                    out, arg = _cpu.max_with_arg(graph, x, w)
                    _same(out, want, dtype)
                    nan_out = torch.isnan(out)
                    assert bool((arg[nan_out] == graph.num_edges).all())   # no edge attains a NaN


def test_max_arg_matches_reference_on_nonfinite():
    """The backward's arg-max edges: the fused pass finds what the reference's search finds
    (first edge equal to the output; none for NaN; the first edge of a row of -inf)."""
    from sparsegnn.ops.reference import spmm_max_arg

    for seed, width in enumerate(WIDTHS):
        edge_index, n, x, _ = _case(200 + seed, width, False)
        x = x.float()
        graph = Graph.from_edge_index(edge_index, num_nodes=n)
        out, arg = _cpu.max_with_arg(graph, x, None)
        assert torch.equal(arg, spmm_max_arg(graph.row, graph.col, x, None, out))


def test_max_gradient_skips_nan_outputs():
    edge_index, n, x, _ = _case(7, 4, False)
    graph = Graph.from_edge_index(edge_index, num_nodes=n)
    grads = []
    for backend in ("cpu", "reference"):
        xs = x.float().clone().requires_grad_(True)
        sg.spmm(graph, xs, reduce="max", backend=backend).sum().backward()
        grads.append(xs.grad)
    torch.testing.assert_close(grads[0], grads[1], equal_nan=True)


@pytest.mark.skipif(not triton_available(), reason="Triton is not installed")
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_triton_nonfinite_matches_pyg(reduce):
    device = "cuda" if torch.cuda.is_available() else "cpu"   # the CPU runs Triton's interpreter
    for seed, width in enumerate((2, 17)):
        edge_index, n, x, _ = _case(300 + seed, width, False)
        x = x.float()
        graph = Graph.from_edge_index(edge_index, num_nodes=n).to(device)
        got = sg.spmm(graph, x.to(device), reduce=reduce, backend="triton").cpu()
        _same(got, _oracle(edge_index, n, x.double(), None, reduce), torch.float32)
