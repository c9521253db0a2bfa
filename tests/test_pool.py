"""global_pool: sum / mean / max per graph against a Python loop over the graphs, gradients, errors."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn.ops.pool import global_pool


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
    with pytest.raises(ValueError, match=r"global_pool\(\): backend"):
        global_pool(torch.randn(3, 2), torch.tensor([0, 3]), backend="triton")
