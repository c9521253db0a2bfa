"""Molecules from SMILES: heavy-atom graphs and MoleculeNet-style CSV files (e.g. Tox21).

``smiles_to_edges`` uses RDKit when it is installed and otherwise a small built-in SMILES
parser (organic subset, aromatic atoms, bracket atoms, branches, ring closures, bond symbols,
``.`` fragments). Both give the same heavy-atom graph: atoms in SMILES order, hydrogens
implicit (a plain ``[H]`` bonded to one heavy atom is dropped, as RDKit's ``RemoveHs`` does),
bonds as sorted ``(i, j)`` pairs with ``i < j``. The built-in parser checks syntax, not valence.
"""
from __future__ import annotations

import contextlib
import csv
import gzip
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .._checks import check
from ..formats.csr import coo_to_csr
from ..graph import Graph

_ELEMENTS = (
    "H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se Br Kr "
    "Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy Ho Er Tm "
    "Yb Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf Es Fm Md No "
    "Lr Rf Db Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og"
).split()
#: Element symbol -> atomic number.
ATOMIC_NUMBER = {s: z for z, s in enumerate(_ELEMENTS, start=1)}
_ORGANIC = {"B": 5, "C": 6, "N": 7, "O": 8, "P": 15, "S": 16, "F": 9, "I": 53, "Cl": 17, "Br": 35}
_AROMATIC = {"b": 5, "c": 6, "n": 7, "o": 8, "p": 15, "s": 16, "se": 34, "as": 33, "te": 52, "si": 14}
# isotope, symbol, chirality, H count, charge, atom class
_BRACKET = re.compile(r"(\d*)([A-Z][a-z]?|se|as|te|si|[bcnops]|\*)"
                      r"(@(?:@|TH[12]|AL[12]|SP[123]|TB\d\d?|OH\d\d?)?)?(H\d*)?([+-]+\d*)?(:\d+)?$")
_BONDS = set("-=#$:/\\")

#: Elements with their own one-hot column in the atom features (then "other"); see :func:`atom_features`.
ATOM_ELEMENTS = ("C", "N", "O", "S", "F", "Cl", "Br", "I", "P", "B", "Si", "Se", "Na", "K", "Ca", "Mg",
                 "Zn", "Fe", "Cu", "Sn", "Hg", "As", "Al", "H")
#: Hybridisations with their own column (then "other": S, SP2D, unspecified, ...); RDKit only.
HYBRIDIZATIONS = ("SP", "SP2", "SP3", "SP3D", "SP3D2")
#: Column ranges of the atom features, in order (widths 25, 6, 5, 6, 1, 5).
ATOM_FEATURE_SLICES = {
    "element": slice(0, len(ATOM_ELEMENTS) + 1),                       # one-hot ATOM_ELEMENTS + other
    "degree": slice(len(ATOM_ELEMENTS) + 1, len(ATOM_ELEMENTS) + 7),   # heavy-atom neighbours 0..5+
    "formal_charge": slice(len(ATOM_ELEMENTS) + 7, len(ATOM_ELEMENTS) + 12),   # <=-2, -1, 0, +1, >=+2
    "hybridization": slice(len(ATOM_ELEMENTS) + 12, len(ATOM_ELEMENTS) + 18),  # HYBRIDIZATIONS + other
    "aromatic": slice(len(ATOM_ELEMENTS) + 18, len(ATOM_ELEMENTS) + 19),
    "num_hs": slice(len(ATOM_ELEMENTS) + 19, len(ATOM_ELEMENTS) + 24),         # total H 0..4+
}
NUM_ATOM_FEATURES = len(ATOM_ELEMENTS) + 24


