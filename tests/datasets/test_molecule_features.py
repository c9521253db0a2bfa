"""Atom features of load_molecules: layout, hand-checked chemistry, RDKit vs the built-in parser, CSV forms."""
import gzip
import math
import warnings

import pytest
import torch

from sparsegnn.datasets import default_data_dir, load_molecules
from sparsegnn.datasets.molecules import (
    ATOM_ELEMENTS, ATOM_FEATURE_SLICES, HYBRIDIZATIONS, NUM_ATOM_FEATURES, atom_features,
)

RDKIT_REASON = "RDKit is not installed (pip install 'sparsegnn[chem]'; make venv installs it where a wheel exists)"
BACKENDS = ["builtin", "rdkit"]


def decode(x):
    """Per atom: element symbol, degree, formal charge, hybridisation, aromatic, H count (from the one-hots)."""
    s = ATOM_FEATURE_SLICES
    rows = []
    for row in x:
        element = (list(ATOM_ELEMENTS) + ["other"])[int(row[s["element"]].argmax())]
        hyb = row[s["hybridization"]]
        rows.append((element, int(row[s["degree"]].argmax()), int(row[s["formal_charge"]].argmax()) - 2,
                     (list(HYBRIDIZATIONS) + ["other"])[int(hyb.argmax())] if hyb.any() else None,
                     bool(row[s["aromatic"]].item()), int(row[s["num_hs"]].argmax())))
    return rows


def molecule_rows(tmp_path, smiles, backend):
    if backend == "rdkit":
        pytest.importorskip("rdkit", reason=RDKIT_REASON)
    (tmp_path / "m.csv").write_text("smiles,t\n" + "".join(f"{s},1\n" for s in smiles))
    mols = load_molecules(tmp_path / "m.csv", backend=backend)
    return mols, decode(mols.x)


def test_layout_is_contiguous_and_documented_width():
    spans = sorted((s.start, s.stop) for s in ATOM_FEATURE_SLICES.values())
    assert spans[0][0] == 0 and spans[-1][1] == NUM_ATOM_FEATURES == 48
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    widths = {k: s.stop - s.start for k, s in ATOM_FEATURE_SLICES.items()}
    assert widths == {"element": 25, "degree": 6, "formal_charge": 5, "hybridization": 6, "aromatic": 1, "num_hs": 5}


def test_atom_features_unknown_blocks_stay_zero():
    x = atom_features([6, 8, 92], [1, 7, 0])
    assert x.shape == (3, NUM_ATOM_FEATURES)
    assert decode(x)[1][:2] == ("O", 5) and decode(x)[2][0] == "other"
    for block in ("formal_charge", "hybridization", "aromatic", "num_hs"):
        assert not x[:, ATOM_FEATURE_SLICES[block]].any()
    x = atom_features([6], [0], hybridization=[-1])
    assert not x[:, ATOM_FEATURE_SLICES["hybridization"]].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_checked_atoms(tmp_path, backend):
    # acetate, benzene, ammonium, acetylene, pyrrole, an explicit [H]
    smiles = ["CC(=O)[O-]", "c1ccccc1", "[NH4+]", "C#C", "c1cc[nH]c1", "[H]C(Cl)(Cl)Cl"]
    mols, rows = molecule_rows(tmp_path, smiles, backend)
    ptr = mols.graph.ptr.tolist()
    per_mol = [rows[ptr[i]:ptr[i + 1]] for i in range(len(smiles))]
    drop_hyb = lambda mol: [r[:3] + r[4:] for r in mol]  # noqa: E731
    assert drop_hyb(per_mol[0]) == [("C", 1, 0, False, 3), ("C", 3, 0, False, 0), ("O", 1, 0, False, 0),
                                    ("O", 1, -1, False, 0)]
    assert drop_hyb(per_mol[1]) == [("C", 2, 0, True, 1)] * 6
    assert drop_hyb(per_mol[2]) == [("N", 0, 1, False, 4)]
    assert drop_hyb(per_mol[3]) == [("C", 1, 0, False, 1)] * 2
    assert [r[5] for r in per_mol[4]] == [1, 1, 1, 1, 1] and all(r[4] for r in per_mol[4])
    assert drop_hyb(per_mol[5]) == [("C", 3, 0, False, 1)] + [("Cl", 1, 0, False, 0)] * 3   # [H] dropped, counted
    hybrids = [r[3] for r in rows]
    if backend == "rdkit":
        assert [r[3] for r in per_mol[0]][:2] == ["SP3", "SP2"] and per_mol[3][0][3] == "SP"
        assert all(r[3] == "SP2" for r in per_mol[1])
    else:
        assert all(h is None for h in hybrids)      # the built-in parser knows no hybridisation: zeros


