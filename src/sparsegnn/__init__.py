"""sparsegnn: fast sparse graph neural network operations and layers for PyTorch.

Build a :class:`Graph` once, then call :func:`spmm`, :func:`sddmm`, :func:`edge_softmax`,
the fused :func:`gat_attention` / :func:`agnn_attention`, or the layers in :mod:`sparsegnn.nn`.  CUDA tensors run Triton kernels; CPU tensors run
the CPU backend (Numba kernels and ``torch.sparse``, :mod:`sparsegnn.ops._cpu`); the pure-PyTorch
reference in :mod:`sparsegnn.ops.reference` is the oracle and the fallback.
"""
from .graph import Graph
from .ops import agnn_attention, dropout, edge_softmax, gat_attention, sddmm, spmm

__version__ = "0.1.0"

__all__ = ["Graph", "spmm", "sddmm", "edge_softmax", "gat_attention", "agnn_attention", "dropout", "nn", "datasets", "__version__"]


def __getattr__(name):  # lazy submodules keep `import sparsegnn` light
    if name in ("nn", "datasets"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'sparsegnn' has no attribute {name!r}")
