"""The CSR build of small graphs on the host (``coo_to_csr`` in NumPy): the same CSR and
permutation as a stable sort of every edge by (target, source), whichever sort it takes."""
import pytest
import torch

from sparsegnn.datasets import random_graph
from sparsegnn.formats import csr as csr_fmt


def _oracle(target: torch.Tensor, source: torch.Tensor, num_nodes: int):
    """rowptr, col, perm from Python's stable sort of ``(target, source, position)``."""
    order = sorted(range(target.numel()), key=lambda e: (int(target[e]), int(source[e])))
    counts = [0] * (num_nodes + 1)
    for e in range(target.numel()):
        counts[int(target[e]) + 1] += 1
    for i in range(num_nodes):
        counts[i + 1] += counts[i]
    return torch.tensor(counts), source[order].long(), torch.tensor(order, dtype=torch.int64)


def _edges(order: str):
    ei, _ = random_graph(60, 500, seed=11, num_isolated=3, num_empty_rows=6, num_self_loops=4, num_duplicates=40)
    ei = torch.cat([ei, ei[:, :30]], 1)                                   # duplicates in input order
    if order == "sorted":                                                  # keys in order: the merge sort
        ei = ei[:, torch.argsort(ei[1] * 60 + ei[0], stable=True)]
    elif order == "nearly":                                                # one descent in ~100
        ei = ei[:, torch.argsort(ei[1] * 60 + ei[0], stable=True)]
        ei[:, 100:102] = ei[:, [101, 100]]
    elif order == "by-source":                                             # PyG's coalesced order
        ei = ei[:, torch.argsort(ei[0] * 60 + ei[1], stable=True)]
    return ei


@pytest.mark.parametrize("order", ["random", "sorted", "nearly", "by-source"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_host_build_is_the_stable_sort(order, dtype):
    ei = _edges(order).to(dtype)
    got = csr_fmt.coo_to_csr(ei[1], ei[0], 60)
    want = _oracle(ei[1], ei[0], 60)
    assert [t.dtype for t in got] == [torch.int64] * 3
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_host_build_of_wide_ids_and_a_bipartite_graph():
    """Ids above 2^16 (no radix passes) and more source columns than target rows."""
    gen = torch.Generator().manual_seed(4)
    target = torch.randint(0, 70_000, (3000,), generator=gen)
    source = torch.randint(0, 90_000, (3000,), generator=gen)
    for a, b in zip(csr_fmt.coo_to_csr(target, source, 70_000, num_cols=90_000), _oracle(target, source, 70_000)):
        assert torch.equal(a, b)
    target = torch.randint(0, 40, (800,), generator=gen)
    source = torch.randint(0, 300, (800,), generator=gen)
    for a, b in zip(csr_fmt.coo_to_csr(target, source, 40, num_cols=300), _oracle(target, source, 40)):
        assert torch.equal(a, b)


def test_host_build_leaves_a_target_out_of_range_to_the_general_path(monkeypatch):
    """A target id >= num_nodes: the result is the general path's (NumPy's row counts would
    have a row too many)."""
    ei = _edges("random")
    ei[1, 7] = 60
    got = csr_fmt.coo_to_csr(ei[1], ei[0], 60)
    monkeypatch.setattr(csr_fmt, "NUMPY_SORT_MAX_EDGES", 0)
    want = csr_fmt.coo_to_csr(ei[1], ei[0], 60)
    assert got[0].numel() == 61
    for a, b in zip(got, want):
        assert torch.equal(a, b)
