"""A model's forward and backward replayed from CUDA graphs, behind the ordinary eager API.

A full-graph training step on a small graph is host-bound: each of the forward's and
backward's few dozen ops costs Python, autograd and launch time that the GPU waits on.  The
reference models (:class:`~sparsegnn.nn.GCN`, ``GraphSAGE``, ``GIN``, ``GAT``, ``AGNN``)
therefore record, after ``warmup`` eager calls with the same inputs, their forward and its
backward (the gradients of every parameter) as two CUDA graphs, and from then on replay them:

    out = model(x, graph)          # replays the forward (one launch), returns a fresh tensor
    loss = F.cross_entropy(out[idx], y)
    loss.backward()                # replays the backward, gradients accumulate as usual
    opt.step()

This is :func:`torch.cuda.make_graphed_callables`' scheme, applied automatically and guarded
so that nothing is silently wrong:

* **When.** Training mode, gradients enabled, on the current device's default stream (a
  whole-step capture such as :class:`~sparsegnn.capture.CapturedStep` warms up on a side
  stream and records the model itself), not under ``torch.compile``, autocast, another
  capture or any module hook; arguments that are CUDA tensors needing no gradient (the
  features first; an ``edge_index`` or edge weights after them), :class:`~sparsegnn.Graph`
  objects whose values need no gradient, or plain values.  A call replays when it matches the
  recording: the same argument objects, storage and shapes (the features' values may change
  in place, a replay reads the current memory; an in-place change of any other tensor or of a
  Graph's values is a new signature, since layers cache what they derive from them), the same
  parameters (identity, storage, ``requires_grad``), the same plain settings of every module
  (``training``, dropout rates, ...), matmul precision flags and deterministic mode.  Anything
  else runs eagerly and, after two calls with one signature, is recorded in its place.  A
  signature whose forward keeps more than ``budget`` bytes alive is never recorded (activations are held by
  the graphs between calls; large graphs are kernel-bound and gain nothing from a replay; by
  default 1/64 of the device's memory, at least 512 MiB: 2.2 GB on an H200, where graphs of
  up to ~1.6M edges at hidden 256 replay).
  Moving or converting the model (``.to()``, ``.half()``) drops its recording.
* **One forward at a time.** The recorded activations are overwritten by the next replay, so
  a forward whose backward has not run yet (and whose autograd graph is still alive) makes the
  next call run eagerly; the backward of an older replay raises instead of using newer
  activations.  Outputs and gradients are fresh tensors, never the graphs' own buffers.
* **Dropout** draws new masks on every replay: PyTorch registers the default generator with
  the graph and advances its offset per replay.
* A recording that fails (an op that syncs the host) turns replay off for the model with a
  warning; ``model.replay = False`` turns it off, ``True`` ignores the memory budget.  A
  double backward (``create_graph=True``) through a replay raises: use ``replay=False``.
* **Inputs that never repeat** (a ``DataLoader``'s batches): in auto mode, after
  ``CHURN_LIMIT`` calls in a row each unlike the one before, the model stops computing
  signatures and runs eagerly from then on (``model.replay = None`` again starts afresh).

PyG models converted by :func:`~sparsegnn.nn.accelerate` get the same through
:func:`enable_replay` (a wrapper set as the module's ``forward``).

Shapes:
    x: [N, F] (CUDA) -> the model's output.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn.utils.stateless import _reparametrize_module

from .._failed_capture import CleanupCUDAGraph, failed_capture_guard
from .._streams import capture_warmup, side_stream
from ..graph import Graph
from ..tune import reuse
from . import _graph_input

#: Eager calls with one signature before it is recorded.
WARMUP = 2
#: The default budget: the largest forward (activations kept for the backward plus output)
#: replayed is this share of the device's memory, and at least ``MIN_BUDGET`` bytes.  H200,
#: MaxK-GNN models (hidden 256, 3 layers) and their ReLU twins on ppi, flickr and artist
#: (0.8M-1.6M edges): 1.1x-1.5x their eager steps once replayed; with 512 MiB some replayed
#: and others not, and MaxK ran at 0.76x its replayed twin.
BUDGET_SHARE = 1 / 64
MIN_BUDGET = 512 << 20


def default_budget(device: torch.device) -> int:
    """The replay budget on ``device`` (bytes): ``BUDGET_SHARE`` of its memory, at least ``MIN_BUDGET``."""
    return max(MIN_BUDGET, int(torch.cuda.get_device_properties(device).total_memory * BUDGET_SHARE))


class _Token:
    """Lives as long as a replay's autograd node (its ``ctx``): a weak reference to it tells
    whether that forward's backward can still come."""

    __slots__ = ("__weakref__",)


