"""Sparse storage formats: pure tensor transformations (no kernels, no Graph)."""
from . import csr

__all__ = ["csr"]
