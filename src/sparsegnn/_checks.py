"""Input validation shared by every layer of the library.

Every failure is a ``ValueError`` whose message starts with the public function's name,
e.g. ``ValueError("spmm(): x has 3 rows but the graph has 4 nodes")``.
"""
from __future__ import annotations

import numbers
from typing import Optional

import torch
from torch import Tensor

INDEX_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)


def check(cond: bool, fn: str, msg: str) -> None:
    """Raise ``ValueError(f"{fn}(): {msg}")`` unless ``cond`` holds."""
    if not cond:
        raise ValueError(f"{fn}(): {msg}")


#: ``precision=`` of the ops and layers: exact fp32 products, or tensor cores at tf32 / bf16.
PRECISIONS = ("ieee", "tf32", "bf16")


#: Largest node count (and, in the loaders, node id + 1 or label count) accepted from input.
#: Index tensors are int64 but the kernels address rows and columns with 32-bit indices, and a
#: graph of 2**31 nodes needs a 16 GiB ``rowptr`` before it holds one edge: a count above this
#: is a typo or a hostile file, refused before anything is allocated for it.
MAX_NODES = 2 ** 31 - 1


def check_count(value, fn: str, name: str, limit: int = MAX_NODES) -> int:
    """``value`` as a Python ``int`` if it is an integer in ``[0, limit]``, else ``ValueError``.

    Counts that size an allocation (``num_nodes``, ids read from files, label counts) go
    through here first, so a wrong or hostile value fails with a message instead of asking the
    allocator for terabytes.  Only integers pass: Python ints, numpy integers and one-element
    integer tensors; ``bool`` (an ``int`` subclass), floats (``3.7`` is not a node count, and
    ``3.0`` hides a unit mistake as well) and strings are refused rather than coerced.
    """
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.dtype not in INDEX_DTYPES:
            raise ValueError(f"{fn}(): {name} must be an integer, got a tensor of shape "
                             f"{tuple(value.shape)} and dtype {value.dtype}")
        value = value.item()
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not isinstance(value, numbers.Integral):
        raise ValueError(f"{fn}(): {name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < 0:
        raise ValueError(f"{fn}(): {name} must be >= 0, got {value}")
    if value > limit:
        raise ValueError(f"{fn}(): {name} = {value} exceeds the limit of {limit}")
    return value


def check_precision(fn: str, precision) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else ``ValueError(f"{fn}(): ...")``."""
    if precision not in PRECISIONS:
        raise ValueError(f"{fn}(): precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def check_tensor(obj, fn: str, name: str) -> None:
    if not isinstance(obj, Tensor):
        raise ValueError(f"{fn}(): {name} must be a torch.Tensor, got {type(obj).__name__}")


def check_index(index: Tensor, fn: str, name: str, upper: Optional[int] = None) -> None:
    """Integer dtype, no negatives, and (when ``upper`` is given) every entry < ``upper``."""
    check_tensor(index, fn, name)
    check(index.dtype in INDEX_DTYPES, fn, f"{name} must have an integer dtype, got {index.dtype}")
    if index.numel() == 0:
        return
    if upper is not None and index.is_cuda and torch.cuda.get_sync_debug_mode() != 0:
        # the caller forbade host syncs (torch.cuda.set_sync_debug_mode): checked on the device,
        # where a bad index stops the process with a device-side assertion instead
        torch._assert_async(((index.min() >= 0) & (index.max() < upper)).reshape(()),
                            f"{fn}(): {name} holds an index out of [0, {upper})")
        return
    if upper is None:
        low = int(index.min())
        check(low >= 0, fn, f"{name} contains a negative index ({low})")
        return
    low, high = (int(v) for v in torch.aminmax(index))   # one read-back for both bounds
    check(low >= 0, fn, f"{name} contains a negative index ({low})")
    check(high < upper, fn, f"{name} contains index {high}, out of range for {upper} nodes")


def index_size(index: Tensor, fn: str, name: str) -> int:
    """``max(index) + 1`` (0 when empty) of an index tensor checked as ``check_index`` does
    (integer dtype, no negatives), both bounds read back at once."""
    check_tensor(index, fn, name)
    check(index.dtype in INDEX_DTYPES, fn, f"{name} must have an integer dtype, got {index.dtype}")
    if index.numel() == 0:
        return 0
    low, high = (int(v) for v in torch.aminmax(index))
    check(low >= 0, fn, f"{name} contains a negative index ({low})")
    return high + 1


def check_same_device(fn: str, **tensors: Optional[Tensor]) -> None:
    present = [t for t in tensors.values() if t is not None]
    if present and any(t.device != present[0].device for t in present[1:]):
        listing = ", ".join(f"{name} on {t.device}" for name, t in tensors.items() if t is not None)
        raise ValueError(f"{fn}(): tensors must be on one device, got {listing}")


def check_float(t: Tensor, fn: str, name: str) -> None:
    if not t.is_floating_point():
        raise ValueError(f"{fn}(): {name} must be a floating-point tensor, got {t.dtype}")


def check_edge_values(values: Tensor, num_edges: int, fn: str, name: str, max_dim: int = 2) -> None:
    """Per-edge tensor: first dimension ``E``, floating point, at most ``max_dim`` dims."""
    check_tensor(values, fn, name)
    if not 1 <= values.dim() <= max_dim:
        raise ValueError(f"{fn}(): {name} must have 1 to {max_dim} dimensions, got shape {tuple(values.shape)}")
    if values.shape[0] != num_edges:
        raise ValueError(f"{fn}(): {name} has {values.shape[0]} entries but the graph has {num_edges} edges")
    check_float(values, fn, name)


def check_node_features(x: Tensor, num_nodes: int, fn: str, name: str = "x", sources: bool = False) -> None:
    """Node features ``[N, F]``, floating point (messages are built only on failure: hot path).
    ``sources``: ``num_nodes`` counts a bipartite graph's source nodes (worded so on failure)."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{fn}(): {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{fn}(): {name} must be 2-D [num_nodes, features], got shape {tuple(x.shape)}")
    if x.shape[0] != num_nodes:
        kind = "source nodes (bipartite)" if sources else "nodes"
        raise ValueError(f"{fn}(): {name} has {x.shape[0]} rows but the graph has {num_nodes} {kind}")
    check_float(x, fn, name)
