"""sparsegnn: fast sparse graph neural network operations and layers for PyTorch.

Build a :class:`Graph` once, then call :func:`spmm`, :func:`sddmm`, :func:`edge_softmax`,
the fused :func:`gat_attention` / :func:`agnn_attention`, the MaxK nonlinearity :func:`maxk`
(rows kept as :class:`CBSR`; :func:`layer_norm_maxk` fuses a LayerNorm before it), or the layers in :mod:`sparsegnn.nn`.  CUDA tensors run Triton kernels; CPU tensors run
the CPU backend (Numba kernels and ``torch.sparse``, :mod:`sparsegnn.ops._cpu`); the pure-PyTorch
reference in :mod:`sparsegnn.ops.reference` is the oracle and the fallback.

Coming from PyG: ``model = sparsegnn.accelerate(model)`` swaps the PyG convs of a model for
ours (weights kept); :mod:`sparsegnn.sampling` has a neighbour loader for mini-batches.
"""
from .graph import Graph
from .formats.cbsr import CBSR
from .ops import agnn_attention, dropout, edge_softmax, gat_attention, layer_norm_maxk, maxk, sddmm, spmm
from .ops.pool import global_pool

__version__ = "0.1.0"

# Triton's start-up work (its key, launch-time imports, tool versions) begins on the first CUDA
# use, on background threads; importing starts no thread and changes no module.
from .kernels import _prewarm as _prewarm  # noqa: E402

_prewarm.arm()

__all__ = ["Graph", "CBSR", "spmm", "sddmm", "edge_softmax", "gat_attention", "agnn_attention", "dropout", "maxk",
           "layer_norm_maxk", "global_pool", "accelerate",
           "nn", "datasets", "sampling", "__version__"]


def __getattr__(name):  # lazy submodules keep `import sparsegnn` light
    import importlib

    if name in ("nn", "datasets", "sampling"):
        return importlib.import_module(f".{name}", __name__)
    if name == "accelerate":
        return importlib.import_module(".nn", __name__).accelerate
    raise AttributeError(f"module 'sparsegnn' has no attribute {name!r}")
