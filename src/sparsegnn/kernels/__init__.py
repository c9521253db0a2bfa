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


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
