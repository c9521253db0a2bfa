"""Launching Triton kernels with less host work per call.

``kernel[grid](*args, **kw)`` spends ~30 us of Python per launch in Triton 3.6 (binding the
arguments, computing the specialisation and cache key, launch metadata): more than the GPU
time of an SpMM on a graph of 10k edges.  ``launch`` keeps the compiled kernel of every
*specialisation* it has seen and calls its launcher directly on a hit.

A hit passes every tensor as its address (an int): Triton's launcher takes an int pointer as
it is, where for a tensor it calls ``data_ptr()`` and checks the address with the driver
(``cuPointerGetAttribute``), per tensor and per launch.  The tensors reaching a launch here
were checked by the op that launches (device, dtype, shape), and the caller holds them for
the launch, so the check only costs host time.

The specialisation key is at least as fine as Triton's own: every constexpr and launch
option, and for each runtime argument its dtype and 16-byte pointer alignment (tensors) or
whether it is 1, a multiple of 16 and within 32 bits (ints).  A miss (a new key, the Triton
interpreter, launch hooks installed by a profiler (an empty ``HookChain`` is no hook), or a Triton whose compiled kernels lack
the launcher fields) takes the normal ``kernel[grid](...)`` path, which compiles if needed
and returns the compiled kernel that the next hit reuses.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import triton

from . import _prewarm, interpreting

_COMPILED: Dict[tuple, tuple] = {}     # key -> (launcher, function handle, packed metadata)
_PARAMS: Dict[int, Tuple[Tuple[str, ...], tuple]] = {}   # id(kernel) -> (names after args, defaults)
_HOOKS = getattr(getattr(triton, "knobs", None), "runtime", None)


_STREAM = []
_DEVICE = []


def _current_device() -> int:
    """``torch.cuda.current_device()`` without its Python wrapper (its lazy initialisation: a
    bound launch has CUDA tensors in hand, so CUDA is initialised)."""
    if not _DEVICE:
        _DEVICE.append(getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device)
    return _DEVICE[0]()


def _current_stream(device: int) -> int:
    """The raw current CUDA stream, looked up as Triton's own launch path does."""
    if not _STREAM:
        _STREAM.append(triton.runtime.driver.active.get_current_stream)
    return _STREAM[0](device)


def _no_hook(hook) -> bool:
    """A launch hook slot that calls nothing: ``None`` or an empty ``HookChain`` (Triton 3.6)."""
    return hook is None or (isinstance(getattr(hook, "calls", None), list) and not hook.calls)


def _hooked() -> bool:
    """Whether a profiler installed launch hooks (then Triton's own path runs them)."""
    return _HOOKS is not None and not (_no_hook(_HOOKS.launch_enter_hook) and _no_hook(_HOOKS.launch_exit_hook))


def _spec(value) -> tuple:
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() & 15 == 0)
    if isinstance(value, bool) or not isinstance(value, int):
        return (type(value), value if isinstance(value, bool) else None)
    return (value == 1, value & 15 == 0, -(1 << 31) <= value < (1 << 31))


def _passed(args) -> Tuple[tuple, Optional[list]]:
    """``(specialisation, values to pass)`` of runtime ``args``: a tensor is passed as its
    address (see the module doc), specialised on its dtype and 16-byte alignment; values None
    when a tensor is not on a CUDA device (Triton's own path then raises its error)."""
    spec, passed = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            if not a.is_cuda:
                return (), None
            ptr = a.data_ptr()
            spec.append((a.dtype, ptr & 15 == 0))
            passed.append(ptr)
        else:
            spec.append(_spec(a))
            passed.append(a)
    return tuple(spec), passed


def _entry(compiled) -> Optional[tuple]:
    """``(launcher, function handle, packed metadata)`` of a kernel Triton compiled and
    launched (its handles loaded), or None for a Triton whose compiled kernels lack them."""
    if not all(hasattr(compiled, f) for f in ("run", "function", "packed_metadata")):
        return None
    return compiled.run, compiled.function, compiled.packed_metadata


def _tail(kernel, num_args: int, constexprs: Dict[str, object]) -> tuple:
    """Values of the parameters after the positional ``args``: the given constexprs, else defaults."""
    cached = _PARAMS.get(id(kernel))
    if cached is None:
        names = tuple(kernel.arg_names[num_args:])
        defaults = tuple(p.default for p in kernel.params[num_args:])
        cached = _PARAMS[id(kernel)] = (names, defaults)
    names, defaults = cached
    return tuple(constexprs.get(n, d) for n, d in zip(names, defaults))