class _Recording:
    """The two graphs of one signature, their static tensors and the replay bookkeeping.
    ``keep``: what the graphs read that nothing else may keep alive (the arguments, the
    parameter aliases, the Graphs the layers built from an ``edge_index``)."""

    def __init__(self, sig: tuple, keep: tuple, fwd, bwd, out: Tensor, grad_out: Tensor,
                 used: Tuple[Tensor, ...], grads: List[Tensor]) -> None:
        self.sig, self.keep = sig, keep
        self.fwd, self.bwd, self.out, self.grad_out = fwd, bwd, out, grad_out
        self.used, self.grads = used, grads       # parameters that get a gradient, and theirs
        self.generation = 0
        self.live: Optional[weakref.ref] = None

    def pending(self) -> bool:
        """A replayed forward whose backward has not run while its autograd graph lives."""
        return self.live is not None and self.live() is not None


class _Replayed(torch.autograd.Function):
    """Forward: replay, return a copy of the output.  Backward: copy ``dY`` in, replay, return
    copies of the parameters' gradients."""

    @staticmethod
    def forward(ctx, rec: _Recording, *params: Tensor) -> Tensor:
        rec.fwd.replay()
        rec.generation += 1
        ctx.rec, ctx.generation, ctx.token = rec, rec.generation, _Token()
        rec.live = weakref.ref(ctx.token)
        return rec.out.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        rec = ctx.rec
        if torch.is_grad_enabled():
            raise RuntimeError("sparsegnn replay: a replayed forward has no double backward (create_graph=True); "
                               "build the model with replay=False for higher-order gradients")
        if ctx.generation != rec.generation:
            raise RuntimeError(
                "sparsegnn replay: the backward of a forward that a later replay has overwritten "
                "(keep one forward per backward, or set model.replay = False)")
        rec.grad_out.copy_(grad)
        rec.bwd.replay()
        rec.live = None
        return (None, *torch._foreach_mul(rec.grads, 1.0))


#: ``_Replayed.apply`` without ``Function.apply``'s Python layer (which unwraps dead functorch
#: wrappers in the arguments: a replay never gets any, ``_signature`` refuses tensors without storage).
_replayed_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Replayed)

_PLAIN = (int, float, bool, str, type(None))
_SETTING = (int, float, bool, str)
_MISSING = object()


def _model_state(model: nn.Module, watched: "weakref.WeakKeyDictionary") -> Optional[Tuple[Tuple[Tensor, ...], tuple]]:
    """``(parameters, settings)``: every parameter once in ``model.parameters()`` order, and
    every module's plain attributes (``training``, dropout rates, flags: the names found on a
    module's first visit, kept in ``watched``) with the global matmul precision settings and
    deterministic mode; None
    if any module has a hook (a replay would skip it)."""
    from torch.nn.modules import module as m

    if (m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
            or m._global_backward_pre_hooks):
        return None
    params = {}
    # global flags the ops read when they pick kernels (deterministic mode: no atomic schedules)
    settings = [torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32, torch.are_deterministic_algorithms_enabled()]
    for mod in model.modules():
        if mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks or mod._backward_pre_hooks:
            return None
        d = mod.__dict__
        names = watched.get(mod)
        if names is None:
            names = watched[mod] = tuple(k for k, v in d.items() if isinstance(v, _SETTING))
        settings.append(tuple(d.get(k, _MISSING) for k in names))
        for p in mod._parameters.values():
            if p is not None:
                params[p] = None
    return tuple(params), tuple(settings)


def _signature(args: tuple, kwargs: dict, params: Tuple[Tensor, ...], settings: tuple) -> Optional[tuple]:
    """``(objects, values)``: what a recording depends on, compared by identity and by value;
    None where a replay cannot take the call.

    Arguments: tensors on CUDA needing no gradient, by identity, storage and shape, and after
    the first (the features) also by version (layers cache what they derive from an
    ``edge_index`` or edge weights); :class:`~sparsegnn.Graph` objects with their values by
    identity and version (values needing a gradient are refused: a replay gives them none);
    plain values by type and value.  Parameters by identity, storage and ``requires_grad``;
    module settings by value."""
    if not args or not isinstance(args[0], Tensor):
        return None
    objs, vals = [], [tuple(kwargs)]
    try:
        for i, a in enumerate(args + tuple(kwargs.values())):
            if isinstance(a, Tensor):
                if not a.is_cuda or a.requires_grad or a.is_inference():
                    return None
                objs.append(a)
                vals.append((a.data_ptr(), a.shape, None if i == 0 else a._version))
            elif isinstance(a, Graph):
                val = a.edge_val
                if a.transient or (val is not None and (val.requires_grad or val.is_inference())):
                    return None
                objs += [a, val]
                vals.append(None if val is None else (val.data_ptr(), val._version))
            elif isinstance(a, _PLAIN):
                vals.append((type(a), a))
            else:
                return None
        vals += [tuple(p.data_ptr() for p in params), tuple(p.requires_grad for p in params), settings]
    except RuntimeError:        # tensors without storage (functorch transforms): not replayable
        return None
    return tuple(objs) + params, tuple(vals)


