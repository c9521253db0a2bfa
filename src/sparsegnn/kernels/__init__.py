"""Triton kernels and their launchers: tensors in, tensors out (no autograd, no Graph, no validation).

Importing this package does not import Triton; each kernel module does, on first use.
"""
from __future__ import annotations

import importlib.util
import os


#: Found once at import (``find_spec`` does not import Triton). A module constant rather than
#: an ``lru_cache``: torch.compile traces the ops' backend choice, and reads a constant.
_TRITON_FOUND = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    """Whether the ``triton`` package can be imported."""
    return _TRITON_FOUND


_RAW_STREAM = []


def current_stream_key(device) -> int:
    """The raw handle of the current CUDA stream of ``device`` (a ``torch.device`` or index;
    0 for a CPU device): what launches outside Triton run on (``_cupy``) and what per-stream
    state (the SpMM kernels' arrival counters) is kept under."""
    index = device if isinstance(device, int) else (device.index if device.type == "cuda" else -1)
    if index is not None and index < 0:
        return 0
    import torch

    if index is None:
        index = torch.cuda.current_device()
    if not _RAW_STREAM:     # torch's own lookup, else the public one (a torch without it)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _RAW_STREAM.append(raw or (lambda i: torch.cuda.current_stream(i).cuda_stream))
    return _RAW_STREAM[0](index)


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_PROPERTIES: dict = {}


def device_properties(device):
    """``torch.cuda.get_device_properties`` of CUDA ``device`` (a ``torch.device`` or index),
    looked up once per device: the lookup costs ~5-20 us of host a call, which grid sizing in a
    launcher would pay on every launch."""
    import torch

    index = device if isinstance(device, int) else device.index
    if index is None:
        index = torch.cuda.current_device()
    props = _PROPERTIES.get(index)
    if props is None:
        props = _PROPERTIES[index] = torch.cuda.get_device_properties(index)
    return props


def sm_count(device) -> int:
    """Streaming multiprocessors of CUDA ``device`` (:func:`device_properties`)."""
    return device_properties(device).multi_processor_count
