"""Format readers (npz, edge lists, Matrix Market, TU batch, SMILES / CSV) and the real-graph suite.

Every reader is tested on small files written here; the tests on the shared data skip cleanly
when ``default_data_dir()`` finds no data folder.
"""
import collections
import gzip
import math
import pickle
import warnings

import numpy as np
import pytest
import torch

import sparsegnn as sg
from sparsegnn.datasets import (
    REAL_SUITE, default_data_dir, describe, load, load_molecules, load_suite_graph, load_tu, load_tu_batch,
    read_edge_list, read_matrix_market, read_npz_graph, smiles_to_edges,
)
from sparsegnn.datasets.molecules import ATOM_ELEMENTS, NUM_ATOM_FEATURES

DATA = default_data_dir()
needs_data = pytest.mark.skipif(DATA is None or not (DATA / "real").is_dir(),
                                reason="no shared datasets folder (set SPARSEGNN_DATA)")


def dense(pairs, n, weights=None):
    """A[target, source] for (source, target) pairs."""
    a = torch.zeros(n, n)
    for k, (s, t) in enumerate(pairs):
        a[t, s] += 1.0 if weights is None else weights[k]
    return a


# ---------------------------------------------------------------- npz
def test_read_npz_graph_layout(tmp_path):
    src = np.array([1, 3, 0, 2, 0], dtype=np.int32)   # sorted by dst; row 2 keeps file order 2, 0
    dst = np.array([0, 0, 1, 2, 2], dtype=np.int32)
    path = tmp_path / "toy.npz"
    np.savez(path, src=src, dst=dst, num_nodes=np.int64(4), y=np.array([0, 1, 1, 0]),
             x_indptr=np.array([0, 1, 1, 3, 3]), x_indices=np.array([2, 0, 1], dtype=np.int32),
             x_data=np.array([1.0, 2.0, 3.0], dtype=np.float32), x_shape=np.array([4, 3]),
             graph_ptr=np.array([0, 3, 4]), graph_y=np.array([1, 0]))
    rg = read_npz_graph(path)
    assert rg.name == "toy" and rg.graph.num_nodes == 4 and rg.graph.edge_val is None
    assert rg.graph.rowptr.tolist() == [0, 2, 3, 5, 5] and rg.graph.col.tolist() == [1, 3, 0, 2, 0]
    assert torch.equal(rg.graph.to_dense(), dense(zip(src.tolist(), dst.tolist()), 4))
    assert rg.x.dtype == torch.float32 and rg.x.tolist() == [[0, 0, 1], [0, 0, 0], [2, 3, 0], [0, 0, 0]]
    assert rg.y.tolist() == [0, 1, 1, 0] and rg.graph.ptr.tolist() == [0, 3, 4] and rg.graph_y.tolist() == [1, 0]

    np.savez(tmp_path / "bare.npz", src=src[::-1], dst=dst[::-1], num_nodes=np.int64(5))  # unsorted: tolerated
    bare = read_npz_graph(tmp_path / "bare.npz")
    assert bare.x is None and bare.y is None and bare.graph.ptr is None and bare.graph.num_nodes == 5
    assert torch.equal(bare.graph.to_dense()[:4, :4], rg.graph.to_dense())
    np.savez(tmp_path / "bad.npz", src=src, dst=dst, num_nodes=np.int64(3))
    with pytest.raises(ValueError, match=r"read_npz_graph\(\): edge ids"):
        read_npz_graph(tmp_path / "bad.npz")
    np.savez(tmp_path / "nodst.npz", src=src, num_nodes=np.int64(4))
    with pytest.raises(ValueError, match="lacks array"):
        read_npz_graph(tmp_path / "nodst.npz")


