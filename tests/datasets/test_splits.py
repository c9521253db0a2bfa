"""Splits: random, Bemis-Murcko scaffold (RDKit), stratified k-fold."""
import pytest
import torch

from sparsegnn.datasets import default_data_dir
from sparsegnn.datasets.splits import murcko_scaffold, random_split, scaffold_split, stratified_kfold

RDKIT_REASON = "RDKit is not installed (pip install 'sparsegnn[chem]'; make venv installs it where a wheel exists)"


def test_random_split_partitions_and_is_seeded():
    train, valid, test = random_split(101, (0.8, 0.1, 0.1), seed=3)
    assert (train.numel(), valid.numel(), test.numel()) == (80, 10, 11)
    assert torch.equal(torch.cat([train, valid, test]).sort().values, torch.arange(101))
    assert all(bool((p[1:] > p[:-1]).all()) for p in (train, valid, test))
    again = random_split(101, (0.8, 0.1, 0.1), seed=3)
    assert all(torch.equal(a, b) for a, b in zip((train, valid, test), again))
    assert not torch.equal(random_split(101, seed=4)[0], train)


@pytest.mark.parametrize("fractions", [(0.8, 0.1), (0.8, 0.3, 0.1), (1.2, -0.1, -0.1)])
def test_random_split_bad_fractions(fractions):
    with pytest.raises(ValueError, match=r"random_split\(\): fractions"):
        random_split(10, fractions)


def test_stratified_kfold_balances_classes():
    labels = torch.tensor([0] * 37 + [1] * 12 + [2] * 5)[torch.randperm(54, generator=torch.Generator().manual_seed(0))]
    folds = stratified_kfold(labels, k=10, seed=1)
    assert len(folds) == 10
    tests = torch.cat([test for _, test in folds])
    assert torch.equal(tests.sort().values, torch.arange(54))        # the test folds partition the graphs
    for train, test in folds:
        assert torch.equal(torch.cat([train, test]).sort().values, torch.arange(54))
        assert 5 <= test.numel() <= 6
        for c, n_c in ((0, 37), (1, 12), (2, 5)):
            count = int((labels[test] == c).sum())
            assert n_c // 10 <= count <= -(-n_c // 10)
    again = stratified_kfold(labels, k=10, seed=1)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(folds, again))


def test_stratified_kfold_errors():
    with pytest.raises(ValueError, match=r"stratified_kfold\(\): k must be"):
        stratified_kfold(torch.tensor([0, 1, 0]), k=1)
    with pytest.raises(ValueError, match=r"stratified_kfold\(\): labels"):
        stratified_kfold(torch.tensor([0.0, 1.0]), k=2)


MOLECULES = [
    "c1ccccc1C", "c1ccccc1O", "Nc1ccccc1", "c1ccccc1CC(=O)O",       # benzene scaffold, 4
    "C1CCCCC1O", "CC1CCCCC1",                                       # cyclohexane, 2
    "CCO", "CCCC", "CC(=O)O",                                       # no ring: scaffold "", 3
    "c1ccc2ccccc2c1C",                                              # naphthalene, 1
]


def test_murcko_scaffold_agrees_with_rdkit_get_scaffold():
    Chem = pytest.importorskip("rdkit.Chem", reason=RDKIT_REASON)
    from rdkit.Chem.Scaffolds import MurckoScaffold

    for smiles in MOLECULES:
        core = MurckoScaffold.GetScaffoldForMol(Chem.MolFromSmiles(smiles))
        assert murcko_scaffold(smiles) == Chem.MolToSmiles(core)
    assert murcko_scaffold("CCO") == "" and murcko_scaffold("Cc1ccccc1") == "c1ccccc1"


def test_scaffold_split_keeps_scaffolds_together():
    pytest.importorskip("rdkit", reason=RDKIT_REASON)
    train, valid, test = scaffold_split(MOLECULES, (0.5, 0.3, 0.2))
    assert torch.equal(torch.cat([train, valid, test]).sort().values, torch.arange(len(MOLECULES)))
    # groups by size: benzene 4 (train), no ring 3 (train would reach 7 > 5: valid), cyclohexane 2
    # (train + valid would reach 9 > 8: test), naphthalene 1 (train: 5 <= 5)
    assert train.tolist() == [0, 1, 2, 3, 9] and valid.tolist() == [6, 7, 8] and test.tolist() == [4, 5]


def test_scaffold_split_on_tox21_subset():
    pytest.importorskip("rdkit", reason=RDKIT_REASON)
    data = default_data_dir()
    path = None if data is None else data / "molecules" / "tox21.csv"
    if path is None or not path.is_file():
        pytest.skip("no shared datasets folder (set SPARSEGNN_DATA)")
    smiles = [line.split(",")[0] for line in path.read_text().splitlines()[1:601]]
    parts = scaffold_split(smiles)
    assert sum(p.numel() for p in parts) == 600
    assert parts[0].numel() <= 480 and parts[0].numel() + parts[1].numel() <= 540
    scaffolds = [murcko_scaffold(s) for s in smiles]
    where = {}
    for name, part in zip(("train", "valid", "test"), parts):
        for i in part.tolist():
            where.setdefault(scaffolds[i], set()).add(name)
    assert all(len(v) == 1 for v in where.values())                 # no scaffold in two parts
    largest = max(where, key=scaffolds.count)
    assert where[largest] == {"train"}
    assert all(torch.equal(a, b) for a, b in zip(parts, scaffold_split(smiles)))   # deterministic
