"""Splits of graph-level datasets: random, Bemis-Murcko scaffold (molecules), stratified k-fold.

Every split returns int64 index tensors into the dataset's graphs (sorted within each part)
and is deterministic: the random ones for a given ``seed`` (a ``torch.Generator``), the
scaffold split for a given list of SMILES.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from .._checks import check
from .molecules import _have_rdkit, _quiet_rdkit

__all__ = ["random_split", "scaffold_split", "murcko_scaffold", "stratified_kfold"]


def _check_fractions(fn: str, fractions: Sequence[float]) -> Tuple[float, float, float]:
    check(len(fractions) == 3 and all(f >= 0 for f in fractions), fn,
          f"fractions must be three non-negative numbers (train, valid, test), got {tuple(fractions)}")
    check(abs(sum(fractions) - 1.0) < 1e-6, fn, f"fractions must add up to 1, got {sum(fractions)}")
    return tuple(float(f) for f in fractions)


def random_split(num_graphs: int, fractions: Sequence[float] = (0.8, 0.1, 0.1),
                 seed: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """A random permutation cut into train / valid / test (``int(f * n)`` for train and valid,
    the rest test).

    Shapes:
        -> (train [n_train], valid [n_valid], test [n_test]) int64, each sorted.
    """
    fn = "random_split"
    check(num_graphs >= 0, fn, f"num_graphs must be >= 0, got {num_graphs}")
    f_train, f_valid, _ = _check_fractions(fn, fractions)
    perm = torch.randperm(num_graphs, generator=torch.Generator().manual_seed(seed))
    n_train, n_valid = int(f_train * num_graphs), int(f_valid * num_graphs)
    parts = perm[:n_train], perm[n_train:n_train + n_valid], perm[n_train + n_valid:]
    return tuple(p.sort().values for p in parts)


def murcko_scaffold(smiles: str) -> str:
    """The Bemis-Murcko scaffold of a molecule as canonical SMILES (RDKit's ``MurckoScaffold``,
    chirality ignored, as DeepChem); ``""`` for a molecule without rings.

    Raises:
        ValueError: RDKit is missing or cannot parse ``smiles``.
    """
    try:
        from rdkit import Chem  # noqa: PLC0415 - optional dependency
        from rdkit.Chem.Scaffolds import MurckoScaffold  # noqa: PLC0415
    except ImportError:
        raise ValueError("murcko_scaffold(): needs RDKit (pip install 'sparsegnn[chem]')") from None
    mol = Chem.MolFromSmiles(smiles)
    check(mol is not None, "murcko_scaffold", f"RDKit cannot parse {smiles!r}")
    return MurckoScaffold.MurckoScaffoldSmiles(mol=mol, includeChirality=False)


def scaffold_split(smiles: Sequence[str], fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> Tuple[Tensor, Tensor, Tensor]:
    """DeepChem's scaffold split: molecules grouped by Bemis-Murcko scaffold, groups sorted by size
    (largest first; among equal sizes, the group whose first molecule comes later first) and
    dealt in that order: a group goes to train unless that would take train past
    ``fractions[0] * n``, then to valid unless that would take train + valid past
    ``(fractions[0] + fractions[1]) * n``, else to test.  A scaffold never spans two parts, so
    valid and test hold scaffolds train has not seen.  Deterministic (no seed).

    A SMILES RDKit cannot parse is a group of its own (keyed by the SMILES).  Needs RDKit.

    Shapes:
        smiles: G strings -> (train, valid, test) int64 indices into ``smiles``, each sorted.
    """
    fn = "scaffold_split"
    f_train, f_valid, _ = _check_fractions(fn, fractions)
    groups: Dict[str, List[int]] = defaultdict(list)
    check(_have_rdkit(), fn, "needs RDKit (pip install 'sparsegnn[chem]')")
    with _quiet_rdkit(True):
        for i, s in enumerate(smiles):
            try:
                key = murcko_scaffold(s)
            except ValueError:
                key = "unparsed:" + s
            groups[key].append(i)
    ordered = sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)
    n = len(smiles)
    train_cut, valid_cut = f_train * n, (f_train + f_valid) * n
    train: List[int] = []
    valid: List[int] = []
    test: List[int] = []
    for group in ordered:
        if len(train) + len(group) > train_cut:
            if len(train) + len(valid) + len(group) > valid_cut:
                test += group
            else:
                valid += group
        else:
            train += group
    return tuple(torch.tensor(sorted(p), dtype=torch.int64) for p in (train, valid, test))


def stratified_kfold(labels: Tensor, k: int = 10, seed: int = 0) -> List[Tuple[Tensor, Tensor]]:
    """``k`` folds with the class proportions of ``labels`` in each: every class's graphs are
    shuffled (``torch.Generator`` seeded by ``seed``), the classes laid one after another and
    graph ``j`` of that sequence goes to fold ``j mod k``.  Each fold's size and class counts
    are within one of ``n / k`` and ``n_c / k``.

    Returns:
        ``[(train, test)] * k``: fold ``i``'s test graphs and the other folds' graphs, int64, sorted;
        the test parts partition ``range(n)``.

    Shapes:
        labels: [G] integer class ids.
    """
    fn = "stratified_kfold"
    check(isinstance(labels, Tensor) and labels.dim() == 1 and not labels.is_floating_point(), fn,
          f"labels must be a 1-D integer tensor, got {getattr(labels, 'shape', type(labels).__name__)}")
    n = labels.numel()
    check(2 <= k <= max(n, 2), fn, f"k must be in [2, number of graphs = {n}], got {k}")
    labels = labels.cpu()
    generator = torch.Generator().manual_seed(seed)
    order = []
    for c in labels.unique().tolist():
        members = (labels == c).nonzero().flatten()
        order.append(members[torch.randperm(members.numel(), generator=generator)])
    order = torch.cat(order)
    fold = torch.empty(n, dtype=torch.int64)
    fold[order] = torch.arange(n) % k
    everything = torch.arange(n)
    return [(everything[fold != i], everything[fold == i]) for i in range(k)]