def launch(kernel, grid: Tuple[int, ...], args: tuple, constexprs: Dict[str, object], num_warps: int,
           num_stages: Optional[int] = None) -> None:
    """``kernel[grid](*args, **constexprs, num_warps=..., num_stages=...)``, with the compiled
    kernel reused for a specialisation seen before (see the module doc).

    Args:
        kernel: a ``@triton.jit`` function whose runtime parameters come first, in ``args``'s order.
        grid: up to three program counts.
        args: the runtime arguments (tensors, ints, floats).
        constexprs: the constexpr arguments by name (absent ones take their defaults).
    """
    options = {"num_warps": num_warps}
    if num_stages is not None:
        options["num_stages"] = num_stages
    if interpreting() or _hooked():
        kernel[grid](*args, **constexprs, **options)
        return
    spec, passed = _passed(args)
    if passed is None:
        kernel[grid](*args, **constexprs, **options)
        return
    device = torch.cuda.current_device()
    key = (id(kernel), device, num_warps, num_stages, tuple(constexprs.items()), spec)
    entry = _COMPILED.get(key)
    if entry is None:
        _prewarm.wait()                       # Triton's key, if still being hashed in the background
        entry = _entry(kernel[grid](*args, **constexprs, **options))
        if entry is not None:
            _COMPILED[key] = entry
        return
    run, function, metadata = entry
    run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, _current_stream(device),
        function, metadata, None, None, None, *passed, *_tail(kernel, len(args), constexprs))


class Bound:
    """``launch(kernel, grid, args, constexprs, ...)`` with the arguments that do not change from
    call to call (a graph's index and value tensors) bound once: a call computes the
    specialisation of the changing ones (``varying`` positions: features, output, temporaries)
    only, and passes the bound tensors as the addresses taken at binding (the Bound keeps the
    tensors alive).  Same compiled kernels and same fallbacks as ``launch``: the key of a hit
    is ``launch``'s key with the bound arguments' part precomputed.

    Args:
        kernel, constexprs, num_warps, num_stages: as for ``launch``.
        args: every runtime argument, in order; the values at ``varying`` positions are
            placeholders replaced at each call.
        varying: positions of the arguments given at each call, in the order they are given;
            each call gives tensors there, all on one device.
    """

    __slots__ = ("kernel", "args", "varying", "constexprs", "num_warps", "num_stages", "fixed_spec", "cons_key",
                 "tail", "hits", "passed")

    def __init__(self, kernel, args: tuple, constexprs: Dict[str, object], num_warps: int,
                 num_stages: Optional[int] = None, varying: Tuple[int, ...] = ()) -> None:
        self.kernel, self.args, self.varying = kernel, tuple(args), tuple(varying)
        self.constexprs, self.num_warps, self.num_stages = dict(constexprs), num_warps, num_stages
        self.fixed_spec = tuple(None if i in self.varying else _spec(a) for i, a in enumerate(self.args))
        self.passed = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in self.args]
        self.cons_key = tuple(self.constexprs.items())
        self.tail = None                          # the compiled path's trailing values, on its first hit
        self.hits: Dict[tuple, tuple] = {}       # (device, specs of the varying values) -> _COMPILED's entry

    def __call__(self, grid: Tuple[int, ...], values: tuple) -> None:
        # CPU tensors (the interpreter) or a profiler's hooks: Triton's own path, through launch
        # (CUDA tensors under TRITON_INTERPRET=1 may take a compiled kernel: the same result)
        if not (values and values[0].is_cuda) or _hooked():
            self._launch(grid, values)
            return
        passed = list(self.passed)
        vspec = []
        for i, v in zip(self.varying, values):
            ptr = v.data_ptr()
            passed[i] = ptr
            vspec.append((v.dtype, ptr & 15 == 0))
        device = _current_device()
        entry = self.hits.get((device, *vspec))
        if entry is None:
            spec = list(self.fixed_spec)
            for i, sp in zip(self.varying, vspec):
                spec[i] = sp
            key = (id(self.kernel), device, self.num_warps, self.num_stages, self.cons_key, tuple(spec))
            entry = _COMPILED.get(key)
            if entry is None:                     # compile (or take Triton's path) through launch
                self._launch(grid, values)
                return
            self.hits[(device, *vspec)] = entry
            if self.tail is None:
                self.tail = _tail(self.kernel, len(self.args), self.constexprs)
        run, function, metadata = entry
        run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, _current_stream(device),
            function, metadata, None, None, None, *passed, *self.tail)

    def _launch(self, grid: Tuple[int, ...], values: tuple) -> None:
        """``launch`` with the bound arguments and this call's ``values`` (the tensors themselves)."""
        args = list(self.args)
        for i, v in zip(self.varying, values):
            args[i] = v
        launch(self.kernel, grid, tuple(args), self.constexprs, self.num_warps, self.num_stages)
