"""``spmm_tc``: the SpMM on tensor cores (TC-GNN tiles), with autograd.

``out[i] = sum_{j -> i} w_ji x_j`` computed window by window as dense ``[W, K] @ [K, F]``
products over the graph's condensed tiles (``formats/tiles.py``, ``kernels/spmm_tiles.py``).
Backward: ``dX = A^T dY`` on the transpose's tiles, ``dw_e = <dY_i, X_j>`` with the row-wise
SDDMM.  The tiles of a graph's structure are built once and kept in ``graph.cache`` (like its
row plan); edge values become tile values with one ``index_put`` per call.

A first version on the way to issue 9's dispatch: called explicitly, never by ``backend="auto"``
until the H100 measurements say where it wins.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._checks import check, check_edge_values, check_node_features, check_same_device
from ..graph import Graph
from ._dispatch import edge_values

__all__ = ["spmm_tc", "tiles_of_graph"]


def tiles_of_graph(graph: Graph, transpose: bool = False, window: int = 16, block_k: int = 16):
    """The graph's (or its transpose's) :class:`~sparsegnn.formats.tiles.TileGraph`, cached per shape."""
    from ..formats.tiles import translate

    key = ("tiles", transpose, window, block_k)
    tiles = graph.cache.get(key)
    if tiles is None:
        if transpose:
            rowptr, col, _ = graph.transpose_parts()
            tiles = translate(rowptr, col, graph.num_nodes, window=window, block_k=block_k)
        else:
            tiles = translate(graph.rowptr, graph.col, graph.num_src, window=window, block_k=block_k)
        graph.cache[key] = tiles
    return tiles


def _tile_values(tiles, graph: Graph, weight: Optional[Tensor], transpose: bool) -> Tensor:
    if weight is not None and transpose:
        weight = weight.index_select(0, graph.transpose_parts()[2])
    return tiles.tiles_of(None if weight is None else weight.detach())


class _SpMMTiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: Graph, x: Tensor, weight: Optional[Tensor], precision: str, window: int,
                block_k: int) -> Tensor:
        from ..kernels.spmm_tiles import spmm_tiles

        tiles = tiles_of_graph(graph, False, window, block_k)
        ctx.graph, ctx.precision, ctx.shape = graph, precision, (window, block_k)
        ctx.save_for_backward(x, weight)
        return spmm_tiles(tiles, x, _tile_values(tiles, graph, weight, False), precision)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        from ..kernels.spmm_tiles import spmm_tiles

        x, weight = ctx.saved_tensors
        graph = ctx.graph
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            tiles_t = tiles_of_graph(graph, True, *ctx.shape)
            grad_x = spmm_tiles(tiles_t, grad_out.contiguous(), _tile_values(tiles_t, graph, weight, True),
                                ctx.precision).to(x.dtype)
        if weight is not None and ctx.needs_input_grad[2]:
            backend = "triton" if grad_out.is_cuda else "reference"
            grad_w = edge_values(backend, graph, grad_out.float(), x.float(), "dot").to(weight.dtype)
        return None, grad_x, grad_w, None, None, None


def spmm_tc(graph: Graph, x: Tensor, edge_weight: Optional[Tensor] = None, precision: str = "tf32",
            window: int = 16, block_k: int = 16) -> Tensor:
    """Sum aggregation on tensor cores: ``out[i] = sum_{j -> i} w_ji x_j`` (see the module doc).

    Args:
        graph: a :class:`Graph` (bipartite allowed).
        x: ``[M, F]`` float32 / float16 / bfloat16 source features.
        edge_weight: ``[E]`` in the graph's CSR order, or None (the graph's ``edge_val``, else ones).
        precision: ``"tf32"`` (default here) or ``"ieee"`` (exact fp32 products).
        window, block_k: tile shape ``W x K`` (powers of two, 16 for ``tl.dot``).

    Returns:
        ``[N, F]`` of ``x``'s dtype (fp32 accumulation).

    Shapes:
        x: [M, F]; edge_weight: [E] -> [N, F].
    """
    fn = "spmm_tc"
    check(isinstance(graph, Graph), fn, f"graph must be a sparsegnn Graph, got {type(graph).__name__}")
    check_node_features(x, graph.num_src, fn, sources=graph.is_bipartite)
    check(precision in ("tf32", "ieee"), fn, f"precision must be 'tf32' or 'ieee', got {precision!r}")
    weight = graph.edge_val if edge_weight is None else edge_weight
    if weight is not None:
        check_edge_values(weight, graph.num_edges, fn, "edge_weight", max_dim=1)
    check_same_device(fn, graph=graph.rowptr, x=x)
    return _SpMMTiles.apply(graph, x, weight, precision, window, block_k)
