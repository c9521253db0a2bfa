"""Shared fixtures: seeded random graphs with every awkward case, and dense float64 oracles.

Without a GPU, Triton kernels run in the CPU interpreter; TRITON_INTERPRET must be set
before any kernel module is imported, hence here.
"""
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Under pytest-xdist each worker's torch (and our Numba kernels, which follow torch's count)
# would run a thread per core: two workers on CI's two cores ran four, and the spinning
# OpenMP threads cost the Cora accuracy tests 146 s instead of 92.  A worker gets
# its share of the cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))
# Tuning decisions persist on disk: keep the suite's away from the user's cache.
if "SPARSEGNN_TUNE_CACHE" not in os.environ:
    import tempfile

    os.environ["SPARSEGNN_TUNE_CACHE"] = tempfile.mkdtemp(prefix="sparsegnn-tune-")
# Most tests check the planned and tuned kernels, so every graph is invested in on its first
# call; the amortisation rule (tune/reuse.py) and the first-contact kernels are tested with
# SPARSEGNN_INVEST=auto set by their own tests (tests/ops/test_first_contact.py).
os.environ.setdefault("SPARSEGNN_INVEST", "always")
# Nor Triton's stored key (kernels/_prewarm.py): its tests start it themselves, in a temp root.
os.environ.setdefault("SPARSEGNN_PREWARM", "0")

import pytest  # noqa: E402

from sparsegnn.datasets import random_graph  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = Path(__file__).resolve().parents[1]


def dense_adjacency(edge_index, num_nodes, weight=None, dtype=torch.float64):
    """A[i, j] = sum of weights of edges j -> i, built from the raw edge list."""
    a = torch.zeros(num_nodes, num_nodes, dtype=dtype)
    w = torch.ones(edge_index.shape[1], dtype=dtype) if weight is None else weight.to(dtype).cpu()
    for e in range(edge_index.shape[1]):
        a[int(edge_index[1, e]), int(edge_index[0, e])] += w[e]
    return a


@pytest.fixture
def fresh_store(tmp_path, monkeypatch):
    """Decision stores on a fresh cache directory (returned), no test timer left behind."""
    from sparsegnn.tune import set_timer
    from sparsegnn.tune.store import reset_stores

    monkeypatch.setenv("SPARSEGNN_TUNE_CACHE", str(tmp_path))
    reset_stores()
    yield tmp_path
    set_timer(None)
    reset_stores()


# (name, num_nodes, edge_index, weight): each graph mixes the cases the issue names.
def _cases():
    cases = []
    ei, w = random_graph(40, 160, seed=1, num_isolated=3, num_empty_rows=4, num_self_loops=5,
                         num_duplicates=6, weighted=True)
    cases.append(("mixed", 40, ei, w))
    ei, w = random_graph(25, 300, seed=2, num_self_loops=3, num_duplicates=10, weighted=True)
    cases.append(("dense-rows", 25, ei, w))
    cases.append(("single-node", 1, torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0)))
    cases.append(("single-node-loop", 1, torch.zeros(2, 2, dtype=torch.int64), torch.tensor([0.7, 1.3])))
    cases.append(("no-edges", 6, torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0)))
    return cases


GRAPH_CASES = _cases()


@pytest.fixture(params=GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def graph_case(request):
    return request.param


# ------------------------------------------------------------ torch.compile against eager
def compile_case(n=30):
    """``(graph, x)``: a small weighted graph with every awkward case and [n, 8] features."""
    from sparsegnn import Graph

    ei, w = random_graph(n, 120, seed=21, num_isolated=2, num_empty_rows=3, num_self_loops=3,
                         num_duplicates=4, weighted=True)
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(5))
    return Graph.from_edge_index(ei, w, num_nodes=n), x


def output_and_grads(model, x, graph, run=None):
    """Forward output of ``run`` (default: ``model``) and the gradient of every parameter of
    ``model`` (a loss that weighs each output differently)."""
    model.zero_grad(set_to_none=True)
    out = (model if run is None else run)(x, graph)
    (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_compiled_step_matches_eager(model, x, graph):
    """``torch.compile(model, fullgraph=True, backend="aot_eager")`` gives eager's output and
    the gradient of every parameter (after ``sparsegnn.nn.prepare``)."""
    from sparsegnn import nn as sgnn

    sgnn.prepare(model, x, graph)
    out_eager, grads_eager = output_and_grads(model, x, graph)
    out, grads = output_and_grads(model, x, graph, torch.compile(model, fullgraph=True, backend="aot_eager"))
    torch.testing.assert_close(out, out_eager, rtol=1e-5, atol=1e-6)
    assert grads.keys() == grads_eager.keys() and len(grads) == len(list(model.parameters()))
    for key in grads:
        torch.testing.assert_close(grads[key], grads_eager[key], rtol=1e-5, atol=1e-6, msg=key)


def empty_graph():
    """A 4-node graph with no edges (float64 edge values): the empty case of the op checks."""
    from sparsegnn import Graph

    return Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0, dtype=torch.float64),
                                 num_nodes=4)


def rand_input(*shape, seed=0, grad=True, dtype=torch.float64):
    """A seeded normal tensor (a leaf that requires grad unless ``grad=False``)."""
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return t.requires_grad_(grad)
