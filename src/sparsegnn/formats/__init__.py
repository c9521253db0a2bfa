"""Sparse storage formats: pure tensor transformations (no kernels, no Graph)."""
from . import cbsr, csr

__all__ = ["cbsr", "csr"]
