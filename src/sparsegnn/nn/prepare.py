"""Getting a model ready for ``torch.compile``: build on the host what compiled code only reads.

Compiled layers read the graphs an eager call built (GCN's normalised graph, GAT's self
loops, ``cached=True`` graphs; see ``_graph_input``), and the first eager call of each op on
a graph also builds the plan, the transpose and the tuned kernel configs.  :func:`prepare`
makes that eager call::

    graph = sparsegnn.Graph.from_edge_index(edge_index, num_nodes=x.shape[0])
    model = sparsegnn.nn.GCN(in_channels, classes)
    sparsegnn.nn.prepare(model, x, graph)
    compiled = torch.compile(model, fullgraph=True)
    loss = loss_fn(compiled(x, graph), y)
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


def prepare(model: nn.Module, x: Tensor, graph, *args, **kwargs) -> nn.Module:
    """Run ``model(x, graph, *args, **kwargs)`` once eagerly, forward and backward, so that a
    compiled ``model`` finds every graph it needs already built.

    The pass runs in evaluation mode (no dropout, so no random numbers are drawn) and its
    gradients go nowhere: no parameter's ``.grad`` changes.  The backward builds the graphs'
    transposes and tunes the backward kernels, so the first compiled training step builds
    nothing either.

    Args:
        model: a module taking ``(x, graph, ...)``, e.g. any model or layer of ``sparsegnn.nn``.
        x: node features.
        graph: the :class:`~sparsegnn.Graph` the compiled model will be called with.

    Returns:
        ``model`` (training mode restored).

    Shapes:
        x: [N, F]; graph: Graph with N nodes.
    """
    if torch.compiler.is_compiling():
        raise ValueError("prepare(): call it eagerly, before compiling the model, not inside compiled code")
    was_training = model.training
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        model.eval()
        with torch.enable_grad():
            out = model(x, graph, *args, **kwargs)
            if params and isinstance(out, Tensor) and out.requires_grad:
                torch.autograd.grad(out.float().sum(), params, allow_unused=True)
    finally:
        model.train(was_training)
    return model


__all__ = ["prepare"]
