"""The functional API: validation, backend dispatch and autograd for every sparse op."""
from .attention import agnn_attention, gat_attention
from .dropout import dropout
from .gcn_fused import batched_gcn
from .maxk import layer_norm_maxk, maxk
from .sddmm import sddmm
from .softmax import edge_softmax
from .spmm import spmm

__all__ = ["spmm", "sddmm", "edge_softmax", "gat_attention", "agnn_attention", "dropout", "maxk", "layer_norm_maxk", "batched_gcn"]
