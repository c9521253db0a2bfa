"""Helpers every backend shares: the variant names of SpMM decisions, the mean's per-edge scale,
edge-value forms cached on the graph, and the effective weights of ``A^T`` for the backward."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..formats.csr import permute_edges
from ..graph import Graph


def spmm_detail(weight: Optional[Tensor], reduce: str) -> str:
    """The variant part of an SpMM decision key: reduce, edge values, heads."""
    heads = weight.shape[1] if weight is not None and weight.dim() == 2 else 0
    return f"{reduce}|val{int(weight is not None)}|h{heads}"


def mean_scale(graph: Graph, dtype: torch.dtype) -> Tensor:
    """Per-edge ``1 / deg(row)``, float64 for float64 inputs, float32 otherwise."""
    return graph.mean_scale(torch.float64 if dtype == torch.float64 else torch.float32)


def scaled(weight: Optional[Tensor], scale: Tensor) -> Tensor:
    """``w_e * s_e`` for per-edge ``scale`` [E] and ``weight`` [E], [E, H] or None (then ``scale``)."""
    if weight is None:
        return scale
    return weight * (scale if weight.dim() == 1 else scale.unsqueeze(1))


def derived_values(graph: Graph, slot: tuple, values: Optional[Tensor], build):
    """``build()``'s result for edge values ``values`` (or None), cached on the graph in
    ``slot`` while the same tensor at the same version comes back: an in-place update (a
    learnable edge weight stepped by the optimiser) bumps the version and rebuilds.  One entry
    per slot, so values that change every call replace each other instead of piling up."""
    return graph.cache.get("edge_values", slot, build, values=values)


def mean_weights(graph: Graph, weight: Optional[Tensor]) -> Tensor:
    """``w_e / deg(row(e))`` (fp32 scale; ``1 / deg`` for None): the graph's cached scale for
    no weights, per call for weights that need a gradient (autograd sees the product), else
    built once per weight tensor and version (``derived_values``), so a call that gets the same
    weights gets the same tensor, and what is derived from it (tile values) is kept."""
    scale = mean_scale(graph, torch.float32)
    if weight is None:
        return scale
    if weight.requires_grad:
        return scaled(weight, scale)
    return derived_values(graph, ("mean_weights",), weight, lambda: scaled(weight, scale))


def permuted_own_values(graph: Graph, values: Tensor, perm: Tensor) -> Tensor:
    """``values[perm]`` for values the graph owns (its ``edge_val``, its cached ``1/deg``),
    permuted once per tensor and version (``derived_values``, one slot per owned tensor)."""
    return derived_values(graph, ("permuted", id(values)), values, lambda: permute_edges(values.detach(), perm))


def transposed_weights(graph: Graph, weight: Optional[Tensor], reduce: str, dtype: torch.dtype):
    """``(graph.t(), w'^T, owned)``: the cached transpose, the effective weights ``w'`` (``w``, or
    ``w / deg(row)`` for ``"mean"``; None = ones) in the transpose's edge order, and whether
    ``w'^T`` is one the graph keeps (its own values or ``1/deg`` permuted once per version, or
    None): the same tensor on every call."""
    transposed = graph.t()
    perm = graph.transpose_parts()[2]
    if weight is None and reduce == "mean":
        return transposed, permuted_own_values(graph, mean_scale(graph, dtype), perm), True
    if weight is not None and weight is graph.edge_val and reduce == "sum":
        return transposed, permuted_own_values(graph, weight, perm), True
    if reduce == "mean":
        weight = scaled(weight, mean_scale(graph, dtype))
    return transposed, (weight.index_select(0, perm) if weight is not None else None), weight is None


def via_transpose(aggregate, graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str) -> Tensor:
    """``A'^T x`` (see ``_dispatch.aggregate_transposed``) by a backend's ``aggregate`` on the
    cached transpose, with the weights ``transposed_weights`` gives.

    Shapes:
        x: [N, F]; weight: [E], [E, H] or None -> [M, F].
    """
    transposed, weight_t, owned = transposed_weights(graph, weight, reduce, x.dtype)
    return aggregate(transposed, x, weight_t, "sum", owned)


def sum_heads(products: Tensor, heads: int) -> Tensor:
    """Per-edge products ``[E, F]`` summed over each head's ``F / H`` features: ``[E, H]``."""
    return products.view(products.shape[0], heads, products.shape[1] // heads).sum(-1)
