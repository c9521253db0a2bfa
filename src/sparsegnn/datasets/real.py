"""Readers for the graph formats users have: plain ``.npz`` arrays, SNAP edge lists,
Matrix Market files and TU collections as one batched graph.

Edge direction. An edge ``src -> dst`` is Graph row ``dst`` (the target), column ``src``, as
everywhere in the library. Every error is a ``ValueError("fn(): what is wrong")``.
"""
from __future__ import annotations

import gzip
import re
import zipfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .._checks import check, check_count
from ..formats.csr import coo_to_csr
from ..graph import Graph
from .tu import MAX_DENSE, _bad_line, _graph_count, _read_members, one_hot_labels


@dataclass
class RealGraph:
    """A real graph with what its file holds besides the structure.

    Shapes:
        y: [N] int64 node labels or None; x: [N, F] float32 dense node features or None;
        graph_y: [B] int64 graph labels or None (then ``graph.ptr`` is [B + 1]).
    """

    name: str
    graph: Graph
    y: Optional[Tensor] = None
    x: Optional[Tensor] = None
    graph_y: Optional[Tensor] = None


# ---------------------------------------------------------------- shared helpers
def _read_text(path: Path, fn: str) -> str:
    check(path.is_file(), fn, f"{path} does not exist or is not a file")
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":  # gzip magic, whatever the suffix
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{fn}(): {path} is not a valid gzip file ({exc})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{fn}(): {path} is not a UTF-8 text file") from exc


_BLANK_LINE = re.compile(r"\n[ \t\r]*\n")


def _data_text(text: str, comment: str) -> Tuple[str, int]:
    """``text`` without comment and blank lines, and its line count.

    Leading comment lines (SNAP and Matrix Market headers) are peeled off directly; the regex
    pass over every line runs only when comment or blank lines remain further down.
    """
    pos = 0
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line = text[pos:end].strip()
        if line and not line.startswith(comment):
            break
        pos = end + 1
    text = text[pos:].rstrip()
    if comment in text or _BLANK_LINE.search(text):
        text = re.sub(rf"(?m)^[ \t\r]*(?:{re.escape(comment)}.*)?(?:\n|\Z)", "", text).rstrip()
    return text, text.count("\n") + 1 if text else 0


def _blank_size_line(rest: str) -> str:
    """A Matrix Market body (after the header line) with its size line emptied, so the entry
    lines keep their line numbers when searched for a bad one."""
    lines = rest.split("\n")
    for k, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith("%"):
            lines[k] = ""
            break
    return "\n".join(lines)


def _numbers(text: str, nlines: int, ncols: int, dtype, fn: str, what: str,
             source: Optional[Tuple[str, str]] = None) -> np.ndarray:
    """Parse whitespace-separated numbers (``np.fromstring``: C speed) into ``[nlines, ncols]``.

    Floats must be finite (a NaN or infinite weight is a damaged file, not a weight).
    ``source``: the file's text as read and its comment marker, searched on failure for the
    line to name in the message."""
    def fail(problem: str, finite: bool = False):
        where = _bad_line(*source, ncols, dtype, finite) if source is not None else ""
        return ValueError(f"{fn}(): {what}{where or ': ' + problem}")

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy < 2.3 only warns on unparsable text
        try:
            flat = np.fromstring(text, dtype=dtype, sep=" ")
        except (ValueError, DeprecationWarning):
            raise fail(f"contains a token that is not a valid {'integer' if dtype == np.int64 else 'number'}") from None
    if flat.size != nlines * ncols:
        raise fail(f"expected {ncols} columns on each of {nlines} lines, got {flat.size} numbers in all")
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        raise fail("contains a NaN or infinite value", finite=True)
    return flat.reshape(nlines, ncols)


