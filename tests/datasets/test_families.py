"""Structure families for the cost model's data: each family's shape, its defining statistics,
the two orders (a relabelling of one graph, with and without locality) and the held-out folds."""
import pytest
import torch

from sparsegnn.datasets.families import FAMILIES, family_graph, leave_out_folds

pytest.importorskip("scipy")


def _degrees(fg):
    return torch.bincount(fg.edge_index[1], minlength=fg.num_nodes)


def _spread(fg):
    """Mean |source - target| of the numbering, relative to the node count."""
    ei = fg.edge_index
    return float((ei[0] - ei[1]).abs().double().mean()) / max(fg.num_nodes, 1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("order", ["locality", "random"])
def test_family_graphs_are_valid_and_near_their_size(family, order):
    fg = family_graph(family, 20_000, seed=1, order=order)
    ei = fg.edge_index
    assert ei.dtype == torch.int64 and ei.dim() == 2 and ei.shape[0] == 2
    assert 0.6 * 20_000 <= ei.shape[1] <= 1.4 * 20_000, ei.shape
    assert int(ei[0].min()) >= 0 and int(ei[0].max()) < fg.num_src
    assert int(ei[1].min()) >= 0 and int(ei[1].max()) < fg.num_nodes
    assert (fg.num_src != fg.num_nodes) == (family == "bipartite")
    assert fg.family == family and fg.order == order
    if fg.ptr is not None:                       # molecules in order: edges stay inside their graph
        graph_of = torch.bucketize(ei, fg.ptr[1:], right=True)
        assert torch.equal(graph_of[0], graph_of[1]) and int(fg.ptr[-1]) == fg.num_nodes


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_random_order_relabels_the_same_graph_and_loses_locality(family):
    local = family_graph(family, 20_000, seed=2, order="locality")
    shuffled = family_graph(family, 20_000, seed=2, order="random")
    assert local.edge_index.shape == shuffled.edge_index.shape
    assert torch.equal(torch.sort(_degrees(local)).values, torch.sort(_degrees(shuffled)).values)
    if family != "bipartite":                    # one side of a bipartite graph has its own ids
        assert _spread(local) < 0.6 * _spread(shuffled), (_spread(local), _spread(shuffled))


def test_families_differ_where_they_should():
    hubs = {f: float(_degrees(family_graph(f, 50_000, seed=3)).max()) / (50_000 / family_graph(f, 50_000, seed=3).num_nodes)
            for f in ("powerlaw-2.1", "powerlaw-3.0", "mesh", "road")}
    assert hubs["powerlaw-2.1"] > 5 * hubs["powerlaw-3.0"]
    assert hubs["mesh"] <= 1.2 and hubs["road"] < 3.5          # lattice degrees stay near the mean
    dense, community = family_graph("dense", 200_000, seed=3), family_graph("community", 200_000, seed=3)
    assert dense.edge_index.shape[1] / dense.num_nodes > 3 * community.edge_index.shape[1] / community.num_nodes
    road, mesh = family_graph("road", 50_000, seed=3), family_graph("mesh", 50_000, seed=3)
    assert road.edge_index.shape[1] / road.num_nodes < mesh.edge_index.shape[1] / mesh.num_nodes


def test_family_graph_rejects_bad_arguments():
    with pytest.raises(ValueError, match="family_graph\\(\\): family"):
        family_graph("tree", 100)
    with pytest.raises(ValueError, match="family_graph\\(\\): order"):
        family_graph("mesh", 100, order="sorted")
    with pytest.raises(ValueError, match="family_graph\\(\\): num_edges"):
        family_graph("mesh", 0)


@pytest.mark.parametrize("by", ["graph", "family"])
def test_leave_out_folds_hold_out_each_group_once(by):
    cases = [("mesh", "m1"), ("mesh", "m1"), ("mesh", "m2"), ("road", "r1"), ("powerlaw-2.1", "p1")]
    folds = leave_out_folds(cases, by=by)
    held = [i for _, out in folds for i in out]
    assert sorted(held) == list(range(len(cases)))
    for train, out in folds:
        assert set(train).isdisjoint(out) and len(train) + len(out) == len(cases)
        key = 1 if by == "graph" else 0
        assert len({cases[i][key] for i in out}) == 1
        assert all(cases[i][key] != cases[out[0]][key] for i in train)
    assert len(folds) == (4 if by == "graph" else 3)
    with pytest.raises(ValueError, match="leave_out_folds"):
        leave_out_folds(cases, by="node")