def _bracket_atom(body: str, smiles: str) -> Tuple[int, bool, int, bool, int]:
    """``(atomic number, is a plain [H], formal charge, aromatic, H count)`` of a bracket atom's content."""
    m = _BRACKET.match(body)
    if m is None:
        raise ValueError(f"smiles_to_edges(): bad bracket atom [{body}] in {smiles!r}")
    isotope, symbol, _, hydrogens, charge, _ = m.groups()
    num_h = 0 if not hydrogens else int(hydrogens[1:] or 1)
    if symbol == "*":
        return 0, False, _charge(charge), False, num_h
    z = _AROMATIC[symbol] if symbol[0].islower() else ATOMIC_NUMBER.get(symbol)
    if z is None:
        raise ValueError(f"smiles_to_edges(): unknown element {symbol!r} in {smiles!r}")
    return z, (z == 1 and not isotope and not charge), _charge(charge), symbol[0].islower(), num_h


_BOND_ORDER = {"-": 1.0, "=": 2.0, "#": 3.0, "$": 4.0, ":": 1.5, "/": 1.0, "\\": 1.0}
#: Normal valences of the organic subset (implicit hydrogens fill an atom up to the smallest one
#: that is >= its bond orders); aromatic atoms use their first valence and count one more bond.
_VALENCES = {5: (3,), 6: (4,), 7: (3, 5), 8: (2,), 15: (3, 5), 16: (2, 4, 6), 9: (1,), 17: (1,), 35: (1,), 53: (1,)}


@dataclass
class _Parsed:
    """What the built-in parser reads from a SMILES: per atom, and bonds with their orders."""

    atoms: List[int]
    charge: List[int]
    aromatic: List[bool]
    hydrogens: List[Optional[int]]        # a bracket atom's H count, None = implicit (organic subset)
    bonds: Dict[Tuple[int, int], float]   # (i, j), i < j -> order (1.5 = aromatic)


def _charge(text: Optional[str]) -> int:
    if not text:
        return 0
    sign = 1 if text[0] == "+" else -1
    return sign * (int(text[1:]) if text[1:].isdigit() else len(text))


