"""Adam with a lean step: the fused kernel called directly once every parameter has its state.

A full-graph training step of a small model is host-bound (about 1 ms on Cora), and
``torch.optim.Adam(fused=True).step()`` spends most of its ~100 us in Python: per group it
walks the parameters through ``_init_group`` (state, dtype and device checks), regroups the
tensors by device and dtype, then launches ``_foreach_add_`` (step counters) and
``_fused_adam_``.  :class:`LeanAdam` launches the same two kernels with the same arguments,
so its updates equal ``Adam(fused=True)``'s bit for bit, after one Python pass over the
parameters.  Whatever the lean path does not cover falls back to ``Adam.step``: a closure,
the first step of a parameter (its state is created there), AMSGrad, ``capturable``,
``differentiable``, a tensor learning rate, complex or sparse parameters, parameters of one
group on several devices or dtypes, and a ``GradScaler`` (``grad_scale`` / ``found_inf``).
Hooks and ``state_dict`` are ``torch.optim.Optimizer``'s.  ``zero_grad()`` (to None) is a
plain loop as well.

The update (Kingma & Ba, with L2 weight decay ``wd``, step ``t``)::

    g = grad + wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

Shapes: any parameter shapes (dense, real).
"""
from __future__ import annotations

from typing import Callable, List, Optional

import torch
from torch import Tensor

__all__ = ["LeanAdam"]


def _adam_step(opt: torch.optim.Optimizer, closure):
    """``Adam.step`` without the hook wrapper that ``Optimizer`` puts around each class's
    ``step`` (``LeanAdam.step`` is wrapped already: the hooks must run once)."""
    step = torch.optim.Adam.step
    if getattr(step, "hooked", False):
        step = step.__wrapped__
    return step(opt, closure)


class LeanAdam(torch.optim.Adam):
    """``torch.optim.Adam`` with ``fused=True`` by default and a lean ``step`` (module doc).

    Same arguments as ``torch.optim.Adam``; ``fused=False`` gives plain Adam (every step
    through ``Adam.step``)."""

    def __init__(self, params, *args, **kwargs) -> None:
        kwargs.setdefault("fused", True)           # keyword-only in Adam: never among ``args``
        super().__init__(params, *args, **kwargs)

    def _lean_lists(self, group: dict) -> Optional[tuple]:
        """``(params, grads, exp_avgs, exp_avg_sqs, steps)`` of ``group``'s parameters that
        have a gradient, or None where ``Adam.step`` must run (see the module doc)."""
        if (not group["fused"] or group["amsgrad"] or group["capturable"] or group["differentiable"]
                or group["decoupled_weight_decay"] or isinstance(group["lr"], Tensor)):
            return None
        params: List[Tensor] = []
        grads: List[Tensor] = []
        avgs: List[Tensor] = []
        sqs: List[Tensor] = []
        steps: List[Tensor] = []
        state = self.state
        kind = None
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            s = state.get(p)
            if not s or g.is_sparse or p.is_complex():
                return None
            if kind is None:
                kind = (p.device, p.dtype)
            elif p.device != kind[0] or p.dtype != kind[1]:
                return None
            params.append(p)
            grads.append(g)
            avgs.append(s["exp_avg"])
            sqs.append(s["exp_avg_sq"])
            steps.append(s["step"])
        return params, grads, avgs, sqs, steps

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``Optimizer.zero_grad``; with ``set_to_none`` (the default) outside a profiler and
        ``torch.compile``, a plain loop setting every ``.grad`` to None (the same result without
        its per-call dynamo guard, profiler range and grouping, ~10-30 us of a small step)."""
        if not set_to_none or torch.autograd._profiler_enabled() or torch.compiler.is_compiling():
            return super().zero_grad(set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
        return None

    def step(self, closure: Optional[Callable[[], float]] = None):
        """One Adam update of every parameter with a gradient (the lean path where it applies)."""
        if (closure is not None or getattr(self, "grad_scale", None) is not None
                or getattr(self, "found_inf", None) is not None):
            return _adam_step(self, closure)
        lists = [self._lean_lists(group) for group in self.param_groups]
        if any(item is None for item in lists):
            return _adam_step(self, closure)
        self._accelerator_graph_capture_health_check()
        with torch.no_grad():
            for group, (params, grads, avgs, sqs, steps) in zip(self.param_groups, lists):
                if not params:
                    continue
                beta1, beta2 = group["betas"]
                torch._foreach_add_(steps, 1)
                torch._fused_adam_(params, grads, avgs, sqs, [], steps, lr=group["lr"], beta1=beta1,
                                   beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                                   amsgrad=False, maximize=group["maximize"], grad_scale=None, found_inf=None)
        return None
