"""Batch normalisation over the real nodes of a padded batch.

A captured training step (``sparsegnn.graph_training.CapturedGraphSteps``) runs on batches
padded to fixed shapes (``datasets.padding``).  Padding nodes must not enter BatchNorm's batch
statistics, or the model trained that way differs from the one trained on unpadded batches.
:class:`PaddedBatchNorm1d` is a ``torch.nn.BatchNorm1d`` (same parameters, buffers and
``state_dict``) that, inside ``with padded_nodes(node_weight):``, takes its statistics over the
rows of weight 1 only; anywhere else it is ``BatchNorm1d``.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

import torch
from torch import Tensor, nn

from .._checks import check

__all__ = ["PaddedBatchNorm1d", "padded_nodes"]

_NODE_WEIGHT: contextvars.ContextVar[Optional[Tensor]] = contextvars.ContextVar("sparsegnn_node_weight", default=None)


@contextlib.contextmanager
def padded_nodes(node_weight: Optional[Tensor]) -> Iterator[None]:
    """Within the block, :class:`PaddedBatchNorm1d` layers given ``[N, C]`` inputs of ``N =
    node_weight.numel()`` rows take batch statistics over the rows of weight 1 (the real nodes
    of a padded batch; ``GraphBatch.node_weight``).  ``None`` does nothing.

    Shapes:
        node_weight: [N] (1.0 = real node, 0.0 = padding).
    """
    if node_weight is not None:
        check(isinstance(node_weight, Tensor) and node_weight.dim() == 1, "padded_nodes",
              f"node_weight must be a 1-D tensor, got {getattr(node_weight, 'shape', type(node_weight).__name__)}")
    token = _NODE_WEIGHT.set(node_weight)
    try:
        yield
    finally:
        _NODE_WEIGHT.reset(token)


class PaddedBatchNorm1d(nn.BatchNorm1d):
    r"""``BatchNorm1d`` whose training-mode statistics skip the padding rows of a padded batch.

    With node weights :math:`w_i \in \{0, 1\}` (:func:`padded_nodes`) and :math:`n = \sum_i w_i`:

    .. math::
        \mu = \tfrac{1}{n} \textstyle\sum_i w_i x_i,\quad
        \sigma^2 = \tfrac{1}{n} \textstyle\sum_i w_i (x_i - \mu)^2,\quad
        y_i = \gamma \frac{x_i - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta

    and the running statistics move by ``momentum`` towards :math:`\mu` and the unbiased
    :math:`\sigma^2 n / (n - 1)`, exactly as ``BatchNorm1d`` does on the real rows alone
    (``momentum=None``: the cumulative average).  Padding rows come out as 0 (they reach no real
    node and no loss); a batch without real nodes leaves the running statistics as they were.
    No host sync: the step can be captured.  Outside :func:`padded_nodes`, in eval mode, or for inputs whose row count
    is not the weights' length it is ``BatchNorm1d``.

    Shapes:
        x: [N, C] -> [N, C].
    """

    def forward(self, x: Tensor) -> Tensor:
        weight = _NODE_WEIGHT.get()
        use_batch_stats = self.training or self.running_mean is None
        if weight is None or not use_batch_stats or x.dim() != 2 or x.shape[0] != weight.shape[0]:
            return super().forward(x)
        self._check_input_dim(x)
        w = weight.to(x.dtype).unsqueeze(1)
        count = w.sum()
        n = count.clamp(min=1.0)                      # a batch without real nodes: no NaN
        wt = w.t()                                    # [1, N]: one GEMV per statistic
        mean = (wt @ x).squeeze(0) / n
        centred = x - mean
        var = (wt @ (centred * centred)).squeeze(0) / n
        if self.training and self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                some = count > 0                      # no real node: the running statistics stay
                self.num_batches_tracked.add_(some.to(self.num_batches_tracked.dtype))
                factor = (1.0 / self.num_batches_tracked.clamp(min=1).to(x.dtype)) if self.momentum is None \
                    else self.momentum
                unbiased = var * (count / (count - 1).clamp(min=1.0))
                self.running_mean.copy_(torch.where(some, self.running_mean * (1 - factor) + factor * mean,
                                                    self.running_mean))
                self.running_var.copy_(torch.where(some, self.running_var * (1 - factor) + factor * unbiased,
                                                   self.running_var))
        out = centred * torch.rsqrt(var + self.eps)
        if self.affine:
            out = out * self.weight + self.bias
        # padding rows set to 0: they feed no real node and no loss, and unbounded they would grow
        # layer by layer (a padding node's self loops multiply it under a sum aggregation)
        return out * w