@pytest.mark.parametrize("backend", BACKENDS)
def test_bonds_both_ways_and_masked_labels(tmp_path, backend):
    if backend == "rdkit":
        pytest.importorskip("rdkit", reason=RDKIT_REASON)
    (tmp_path / "m.csv").write_text("smiles,a,b,c\nCCO,1,,0\nc1ccccc1,,0,1\nC1CC1N,0,1,\n")
    mols = load_molecules(tmp_path / "m.csv", backend=backend)
    dense = mols.graph.to_dense()
    assert torch.equal(dense, dense.T) and mols.graph.num_edges == 2 * (2 + 6 + 4)
    assert mols.y_mask.tolist() == [[True, False, True], [False, True, True], [True, True, False]]
    assert math.isnan(float(mols.y[0, 1])) and mols.y[1, 2] == 1


def test_moleculenet_style_csv_with_text_columns_and_gzip(tmp_path):
    text = ('num,name,p_np,smiles,label_b\n1,"Propanolol, (S)",1,CC(C)NCC(O)COc1cccc2ccccc12,0\n'
            "2,Terbutylchlorambucil,0,CCCC,\n3,x,1,not-a-smiles,1\n")
    (tmp_path / "bbbp.csv").write_text(text)
    with gzip.open(tmp_path / "bbbp.csv.gz", "wt") as f:
        f.write(text)
    for name in ("bbbp.csv", "bbbp.csv.gz"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mols = load_molecules(tmp_path / name)
        assert mols.tasks == ["num", "p_np", "label_b"]              # "name" is text: not a task
        assert mols.smiles == ["CC(C)NCC(O)COc1cccc2ccccc12", "CCCC"] and mols.x.shape[1] == NUM_ATOM_FEATURES
        assert mols.y_mask.tolist() == [[True, True, True], [True, True, False]]


def test_builtin_agrees_with_rdkit_on_tox21(tmp_path):
    pytest.importorskip("rdkit", reason=RDKIT_REASON)
    data = default_data_dir()
    path = None if data is None else data / "molecules" / "tox21.csv"
    if path is None or not path.is_file():
        pytest.skip("no shared datasets folder (set SPARSEGNN_DATA)")
    sub = tmp_path / "tox21_head.csv"
    sub.write_text("\n".join(path.read_text().splitlines()[:801]) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = load_molecules(sub, backend="builtin"), load_molecules(sub, backend="rdkit")
    keep = [i for i, s in enumerate(ours.smiles) if s in set(theirs.smiles)]
    assert len(keep) == len(theirs.smiles) >= 795
    ptr = ours.graph.ptr
    rows = torch.cat([torch.arange(int(ptr[i]), int(ptr[i + 1])) for i in keep])
    mine, ref = ours.x[rows], theirs.x
    assert mine.shape == ref.shape
    for block in ("element", "degree", "formal_charge", "num_hs"):
        s = ATOM_FEATURE_SLICES[block]
        assert torch.equal(mine[:, s], ref[:, s]), block
    s = ATOM_FEATURE_SLICES["aromatic"]
    assert float((mine[:, s] == ref[:, s]).float().mean()) > 0.999   # RDKit also aromatises Kekule rings
    assert not mine[:, ATOM_FEATURE_SLICES["hybridization"]].any()
    assert bool((ref[:, ATOM_FEATURE_SLICES["hybridization"]].sum(1) == 1).all())