_PTRS, _GRADS = -3, -2     # where the parameters' storage and requires_grad sit in a signature's values


def _same(a: Optional[tuple], b: tuple) -> bool:
    return (a is not None and len(a[0]) == len(b[0]) and all(p is q for p, q in zip(a[0], b[0]))
            and a[1] == b[1])


#: In auto mode, a model called this many times in a row with inputs unlike the last call's (a
#: DataLoader's batches, a new graph every step) stops looking for repeats: the signature of a
#: call costs ~0.5 ms of host time that no recording would repay.
CHURN_LIMIT = 16


class Replay:
    """Per-model replay state (owned by the model, not a submodule; copies and pickles start
    afresh).  ``mode``: None (auto: within ``budget`` bytes, None: ``default_budget`` of the
    device), True (any size), False (off)."""

    def __init__(self, mode: Optional[bool] = None, warmup: int = WARMUP, budget: Optional[int] = None) -> None:
        if mode not in (None, True, False):
            raise ValueError(f"replay(): mode must be None, True or False, got {mode!r}")
        if budget is not None and (isinstance(budget, bool) or int(budget) < 0):
            raise ValueError(f"replay(): budget must be None or bytes >= 0, got {budget!r}")
        self.mode, self.warmup = mode, int(warmup)
        self.budget = None if budget is None else int(budget)
        self.reset()

    def reset(self) -> None:
        """Drop the recording (its graphs and memory) and what was counted."""
        self.rec: Optional[_Recording] = None
        self.seen: Optional[tuple] = None        # the signature of the eager calls counted
        self.count = 0
        self.refused: Optional[tuple] = None     # a signature over budget (or out of memory)
        self.failed: Optional[str] = None
        self.watched: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # module -> setting names
        self.new_signatures = 0                  # consecutive calls whose inputs differed from the last
        self.churned = False                     # auto mode gave up: the inputs never repeat

    def __reduce__(self):
        return (Replay, (self.mode, self.warmup, self.budget))

    @property
    def recorded(self) -> bool:
        return self.rec is not None

    def _active(self, model: nn.Module, x) -> bool:
        if not (self.mode is not False and self.failed is None and model.training and torch.is_grad_enabled()
                and isinstance(x, Tensor) and x.is_cuda and not torch.compiler.is_compiling()
                and not torch.is_autocast_enabled("cuda") and not torch._C._are_functorch_transforms_active()):
            return False
        index = x.get_device()
        # the current device's current stream is its default (legacy) one, id 0, and not capturing
        return (index == torch.cuda.current_device() and torch._C._cuda_getCurrentStream(index)[0] == 0
                and not torch.cuda.is_current_stream_capturing())

    def __call__(self, model: nn.Module, forward: Callable[..., Tensor], args: tuple, kwargs: dict) -> Tensor:
        """``forward(*args, **kwargs)``, replayed where it can be (see the module doc)."""
        if self.churned or not self._active(model, args[0] if args else None):
            return forward(*args, **kwargs)
        state = _model_state(model, self.watched)
        sig = None if state is None else _signature(args, kwargs, *state)
        if sig is None or not any(sig[1][_GRADS]):
            return forward(*args, **kwargs)
        rec = self.rec
        if rec is not None:
            if _same(rec.sig, sig):
                if rec.pending():
                    return forward(*args, **kwargs)
                return _replayed_apply(rec, *rec.used)
            if rec.sig[1][_PTRS] != sig[1][_PTRS]:      # parameters moved (.to(), .half()): never again
                self.rec = rec = None
        if _same(self.refused, sig):
            return forward(*args, **kwargs)
        if _same(self.seen, sig):
            self.count, self.new_signatures = self.count + 1, 0
        else:
            self.seen, self.count = sig, 1
            self.new_signatures += 1
            if self.mode is None and self.new_signatures >= CHURN_LIMIT:   # a DataLoader's batches
                self.churned, self.seen = True, None
                return forward(*args, **kwargs)
        if self.count <= self.warmup:
            return forward(*args, **kwargs)
        self.rec, self.seen = None, None          # a new signature replaces the old recording
        try:
            limit = None if self.mode is True else (
                default_budget(args[0].device) if self.budget is None else self.budget)
            self.rec = _record(model, forward, args, kwargs, sig, state[0], limit)
        except (torch.cuda.OutOfMemoryError, _OverBudget):
            self.refused = sig
            return forward(*args, **kwargs)
        except RuntimeError as exc:
            self.failed = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            warnings.warn(f"{type(model).__name__}: recording the forward as a CUDA graph failed, replay is off "
                          f"for this model ({self.failed})", RuntimeWarning, stacklevel=3)
            return forward(*args, **kwargs)
        return _replayed_apply(self.rec, *self.rec.used)


