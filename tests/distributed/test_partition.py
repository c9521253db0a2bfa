"""Graph partitioning for multi-GPU training: ``sparsegnn.distributed.partition``.

Expected values come from plain Python over the raw edge lists (sets, sorted tuples), not from
the vectorised construction under test.
"""
import importlib.util
import json
import sys
from collections import Counter

import pytest
import torch

import sparsegnn
from sparsegnn import Graph
from sparsegnn.datasets import random_graph
from sparsegnn.datasets.synthetic import chung_lu, grid_graph
from sparsegnn.distributed import (build_parts, load_part, partition_graph, partition_nodes, partition_stats,
                                   save_parts)

HAVE_METIS = importlib.util.find_spec("pymetis") is not None
needs_metis = pytest.mark.skipif(not HAVE_METIS, reason="pymetis is not installed (pip install pymetis)")


def _graphs():
    """(name, N, edge_index, weight or None): self loops, duplicates, isolated nodes, empty rows."""
    out = []
    ei, w = random_graph(40, 160, seed=1, num_isolated=3, num_empty_rows=4, num_self_loops=5,
                         num_duplicates=6, weighted=True)
    out.append(("mixed-weighted", 40, ei, w))
    ei, _ = random_graph(57, 230, seed=2, num_isolated=5, num_empty_rows=2, num_self_loops=4, num_duplicates=9)
    out.append(("mixed-unweighted", 57, ei, None))
    ei, w = random_graph(12, 90, seed=3, num_self_loops=3, num_duplicates=10, weighted=True)
    out.append(("dense", 12, ei, w))
    out.append(("no-edges", 6, torch.zeros(2, 0, dtype=torch.int64), None))
    return out


GRAPHS = _graphs()
METHODS = ["contiguous", pytest.param("metis", marks=needs_metis), "random-owner"]


def _owner(graph, num_parts, method):
    if method == "random-owner":      # build_parts on an arbitrary assignment, not a partitioner's
        gen = torch.Generator().manual_seed(num_parts)
        return torch.randint(0, num_parts, (graph.num_nodes,), generator=gen)
    return partition_nodes(graph, num_parts, method)


def _edge_multiset(src, dst, val):
    vals = [None] * len(src) if val is None else val.tolist()
    return Counter(zip(src.tolist(), dst.tolist(), vals))


def _check_parts(parts, edge_index, weight, owner, num_nodes, num_parts):
    """Every property of a partition, against plain Python over the raw edge list."""
    owner_list = owner.tolist()
    src_list, dst_list = edge_index[0].tolist(), edge_index[1].tolist()
    assert len(parts) == num_parts and [p.rank for p in parts] == list(range(num_parts))
    # every node owned exactly once, by the rank of `owner`, ascending
    for p in parts:
        assert p.num_parts == num_parts
        assert p.nodes.dtype == torch.int64 and p.halo.dtype == torch.int64 and p.send_idx.dtype == torch.int64
        assert p.nodes.tolist() == [i for i in range(num_nodes) if owner_list[i] == p.rank]
    assert sorted(torch.cat([p.nodes for p in parts]).tolist()) == list(range(num_nodes))
    # halo = the remote sources of the rank's edges, grouped by owner, then id
    for p in parts:
        remote = {s for s, d in zip(src_list, dst_list) if owner_list[d] == p.rank and owner_list[s] != p.rank}
        assert p.halo.tolist() == sorted(remote, key=lambda j: (owner_list[j], j))
        per_owner = [sum(1 for j in remote if owner_list[j] == q) for q in range(num_parts)]
        assert p.halo_ptr.tolist() == [sum(per_owner[:q]) for q in range(num_parts + 1)]
        assert int(p.halo_ptr[p.rank + 1] - p.halo_ptr[p.rank]) == 0
    # send / receive: what q sends to r is exactly r's halo range for q, in order
    for q in parts:
        assert q.send_ptr.numel() == num_parts + 1 and int(q.send_ptr[-1]) == q.send_idx.numel()
        for r in parts:
            sent = q.nodes[q.send_idx[q.send_ptr[r.rank]:q.send_ptr[r.rank + 1]]]
            assert sent.tolist() == r.halo[r.halo_ptr[q.rank]:r.halo_ptr[q.rank + 1]].tolist()
    # local edges, mapped back to global ids, are the global edge multiset with the same values
    got = Counter()
    for p in parts:
        g, n = p.graph, p.num_nodes
        assert (g.num_nodes, g.num_src) == (n, n + p.num_halo)
        Graph.from_csr(g.rowptr, g.col, g.edge_val, n, num_src=g.num_src)   # valid CSR (raises otherwise)
        assert (g.edge_val is None) == (weight is None)
        columns = torch.cat([p.nodes, p.halo])
        got += _edge_multiset(columns[g.col], p.nodes[g.row], g.edge_val)
        assert p.num_inner_edges == sum(1 for d, s in zip(p.nodes[g.row].tolist(), columns[g.col].tolist())
                                        if owner_list[s] == p.rank)
    assert got == _edge_multiset(edge_index[0], edge_index[1], weight)


