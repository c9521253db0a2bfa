"""Molecules from SMILES: heavy-atom graphs and MoleculeNet-style CSV files (e.g. Tox21).

``smiles_to_edges`` uses RDKit when it is installed and otherwise a small built-in SMILES
parser (organic subset, aromatic atoms, bracket atoms, branches, ring closures, bond symbols,
``.`` fragments). Both give the same heavy-atom graph: atoms in SMILES order, hydrogens
implicit (a plain ``[H]`` bonded to one heavy atom is dropped, as RDKit's ``RemoveHs`` does),
bonds as sorted ``(i, j)`` pairs with ``i < j``. The built-in parser checks syntax, not valence.
"""
from __future__ import annotations

import csv
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

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

#: Elements with their own one-hot column in the atom features (then "other", then degree 0..5+).
ATOM_ELEMENTS = ("C", "N", "O", "S", "F", "Cl", "Br", "I", "P", "B", "Si", "Se", "Na", "K", "Ca", "Mg",
                 "Zn", "Fe", "Cu", "Sn", "Hg", "As", "Al", "H")
NUM_ATOM_FEATURES = len(ATOM_ELEMENTS) + 1 + 6


def _bracket_atom(body: str, smiles: str) -> Tuple[int, bool]:
    """``(atomic number, is a plain [H])`` of a bracket atom's content."""
    m = _BRACKET.match(body)
    if m is None:
        raise ValueError(f"smiles_to_edges(): bad bracket atom [{body}] in {smiles!r}")
    isotope, symbol, _, _, charge, _ = m.groups()
    if symbol == "*":
        return 0, False
    z = _AROMATIC[symbol] if symbol[0].islower() else ATOMIC_NUMBER.get(symbol)
    if z is None:
        raise ValueError(f"smiles_to_edges(): unknown element {symbol!r} in {smiles!r}")
    return z, (z == 1 and not isotope and not charge)


def _parse(smiles: str) -> Tuple[List[int], List[Tuple[int, int]]]:
    atoms: List[int] = []
    plain_h: List[int] = []
    bonds = set()
    branches: List[int] = []
    rings = {}
    prev: Optional[int] = None
    i, n = 0, len(smiles)

    def bond(a: int, b: int) -> None:
        key = (min(a, b), max(a, b))
        if a == b or key in bonds:
            raise ValueError(f"smiles_to_edges(): atom {a} bonded to {'itself' if a == b else 'atom %d twice' % b} in {smiles!r}")
        bonds.add(key)

    while i < n:
        ch = smiles[i]
        z = None
        if ch == "[":
            end = smiles.find("]", i)
            if end < 0:
                raise ValueError(f"smiles_to_edges(): unclosed '[' at position {i} in {smiles!r}")
            z, is_h = _bracket_atom(smiles[i + 1:end], smiles)
            if is_h:
                plain_h.append(len(atoms))
            i = end + 1
        elif ch in _ORGANIC:
            two = smiles[i:i + 2]
            if two in ("Cl", "Br"):
                z, i = _ORGANIC[two], i + 2
            else:
                z, i = _ORGANIC[ch], i + 1
        elif ch in _AROMATIC:
            z, i = _AROMATIC[ch], i + 1
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
                bond(rings.pop(num), prev)
            else:
                rings[num] = prev
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
            prev, i = None, i + 1
            continue
        elif ch in _BONDS:
            i += 1
            continue
        else:
            raise ValueError(f"smiles_to_edges(): unexpected character {ch!r} at position {i} in {smiles!r}")
        atoms.append(z)
        if prev is not None:
            bond(prev, len(atoms) - 1)
        prev = len(atoms) - 1
    if rings or branches or not atoms:
        what = "unclosed ring(s) %s" % sorted(rings) if rings else "unclosed '('" if branches else "no atoms"
        raise ValueError(f"smiles_to_edges(): {what} in {smiles!r}")
    if plain_h:  # drop [H] bonded to exactly one heavy atom, as RDKit's RemoveHs
        nbrs = {h: [b if a == h else a for a, b in bonds if h in (a, b)] for h in plain_h}
        drop = {h for h, nb in nbrs.items() if len(nb) == 1 and atoms[nb[0]] != 1}
        if drop:
            new = np.cumsum([k not in drop for k in range(len(atoms))]) - 1
            atoms = [z for k, z in enumerate(atoms) if k not in drop]
            bonds = {(int(new[a]), int(new[b])) for a, b in bonds if a not in drop and b not in drop}
    return atoms, sorted(bonds)


