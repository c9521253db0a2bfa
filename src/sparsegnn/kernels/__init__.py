"""Triton kernels and their launchers: tensors in, tensors out (no autograd, no Graph, no validation).

Importing this package does not import Triton; each kernel module does, on first use.
"""
from __future__ import annotations

import functools
import importlib.util
import os


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