def _check_split(part):
    """inner_graph / halo_graph split the local edges at column n."""
    n, h = part.num_nodes, part.num_halo
    inner, halo = part.inner_graph(), part.halo_graph()
    assert inner is part.inner_graph() and halo is part.halo_graph()          # cached
    assert inner.shape == (n, n) and halo.shape == (n, h)
    assert inner.num_edges == part.num_inner_edges
    assert inner.num_edges + halo.num_edges == part.graph.num_edges
    dense = part.graph.to_dense(torch.float64)
    assert torch.equal(inner.to_dense(torch.float64), dense[:, :n])
    assert torch.equal(halo.to_dense(torch.float64), dense[:, n:])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("num_parts", [1, 2, 3, 4])
@pytest.mark.parametrize("case", GRAPHS, ids=[c[0] for c in GRAPHS])
def test_parts_cover_the_graph(case, num_parts, method):
    name, num_nodes, edge_index, weight = case
    graph = Graph.from_edge_index(edge_index, weight, num_nodes)
    owner = _owner(graph, num_parts, method)
    assert owner.shape == (num_nodes,) and owner.dtype == torch.int64
    assert int(owner.min()) >= 0 and int(owner.max()) < num_parts
    parts = build_parts(graph, owner, num_parts=num_parts)
    _check_parts(parts, edge_index, weight, owner, num_nodes, num_parts)
    x = torch.randn(num_nodes, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    expected = sparsegnn.spmm(graph, x, backend="reference")
    for part in parts:
        _check_split(part)
        local = torch.cat([x[part.nodes], x[part.halo]])
        out = sparsegnn.spmm(part.graph, local, backend="reference")
        torch.testing.assert_close(out, expected[part.nodes], rtol=1e-12, atol=1e-12)
        split = (sparsegnn.spmm(part.inner_graph(), x[part.nodes], backend="reference")
                 + sparsegnn.spmm(part.halo_graph(), x[part.halo], backend="reference"))
        torch.testing.assert_close(split, expected[part.nodes], rtol=1e-12, atol=1e-12)
    if method != "random-owner":
        again = partition_graph(graph, num_parts, method)
        assert all(torch.equal(a.nodes, b.nodes) for a, b in zip(parts, again))   # deterministic
        assert all(p.method == method for p in again)


def test_stats_on_a_hand_made_partition():
    # 0 -> 1, 1 -> 2, 2 -> 3, 3 -> 0, 0 -> 2 (twice), 1 -> 1; owners {0, 1} and {2, 3}
    edge_index = torch.tensor([[0, 1, 2, 3, 0, 0, 1], [1, 2, 3, 0, 2, 2, 1]])
    graph = Graph.from_edge_index(edge_index, num_nodes=4)
    parts = build_parts(graph, torch.tensor([0, 0, 1, 1]))
    assert parts[0].halo.tolist() == [3] and parts[1].halo.tolist() == [0, 1]
    assert parts[0].send_idx.tolist() == [0, 1] and parts[1].send_idx.tolist() == [1]
    stats = partition_stats(parts)
    # cut: 1 -> 2, 3 -> 0, 0 -> 2, 0 -> 2 = 4 of 7; rank 0 keeps 3 edges (targets 0, 1), rank 1 four
    assert (stats["cut_edges"], stats["num_edges"], stats["num_nodes"]) == (4, 7, 4)
    assert stats["cut_fraction"] == pytest.approx(4 / 7)
    assert stats["edges"] == [3, 4] and stats["inner_edges"] == [2, 1]
    assert stats["halo_sizes"] == [1, 2] and stats["halo_nodes"] == 3 and stats["send_sizes"] == [2, 1]
    assert stats["edge_imbalance"] == pytest.approx(4 / 3.5)
    assert stats["node_imbalance"] == pytest.approx(1.0)
    assert stats["replication"] == pytest.approx(7 / 4)


def test_rank_without_nodes():
    ei, w = random_graph(20, 60, seed=4, weighted=True)
    graph = Graph.from_edge_index(ei, w, 20)
    owner = torch.randint(0, 2, (20,), generator=torch.Generator().manual_seed(0)) * 2   # ranks 0 and 2
    parts = build_parts(graph, owner, num_parts=3)
    assert parts[1].num_nodes == 0 and parts[1].graph.num_edges == 0 and parts[1].num_halo == 0
    _check_parts(parts, ei, w, owner, 20, 3)


# ---------------------------------------------------------------- partitioners
def _power_law_graph():
    return Graph.from_edge_index(chung_lu(20_000, 200_000, seed=3), num_nodes=20_000)


@pytest.mark.parametrize("num_parts", [2, 4, 8])
def test_contiguous_balances_edges_on_a_power_law_graph(num_parts):
    graph = _power_law_graph()
    owner = partition_nodes(graph, num_parts, "contiguous")
    assert bool((owner[1:] >= owner[:-1]).all())                      # contiguous ranges
    weight = (graph.in_degree() + 1).tolist()
    per_part = [0] * num_parts
    for i, r in enumerate(owner.tolist()):
        per_part[r] += weight[i]
    assert max(per_part) <= sum(weight) / num_parts + max(weight)    # the cut rule's guarantee
    stats = partition_stats(build_parts(graph, owner))
    assert stats["edge_imbalance"] <= 1.02, stats["edges"]


def test_contiguous_keeps_every_range_non_empty():
    # a hub with far more than W / P in-edges: ranges after it would be empty without the fix-up
    for hub in (0, 5, 9):
        edge_index = torch.tensor([[i for i in range(10) if i != hub] * 50, [hub] * 450])
        graph = Graph.from_edge_index(edge_index, num_nodes=10)
        for p in range(1, 11):
            owner = partition_nodes(graph, p, "contiguous")
            assert torch.bincount(owner, minlength=p).min() >= 1, (hub, p, owner)
            assert bool((owner[1:] - owner[:-1]).le(1).all() and (owner[1:] >= owner[:-1]).all())


@needs_metis
def test_metis_cuts_fewer_edges_than_contiguous_on_a_shuffled_mesh():
    edge_index = grid_graph(4_096, seed=0, shuffle=True)
    graph = Graph.from_edge_index(edge_index, num_nodes=4_096)
    metis = partition_stats(partition_graph(graph, 4, "metis"))
    contiguous = partition_stats(partition_graph(graph, 4, "contiguous"))
    assert metis["cut_fraction"] < 0.1 < 0.5 < contiguous["cut_fraction"]
    assert metis["edge_imbalance"] <= 1.1


@needs_metis
def test_metis_balances_a_power_law_graph():
    stats = partition_stats(partition_graph(_power_law_graph(), 4, "metis"))
    assert stats["edge_imbalance"] <= 1.1, stats["edges"]
    assert min(stats["nodes"]) > 0


def test_auto_without_pymetis_is_contiguous(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)     # `import pymetis` raises ImportError
    ei, _ = random_graph(30, 100, seed=5)
    graph = Graph.from_edge_index(ei, num_nodes=30)
    assert torch.equal(partition_nodes(graph, 3, "auto"), partition_nodes(graph, 3, "contiguous"))
    assert partition_graph(graph, 3)[0].method == "contiguous"
    with pytest.raises(ValueError, match=r"partition_nodes\(\): method='metis' needs pymetis"):
        partition_nodes(graph, 3, "metis")


# ---------------------------------------------------------------- storage
@pytest.mark.parametrize("weighted", [True, False])
def test_save_and_load_round_trip(tmp_path, weighted):
    ei, w = random_graph(50, 200, seed=6, num_isolated=2, num_self_loops=3, num_duplicates=4, weighted=weighted)
    graph = Graph.from_edge_index(ei, w, 50)
    parts = partition_graph(graph, 3, "contiguous")
    gen = torch.Generator().manual_seed(1)
    tensors = {"x": torch.randn(50, 4, generator=gen), "y": torch.randint(0, 5, (50,), generator=gen),
               "train_mask": torch.rand(50, generator=gen) < 0.5}
    save_parts(parts, tmp_path / "parts", tensors)
    meta = json.loads((tmp_path / "parts" / "meta.json").read_text())
    stats = partition_stats(parts)
    assert (meta["num_parts"], meta["num_nodes"], meta["num_edges"]) == (3, 50, graph.num_edges)
    assert meta["method"] == "contiguous" and meta["cut_edges"] == stats["cut_edges"]
    assert [m["nodes"] for m in meta["parts"]] == stats["nodes"]
    assert [m["edges"] for m in meta["parts"]] == stats["edges"]
    assert meta["tensors"]["x"] == {"shape": [50, 4], "dtype": "float32"}

    for part in parts:
        # a rank's file holds plain tensors (weights_only loads it) and only its own rows
        raw = torch.load(tmp_path / "parts" / f"part_{part.rank}.pt", weights_only=True)
        assert {k: v.shape[0] for k, v in raw["tensors"].items()} == {k: part.num_nodes for k in tensors}
        loaded, local = load_part(tmp_path / "parts", part.rank)
        for name in ("nodes", "halo", "halo_ptr", "send_idx", "send_ptr"):
            assert torch.equal(getattr(loaded, name), getattr(part, name)), name
        assert (loaded.rank, loaded.num_parts, loaded.num_inner_edges, loaded.method) == \
               (part.rank, 3, part.num_inner_edges, "contiguous")
        assert loaded.graph.shape == part.graph.shape
        assert torch.equal(loaded.graph.rowptr, part.graph.rowptr) and torch.equal(loaded.graph.col, part.graph.col)
        assert (loaded.graph.edge_val is None) == (not weighted)
        if weighted:
            assert torch.equal(loaded.graph.edge_val, part.graph.edge_val)
        for name, t in tensors.items():
            assert torch.equal(local[name], t[part.nodes]), name
        assert loaded.halo_graph().num_edges == part.halo_graph().num_edges


def test_load_part_reads_only_its_own_file(tmp_path):
    ei, _ = random_graph(30, 90, seed=8)
    parts = partition_graph(Graph.from_edge_index(ei, num_nodes=30), 2, "contiguous")
    save_parts(parts, tmp_path, {"y": torch.arange(30)})
    (tmp_path / "part_0.pt").unlink()
    part, tensors = load_part(tmp_path, 1)
    assert torch.equal(tensors["y"], parts[1].nodes)
    assert torch.equal(part.nodes, parts[1].nodes)


# ---------------------------------------------------------------- errors
def test_errors(tmp_path):
    ei, _ = random_graph(10, 30, seed=9)
    graph = Graph.from_edge_index(ei, num_nodes=10)
    with pytest.raises(ValueError, match=r"partition_nodes\(\): num_parts must be >= 1, got 0"):
        partition_nodes(graph, 0)
    with pytest.raises(ValueError, match=r"partition_nodes\(\): num_parts=11 exceeds the graph's 10 nodes"):
        partition_nodes(graph, 11)
    with pytest.raises(ValueError, match=r"partition_nodes\(\): num_parts must be an int"):
        partition_nodes(graph, 2.0)
    with pytest.raises(ValueError, match=r"partition_nodes\(\): method must be one of .*'spectral'"):
        partition_nodes(graph, 2, "spectral")
    bipartite = Graph.from_edge_index(torch.tensor([[0, 1], [0, 2]]), num_nodes=3, num_src=2)
    with pytest.raises(ValueError, match=r"partition_nodes\(\): needs a square graph"):
        partition_nodes(bipartite, 2)
    with pytest.raises(ValueError, match=r"partition_nodes\(\): method must be one of"):
        partition_graph(graph, 2, "spectral")
    with pytest.raises(ValueError, match=r"build_parts\(\): owner must have shape \[10\]"):
        build_parts(graph, torch.zeros(9, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"build_parts\(\): owner contains index 3, out of range"):
        build_parts(graph, torch.full((10,), 3), num_parts=2)
    with pytest.raises(ValueError, match=r"build_parts\(\): owner contains a negative index"):
        build_parts(graph, torch.full((10,), -1))
    with pytest.raises(ValueError, match=r"build_parts\(\): needs a square graph"):
        build_parts(bipartite, torch.zeros(3, dtype=torch.int64))
    parts = partition_graph(graph, 2, "contiguous")
    with pytest.raises(ValueError, match=r"save_parts\(\): tensors\['x'\] must have one row per node \(10\)"):
        save_parts(parts, tmp_path, {"x": torch.zeros(9, 2)})
    with pytest.raises(ValueError, match=r"save_parts\(\): need all 2 parts in rank order"):
        save_parts(parts[1:], tmp_path)
    with pytest.raises(ValueError, match=r"load_part\(\): .*meta.json' not found"):
        load_part(tmp_path / "missing", 0)
    save_parts(parts, tmp_path)
    with pytest.raises(ValueError, match=r"load_part\(\): rank must be in \[0, 2\), got 2"):
        load_part(tmp_path, 2)