def _parse_full(smiles: str) -> _Parsed:
    mol = _Parsed([], [], [], [], {})
    plain_h: List[int] = []
    branches: List[int] = []
    rings: Dict[int, Tuple[int, Optional[str]]] = {}
    prev: Optional[int] = None
    pending: Optional[str] = None          # a bond symbol waiting for its second atom or ring digit
    i, n = 0, len(smiles)

    def bond(a: int, b: int, symbol: Optional[str]) -> None:
        key = (min(a, b), max(a, b))
        if a == b or key in mol.bonds:
            raise ValueError(f"smiles_to_edges(): atom {a} bonded to {'itself' if a == b else 'atom %d twice' % b} in {smiles!r}")
        if symbol is None:
            order = 1.5 if mol.aromatic[a] and mol.aromatic[b] else 1.0
        else:
            order = _BOND_ORDER[symbol]
        mol.bonds[key] = order

    while i < n:
        ch = smiles[i]
        z, charge, aromatic, hydrogens = None, 0, False, None
        if ch == "[":
            end = smiles.find("]", i)
            if end < 0:
                raise ValueError(f"smiles_to_edges(): unclosed '[' at position {i} in {smiles!r}")
            z, is_h, charge, aromatic, hydrogens = _bracket_atom(smiles[i + 1:end], smiles)
            if is_h:
                plain_h.append(len(mol.atoms))
            i = end + 1
        elif ch in _ORGANIC:
            two = smiles[i:i + 2]
            if two in ("Cl", "Br"):
                z, i = _ORGANIC[two], i + 2
            else:
                z, i = _ORGANIC[ch], i + 1
        elif ch in _AROMATIC:
            z, aromatic, i = _AROMATIC[ch], True, i + 1
        elif ch == "*":
            z, i = 0, i + 1
        elif ch.isdigit() or ch == "%":
            if ch == "%":
                if smiles[i + 1:i + 2] == "(":
                    end = smiles.find(")", i)
                    num, i = smiles[i + 2:end], end + 1
                else:
                    num, i = smiles[i + 1:i + 3], i + 3
                if not num.isdigit():
                    raise ValueError(f"smiles_to_edges(): bad ring number %{num} in {smiles!r}")
            else:
                num, i = ch, i + 1
            if prev is None:
                raise ValueError(f"smiles_to_edges(): ring closure {num} without an atom in {smiles!r}")
            num = int(num)
            if num in rings:
                other, symbol = rings.pop(num)
                bond(other, prev, pending or symbol)
            else:
                rings[num] = (prev, pending)
            pending = None
            continue
        elif ch == "(":
            if prev is None:
                raise ValueError(f"smiles_to_edges(): branch without an atom in {smiles!r}")
            branches.append(prev)
            i += 1
            continue
        elif ch == ")":
            if not branches:
                raise ValueError(f"smiles_to_edges(): unmatched ')' in {smiles!r}")
            prev = branches.pop()
            i += 1
            continue
        elif ch == ".":
            prev, pending, i = None, None, i + 1
            continue
        elif ch in _BONDS:
            pending, i = ch, i + 1
            continue
        else:
            raise ValueError(f"smiles_to_edges(): unexpected character {ch!r} at position {i} in {smiles!r}")
        mol.atoms.append(z)
        mol.charge.append(charge)
        mol.aromatic.append(aromatic)
        mol.hydrogens.append(hydrogens)
        if prev is not None:
            bond(prev, len(mol.atoms) - 1, pending)
        prev, pending = len(mol.atoms) - 1, None
    if rings or branches or not mol.atoms:
        what = "unclosed ring(s) %s" % sorted(rings) if rings else "unclosed '('" if branches else "no atoms"
        raise ValueError(f"smiles_to_edges(): {what} in {smiles!r}")
    _fill_hydrogens(mol)
    if plain_h:  # drop [H] bonded to exactly one heavy atom, as RDKit's RemoveHs; it counts as that atom's H
        nbrs = {h: [b if a == h else a for a, b in mol.bonds if h in (a, b)] for h in plain_h}
        drop = {h for h, nb in nbrs.items() if len(nb) == 1 and mol.atoms[nb[0]] != 1}
        for h in drop:
            mol.hydrogens[nbrs[h][0]] += 1
        if drop:
            new = np.cumsum([k not in drop for k in range(len(mol.atoms))]) - 1
            keep = [k for k in range(len(mol.atoms)) if k not in drop]
            mol.atoms, mol.charge = [mol.atoms[k] for k in keep], [mol.charge[k] for k in keep]
            mol.aromatic, mol.hydrogens = [mol.aromatic[k] for k in keep], [mol.hydrogens[k] for k in keep]
            mol.bonds = {(int(new[a]), int(new[b])): o for (a, b), o in mol.bonds.items() if a not in drop and b not in drop}
    return mol


def _fill_hydrogens(mol: _Parsed) -> None:
    """Implicit H counts of organic-subset atoms (OpenSMILES): the smallest normal valence >= the
    sum of bond orders, minus that sum; an aromatic atom counts its aromatic bonds as single plus one."""
    total = [0.0] * len(mol.atoms)
    for (a, b), order in mol.bonds.items():
        for k in (a, b):
            total[k] += 1.0 if order == 1.5 and mol.aromatic[k] else order
    for k, z in enumerate(mol.atoms):
        if mol.hydrogens[k] is not None:
            continue
        valences = _VALENCES.get(z, ())
        if mol.aromatic[k]:
            valences, total[k] = valences[:1], total[k] + 1
        fit = [v for v in valences if v >= total[k]]
        mol.hydrogens[k] = int(fit[0] - total[k]) if fit else 0


def _parse(smiles: str) -> Tuple[List[int], List[Tuple[int, int]]]:
    mol = _parse_full(smiles)
    return mol.atoms, sorted(mol.bonds)


def _rdkit_mol(smiles: str):
    from rdkit import Chem  # noqa: PLC0415 - optional dependency

    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"smiles_to_edges(): RDKit cannot parse {smiles!r}")
    return mol


def _rdkit_edges(smiles: str):
    return _rdkit_edges_of(_rdkit_mol(smiles))