def _rdkit_edges(smiles: str):
    from rdkit import Chem  # noqa: PLC0415 - optional dependency

    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"smiles_to_edges(): RDKit cannot parse {smiles!r}")
    atoms = [a.GetAtomicNum() for a in mol.GetAtoms()]
    pairs = ((b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds())
    return atoms, sorted((min(a, b), max(a, b)) for a, b in pairs)


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


def atom_features(atomic_numbers: np.ndarray, degree: np.ndarray) -> Tensor:
    """One-hot element over :data:`ATOM_ELEMENTS` + "other", then one-hot degree 0..5+.

    Shapes:
        atomic_numbers, degree: [N] -> [N, NUM_ATOM_FEATURES] float32.
    """
    column = np.full(119, len(ATOM_ELEMENTS), dtype=np.int64)
    column[[ATOMIC_NUMBER[s] for s in ATOM_ELEMENTS]] = np.arange(len(ATOM_ELEMENTS))
    x = np.zeros((atomic_numbers.size, NUM_ATOM_FEATURES), dtype=np.float32)
    rows = np.arange(atomic_numbers.size)
    x[rows, column[np.clip(atomic_numbers, 0, 118)]] = 1.0
    x[rows, len(ATOM_ELEMENTS) + 1 + np.minimum(degree, 5)] = 1.0
    return torch.from_numpy(x)


def load_molecules(csv_path, smiles_column: Optional[str] = None,
                   task_columns: Optional[Sequence[str]] = None, *, backend: str = "auto") -> MoleculeBatch:
    """Read a MoleculeNet-style CSV (a SMILES column and task columns; blank = unknown label).

    Args:
        csv_path: the CSV file (header row first).
        smiles_column: default: the column named ``smiles`` (any case), else the first column.
        task_columns: default: every other column.
        backend: passed to :func:`smiles_to_edges`.

    Returns:
        :class:`MoleculeBatch` of the molecules that parse; the others are skipped with one warning.

    Shapes:
        G molecules, T tasks -> graph with ptr [G + 1]; x: [N, F]; y, y_mask: [G, T].
    """
    fn, path = "load_molecules", Path(csv_path)
    check(path.is_file(), fn, f"{path} does not exist or is not a file")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    check(len(rows) >= 1 and len(rows[0]) >= 1, fn, f"{path} has no header row")
    header = [h.strip() for h in rows[0]]
    if smiles_column is None:
        lower = [h.lower() for h in header]
        smiles_column = header[lower.index("smiles")] if "smiles" in lower else header[0]
    check(smiles_column in header, fn, f"no column {smiles_column!r} in {path} (columns: {', '.join(header)})")
    s_col = header.index(smiles_column)
    tasks = [h for h in header if h != smiles_column] if task_columns is None else list(task_columns)
    missing = [t for t in tasks if t not in header]
    check(not missing, fn, f"no task column(s) {', '.join(missing)} in {path}")
    t_cols = [header.index(t) for t in tasks]

    z_all: List[int] = []
    src: List[int] = []
    dst: List[int] = []
    ptr, labels, kept, failed = [0], [], [], 0
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        check(len(row) == len(header), fn, f"line {line} has {len(row)} fields, the header {len(header)}")
        try:
            atoms, bonds = smiles_to_edges(row[s_col], backend=backend)
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
        z_all += atoms
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
    x = atom_features(np.asarray(z_all, dtype=np.int64), np.diff(rowptr.numpy()))
    y = torch.tensor(labels, dtype=torch.float32).reshape(len(kept), len(tasks))
    return MoleculeBatch(graph, x, y, ~torch.isnan(y), tasks, kept)
