"""A linear layer with lazy input width and PyG's initialisers, so PyG state dicts load as they are.

PyG's convolutions build their projections from ``torch_geometric.nn.dense.linear.Linear``:
``x W^T + b`` whose ``in_channels`` may be ``-1`` (the weight is a
``torch.nn.parameter.UninitializedParameter`` until the first forward, which reads the width
from its input), and whose weight initialiser is chosen by name.  :class:`Linear` behaves the
same way, with the same parameter names (``weight``, ``bias``), so that

* a PyG ``state_dict`` loads strictly into a layer of ours, also into a lazy one that has not
  run yet (loading an initialised weight materialises it), and ours loads into PyG's;
* an uninitialised layer's ``state_dict`` holds the uninitialised parameter, as PyG's does.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parameter import UninitializedParameter

__all__ = ["Linear", "glorot", "is_lazy"]


def is_lazy(param) -> bool:
    """Whether ``param`` is an uninitialised (lazy) parameter."""
    return isinstance(param, UninitializedParameter)


def glorot(param: Optional[Tensor]) -> None:
    r"""Glorot-uniform in place: :math:`U(-a, a)`, :math:`a = \sqrt{6 / (\text{fan}_{-2} + \text{fan}_{-1})}`
    over the last two dimensions (PyG's ``inits.glorot``, also for ``[1, heads, channels]``)."""
    if param is None or is_lazy(param):
        return
    bound = math.sqrt(6.0 / (param.size(-2) + param.size(-1)))
    with torch.no_grad():
        param.uniform_(-bound, bound)


def _kaiming_uniform(weight: Tensor, fan: int, a: float) -> None:
    bound = math.sqrt(6.0 / ((1 + a * a) * fan))
    with torch.no_grad():
        weight.uniform_(-bound, bound)


class Linear(nn.Module):
    r""":math:`y = x W^\top + b`, with a lazy input width and named initialisers (PyG's ``Linear``).

    Args:
        in_channels: input width, or ``-1`` (any value ``<= 0``) to take it from the first input.
        out_channels: output width.
        bias: learn ``b``.
        weight_initializer: ``"glorot"``, ``"uniform"`` (:math:`U(\pm 1/\sqrt{F_{in}})`),
            ``"kaiming_uniform"`` or ``None`` (``torch.nn.Linear``'s default).
        bias_initializer: ``"zeros"`` or ``None`` (``torch.nn.Linear``'s default).

    Shapes:
        x: [*, in_channels] -> [*, out_channels].
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True,
                 weight_initializer: Optional[str] = None, bias_initializer: Optional[str] = None) -> None:
        super().__init__()
        if weight_initializer not in (None, "glorot", "uniform", "kaiming_uniform"):
            raise ValueError(f"Linear(): weight_initializer={weight_initializer!r} is not supported; use 'glorot', "
                             "'uniform', 'kaiming_uniform' or None")
        if bias_initializer not in (None, "zeros"):
            raise ValueError(f"Linear(): bias_initializer={bias_initializer!r} is not supported; use 'zeros' or None")
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.weight_initializer = weight_initializer
        self.bias_initializer = bias_initializer
        if self.in_channels > 0:
            self.weight = nn.Parameter(torch.empty(self.out_channels, self.in_channels))
        else:
            self.weight = UninitializedParameter()
            self._hook = self.register_forward_pre_hook(self._initialize_from_input)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw the parameters (nothing while the input width is unknown)."""
        if self.in_channels <= 0 or is_lazy(self.weight):
            return
        init = self.weight_initializer
        if init == "glorot":
            glorot(self.weight)
        elif init == "uniform":
            bound = 1.0 / math.sqrt(self.in_channels)
            with torch.no_grad():
                self.weight.uniform_(-bound, bound)
        else:   # "kaiming_uniform" or None: torch.nn.Linear's default
            _kaiming_uniform(self.weight, self.in_channels, math.sqrt(5))
        if self.bias is not None:
            with torch.no_grad():
                if self.bias_initializer == "zeros":
                    self.bias.zero_()
                else:
                    bound = 1.0 / math.sqrt(self.in_channels)
                    self.bias.uniform_(-bound, bound)

    # ---------------------------------------------------------------- lazy width
    def initialize(self, in_channels: int) -> None:
        """Materialise a lazy weight for inputs of width ``in_channels`` (no-op once initialised)."""
        if not is_lazy(self.weight):
            return
        with torch.no_grad():
            self.in_channels = int(in_channels)
            self.weight.materialize((self.out_channels, self.in_channels))
            self.reset_parameters()
        self._drop_hook()

    def _drop_hook(self) -> None:
        hook = self.__dict__.pop("_hook", None)
        if hook is not None:
            hook.remove()

    def _initialize_from_input(self, module: nn.Module, inputs) -> None:
        self.initialize(inputs[0].size(-1))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    # ---------------------------------------------------------------- state dicts (PyG's behaviour)
    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        weight = self.weight if (keep_vars or is_lazy(self.weight)) else self.weight.detach()
        destination[prefix + "weight"] = weight
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias if keep_vars else self.bias.detach()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        weight = state_dict.get(prefix + "weight", None)
        if weight is not None and is_lazy(weight):           # an uninitialised layer's state: become lazy
            self.in_channels = -1
            self.weight = UninitializedParameter()
            if "_hook" not in self.__dict__:
                self._hook = self.register_forward_pre_hook(self._initialize_from_input)
        elif weight is not None and is_lazy(self.weight):     # materialise to the stored width, then copy
            self.in_channels = int(weight.size(-1))
            self.weight.materialize((self.out_channels, self.in_channels))
            self._drop_hook()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, bias={self.bias is not None})"
