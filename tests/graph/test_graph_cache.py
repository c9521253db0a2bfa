"""``GraphCache``: named slots, one invalidation rule (values slots follow the value tensor's
identity, version and stamp; structure slots live as long as the graph), sharing by
``with_values``, nothing kept on a volatile graph but what its owner supplies."""
import pytest
import torch

from sparsegnn import Graph
from sparsegnn.graph_cache import SLOTS, GraphCache


def _graph(**kw):
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    return Graph.from_edge_index(edge_index, torch.rand(4), **kw)


def test_unknown_slots_are_refused():
    cache = GraphCache()
    with pytest.raises(ValueError, match="unknown slot 'plans'"):
        cache.get("plans")
    with pytest.raises(ValueError, match="unknown slot"):
        cache.put(("derived", "x"), 1)


def test_structure_slots_build_once_and_values_slots_follow_the_values():
    cache, builds = GraphCache(), []
    build = lambda: builds.append(1) or len(builds)  # noqa: E731
    assert cache.get("row_plan", 64, build) == 1 and cache.get("row_plan", 64, build) == 1
    assert cache.get("row_plan", 128, build) == 2                     # another key, another entry
    values = torch.ones(3)
    assert SLOTS["cpu_csr"][0] and not SLOTS["row_plan"][0]
    assert cache.get("cpu_csr", "k", build, values=values) == 3
    assert cache.get("cpu_csr", "k", build, values=values) == 3       # same tensor, same version
    values.add_(1)                                                    # in place: the version moves
    assert cache.get("cpu_csr", "k", build, values=values) == 4
    assert cache.get("cpu_csr", "k", build, values=values.clone()) == 5   # another tensor
    assert cache.get("cpu_csr", "k", build, values=None) == 6
    assert cache.get("cpu_csr", "k", build, values=None, stamp=1) == 7    # another stamp
    assert cache.get("cpu_csr", "k", build, values=None, stamp=1) == 7
    assert sum(1 for slot, _ in cache if slot == "cpu_csr") == 1     # rebuilt in place, never piled up
    assert cache.get("cpu_csr", "other") is None                      # absent, nothing to build


def test_with_values_shares_the_structure_and_drops_the_values_forms():
    g = _graph()
    plan = g.row_plan(2)
    g.cache.put("spmm_run", "bound", "k", values=g.edge_val)
    transposed = g.t()
    h = g.with_values(torch.rand(4))
    assert h.row_plan(2) is plan                                      # the structure's plan is shared
    assert "spmm_run" not in {slot for slot, _ in h.cache} and "t" not in h.cache
    assert h.t() is not transposed and torch.equal(h.t().edge_val, h.edge_val[g.transpose_parts()[2]])


def test_transpose_follows_in_place_updates_of_the_values_and_keeps_its_plans():
    g = _graph()
    first = g.t()
    plan = first.row_plan(2)
    assert g.t() is first
    g.edge_val.mul_(2)
    second = g.t()
    assert second is not first and second.row_plan(2) is plan        # same structure: its plan kept
    assert torch.equal(second.edge_val, g.edge_val[g.transpose_parts()[2]])


def test_to_starts_empty():
    g = _graph()
    g.row_plan(2)
    assert ("row_plan", 2) in g.cache and len(g.to("cpu").cache) == 0


def test_a_volatile_graph_keeps_only_its_owners_forms():
    g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), None, 2, volatile=True)
    g.row_plan(1)
    g.cache.put("plan", "p")
    assert len(g.cache) == 0
    g.set_derived("in_degree", torch.tensor([1, 1]))
    g.set_batch_stats(2)
    assert {slot for slot, _ in g.cache} == {"in_degree", "batch_stats"}


def test_an_owner_supplied_transpose_is_kept_across_refills_of_a_volatile_graph():
    g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.ones(2), 2, volatile=True)
    transposed = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.ones(2), 2, volatile=True)
    g.set_derived("t", transposed)
    g.edge_val.mul_(3)                            # the owner refills values in place between calls
    transposed.edge_val.mul_(3)
    assert g.t() is transposed and g.t() is transposed
