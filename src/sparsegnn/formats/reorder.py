"""Node orders that put neighbours close in the numbering (locality for tiles and caches).

Each function takes a square destination-major CSR and returns ``perm`` ([N] int64, on the
graph's device): new node ``i`` is old node ``perm[i]``.  Applying it is
``formats.reorder.permute_csr`` (or ``Graph.reorder``).

- ``degree``: by in-degree, largest first (hubs together; cheap, on the device).
- ``rcm``: reverse Cuthill-McKee on the symmetrised structure (scipy, on the host).
- ``metis``: METIS partitions of about 256 nodes (``pymetis``, on the host), nodes grouped by
  partition, by degree inside.
- ``lpa``: label-propagation communities on the device (a few rounds of "take the most
  frequent label among your neighbours", ties to the smaller label), nodes grouped by
  community, larger communities first, by degree inside: a Rabbit-order-like grouping
  without a host round trip per round.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from .csr import coo_to_csr, rowptr_to_row

__all__ = ["METHODS", "order", "permute_csr"]

METHODS = ("degree", "rcm", "metis", "lpa")

#: Nodes per METIS partition: a few tensor-core row windows' worth.
METIS_PART_NODES = 256


def _degree_order(rowptr: Tensor) -> Tensor:
    deg = rowptr[1:] - rowptr[:-1]
    return torch.argsort(-deg, stable=True)


def _rcm_order(rowptr: Tensor, col: Tensor) -> Tensor:
    try:
        import numpy as np
        import scipy.sparse as sp
        from scipy.sparse.csgraph import reverse_cuthill_mckee
    except ImportError as exc:  # pragma: no cover - scipy is a test dependency
        raise ValueError("reorder(): method='rcm' needs scipy (pip install scipy); or use 'degree' / 'lpa'") from exc
    n = rowptr.numel() - 1
    rows = rowptr_to_row(rowptr, col.numel()).cpu().numpy()
    cols = col.cpu().numpy()
    mat = sp.csr_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(n, n))
    mat = ((mat + mat.T) > 0).astype(np.int8).tocsr()
    perm = reverse_cuthill_mckee(mat, symmetric_mode=True)
    return torch.from_numpy(perm.astype(np.int64)).to(rowptr.device)


def metis_parts(parts: int, xadj, adjncy, **kwargs):
    """``pymetis.part_graph``'s part of each node, for a symmetric CSR (``xadj``, ``adjncy``:
    NumPy arrays); ``kwargs`` go to ``part_graph``.  The adjacency goes in as
    ``pymetis.CSRAdjacency`` where pymetis has it (>= 2025.2; the ``xadj``/``adjncy`` keywords
    are deprecated, to be removed in 2027)."""
    import pymetis

    if hasattr(pymetis, "CSRAdjacency"):
        return pymetis.part_graph(parts, pymetis.CSRAdjacency(xadj, adjncy), **kwargs)[1]
    return pymetis.part_graph(parts, xadj=xadj, adjncy=adjncy, **kwargs)[1]


def _metis_order(rowptr: Tensor, col: Tensor) -> Tensor:
    try:
        import numpy as np
        import pymetis  # noqa: F401 - the availability check; metis_parts uses it
    except ImportError as exc:
        raise ValueError("reorder(): method='metis' needs pymetis (pip install pymetis); or use 'rcm' / 'lpa'") from exc
    n = rowptr.numel() - 1
    parts = -(-n // METIS_PART_NODES)
    if parts <= 1:
        return _degree_order(rowptr)
    row = rowptr_to_row(rowptr, col.numel())
    keep = row != col
    src, dst = torch.cat([col[keep], row[keep]]), torch.cat([row[keep], col[keep]])   # symmetrised
    sym_ptr, sym_col, _ = coo_to_csr(dst, src, n)
    xadj = sym_ptr.cpu().numpy().astype(np.int64)
    adjncy = sym_col.cpu().numpy().astype(np.int64)
    membership = metis_parts(parts, xadj, adjncy)
    part = torch.as_tensor(np.asarray(membership, dtype=np.int64), device=rowptr.device)
    order = _degree_order(rowptr)
    return order[torch.argsort(part[order], stable=True)]


def _lpa_order(rowptr: Tensor, col: Tensor, rounds: int = 5) -> Tensor:
    n = rowptr.numel() - 1
    device = rowptr.device
    row = rowptr_to_row(rowptr, col.numel())
    # undirected, without self loops: labels flow both ways
    src = torch.cat([col, row])
    dst = torch.cat([row, col])
    keep = src != dst
    src, dst = src[keep], dst[keep]
    labels = torch.arange(n, device=device)
    span = max(n, 1)
    for _ in range(rounds):
        # count (node, neighbour label) pairs; each node takes its most frequent (smallest on ties)
        pairs, counts = torch.unique(dst * span + labels[src], return_counts=True)
        node, label = torch.div(pairs, span, rounding_mode="floor"), pairs % span
        # best per node: sort by (node, -count, label) and take the first of each node
        key = torch.argsort(label, stable=True)
        key = key[torch.argsort(-counts[key], stable=True)]
        key = key[torch.argsort(node[key], stable=True)]
        first = torch.ones(key.numel(), dtype=torch.bool, device=device)
        first[1:] = node[key][1:] != node[key][:-1]
        chosen = key[first]
        new = labels.clone()
        new[node[chosen]] = label[chosen]
        if torch.equal(new, labels):
            break
        labels = new
    size = torch.bincount(labels, minlength=n)
    deg = rowptr[1:] - rowptr[:-1]
    # larger communities first, then by community id, then by degree (largest first)
    order = torch.argsort(-deg, stable=True)
    order = order[torch.argsort(labels[order], stable=True)]
    return order[torch.argsort(-size[labels[order]], stable=True)]


def order(rowptr: Tensor, col: Tensor, method: str) -> Tensor:
    """The permutation ``perm`` of ``method`` (see the module doc): new node ``i`` = old ``perm[i]``.

    Shapes:
        rowptr: [N + 1]; col: [E] (square graph) -> perm: [N] int64.
    """
    if method == "degree":
        return _degree_order(rowptr)
    if method == "rcm":
        return _rcm_order(rowptr, col)
    if method == "metis":
        return _metis_order(rowptr, col)
    if method == "lpa":
        return _lpa_order(rowptr, col)
    raise ValueError(f"reorder(): method must be one of {METHODS}, got {method!r}")


def permute_csr(rowptr: Tensor, col: Tensor, perm: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """The CSR of the graph renumbered by ``perm`` (new node ``i`` = old ``perm[i]``) and the
    edge permutation: new CSR edge ``k`` is old CSR edge ``edge_perm[k]``.

    Shapes:
        rowptr: [N + 1]; col: [E]; perm: [N] -> rowptr' [N + 1], col' [E], edge_perm [E].
    """
    n = rowptr.numel() - 1
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n, device=perm.device)
    row = rowptr_to_row(rowptr, col.numel())
    return coo_to_csr(inverse[row], inverse[col], n)