def _table(text: str, fn: str, what: str, dtype, delimiter: Optional[str] = ",", comment: str = "#") -> np.ndarray:
    """A numeric table with the column count of its first data line; ``delimiter`` or whitespace separated."""
    if delimiter is not None and delimiter.strip():
        text = text.replace(delimiter, " ")
    source = text
    text, nlines = _data_text(text, comment)
    if not nlines:
        return np.zeros((0, 0), dtype=dtype)
    return _numbers(text, nlines, len(text.partition("\n")[0].split()), dtype, fn, what, (source, comment))


def _as_ids(values: np.ndarray, fn: str, what: str) -> np.ndarray:
    ids = values.astype(np.int64)
    check(bool((ids == values).all()), fn, f"{what} must be integers")
    return ids


def _csr_graph(target: np.ndarray, source: np.ndarray, num_nodes: int, values: Optional[np.ndarray] = None,
               ptr: Optional[np.ndarray] = None) -> Graph:
    """Graph with rows sorted by (target, source), stably (``formats.csr.coo_to_csr``)."""
    rowptr, col, perm = coo_to_csr(torch.from_numpy(target), torch.from_numpy(source), num_nodes)
    val = None if values is None else torch.from_numpy(values)[perm]
    return Graph(rowptr, col, val, num_nodes, ptr=None if ptr is None else torch.from_numpy(ptr.astype(np.int64)))


# ---------------------------------------------------------------- npz
def read_npz_graph(path) -> RealGraph:
    """Read a graph in the ``real/`` ``.npz`` layout (plain arrays, no pickles).

    Arrays: ``src``, ``dst`` (edges ``src -> dst``), ``num_nodes``, optional ``y`` (node labels),
    ``x_indptr, x_indices, x_data, x_shape`` (CSR node features), ``graph_ptr`` and ``graph_y``
    (a batch of graphs). The Graph keeps the file's node order; within each row the columns
    keep the file's edge order.

    Args:
        path: the ``.npz`` file; its stem becomes the name.

    Returns:
        :class:`RealGraph` (``graph.ptr`` set from ``graph_ptr`` when present).

    Shapes:
        src, dst: [E] -> graph with N nodes, E edges; x: [N, F] float32; y: [N]; graph_y: [B].
    """
    fn, path = "read_npz_graph", Path(path)
    check(path.is_file(), fn, f"{path} does not exist or is not a file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = dict(npz)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{fn}(): cannot read {path} as a plain npz ({exc})") from exc
    missing = [k for k in ("src", "dst", "num_nodes") if k not in arrays]
    check(not missing, fn, f"{path} lacks array(s) {', '.join(missing)}")
    for key in ("src", "dst", "num_nodes"):
        check(arrays[key].dtype.kind in "iu", fn, f"{path}: {key} must hold integers, got dtype {arrays[key].dtype}")
    check(arrays["num_nodes"].size == 1, fn, f"{path}: num_nodes must hold one integer, got {arrays['num_nodes'].size}")
    src, dst = (arrays[k].astype(np.int64).ravel() for k in ("src", "dst"))
    n = check_count(arrays["num_nodes"].reshape(-1)[0], fn, f"num_nodes of {path}")
    check(src.shape == dst.shape, fn, f"src has {src.size} entries but dst has {dst.size}")
    lo, hi = (int(min(src.min(), dst.min())), int(max(src.max(), dst.max()))) if src.size else (0, -1)
    check(lo >= 0 and hi < n, fn, f"edge ids must lie in [0, {n}), got {lo}..{hi}")
    if src.size and not bool((dst[1:] >= dst[:-1]).all()):  # tolerate unsorted files
        order = np.argsort(dst, kind="stable")
        src, dst = src[order], dst[order]
    rowptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=rowptr[1:])
    graph = Graph.from_csr(torch.from_numpy(rowptr), torch.from_numpy(src), None, n)
    if "graph_ptr" in arrays:
        ptr = arrays["graph_ptr"].astype(np.int64)
        check(ptr.ndim == 1 and ptr.size >= 1 and ptr[0] == 0 and ptr[-1] == n and bool((np.diff(ptr) >= 0).all()), fn,
              f"graph_ptr must be non-decreasing from 0 to num_nodes={n}")
        graph.ptr = torch.from_numpy(ptr)

    def labels(key: str, size: int, what: str) -> Optional[Tensor]:
        if key not in arrays:
            return None
        check(arrays[key].ndim >= 1 and arrays[key].shape[0] == size, fn,
              f"{path}: {key} has {arrays[key].shape[:1]} entries for {size} {what}")
        return torch.from_numpy(arrays[key])

    y = labels("y", n, "nodes")
    graph_y = None if graph.ptr is None else labels("graph_y", graph.ptr.numel() - 1, "graphs")
    x = None
    if "x_indptr" in arrays:
        missing = [k for k in ("x_indices", "x_data", "x_shape") if k not in arrays]
        check(not missing, fn, f"x_indptr present but {', '.join(missing)} missing")
        check(arrays["x_shape"].dtype.kind in "iu" and arrays["x_shape"].size == 2, fn,
              f"{path}: x_shape must hold two integers, got {arrays['x_shape'].size} of dtype {arrays['x_shape'].dtype}")
        rows, cols = (check_count(v, fn, f"x_shape of {path}") for v in arrays["x_shape"].ravel())
        check_count(rows * cols, fn, f"entries of the dense features of {path} (x_shape {rows} x {cols})", MAX_DENSE)
        indptr = np.asarray(arrays["x_indptr"], dtype=np.int64)
        indices = np.asarray(arrays["x_indices"], dtype=np.int64)
        check(rows == n and indptr.size == n + 1 and indptr[-1] == indices.size == arrays["x_data"].size, fn,
              f"sparse features (x_shape {rows}x{cols}, {indptr.size} indptr) do not match {n} nodes")
        check(indices.size == 0 or (indices.min() >= 0 and indices.max() < cols), fn, "x_indices out of range")
        dense = np.zeros((rows, cols), dtype=np.float32)
        dense[np.repeat(np.arange(rows), np.diff(indptr)), indices] = arrays["x_data"]
        x = torch.from_numpy(dense)
    return RealGraph(path.stem, graph, y, x, graph_y)


