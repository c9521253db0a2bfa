import pickle
from pathlib import Path

import pytest
import torch

import sparsegnn as sg
from sparsegnn.datasets import load, load_tu, random_graph
from sparsegnn.datasets.planetoid import _unpickle

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/datasets not beside the checkout")


def test_bundled_cora():
    data = load("cora")
    assert data.x.shape == (2708, 1433) and data.graph.num_edges == 10556 and data.num_classes == 7
    assert int(data.train_mask.sum()) == 140 and int(data.val_mask.sum()) == 500 and int(data.test_mask.sum()) == 1000
    assert not bool((data.train_mask & data.val_mask).any() or (data.val_mask & data.test_mask).any())
    assert torch.bincount(data.y[data.train_mask]).tolist() == [20] * 7
    assert torch.allclose(data.x.sum(1)[data.x.sum(1) > 0], torch.ones(1))  # row-normalised
    dense = data.graph.to_dense()
    assert torch.equal(dense, dense.T) and float(dense.diagonal().sum()) == 0  # undirected, no loops


@needs_shared
def test_raw_planetoid_matches_bundled_and_reads_citeseer():
    raw = load("cora", root=str(SHARED / "planetoid"))
    bundled = load("cora")
    assert torch.equal(raw.x, bundled.x) and torch.equal(raw.y, bundled.y)
    assert torch.equal(raw.graph.to_dense(), bundled.graph.to_dense())
    citeseer = load("citeseer", root=str(SHARED / "planetoid"))
    assert citeseer.x.shape == (3327, 3703) and citeseer.num_classes == 6
    assert int(citeseer.test_mask.sum()) == 1000 and int(citeseer.train_mask.sum()) == 120


def test_unpickler_refuses_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "ind.cora.x"
    path.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ValueError, match="refusing to unpickle builtins.print"):
        _unpickle(path)


def test_load_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown dataset"):
        load("reddit")
    monkeypatch.setenv("SPARSEGNN_DATA", str(tmp_path))          # a data folder without planetoid/
    with pytest.raises(ValueError, match="not bundled"):
        load("citeseer")
    with pytest.raises(ValueError, match="missing file"):
        load("citeseer", root=str(tmp_path))


@needs_shared
def test_load_tu_proteins():
    graphs = load_tu(SHARED / "tu" / "PROTEINS_full.zip")
    assert len(graphs) == 1113
    assert sum(g.graph.num_nodes for g in graphs) == 43471
    assert sum(g.graph.num_edges for g in graphs) == 162088
    assert {g.y for g in graphs} == {0, 1}
    assert all(g.x.shape[0] == g.graph.num_nodes for g in graphs)
    assert graphs[0].x.shape[1] == 29 + 3  # 29 attributes + one-hot of 3 node labels
    batch = sg.Graph.batch([g.graph for g in graphs[:10]])
    assert batch.num_nodes == sum(g.graph.num_nodes for g in graphs[:10])


def test_load_tu_from_directory(tmp_path):
    root = tmp_path / "TOY"
    root.mkdir()
    (root / "TOY_A.txt").write_text("1, 2\n2, 1\n3, 4\n4, 3\n4, 5\n5, 4\n")
    (root / "TOY_graph_indicator.txt").write_text("1\n1\n2\n2\n2\n")
    (root / "TOY_graph_labels.txt").write_text("1\n-1\n")
    graphs = load_tu(root)
    assert [g.graph.num_nodes for g in graphs] == [2, 3]
    assert [g.graph.num_edges for g in graphs] == [2, 4]
    assert [g.y for g in graphs] == [2, 0]
    assert graphs[1].graph.edge_index().max() == 2  # local node ids
    with pytest.raises(ValueError, match="does not exist"):
        load_tu(tmp_path / "missing.zip")


def test_random_graph_plants_cases():
    ei, w = random_graph(50, 200, seed=3, num_isolated=4, num_empty_rows=5, num_self_loops=6,
                         num_duplicates=7, weighted=True)
    assert ei.shape == (2, 213) and w.shape == (213,)
    assert int((ei[0] == ei[1]).sum()) >= 6
    assert not bool((ei >= 46).any())                     # last 4 nodes isolated
    assert not bool(((ei[1] >= 41) & (ei[1] < 46)).any())  # 5 nodes without incoming edges
    assert torch.unique(ei, dim=1).shape[1] < 213          # duplicates present
    again, _ = random_graph(50, 200, seed=3, num_isolated=4, num_empty_rows=5, num_self_loops=6,
                            num_duplicates=7, weighted=True)
    assert torch.equal(ei, again)