class _OverBudget(Exception):
    """The forward keeps more memory alive than the replay budget allows."""


def _record(model: nn.Module, forward: Callable[..., Tensor], args: tuple, kwargs: dict, sig: tuple,
            params: Tuple[Tensor, ...], budget: Optional[int]) -> _Recording:
    """Under the ``auto`` investment policy, an eager forward and backward that invest in every
    graph the model uses (``_invest``: a signature met ``warmup + 1`` times is taken as proof of
    reuse, and a replay keeps the kernels it captures, so they must be the tuned ones, not those
    of first contact; done also when the recording is then refused, so the eager calls that
    follow run tuned kernels), one warm-up on a side stream (the CUDA-graph recipe; host syncs
    there raise, so a forward that cannot be captured is found before any capture starts; what
    its forward keeps alive is measured there, after the eager calls built every cache, and
    over ``budget`` bytes nothing is captured; buffers the extra calls update, such as
    BatchNorm's running statistics, are restored, whether or not anything is captured), then the
    forward and the backward (``autograd.grad`` for a static ``dY``) captured into one memory pool.

    ``forward`` runs with the module's parameters swapped for aliases (``p.detach()``: same
    storage, so a replay reads the current values; new leaves): ``autograd.grad`` on the
    parameters themselves would reach their gradient accumulators, which live on the stream of
    an earlier eager step whenever its output is still alive, and the capture would then reach
    into that stream and fail.  The Graphs the layers build from an ``edge_index`` while it
    runs are kept with the recording (the process-wide graph cache may drop them)."""
    named = dict(model.named_parameters())
    aliases = {n: p.detach().requires_grad_(p.requires_grad) for n, p in named.items()}
    by_id = {id(p): aliases[n] for n, p in named.items()}
    trained = tuple(p for p in params if p.requires_grad)
    leaves = tuple(by_id[id(p)] for p in trained)
    graphs: List[Graph] = []

    def run(into: List[Graph] = graphs) -> Tensor:
        with _reparametrize_module(model, aliases, tie_weights=True), _graph_input.collect_graphs(into):
            return forward(*args, **kwargs)

    buffers = [b for b in model.buffers() if b.is_cuda]
    saved = [b.clone() for b in buffers]
    mode = torch.cuda.get_sync_debug_mode()
    side = side_stream()      # one per device: each new stream keeps a cuBLAS workspace
    try:
        if reuse.policy() == "auto":      # ("always" invested on the first call, "never" never does)
            _invest(run, leaves)
        torch.cuda.synchronize()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), capture_warmup():
            torch.cuda.set_sync_debug_mode("error")
            before = torch.cuda.memory_allocated()
            out = run()
            if not isinstance(out, Tensor) or not out.requires_grad:
                raise RuntimeError(f"the forward must return one tensor that needs a gradient, got {type(out).__name__}")
            if budget is not None and torch.cuda.memory_allocated() - before > budget:
                raise _OverBudget()
            torch.autograd.grad(out, leaves, grad_outputs=torch.empty_like(out), allow_unused=True)
            del out
    finally:
        torch.cuda.set_sync_debug_mode(mode)
        torch.cuda.current_stream().wait_stream(side)
        for b, v in zip(buffers, saved):        # also when refused: the eager call updates them once
            b.copy_(v)
        torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    fwd = CleanupCUDAGraph()
    with failed_capture_guard(), torch.cuda.graph(fwd, pool=pool, capture_error_mode="thread_local"):
        out = run()
    grad_out = torch.empty_like(out)
    bwd = CleanupCUDAGraph()
    with failed_capture_guard(), torch.cuda.graph(bwd, pool=pool, capture_error_mode="thread_local"):
        grads = torch.autograd.grad(out, leaves, grad_outputs=grad_out, allow_unused=True)
    used = tuple(p for p, g in zip(trained, grads) if g is not None)
    if not used:
        raise RuntimeError("no parameter gets a gradient from the forward's output")
    return _Recording(sig, (args, kwargs, aliases, graphs), fwd, bwd, out.detach(), grad_out, used,
                      [g for g in grads if g is not None])