# ---------------------------------------------------------------- SNAP edge lists
def read_edge_list(path, *, directed: bool = True, num_nodes: Optional[int] = None, relabel: bool = False,
                   delimiter: Optional[str] = None) -> Graph:
    """Read a SNAP-style edge list: one ``source target [weight]`` per line.

    ``#`` lines are comments; columns are separated by whitespace or commas (or ``delimiter``);
    ``.gz`` files (any gzip file) are decompressed transparently.

    Args:
        path: the text file.
        directed: False stores every edge in both directions (self loops once). Files that
            already list both directions should be read with ``directed=True``.
        num_nodes: node count (default: max id + 1, or the number of distinct ids with ``relabel``).
        relabel: map arbitrary integer ids to ``0..n-1`` in sorted id order.
        delimiter: column separator besides whitespace (default: a comma).

    Returns:
        :class:`~sparsegnn.Graph` with ``edge_val`` = the weights (float32) when a third column
        exists, rows sorted by (target, source).

    Shapes:
        E lines -> Graph with E edges (directed) or 2E - loops edges (undirected).
    """
    fn, path = "read_edge_list", Path(path)
    raw = _read_text(path, fn)
    text, nlines = _data_text(raw.replace(delimiter if delimiter is not None else ",", " "), "#")
    first = text.partition("\n")[0]
    ncols = len(first.split()) if nlines else 2
    check(ncols in (2, 3), fn, f"expected 2 or 3 columns (source target [weight]), got {ncols}: {first[:80]!r}")
    source = (raw.replace(delimiter if delimiter is not None else ",", " "), "#")
    if ncols == 2:
        ids, weight = _numbers(text, nlines, 2, np.int64, fn, str(path), source), None
    else:
        table = _numbers(text, nlines, 3, np.float64, fn, str(path), source)
        ids, weight = _as_ids(table[:, :2], fn, f"node ids of {path}"), table[:, 2].astype(np.float32)
    src, dst = ids[:, 0].copy(), ids[:, 1].copy()
    if relabel:
        uniq, inverse = np.unique(ids, return_inverse=True)
        inverse = inverse.reshape(ids.shape)
        src, dst = inverse[:, 0].astype(np.int64), inverse[:, 1].astype(np.int64)
        count = uniq.size
    else:
        check(ids.size == 0 or int(ids.min()) >= 0, fn, f"negative node id {int(ids.min()) if ids.size else 0} (use relabel=True)")
        count = check_count(int(ids.max()) + 1 if ids.size else 0, fn, f"node count of {path} (largest id + 1)")
    num_nodes = count if num_nodes is None else check_count(num_nodes, fn, "num_nodes")
    check(int(num_nodes) >= count, fn, f"num_nodes={num_nodes} but the file has {'distinct ids' if relabel else 'ids up to'} {count if relabel else count - 1}")
    if not directed:
        other = src != dst
        src, dst = np.concatenate([src, dst[other]]), np.concatenate([dst, src[other]])
        if weight is not None:
            weight = np.concatenate([weight, weight[other]])
    return _csr_graph(dst, src, int(num_nodes), weight)


