"""ChemGCN / GINClassifier, ROC-AUC, masked BCE, short training runs (loss falls) and the train CLI."""
import json
import math
import zipfile

import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.cli import main
from sparsegnn.graph_training import (
    _exact_roc_auc, build_graph_model, masked_bce, masked_roc_auc, roc_auc_score, train_molecules, train_tu_kfold,
)
from sparsegnn.datasets.loader import GraphDataset, collate
from sparsegnn.datasets.tu import GraphSample

SMILES = ["CCO", "c1ccccc1O", "CC(=O)O", "C1CCCCC1N", "CCN(CC)CC", "c1ccncc1", "OCC(O)CO", "CC#N", "ClC(Cl)Cl",
          "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "O=C=O", "c1ccc2ccccc2c1", "CCCCCCCC", "NC(=O)N", "C[N+](C)(C)C"]


def molecule_csv(path, n=300, seed=0):
    """A Tox21-like CSV: two learnable tasks (has an aromatic ring / has oxygen) with blanks."""
    gen = torch.Generator().manual_seed(seed)
    lines = ["smiles,aromatic,oxygen"]
    for i in range(n):
        s = SMILES[int(torch.randint(len(SMILES), (1,), generator=gen))]
        blank = float(torch.rand(1, generator=gen)) < 0.2
        lines.append(f"{s},{'' if blank else int('c' in s)},{int('O' in s)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def tu_zip(path, num=60, seed=0):
    """Class 0: cycles, class 1: stars (no node labels: constant features)."""
    gen = torch.Generator().manual_seed(seed)
    edges, indicator, labels, offset = [], [], [], 0
    for g in range(num):
        n, label = int(torch.randint(4, 9, (1,), generator=gen)), g % 2
        pairs = [(i, (i + 1) % n) for i in range(n)] if label == 0 else [(0, i) for i in range(1, n)]
        for a, b in pairs:
            edges += [(a + offset + 1, b + offset + 1), (b + offset + 1, a + offset + 1)]
        indicator += [g + 1] * n
        labels.append(label)
        offset += n
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("S/S_A.txt", "".join(f"{a}, {b}\n" for a, b in edges))
        zf.writestr("S/S_graph_indicator.txt", "".join(f"{g}\n" for g in indicator))
        zf.writestr("S/S_graph_labels.txt", "".join(f"{y}\n" for y in labels))
    return path


# ---------------------------------------------------------------- models
def sample_graphs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in (3, 5, 1, 6):
        ei = torch.randint(0, n, (2, 2 * n), generator=gen)
        ei = torch.cat([ei, ei.flip(0)], 1)
        out.append((Graph.from_edge_index(ei, num_nodes=n), torch.randn(n, 7, generator=gen)))
    return out


@pytest.mark.parametrize("name", ["chemgcn", "gin"])
def test_models_treat_each_graph_of_a_batch_alone(name):
    torch.manual_seed(0)
    model = build_graph_model(name, 7, 3)
    model.train()
    graphs = sample_graphs()
    batch = Graph.batch([g for g, _ in graphs])
    x = torch.cat([x for _, x in graphs])
    model(x, batch)                                          # BatchNorm running statistics move off the init
    model.eval()
    out = model(x, batch)
    assert out.shape == (4, 3)
    alone = torch.cat([model(xi, Graph.batch([g])) for g, xi in graphs])
    torch.testing.assert_close(out, alone, rtol=1e-4, atol=1e-5)
    perm = torch.tensor([2, 0, 1])                           # renumbering a graph's nodes changes nothing
    g0, x0 = graphs[0]
    inverse = torch.argsort(perm)
    relabelled = Graph.from_edge_index(inverse[g0.edge_index()], num_nodes=3)
    torch.testing.assert_close(model(x0[perm], Graph.batch([relabelled])), model(x0, Graph.batch([g0])),
                               rtol=1e-4, atol=1e-5)


def test_model_structure_and_exports():
    chem, wide = sg.nn.ChemGCN(48, 12), sg.nn.ChemGCN.wide(48, 12)
    assert [c.out_channels for c in chem.convs] == [64, 64] and [c.out_channels for c in wide.convs] == [512] * 3
    assert isinstance(chem.convs[0], sg.nn.GCNConv)
    gin = sg.nn.GINClassifier(3, 2)
    assert len(gin.convs) == 4 and len(gin.heads) == 5 and gin.pool == "sum" and gin.dropout == 0.5
    assert isinstance(gin.convs[0], sg.nn.GINConv) and isinstance(gin.convs[0].nn[1], torch.nn.BatchNorm1d)
    with pytest.raises(ValueError, match=r"ChemGCN\(\): pool"):
        sg.nn.ChemGCN(3, 2, pool="median")
    with pytest.raises(ValueError, match=r"GINClassifier\(\): needs the graphs' node offsets"):
        gin(torch.randn(2, 3), Graph.from_edge_index(torch.tensor([[0], [1]])))


# ---------------------------------------------------------------- metrics
def test_roc_auc_hand_examples():
    assert roc_auc_score(torch.tensor([0, 0, 1, 1]), torch.tensor([0.1, 0.4, 0.35, 0.8])) == pytest.approx(0.75)
    assert roc_auc_score(torch.tensor([0, 1, 0, 1]), torch.tensor([0.5, 0.5, 0.5, 0.5])) == pytest.approx(0.5)
    assert roc_auc_score(torch.tensor([1, 1, 0]), torch.tensor([3.0, 2.0, 1.0])) == pytest.approx(1.0)
    assert _exact_roc_auc(torch.tensor([0, 1, 1, 0, 1]), torch.tensor([2.0, 2.0, 3.0, 1.0, 0.0])) == pytest.approx(
        (1.5 + 2 + 0) / 6)          # positive-vs-negative pairs won: 2 beats {1} and ties 2 (1.5), 3 beats both, 0 none
    with pytest.raises(ValueError, match=r"roc_auc_score\(\): y_true needs both classes"):
        roc_auc_score(torch.tensor([1, 1]), torch.tensor([0.2, 0.3]))


def test_exact_roc_auc_equals_mann_whitney():
    stats = pytest.importorskip("scipy.stats")
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (400,), generator=gen)
    s = torch.randint(0, 30, (400,), generator=gen).float() + y * 3.0          # with many ties
    u = stats.mannwhitneyu(s[y == 1].numpy(), s[y == 0].numpy()).statistic
    expected = u / (int(y.sum()) * int((1 - y).sum()))
    assert _exact_roc_auc(y, s) == pytest.approx(expected, abs=1e-12)
    assert roc_auc_score(y, s) == pytest.approx(expected, abs=1e-12)


def test_masked_metrics():
    logits = torch.tensor([[2.0, 0.1], [-1.0, 0.3], [0.5, -0.2], [1.0, 5.0]])
    y = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    mask = torch.tensor([[True, True], [True, True], [False, True], [True, False]])
    mean, per_task = masked_roc_auc(logits, y, mask)
    assert per_task[0] == pytest.approx(1.0) and per_task[1] == pytest.approx(1.0) and mean == pytest.approx(1.0)
    _, per_task = masked_roc_auc(logits, y, torch.tensor([[True, True], [False, True], [False, False], [True, False]]))
    assert math.isnan(per_task[0])                          # only positives known: undefined, left out
    terms = [torch.nn.functional.binary_cross_entropy_with_logits(logits[i, t], y[i, t])
             for i in range(4) for t in range(2) if mask[i, t]]
    torch.testing.assert_close(masked_bce(logits, y, mask), torch.stack(terms).mean())


# ---------------------------------------------------------------- training
def test_train_molecules_loss_falls(tmp_path):
    result = train_molecules(molecule_csv(tmp_path / "m.csv"), "chemgcn", epochs=6, batch_size=25, split="random",
                             lr=0.01, progress=False, smiles_backend="builtin")
    assert result.num_train == 240 and result.num_valid == 30 and result.num_test == 30
    assert result.losses[-1] < 0.7 * result.losses[0]
    assert result.test_auc > 0.8 and result.train_molecules_per_s > 0 and result.inference_molecules_per_s > 0
    assert len(result.test_auc_per_task) == 2


def test_train_tu_kfold_learns_cycles_vs_stars(tmp_path):
    result = train_tu_kfold(tu_zip(tmp_path / "S.zip"), "gin", epochs=12, batch_size=8, folds=3, progress=False)
    assert len(result.test_acc_per_fold) == 3 and 0 <= result.best_epoch < 12
    assert result.losses_first_fold[-1] < result.losses_first_fold[0]
    assert result.test_acc_best_epoch_mean >= 0.9 and result.mean_epoch_ms > 0


def test_cli_graph_datasets(tmp_path, capsys):
    csv = molecule_csv(tmp_path / "m.csv", n=120)
    argv = ["train", "--dataset", str(csv), "--model", "chemgcn", "--epochs", "2", "--split", "random",
            "--device", "cpu", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["kind"] == "molecules" and result["batch_size"] == 50 and result["epochs"] == 2
    assert {"test_auc", "train_molecules_per_s", "inference_molecules_per_s"} <= set(result)
    argv = ["train", "--dataset", str(tu_zip(tmp_path / "S.zip", num=20)), "--model", "gin", "--epochs", "2",
            "--folds", "2", "--device", "cpu"]
    assert main(argv) == 0
    assert "2-fold" in capsys.readouterr().out
    assert main(["train", "--dataset", "cora", "--model", "chemgcn", "--device", "cpu"]) == 2
    assert main(["train", "--dataset", str(csv), "--model", "gcn", "--device", "cpu"]) == 2
    assert main(["train", "--dataset", str(csv), "--model", "gin", "--minibatch", "--device", "cpu"]) == 2
    assert main(["train", "--dataset", str(csv), "--model", "gin", "--folds", "3", "--device", "cpu"]) == 2
    assert main(["train", "--model", "gcn", "--split", "random", "--epochs", "1", "--device", "cpu"]) == 2
    assert "graph-level" in capsys.readouterr().err


def test_gcn_normalized_chemgcn_equals_normalizing_chemgcn(tmp_path):
    from sparsegnn.datasets import load_molecules

    mols = load_molecules(molecule_csv(tmp_path / "m.csv", n=40), backend="builtin")
    data = GraphDataset.from_molecules(mols)
    index = torch.arange(0, 40, 3)
    torch.manual_seed(0)
    a = sg.nn.ChemGCN(data.num_features, 2).eval()
    b = sg.nn.ChemGCN(data.num_features, 2, normalize=False).eval()
    b.load_state_dict(a.state_dict())
    raw, normed = collate(data, index), collate(data.gcn_normalized(), index)
    torch.testing.assert_close(b(normed.x, normed.graph), a(raw.x, raw.graph))
    unweighted = normed.graph.with_values(None)                     # the weights are what it aggregates with
    assert not torch.allclose(b(normed.x, unweighted), a(raw.x, raw.graph))


def test_samples_dataset_round_trip():
    graphs = sample_graphs()
    data = GraphDataset.from_samples([GraphSample(g, x, i % 2) for i, (g, x) in enumerate(graphs)])
    assert data.y.tolist() == [0, 1, 0, 1] and data.graph.ptr.tolist() == [0, 3, 8, 9, 15]