def _rdkit_atoms(smiles: str):
    """``(atoms, bonds, charge, hybridisation code, aromatic, total H)`` of RDKit's molecule."""
    mol = _rdkit_mol(smiles)
    atoms, pairs = _rdkit_edges_of(mol)
    codes = _hybridization_codes()
    info = [(a.GetFormalCharge(), codes.get(str(a.GetHybridization()), len(HYBRIDIZATIONS)), a.GetIsAromatic(),
             a.GetTotalNumHs()) for a in mol.GetAtoms()]
    charge, hybrid, aromatic, hydrogens = zip(*info)
    return atoms, pairs, charge, hybrid, aromatic, hydrogens


def _rdkit_edges_of(mol):
    atoms = [a.GetAtomicNum() for a in mol.GetAtoms()]
    pairs = ((b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds())
    return atoms, sorted((min(a, b), max(a, b)) for a, b in pairs)


def _hybridization_codes() -> Dict[str, int]:
    return {name: k for k, name in enumerate(HYBRIDIZATIONS)}


def _have_rdkit() -> bool:
    try:
        import rdkit  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def smiles_to_edges(smiles: str, *, backend: str = "auto") -> Tuple[List[int], List[Tuple[int, int]]]:
    """Heavy atoms and bonds of a SMILES string.

    Args:
        smiles: the SMILES string (``.`` separates fragments, which stay disconnected).
        backend: ``"auto"`` (RDKit when importable, else the built-in parser), ``"rdkit"`` or ``"builtin"``.

    Returns:
        ``(atomic_numbers, bonds)``: atoms in SMILES order; each bond once as ``(i, j)`` with
        ``i < j``, sorted.

    Example:
        >>> smiles_to_edges("CC(=O)O", backend="builtin")
        ([6, 6, 8, 8], [(0, 1), (1, 2), (1, 3)])
    """
    check(isinstance(smiles, str), "smiles_to_edges", f"smiles must be a str, got {type(smiles).__name__}")
    check(backend in ("auto", "rdkit", "builtin"), "smiles_to_edges", f"backend must be auto, rdkit or builtin, got {backend!r}")
    smiles = smiles.strip()
    if backend == "rdkit" or (backend == "auto" and _have_rdkit()):
        check(backend == "auto" or _have_rdkit(), "smiles_to_edges", "backend='rdkit' needs RDKit (pip install rdkit)")
        return _rdkit_edges(smiles)
    return _parse(smiles)


@dataclass
class MoleculeBatch:
    """Molecules as one block-diagonal graph with atom features and (partly unknown) task labels.

    Shapes:
        graph: N atoms, E directed bond edges (each bond both ways), ptr [G + 1];
        x: [N, F] float32; y: [G, T] float32 (NaN where unknown); y_mask: [G, T] bool (True = known).
    """

    graph: Graph
    x: Tensor
    y: Tensor
    y_mask: Tensor
    tasks: List[str]
    smiles: List[str]


def _one_hot(x: np.ndarray, rows: np.ndarray, columns: slice, index: Optional[np.ndarray]) -> None:
    """Set ``x[rows, columns.start + index]`` (entries < 0 = unknown: left zero)."""
    if index is None:
        return
    index = np.asarray(index, dtype=np.int64)
    known = index >= 0
    x[rows[known], columns.start + index[known]] = 1.0


def atom_features(atomic_numbers: np.ndarray, degree: np.ndarray, formal_charge: Optional[np.ndarray] = None,
                  hybridization: Optional[np.ndarray] = None, aromatic: Optional[np.ndarray] = None,
                  num_hs: Optional[np.ndarray] = None) -> Tensor:
    """Atom features as in DeepChem's ``ConvMolFeaturizer`` (ChemGCN), one-hot blocks in this order
    (:data:`ATOM_FEATURE_SLICES`, :data:`NUM_ATOM_FEATURES` = 48 columns):

    ======================  =====  ==============================================================
    block                   width  columns
    ======================  =====  ==============================================================
    element                 25     :data:`ATOM_ELEMENTS` (24 common elements), then "other"
    degree                  6      heavy-atom neighbours 0, 1, 2, 3, 4, 5 or more
    formal charge           5      -2 or less, -1, 0, +1, +2 or more
    hybridisation           6      :data:`HYBRIDIZATIONS` (SP .. SP3D2), then "other"
    aromatic                1      1 for an aromatic atom
    total hydrogens         5      0, 1, 2, 3, 4 or more (implicit + explicit)
    ======================  =====  ==============================================================

    A block whose argument is ``None`` (or an entry < 0 in ``hybridization``) stays zero: the
    built-in SMILES parser gives no hybridisation, so its rows have zeros there and the same width.

    Shapes:
        every argument: [N] -> [N, NUM_ATOM_FEATURES] float32.
    """
    atomic_numbers = np.asarray(atomic_numbers, dtype=np.int64)
    column = np.full(119, len(ATOM_ELEMENTS), dtype=np.int64)
    column[[ATOMIC_NUMBER[s] for s in ATOM_ELEMENTS]] = np.arange(len(ATOM_ELEMENTS))
    x = np.zeros((atomic_numbers.size, NUM_ATOM_FEATURES), dtype=np.float32)
    rows = np.arange(atomic_numbers.size)
    blocks = ATOM_FEATURE_SLICES
    _one_hot(x, rows, blocks["element"], column[np.clip(atomic_numbers, 0, 118)])
    _one_hot(x, rows, blocks["degree"], np.minimum(np.asarray(degree, dtype=np.int64), 5))
    if formal_charge is not None:
        _one_hot(x, rows, blocks["formal_charge"], np.clip(np.asarray(formal_charge, dtype=np.int64), -2, 2) + 2)
    _one_hot(x, rows, blocks["hybridization"], hybridization)
    if aromatic is not None:
        x[:, blocks["aromatic"].start] = np.asarray(aromatic, dtype=np.float32)
    if num_hs is not None:
        _one_hot(x, rows, blocks["num_hs"], np.minimum(np.asarray(num_hs, dtype=np.int64), 4))
    return torch.from_numpy(x)


def _molecule(smiles: str, use_rdkit: bool):
    """``(atoms, bonds, charge, hybridisation code or -1, aromatic, total H)`` of one SMILES."""
    if use_rdkit:
        return _rdkit_atoms(smiles)
    mol = _parse_full(smiles.strip())
    return mol.atoms, sorted(mol.bonds), mol.charge, [-1] * len(mol.atoms), mol.aromatic, mol.hydrogens


def _read_rows(path: Path) -> List[List[str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="", encoding="utf-8-sig") as f:
        return [row for row in csv.reader(f)]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _numeric_columns(rows: List[List[str]], columns: Sequence[int]) -> List[int]:
    """The columns whose every non-blank value is a number (MoleculeNet tasks; ids and names are not)."""
    return [c for c in columns if all(not r[c].strip() or _is_number(r[c]) for r in rows if len(r) > c)]


def load_molecules(csv_path, smiles_column: Optional[str] = None,
                   task_columns: Optional[Sequence[str]] = None, *, backend: str = "auto") -> MoleculeBatch:
    """Read a MoleculeNet-style CSV (a SMILES column and task columns; blank = unknown label).

    Each molecule becomes a graph of its heavy atoms, every bond as two directed edges, with the
    atom features of :func:`atom_features`.  With RDKit (``backend="rdkit"``, or ``"auto"`` when
    it is installed) every block is filled; the built-in parser (``"builtin"``) fills element,
    degree, formal charge (bracket atoms), aromaticity (lower-case atoms) and total hydrogens
    (a bracket atom's ``H`` count; for the organic subset, OpenSMILES' implicit hydrogens from
    the normal valences) and leaves hybridisation zero: the same width either way.

    Args:
        csv_path: the CSV file (header row first; ``.csv.gz`` is read too).
        smiles_column: default: the column named ``smiles`` (any case), else the first column.
        task_columns: default: every other column whose values are all numbers or blank (an id
            or name column of text is left out).
        backend: passed to :func:`smiles_to_edges`.

    Returns:
        :class:`MoleculeBatch` of the molecules that parse; the others are skipped with one warning.

    Shapes:
        G molecules, T tasks -> graph with ptr [G + 1]; x: [N, NUM_ATOM_FEATURES]; y, y_mask: [G, T].
    """
    fn, path = "load_molecules", Path(csv_path)
    check(path.is_file(), fn, f"{path} does not exist or is not a file")
    check(backend in ("auto", "rdkit", "builtin"), fn, f"backend must be auto, rdkit or builtin, got {backend!r}")
    check(backend != "rdkit" or _have_rdkit(), fn, "backend='rdkit' needs RDKit (pip install rdkit)")
    use_rdkit = backend == "rdkit" or (backend == "auto" and _have_rdkit())
    rows = _read_rows(path)
    check(len(rows) >= 1 and len(rows[0]) >= 1, fn, f"{path} has no header row")
    header = [h.strip() for h in rows[0]]
    if smiles_column is None:
        lower = [h.lower() for h in header]
        smiles_column = header[lower.index("smiles")] if "smiles" in lower else header[0]
    check(smiles_column in header, fn, f"no column {smiles_column!r} in {path} (columns: {', '.join(header)})")
    s_col = header.index(smiles_column)
    if task_columns is None:
        t_cols = _numeric_columns(rows[1:], [c for c in range(len(header)) if c != s_col])
        tasks = [header[c] for c in t_cols]
    else:
        tasks = list(task_columns)
        missing = [t for t in tasks if t not in header]
        check(not missing, fn, f"no task column(s) {', '.join(missing)} in {path}")
        t_cols = [header.index(t) for t in tasks]

    src: List[int] = []
    dst: List[int] = []
    parts: List[List] = [[], [], [], [], []]       # atomic number, charge, hybridisation, aromatic, H
    ptr, labels, kept, failed = [0], [], [], 0
    with _quiet_rdkit(use_rdkit):
        for line, row in enumerate(rows[1:], start=2):
            if not row:
                continue
            check(len(row) == len(header), fn, f"line {line} has {len(row)} fields, the header {len(header)}")
            try:
                atoms, bonds, charge, hybrid, aromatic, hydrogens = _molecule(row[s_col], use_rdkit)
            except ValueError:
                failed += 1
                continue
            try:
                labels.append([float(row[c]) if row[c].strip() else math.nan for c in t_cols])
            except ValueError as exc:
                raise ValueError(f"{fn}(): line {line}: a task value is not a number ({exc})") from exc
            off = ptr[-1]
            for a, b in bonds:
                src += (a + off, b + off)
                dst += (b + off, a + off)
            for part, values in zip(parts, (atoms, charge, hybrid, aromatic, hydrogens)):
                part += values
            ptr.append(off + len(atoms))
            kept.append(row[s_col].strip())
    if failed:
        warnings.warn(f"{fn}(): skipped {failed} of {failed + len(kept)} molecules whose SMILES could not be parsed",
                      stacklevel=2)
    check(len(kept) > 0, fn, f"no molecule in {path} could be parsed")
    n = ptr[-1]
    target, source = torch.tensor(dst, dtype=torch.int64), torch.tensor(src, dtype=torch.int64)
    rowptr, col, _ = coo_to_csr(target, source, n)
    graph = Graph(rowptr, col, None, n, ptr=torch.tensor(ptr, dtype=torch.int64))
    z, charge, hybrid, aromatic, hydrogens = (np.asarray(p, dtype=np.int64) for p in parts)
    x = atom_features(z, np.diff(rowptr.numpy()), charge, hybrid, aromatic, hydrogens)
    y = torch.tensor(labels, dtype=torch.float32).reshape(len(kept), len(tasks))
    return MoleculeBatch(graph, x, y, ~torch.isnan(y), tasks, kept)


@contextlib.contextmanager
def _quiet_rdkit(active: bool):
    """RDKit's per-molecule error log off (the skipped molecules are counted in one warning)."""
    if not active:
        yield
        return
    from rdkit import RDLogger  # noqa: PLC0415 - optional dependency

    RDLogger.DisableLog("rdApp.*")
    try:
        yield
    finally:
        RDLogger.EnableLog("rdApp.*")