def _invest(run: Callable[[List[Graph]], Tensor], leaves: Tuple[Tensor, ...]) -> None:
    """Eager forwards and backwards under ``tune.reuse.investing()`` on the current stream
    (syncs allowed): every graph they use is invested in.  Another pass while the last one
    invested in something (at most three): decisions an op takes on the call *after* its graph
    is invested (a precision mode's pick between exact and tensor-core kernels) are then made
    here, timed, rather than provisionally in the warm-up or the capture, where nothing may be
    timed."""
    for _ in range(3):
        before = reuse.reuse_counts()["invested"]
        with reuse.investing():
            out = run([])
            if isinstance(out, Tensor) and out.requires_grad:
                torch.autograd.grad(out, leaves, grad_outputs=torch.zeros_like(out), allow_unused=True)
            del out
        if reuse.reuse_counts()["invested"] == before:
            return


def replay_state(module: nn.Module) -> str:
    """What ``module``'s replay did: ``"recorded, N replays"``, ``"refused"`` (over the memory
    budget), ``"failed: ..."`` (the recording's error), ``"waiting"`` (not recorded yet: fewer
    than three calls with one signature, or none that qualified), ``"off"`` or ``"none"`` (not a
    replaying module)."""
    r = module._replay if isinstance(module, Replayable) else getattr(module.__dict__.get("forward"), "state", None)
    if r is None:
        return "none"
    if r.mode is False:
        return "off"
    if r.churned:
        return "gave up: inputs never repeat"
    if r.rec is not None:
        return f"recorded, {r.rec.generation} replays"
    if r.failed:
        return f"failed: {r.failed}"
    return "refused" if r.refused is not None else "waiting"


class ReplayedForward:
    """``module.forward`` replaced by a replaying wrapper (:func:`enable_replay`): picklable and
    deep-copied with the module (a copy starts without a recording).  ``forward``: an instance
    override that was there before, else None (the class's ``forward``, looked up per call)."""

    def __init__(self, module: nn.Module, forward: Optional[Callable[..., Tensor]], mode: Optional[bool]) -> None:
        self.module, self.forward, self.state = module, forward, Replay(mode)

    def __call__(self, *args, **kwargs) -> Tensor:
        forward = self.forward if self.forward is not None else type(self.module).forward.__get__(self.module)
        return self.state(self.module, forward, args, kwargs)


def enable_replay(module: nn.Module, mode: Optional[bool] = None) -> nn.Module:
    """Make ``module``'s ``forward`` replay (any model whose forward takes CUDA tensors,
    :class:`~sparsegnn.Graph` objects and plain values and returns one tensor; see the module
    doc).  ``mode``: None (within the memory budget) or True; False turns it off.  Returns
    ``module``."""
    if mode not in (None, True, False):
        raise ValueError(f"enable_replay(): mode must be None, True or False, got {mode!r}")
    if isinstance(module, Replayable):
        module.replay = mode
        return module
    current = module.__dict__.get("forward")
    if isinstance(current, ReplayedForward):
        del module.forward
        current = current.forward
    if mode is not False:
        module.forward = ReplayedForward(module, current, mode)
    elif current is not None:
        module.forward = current
    return module


class Replayable(nn.Module):
    """Base of the reference models: ``forward(x, graph)`` replays (see the module doc) and
    otherwise runs ``_forward(x, graph)``.  ``replay``: None (auto), True or False.  Moving or
    converting the model (``.to()``, ``.half()``) drops its recording."""

    def __init__(self, replay: Optional[bool] = None) -> None:
        super().__init__()
        self._replay = Replay(replay)

    @property
    def replay(self) -> Optional[bool]:
        return self._replay.mode

    @replay.setter
    def replay(self, mode: Optional[bool]) -> None:
        self._replay = Replay(mode, self._replay.warmup, self._replay.budget)

    def _apply(self, fn, *args, **kwargs):
        self._replay.reset()
        return super()._apply(fn, *args, **kwargs)

    def _forward(self, x: Tensor, graph) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, graph) -> Tensor:
        return self._replay(self, self._forward, (x, graph), {})
