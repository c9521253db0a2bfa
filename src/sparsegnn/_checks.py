"""Input validation shared by every layer of the library.

Every failure is a ``ValueError`` whose message starts with the public function's name,
e.g. ``ValueError("spmm(): x has 3 rows but the graph has 4 nodes")``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

INDEX_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)


def check(cond: bool, fn: str, msg: str) -> None:
    """Raise ``ValueError(f"{fn}(): {msg}")`` unless ``cond`` holds."""
    if not cond:
        raise ValueError(f"{fn}(): {msg}")


def check_tensor(obj, fn: str, name: str) -> None:
    check(isinstance(obj, Tensor), fn, f"{name} must be a torch.Tensor, got {type(obj).__name__}")


def check_index(index: Tensor, fn: str, name: str, upper: Optional[int] = None) -> None:
    """Integer dtype, no negatives, and (when ``upper`` is given) every entry < ``upper``."""
    check_tensor(index, fn, name)
    check(index.dtype in INDEX_DTYPES, fn, f"{name} must have an integer dtype, got {index.dtype}")
    if index.numel() == 0:
        return
    low = int(index.min())
    check(low >= 0, fn, f"{name} contains a negative index ({low})")
    if upper is not None:
        high = int(index.max())
        check(high < upper, fn, f"{name} contains index {high}, out of range for {upper} nodes")


def check_same_device(fn: str, **tensors: Optional[Tensor]) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"{fn}(): tensors must be on one device, got {listing}")


def check_float(t: Tensor, fn: str, name: str) -> None:
    check(t.is_floating_point(), fn, f"{name} must be a floating-point tensor, got {t.dtype}")


def check_edge_values(values: Tensor, num_edges: int, fn: str, name: str, max_dim: int = 2) -> None:
    """Per-edge tensor: first dimension ``E``, floating point, at most ``max_dim`` dims."""
    check_tensor(values, fn, name)
    check(1 <= values.dim() <= max_dim, fn, f"{name} must have 1 to {max_dim} dimensions, got shape {tuple(values.shape)}")
    check(values.shape[0] == num_edges, fn, f"{name} has {values.shape[0]} entries but the graph has {num_edges} edges")
    check_float(values, fn, name)


def check_node_features(x: Tensor, num_nodes: int, fn: str, name: str = "x") -> None:
    """Node features ``[N, F]``, floating point."""
    check_tensor(x, fn, name)
    check(x.dim() == 2, fn, f"{name} must be 2-D [num_nodes, features], got shape {tuple(x.shape)}")
    check(x.shape[0] == num_nodes, fn, f"{name} has {x.shape[0]} rows but the graph has {num_nodes} nodes")
    check_float(x, fn, name)