# ---------------------------------------------------------------- edge lists
def test_read_edge_list_snap(tmp_path):
    text = "# Directed graph\n# FromNodeId\tToNodeId\n0\t1\n1\t2\n\n2\t0\n3\t0\n"
    (tmp_path / "g.txt").write_text(text)
    g = read_edge_list(tmp_path / "g.txt")
    pairs = [(0, 1), (1, 2), (2, 0), (3, 0)]
    assert g.num_nodes == 4 and g.edge_val is None and torch.equal(g.to_dense(), dense(pairs, 4))
    with gzip.open(tmp_path / "g.txt.gz", "wt") as f:
        f.write(text)
    gz = read_edge_list(tmp_path / "g.txt.gz", num_nodes=6)
    assert gz.num_nodes == 6 and torch.equal(gz.to_dense()[:4, :4], g.to_dense())

    (tmp_path / "w.csv").write_text("0,1,0.5\n1,1,2.0\n2,0,1.5\n")
    w = read_edge_list(tmp_path / "w.csv")
    assert w.edge_val.dtype == torch.float32
    assert torch.equal(w.to_dense(), dense([(0, 1), (1, 1), (2, 0)], 3, [0.5, 2.0, 1.5]))
    u = read_edge_list(tmp_path / "w.csv", directed=False)  # self loop stored once
    assert u.num_edges == 5
    assert torch.equal(u.to_dense(), dense([(0, 1), (1, 0), (1, 1), (2, 0), (0, 2)], 3, [0.5, 0.5, 2.0, 1.5, 1.5]))
    (tmp_path / "semi.txt").write_text("0;1\n1;2\n")
    assert read_edge_list(tmp_path / "semi.txt", delimiter=";").num_edges == 2