# ---------------------------------------------------------------- Matrix Market
def read_matrix_market(path) -> Graph:
    """Read a coordinate Matrix Market file (``.mtx``, optionally gzipped) as a Graph.

    Entry ``(i, j, v)`` (1-based) becomes row ``i - 1``, column ``j - 1``, value ``v``: ``A[i, j]``
    is the weight of edge ``j -> i``, as in :meth:`Graph.from_scipy`. Symmetric files are
    expanded to both triangles (diagonal entries once). Fields ``pattern`` (no values),
    ``real`` and ``integer`` (float32 values) are supported; the matrix must be square.

    Shapes:
        nnz entries (general) -> Graph with nnz edges, rows sorted by column.
    """
    fn, path = "read_matrix_market", Path(path)
    text = _read_text(path, fn)
    head, _, rest = text.partition("\n")
    header = head.split()
    check(len(header) == 5 and header[0].lower() == "%%matrixmarket" and header[1].lower() == "matrix", fn,
          f"{path} does not start with a '%%MatrixMarket matrix ...' header")
    layout, field, symmetry = (h.lower() for h in header[2:])
    check(layout == "coordinate", fn, f"only coordinate files are supported, got {layout!r}")
    check(field in ("pattern", "real", "integer"), fn, f"field must be pattern, real or integer, got {field!r}")
    check(symmetry in ("general", "symmetric"), fn, f"symmetry must be general or symmetric, got {symmetry!r}")
    body, nlines = _data_text(rest, "%")
    check(nlines >= 1, fn, "missing the 'rows cols entries' size line")
    size_line, _, body = body.partition("\n")
    size = size_line.split()
    check(len(size) == 3 and all(s.isdigit() for s in size), fn, f"bad size line {size_line!r}")
    rows, cols, nnz = (int(s) for s in size)
    check_count(rows, fn, f"row count on the size line of {path}")
    check_count(cols, fn, f"column count on the size line of {path}")
    check(rows == cols, fn, f"matrix must be square, got {rows} x {cols}")
    check(nlines - 1 == nnz, fn, f"size line announces {nnz} entries, file has {nlines - 1}")
    ncols = 2 if field == "pattern" else 3
    table = _numbers(body, nnz, ncols, np.int64 if field != "real" else np.float64, fn, f"entries of {path}",
                     ("\n" + _blank_size_line(rest), "%"))
    ij = _as_ids(table[:, :2], fn, f"row and column indices of {path}") - 1
    check(ij.size == 0 or (ij.min() >= 0 and ij.max() < rows), fn, f"{path}: indices must lie in 1..{rows}")
    i, j = ij[:, 0].copy(), ij[:, 1].copy()
    values = table[:, 2].astype(np.float32) if ncols == 3 else None
    if symmetry == "symmetric":
        off = i != j
        i, j = np.concatenate([i, j[off]]), np.concatenate([j, i[off]])
        values = None if values is None else np.concatenate([values, values[off]])
    return _csr_graph(i, j, rows, values)


