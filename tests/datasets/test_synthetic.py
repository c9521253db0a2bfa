import torch

from sparsegnn import Graph
from sparsegnn.datasets.synthetic import STAND_INS, SUITES, chung_lu, stand_in_graph
from sparsegnn.formats.plan import build_row_plan


def test_chung_lu_is_seeded_and_power_law():
    a = chung_lu(5000, 60_000, seed=3)
    assert a.shape == (2, 60_000) and a.dtype == torch.int64
    assert torch.equal(a, chung_lu(5000, 60_000, seed=3))
    assert not torch.equal(a, chung_lu(5000, 60_000, seed=4))
    deg = torch.bincount(a[1], minlength=5000).float()
    avg = 12.0
    assert deg.max() <= 50 * avg * 1.5          # head clipped near 50x the average
    assert deg.max() > 5 * avg                  # but heavy-tailed
    assert deg.median() < 0.6 * avg             # most nodes below the mean: skewed


def test_community_variant_keeps_edges_local():
    ei = chung_lu(8192, 50_000, seed=1, community_size=1024, community_fraction=0.8)
    local = ((ei[0] // 1024) == (ei[1] // 1024)).float().mean()
    assert 0.75 < float(local) < 0.9


def test_registry_and_cache(tmp_path, monkeypatch):
    assert STAND_INS["reddit"].num_edges == 114_615_891 and STAND_INS["ogbn-products"].num_nodes == 2_449_029
    assert set(SUITES["paper"]) >= {"cora", "amazon0505", "reddit", "flickr", "yelp"}
    monkeypatch.setenv("SPARSEGNN_CACHE", str(tmp_path))
    first = stand_in_graph("cora")
    assert (tmp_path / "graphs" / "cora-seed0.pt").exists()
    assert torch.equal(stand_in_graph("cora"), first)  # loaded from the cache
    assert first.shape == (2, STAND_INS["cora"].num_edges)


def test_plan_lists_short_rows_by_degree_bucket():
    ei = chung_lu(3000, 30_000, seed=2)
    g = Graph.from_edge_index(ei, num_nodes=3000)
    plan = build_row_plan(g.rowptr, g.col, 64)
    deg = g.in_degree()[plan.short_rows.long()]
    bucket = torch.floor(torch.log2(deg.double() + 1))
    assert bool((bucket[1:] >= bucket[:-1]).all())
    assert plan.bucket_ptr[-1] == plan.short_rows.numel()
    light = plan.num_short_below(7)
    assert int(deg[:light].max()) <= 7 and (light == deg.numel() or int(deg[light]) > 7)
    # the single-launch schedule walks them heaviest bucket first: the rows after the first
    # num_heavy entries are exactly the light ones
    desc = plan.short_desc
    assert sorted(desc.tolist()) == sorted(plan.short_rows.tolist())
    desc_bucket = torch.floor(torch.log2(g.in_degree()[desc.long()].double() + 1))
    assert bool((desc_bucket[1:] <= desc_bucket[:-1]).all())
    num_heavy = desc.numel() - light
    light_deg = g.in_degree()[desc[num_heavy:].long()]
    assert int(light_deg.max()) <= 7 and sorted(desc[num_heavy:].tolist()) == sorted(plan.short_rows[:light].tolist())
    assert num_heavy > 0 and int(g.in_degree()[desc[:num_heavy].long()].min()) > int(light_deg.max())