def test_read_edge_list_relabel_and_errors(tmp_path):
    (tmp_path / "ids.txt").write_text("100 5\n5 -7\n-7 100\n")
    g = read_edge_list(tmp_path / "ids.txt", relabel=True)     # sorted ids -7, 5, 100 -> 0, 1, 2
    assert g.num_nodes == 3 and torch.equal(g.to_dense(), dense([(2, 1), (1, 0), (0, 2)], 3))
    with pytest.raises(ValueError, match=r"read_edge_list\(\): negative node id"):
        read_edge_list(tmp_path / "ids.txt")
    (tmp_path / "ok.txt").write_text("0 4\n")
    with pytest.raises(ValueError, match="num_nodes=3"):
        read_edge_list(tmp_path / "ok.txt", num_nodes=3)
    for name, body, msg in [("four.txt", "0 1 1 1\n", "2 or 3 columns"), ("mixed.txt", "0 1\n1 2 3\n", "expected 2 columns"),
                            ("word.txt", "0 1\nx 2\n", "not a valid integer"), ("fid.txt", "0.5 1 1\n", "integers")]:
        (tmp_path / name).write_text(body)
        with pytest.raises(ValueError, match=msg):
            read_edge_list(tmp_path / name)
    with pytest.raises(ValueError, match="does not exist"):
        read_edge_list(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    assert read_edge_list(tmp_path / "empty.txt").num_nodes == 0


# ---------------------------------------------------------------- Matrix Market
def test_read_matrix_market(tmp_path):
    (tmp_path / "g.mtx").write_text("%%MatrixMarket matrix coordinate real general\n% comment\n3 3 3\n"
                                    "1 2 0.5\n3 1 -2e0\n2 2 1\n")
    g = read_matrix_market(tmp_path / "g.mtx")
    expected = torch.zeros(3, 3)
    expected[0, 1], expected[2, 0], expected[1, 1] = 0.5, -2.0, 1.0   # A[i, j] = weight of edge j -> i
    assert g.edge_val.dtype == torch.float32 and torch.equal(g.to_dense(), expected)
    (tmp_path / "s.mtx").write_text("%%MatrixMarket matrix coordinate pattern symmetric\n4 4 3\n2 1\n3 3\n4 2\n")
    s = read_matrix_market(tmp_path / "s.mtx")
    assert s.edge_val is None and s.num_edges == 5 and torch.equal(s.to_dense(), s.to_dense().T)
    assert s.to_dense()[2, 2] == 1 and s.to_dense()[0, 1] == 1 and s.to_dense()[3, 1] == 1
    (tmp_path / "i.mtx.gz").write_bytes(gzip.compress(b"%%MatrixMarket matrix coordinate integer symmetric\n"
                                                      b"2 2 2\n1 1 3\n2 1 4\n"))
    assert read_matrix_market(tmp_path / "i.mtx.gz").to_dense().tolist() == [[3, 4], [4, 0]]
    try:
        import scipy.io
        import scipy.sparse
    except ImportError:
        pass
    else:
        ref = sg.Graph.from_scipy(scipy.sparse.csr_matrix(scipy.io.mmread(str(tmp_path / "g.mtx"))))
        assert torch.equal(ref.to_dense(), g.to_dense())
    bad = {"h.mtx": ("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n", "coordinate"),
           "n.mtx": ("%%MatrixMarket matrix coordinate real general\n2 3 1\n1 3 1\n", "square"),
           "c.mtx": ("%%MatrixMarket matrix coordinate complex general\n2 2 1\n1 1 1 0\n", "field"),
           "k.mtx": ("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n2 1 1\n", "symmetry"),
           "x.mtx": ("just text\n", "header"),
           "e.mtx": ("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n", "announces 2 entries"),
           "r.mtx": ("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n3 1\n", "indices must lie")}
    for name, (body, msg) in bad.items():
        (tmp_path / name).write_text(body)
        with pytest.raises(ValueError, match=rf"read_matrix_market\(\): .*{msg}"):
            read_matrix_market(tmp_path / name)


# ---------------------------------------------------------------- TU batch
def _check_tu_batch(path):
    samples = load_tu(path)
    batch = load_tu_batch(path)
    ref = sg.Graph.batch([s.graph for s in samples])
    assert torch.equal(batch.graph.rowptr, ref.rowptr) and torch.equal(batch.graph.col, ref.col)
    assert torch.equal(batch.graph.ptr, ref.ptr) and batch.graph.edge_val is None
    assert torch.equal(batch.x, torch.cat([s.x for s in samples]))
    assert batch.graph_y.tolist() == [s.y for s in samples]
    return batch


def test_load_tu_batch_small(tmp_path):
    root = tmp_path / "TOY"
    root.mkdir()
    (root / "TOY_A.txt").write_text("1, 2\n2, 1\n3, 4\n4, 3\n4, 5\n5, 4\n5, 3\n")
    (root / "TOY_graph_indicator.txt").write_text("1\n1\n2\n2\n2\n")
    (root / "TOY_graph_labels.txt").write_text("1\n-1\n")
    (root / "TOY_node_labels.txt").write_text("0\n2\n1\n1\n0\n")
    (root / "TOY_node_attributes.txt").write_text("0.5, 1\n1, 2\n-1, 0\n0, 0\n2.5, 1\n")
    batch = _check_tu_batch(root)
    assert batch.name == "TOY" and batch.graph.ptr.tolist() == [0, 2, 5] and batch.graph_y.tolist() == [2, 0]
    assert batch.x.shape == (5, 2 + 3) and batch.graph.num_edges == 7
    (root / "TOY_A.txt").write_text("1, 3\n")
    with pytest.raises(ValueError, match=r"load_tu_batch\(\): an edge joins two different graphs"):
        load_tu_batch(root)
    with pytest.raises(ValueError, match="does not exist"):
        load_tu_batch(tmp_path / "nope.zip")


@needs_data
@pytest.mark.parametrize("name", ["PROTEINS_full", "ENZYMES"])
def test_load_tu_batch_matches_load_tu(name):
    batch = _check_tu_batch(DATA / "tu" / f"{name}.zip")
    assert batch.graph.ptr.numel() - 1 == {"PROTEINS_full": 1113, "ENZYMES": 600}[name]


# ---------------------------------------------------------------- SMILES
SMILES_CASES = {  # hand-counted heavy-atom graphs
    "c1ccccc1": ([6] * 6, [(0, 1), (0, 5), (1, 2), (2, 3), (3, 4), (4, 5)]),
    "CCO": ([6, 6, 8], [(0, 1), (1, 2)]),
    "CC(=O)O": ([6, 6, 8, 8], [(0, 1), (1, 2), (1, 3)]),
    "C[N+](C)(C)CC(=O)[O-]": ([6, 7, 6, 6, 6, 6, 8, 8], [(0, 1), (1, 2), (1, 3), (1, 4), (4, 5), (5, 6), (5, 7)]),
    "C%10CCCC%10": ([6] * 5, [(0, 1), (0, 4), (1, 2), (2, 3), (3, 4)]),
    "[Na+].[O-]C(=O)C": ([11, 8, 6, 8, 6], [(1, 2), (2, 3), (2, 4)]),
    "c1cc[nH]c1": ([6, 6, 6, 7, 6], [(0, 1), (0, 4), (1, 2), (2, 3), (3, 4)]),
    "N[C@@H](C)C(=O)O": ([7, 6, 6, 6, 8, 8], [(0, 1), (1, 2), (1, 3), (3, 4), (3, 5)]),
    "ClC(Br)=C/C#N": ([17, 6, 35, 6, 6, 7], [(0, 1), (1, 2), (1, 3), (3, 4), (4, 5)]),
    "[13CH3][2H]": ([6, 1], [(0, 1)]),                      # isotopic H is an atom, as in RDKit
    "[H]OC([H])([H])[H]": ([8, 6], [(0, 1)]),                # plain [H] on a heavy atom is implicit
    "C12CC1C2": ([6] * 4, [(0, 1), (0, 2), (0, 3), (1, 2), (2, 3)]),
    "[NH4+].[NH4+].[O-]S([O-])(=O)=O": ([7, 7, 8, 16, 8, 8, 8], [(2, 3), (3, 4), (3, 5), (3, 6)]),
}


@pytest.mark.parametrize("smiles", list(SMILES_CASES))
def test_smiles_builtin_parser(smiles):
    assert smiles_to_edges(smiles, backend="builtin") == SMILES_CASES[smiles]


@pytest.mark.parametrize("smiles", list(SMILES_CASES))
def test_smiles_rdkit_agrees(smiles):
    pytest.importorskip("rdkit")
    assert smiles_to_edges(smiles, backend="rdkit") == smiles_to_edges(smiles, backend="builtin")


@pytest.mark.parametrize("bad", ["C1CC", "C(C", "C)C", "[Xx]", "C11", "CC[C", "CQ", "(C)", "", "C%1x"])
def test_smiles_errors(bad):
    with pytest.raises(ValueError, match=r"smiles_to_edges\(\)"):
        smiles_to_edges(bad, backend="builtin")


def test_load_molecules_small(tmp_path):
    (tmp_path / "m.csv").write_text("id,SMILES,a,b\n1,CCO,1,\n2,not a smiles,0,1\n3,c1ccccc1,,0\n4,[Na+].[Cl-],1,1\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mols = load_molecules(tmp_path / "m.csv", task_columns=["a", "b"])
    assert len(caught) == 1 and "skipped 1 of 4" in str(caught[0].message)
    assert mols.smiles == ["CCO", "c1ccccc1", "[Na+].[Cl-]"] and mols.tasks == ["a", "b"]
    g = mols.graph
    assert g.ptr.tolist() == [0, 3, 9, 11] and g.num_edges == 2 * (2 + 6) and g.edge_val is None
    assert torch.equal(g.to_dense(), g.to_dense().T)
    assert mols.x.shape == (11, NUM_ATOM_FEATURES)
    assert torch.equal(mols.x[:, :len(ATOM_ELEMENTS) + 7].sum(1), torch.full((11,), 2.0))   # element + degree one-hots
    element, degree = mols.x[:, :len(ATOM_ELEMENTS) + 1].argmax(1), mols.x[:, len(ATOM_ELEMENTS) + 1:].argmax(1)
    assert [ATOM_ELEMENTS[i] for i in element[:3]] == ["C", "C", "O"] and degree.tolist() == [1, 2, 1] + [2] * 6 + [0, 0]
    assert mols.y_mask.tolist() == [[True, False], [False, True], [True, True]]
    assert mols.y[0, 0] == 1 and math.isnan(float(mols.y[0, 1])) and mols.y[1, 1] == 0
    with pytest.warns(UserWarning, match="skipped 1 of 4"):
        default = load_molecules(tmp_path / "m.csv", smiles_column="SMILES", backend="builtin")
    assert default.tasks == ["id", "a", "b"]
    with pytest.raises(ValueError, match=r"load_molecules\(\): no column 'smile'"):
        load_molecules(tmp_path / "m.csv", smiles_column="smile")


@pytest.fixture(scope="module")
def tox21():
    if DATA is None or not (DATA / "molecules" / "tox21.csv").is_file():
        pytest.skip("no shared datasets folder (set SPARSEGNN_DATA)")
    return load_molecules(DATA / "molecules" / "tox21.csv", backend="builtin")  # RDKit rejects 8 (valence)


def test_tox21_counts(tox21):
    assert len(tox21.smiles) == 7831 and tox21.y.shape == (7831, 12) and len(tox21.tasks) == 12
    assert tox21.tasks[0] == "NR-AR" and tox21.graph.ptr.numel() == 7832
    atoms, edges = tox21.graph.num_nodes, tox21.graph.num_edges
    assert abs(atoms - 145_000) / 145_000 < 0.03 and abs(edges - 302_000) / 302_000 < 0.03
    assert edges % 2 == 0 and int(tox21.graph.in_degree().max()) <= 6
    assert 0.1 < float(tox21.y_mask.float().mean()) < 1.0 and not torch.isnan(tox21.y[tox21.y_mask]).any()


# ---------------------------------------------------------------- Planetoid (any name, Citeseer-style gaps)
def test_planetoid_raw_generic(tmp_path):
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    feats = rng.random((10, 4))                    # float (TF-IDF-like) features
    onehot = np.eye(3)[[0, 1, 2, 0, 1, 2, 0, 1, 2, 0]]
    test_index = np.array([9, 7, 6])               # node 8: an isolated test node missing from tx
    parts = {"x": sp.csr_matrix(feats[:3]), "y": onehot[:3], "allx": sp.csr_matrix(feats[:6]), "ally": onehot[:6],
             "tx": sp.csr_matrix(feats[test_index]), "ty": onehot[test_index],  # rows in test.index order
             "graph": collections.defaultdict(list, {0: [1, 1, 0], 1: [0, 2], 2: [1], 6: [9], 9: [6]})}
    for key, value in parts.items():
        (tmp_path / f"ind.pubmed.{key}").write_bytes(pickle.dumps(value))
    (tmp_path / "ind.pubmed.test.index").write_text("\n".join(map(str, test_index)) + "\n")
    data = load("pubmed", root=str(tmp_path), normalize_features=False)
    expected = torch.tensor(feats, dtype=torch.float32)
    expected[8] = 0
    assert torch.allclose(data.x, expected) and data.y.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 0, 0]
    assert data.test_mask.nonzero().flatten().tolist() == [6, 7, 9] and int(data.val_mask.sum()) == 7
    assert data.graph.num_edges == 6 and torch.equal(data.graph.to_dense(), data.graph.to_dense().T)
    with pytest.raises(ValueError, match="not bundled"):
        load("pubmed")


# ---------------------------------------------------------------- the suite
README_COUNTS = {  # nodes, directed edges, max in-degree (data READMEs; Cora/Citeseer: Planetoid, deduplicated)
    "cora": (2708, 10556, None), "citeseer": (3327, 9104, None),
    "deezer": (28281, 185504, 172), "lastfm": (7624, 55612, 216), "twitch": (7126, 70648, 720),
    "wikipedia": (11631, 341691, 3546), "roadnet-pa-excerpt": (6239, 17134, 7),
    "reddit-threads-10k": (237390, 493733, 89), "PROTEINS_full": (43471, 162088, None),
    "ENZYMES": (19580, 74564, None),
}


@needs_data
def test_every_suite_graph_loads_with_readme_counts():
    assert set(README_COUNTS) | {"tox21"} == set(REAL_SUITE)
    for name in REAL_SUITE:
        g = load_suite_graph(name)
        info = describe(g)
        assert g.edge_val is None, name
        assert bool((g.rowptr[1:] >= g.rowptr[:-1]).all()) and int(g.col.max()) < g.num_nodes, name
        if name == "tox21":
            assert abs(info["nodes"] - 145_000) / 145_000 < 0.03 and info["graphs"] == 7831
            assert abs(info["edges"] - 302_000) / 302_000 < 0.03
            continue
        nodes, edges, max_in = README_COUNTS[name]
        assert (info["nodes"], info["edges"]) == (nodes, edges), name
        assert max_in is None or info["max_in_degree"] == max_in, name
        assert info["mean_degree"] == pytest.approx(edges / nodes)
    assert describe(load_suite_graph("reddit-threads-10k"))["graphs"] == 10000


@needs_data
def test_real_npz_extras():
    twitch = read_npz_graph(DATA / "real" / "twitch.npz")
    assert twitch.x.shape == (7126, 3170) and twitch.y.shape == (7126,) and twitch.graph_y is None
    threads = read_npz_graph(DATA / "real" / "reddit-threads-10k.npz")
    assert threads.graph.ptr.shape == (10001,) and threads.graph_y.shape == (10000,) and threads.y is None


def test_suite_data_dir_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEGNN_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    assert load_suite_graph("Cora").num_nodes == 2708              # bundled: needs no data folder
    with pytest.raises(ValueError, match=r"load_suite_graph\(\): 'deezer': missing .*deezer\.npz.*SPARSEGNN_DATA"):
        load_suite_graph("deezer")
    with pytest.raises(ValueError, match=r"ind\.citeseer\.x"):
        load_suite_graph("citeseer", data_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown suite graph 'reddit'"):
        load_suite_graph("reddit")
    with pytest.raises(ValueError, match=r"describe\(\)"):
        describe("cora")