# ---------------------------------------------------------------- TU as one batch
def load_tu_batch(path) -> RealGraph:
    """Read a TU collection (zip or directory) as ONE block-diagonal graph.

    Same node features and labels as :func:`~sparsegnn.datasets.load_tu` (attributes, then
    one-hot node labels, else a constant 1; graph labels shifted to start at 0), built
    straight from the arrays instead of one Graph per sample.

    Returns:
        :class:`RealGraph` with ``graph.ptr`` (graph ``b`` = nodes ``ptr[b]:ptr[b+1]``),
        ``x`` and ``graph_y``.

    Shapes:
        -> graph: N nodes, E edges, ptr [B + 1]; x: [N, F] float32; graph_y: [B] int64.
    """
    fn, path = "load_tu_batch", Path(path)
    check(path.exists(), fn, f"{path} does not exist")
    check(path.is_dir() or path.suffix == ".zip", fn, f"{path} is neither a directory nor a .zip file")
    name, members = path.stem, _read_members(path, fn)

    def table(suffix: str, dtype):
        data = members.get(f"{name}_{suffix}.txt")
        return None if data is None else _table(data.decode("utf-8"), fn, f"{name}_{suffix}.txt", dtype)

    for suffix in ("A", "graph_indicator", "graph_labels"):
        check(f"{name}_{suffix}.txt" in members, fn, f"{name}_{suffix}.txt not found in {path}")
    edges = table("A", np.int64) - 1
    edges = edges.reshape(0, 2) if edges.size == 0 else edges
    indicator = table("graph_indicator", np.int64)[:, 0] - 1
    labels = table("graph_labels", np.int64)[:, 0]
    n = indicator.size
    check(n > 0 and bool((np.diff(indicator) >= 0).all()) and indicator[0] == 0, fn,
          "graph_indicator must list graph ids 1.. in non-decreasing order")
    check(edges.shape[1] == 2 and (edges.size == 0 or (edges.min() >= 0 and edges.max() < n)), fn,
          f"{name}_A.txt must hold 'source, target' pairs within 1..{n}")
    num_graphs = _graph_count(indicator, fn, f"{name}_graph_indicator.txt")
    check(labels.size == num_graphs, fn, f"{labels.size} graph labels for {num_graphs} graphs")
    check(bool((indicator[edges[:, 0]] == indicator[edges[:, 1]]).all()), fn, "an edge joins two different graphs")
    feats = []
    attrs = table("node_attributes", np.float64)
    if attrs is not None:
        feats.append(attrs.astype(np.float32))
    node_labels = table("node_labels", np.int64)
    if node_labels is not None:
        feats.append(one_hot_labels(node_labels[:, 0], fn, f"{name}_node_labels.txt"))
    check(all(f.shape[0] == n for f in feats), fn, f"node attribute/label files must have {n} rows")
    x = np.concatenate(feats, axis=1) if feats else np.ones((n, 1), np.float32)
    ptr = np.zeros(num_graphs + 1, dtype=np.int64)
    np.cumsum(np.bincount(indicator, minlength=num_graphs), out=ptr[1:])
    graph = _csr_graph(edges[:, 1].copy(), edges[:, 0].copy(), n, ptr=ptr)
    return RealGraph(name, graph, None, torch.from_numpy(x), torch.from_numpy(labels - labels.min()))
