"""Whole training steps as one CUDA graph replay.

A full-graph training step on a small graph is a few hundred kernel launches of a few
microseconds each: the GPU waits on Python. :class:`CapturedStep` records one whole step
(forward, loss, backward and ``optimizer.step()``) into a CUDA graph once and then replays
it, one launch from the host per step. It follows the ``torch.cuda.graphs`` recipe for whole
networks: ``warmup`` eager steps on a side stream, gradients set to ``None``, one step
captured with :class:`torch.cuda.graph`.

Recipe::

    model = sparsegnn.nn.GCN(F_in, C).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)   # step count on the GPU
    train_idx = train_mask.nonzero().flatten()                             # once: no host sync per step
    y_train = y.index_select(0, train_idx)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, graph).index_select(0, train_idx), y_train)
        loss.backward()
        opt.step()
        return loss

    step = CapturedStep(step, warmup=3, optimizer=opt, inputs=(x, y_train, train_idx))
    for epoch in range(200):
        loss = step()            # eager for 3 calls, captured on the 4th, replayed from then on

What a step may do (the rules of CUDA graphs):

* **CUDA only.** Every tensor it touches lives on the GPU.
* **No host syncs.** ``logits[mask]`` with a boolean mask, ``.item()``, ``nonzero()``,
  ``print(tensor)`` wait for the GPU and cannot be captured: compute index tensors once
  outside the step and use ``index_select``. A failed capture is reported as a ``ValueError``
  naming this rule; ``torch.cuda.set_sync_debug_mode("warn")`` on an eager step shows where.
* **Static inputs.** The replay reads the same memory every time: to train on new data, copy
  it into the captured tensors (``x.copy_(new_x)``), never rebind the names.
* **Capturable optimiser.** ``Adam``/``AdamW`` (and others with a ``capturable`` flag) must be
  built with ``capturable=True`` so that their step counter lives on the GPU. A float ``lr``
  is baked into the graph: learning-rate schedules need a tensor ``lr``.
* **Dropout is fine:** PyTorch registers the RNG state with the graph, every replay draws new
  masks.
* **Warm-up fills the caches.** The sparse ops plan and tune kernels on first use (timing
  them with CUDA events) and cache transposes on the Graph: all of this happens in the eager
  warm-up steps; during capture their decisions are memoised, so nothing is timed or built.

The returned loss is the graph's static output tensor, overwritten by the next replay:
``.item()`` or ``.clone()`` it to keep a value.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Dict, Iterable, Optional

import torch
from torch import Tensor, nn

from ._failed_capture import CleanupCUDAGraph, failed_capture_guard
from ._checks import check
from ._streams import capture_warmup, side_stream
from .nn.norm import padded_nodes
from .ops._dispatch import capturable
from .tune import reuse

__all__ = ["CapturedStep", "capture_step", "CapturedGraphSteps", "use_capture"]


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"CapturedStep(): {message}")


def use_capture(fn: str, capture: Optional[bool], device, backend: str = "auto", supported: bool = True) -> bool:
    """Whether a training loop captures its steps: ``capture`` when given (True needs CUDA), else
    on CUDA with the Triton kernels (the reference backend's ops may sync the host) for models
    whose steps can be captured (``supported``)."""
    cuda = torch.device(device).type == "cuda"
    if capture is None:
        return cuda and capturable(backend) and supported
    check(not capture or cuda, fn, f"capture=True needs a CUDA device, got {device}")
    return bool(capture)


def _check_optimizer(optimizer: torch.optim.Optimizer) -> None:
    _check(isinstance(optimizer, torch.optim.Optimizer),
           f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    for group in optimizer.param_groups:
        if "capturable" in group and not group["capturable"]:
            name = type(optimizer).__name__
            raise ValueError(
                f"CapturedStep(): {name} is not capturable: its step counter lives on the host and a "
                f"captured step would replay a frozen counter; build it with "
                f"torch.optim.{name}(params, ..., capturable=True)")
        for param in group["params"]:
            _check(param.is_cuda, f"optimizer parameters must be CUDA tensors, got one on {param.device} "
                                  "(move the model with .cuda() before building the optimizer)")


class CapturedStep:
    """One training step captured as a CUDA graph and replayed on every later call.

    Each call performs exactly one training step and returns its loss: the first ``warmup``
    calls run ``step_fn`` eagerly on a side stream (filling the sparse ops' plans, tuned
    configs and the optimiser's state; the first invests in every graph it uses,
    ``tune.reuse.investing``, since the capture keeps its kernels), the next one captures
    ``step_fn`` into a CUDA graph and replays it, and every later call is a replay. :meth:`capture` captures at once.

    Args:
        step_fn: zero-argument callable doing forward, loss, backward and optimiser step on
            static tensors, returning the loss tensor. It should start with
            ``optimizer.zero_grad(set_to_none=True)`` so that the gradients captured live in
            the graph's memory pool.
        warmup: eager steps before the capture (>= 1; 3 as in the PyTorch recipe).
        optimizer: the optimiser ``step_fn`` steps, checked to be capturable and on CUDA; its
            gradients are set to None before the capture.
        inputs: the static tensors ``step_fn`` reads (features, labels, index sets), checked
            to be CUDA tensors.
        pool: memory pool handle for :class:`torch.cuda.graph` (share one between graphs).

    Shapes:
        step_fn: () -> loss: [] (a scalar CUDA tensor; the same tensor on every replay).

    Raises:
        ValueError: no CUDA device, CPU tensors, a non-capturable optimiser, a step that does
            not return a CUDA tensor, or a capture that failed (usually a host sync in the step).
    """

    def __init__(self, step_fn: Callable[[], Tensor], warmup: int = 3, *,
                 optimizer: Optional[torch.optim.Optimizer] = None, inputs: Iterable[Tensor] = (),
                 pool=None) -> None:
        _check(callable(step_fn), f"step_fn must be callable, got {type(step_fn).__name__}")
        _check(isinstance(warmup, int) and warmup >= 1, f"warmup must be an int >= 1, got {warmup!r}")
        if optimizer is not None:
            _check_optimizer(optimizer)
        for i, tensor in enumerate(inputs):
            _check(isinstance(tensor, Tensor), f"inputs[{i}] must be a tensor, got {type(tensor).__name__}")
            _check(tensor.is_cuda, f"inputs[{i}] is on {tensor.device}: every tensor of a captured step "
                                   "must be a CUDA tensor")
        _check(torch.cuda.is_available(), "CUDA graphs need a CUDA device and none is available "
                                          "(run the step eagerly on the CPU)")
        self.step_fn = step_fn
        self.warmup = warmup
        self.optimizer = optimizer
        self.pool = pool
        self.cuda_graph: Optional[torch.cuda.CUDAGraph] = None
        self.loss: Optional[Tensor] = None
        self.steps_run = 0
        self._stream: Optional[torch.cuda.Stream] = None

    @property
    def captured(self) -> bool:
        """Whether the step has been captured (every later call is a replay)."""
        return self.cuda_graph is not None

    def _eager_step(self) -> Tensor:
        """One eager step on the side stream (the recipe's warm-up), ordered with the current stream."""
        if self._stream is None:
            self._stream = side_stream()    # shared: each new stream keeps a cuBLAS workspace
        current = torch.cuda.current_stream()
        self._stream.wait_stream(current)
        # the first warm-up step invests in every graph the step uses (the capture repeats its
        # kernels for good, so they must be the tuned ones); later ones make the decisions taken
        # on the call after an investment (a precision mode's pick), so the capture times nothing
        # (with warmup=1 such a pick is made in the capture: the model's, provisional)
        investing = reuse.investing() if self.steps_run == 0 and reuse.policy() == "auto" else nullcontext()
        with torch.cuda.stream(self._stream), capture_warmup(), investing:
            loss = self.step_fn()
        current.wait_stream(self._stream)
        _check(isinstance(loss, Tensor), f"step_fn must return the loss tensor, got {type(loss).__name__}")
        _check(loss.is_cuda, f"step_fn returned a loss on {loss.device}: every tensor of a captured step "
                             "must be a CUDA tensor")
        loss.record_stream(current)     # made on the side stream, read on the current one
        self.steps_run += 1
        # detached: a loss that keeps its autograd graph alive keeps the parameters' AccumulateGrad
        # nodes of this stream alive, and a later capture on another stream then syncs and fails
        return loss.detach()

    def capture(self) -> "CapturedStep":
        """Run the remaining warm-up steps and capture the step now (the capture itself runs
        nothing: the captured step first executes on the next call). Returns ``self``."""
        if self.captured:
            return self
        while self.steps_run < self.warmup:
            self._eager_step()
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        graph = CleanupCUDAGraph()
        try:
            # thread_local: a loader thread sampling the next batch (host syncs, allocations) meanwhile
            # must not invalidate this capture
            with failed_capture_guard(), torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                loss = self.step_fn()
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError as exc:
            raise ValueError(
                "CapturedStep(): capturing the step failed (the error below). The usual cause is a host sync: a "
                "step must not synchronise with the host (boolean-mask indexing, .item(), nonzero(), printing "
                "tensors, CPU tensors): use index "
                "tensors computed once (x.index_select(0, idx)); run one eager step under "
                f"torch.cuda.set_sync_debug_mode('warn') to find the sync. CUDA said: {exc}") from exc
        _check(isinstance(loss, Tensor), f"step_fn must return the loss tensor, got {type(loss).__name__}")
        self.cuda_graph, self.loss = graph, loss.detach()     # no autograd graph kept alive (see _eager_step)
        return self

    def __call__(self) -> Tensor:
        """One training step: eager during warm-up, then a replay. Returns the loss tensor.

        Shapes:
            -> [] (after the capture, the same static tensor every call).
        """
        if not self.captured and self.steps_run < self.warmup:
            return self._eager_step()
        self.capture()
        self.cuda_graph.replay()
        self.steps_run += 1
        return self.loss

    def __repr__(self) -> str:
        state = "captured" if self.captured else f"warm-up {self.steps_run}/{self.warmup}"
        return f"CapturedStep({state}, steps run {self.steps_run})"


def capture_step(step_fn: Callable[[], Tensor], warmup: int = 3, *,
                 optimizer: Optional[torch.optim.Optimizer] = None, inputs: Iterable[Tensor] = (),
                 pool=None) -> CapturedStep:
    """Run ``warmup`` eager steps, capture ``step_fn`` and return the :class:`CapturedStep`
    whose every call replays it (the eager form of ``CapturedStep(...).capture()``).

    Shapes:
        step_fn: () -> loss: [] (a scalar CUDA tensor).
    """
    return CapturedStep(step_fn, warmup, optimizer=optimizer, inputs=inputs, pool=pool).capture()


LossFn = Callable[[Tensor, object], Tensor]


class CapturedGraphSteps:
    """Training steps of a graph-level model, each a CUDA graph replay on a padded batch.

    Every batch is padded to its shape (:class:`~sparsegnn.datasets.padding.BatchPadding`:
    nodes and edges rounded up, a fixed number of graph slots, the size class of its largest
    graph; or :class:`~sparsegnn.sampling.padding.MiniBatchPadding` for sampled sub-graphs) and
    copied into that shape's static tensors (:class:`~sparsegnn.datasets.padding.StaticBatch`).  The
    first batch of a shape runs eagerly (warm-up: kernels compiled, optimiser state made), the
    second captures the step (:class:`~sparsegnn.capture.CapturedStep`) and every later one
    replays it.  The step is ``zero_grad``, ``loss_fn(model(x, graph), batch)`` under
    :func:`~sparsegnn.nn.padded_nodes` (BatchNorm over the real nodes), ``backward`` and
    ``optimizer.step()``, so the model trains as on the unpadded batches.

    Args:
        model: takes ``(x, graph)`` of a batch and returns per-graph logits (``[slots, ...]``).
        optimizer: built with ``capturable=True`` when capturing (Adam / AdamW); a learning
            rate that changes (a schedule) must be a tensor, changed in place (``set_lr``).
        loss_fn: ``(logits, batch) -> loss`` that weighs out the padding slots (a padded
            ``y_mask``, or ``batch.graph_weight``: :func:`masked_bce`, :func:`graph_cross_entropy`).
        padding: the shapes: ``shape_of(batch)`` (hashable, host integers only) and
            ``static(shape, batch)`` (an object with ``fill(batch)`` and a static ``batch``):
            ``datasets.BatchPadding.for_dataset(dataset, batch_size)`` for batches of small
            graphs, ``sampling.MiniBatchPadding`` for sampled mini-batches.
        capture: False runs the same padded steps eagerly (CPU; tests).

    Returns (``__call__``): the loss tensor of the step; with capture the shape's static
    tensor, overwritten by its next replay (read or accumulate it before then).

    Shapes:
        batch: a GraphLoader batch of at most ``padding.batch_size`` graphs, or a sampled mini-batch -> loss [].

    Capturing needs CUDA and an optimiser with ``capturable=True``; ``capture=False`` runs anywhere.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                 padding, *, capture: bool = True) -> None:
        check(hasattr(padding, "shape_of") and hasattr(padding, "static"), "CapturedGraphSteps",
              f"padding must have shape_of() and static() (a BatchPadding), got {type(padding).__name__}")
        self.model, self.optimizer, self.loss_fn, self.padding, self.capture = model, optimizer, loss_fn, padding, capture
        self._steps: Dict[tuple, tuple] = {}

    @property
    def shapes(self) -> Dict[tuple, int]:
        """Each shape seen so far and how many batches it has run."""
        return {shape: static.fills for shape, (static, _) in self._steps.items()}

    def _step_fn(self, static) -> Callable[[], Tensor]:
        batch = static.batch

        def step() -> Tensor:
            self.optimizer.zero_grad(set_to_none=True)
            with padded_nodes(batch.node_weight):
                loss = self.loss_fn(self.model(batch.x, batch.graph), batch)
            loss.backward()
            self.optimizer.step()
            return loss
        return step

    def __call__(self, batch) -> Tensor:
        shape = self.padding.shape_of(batch)
        entry = self._steps.get(shape)
        if entry is None:
            static = self.padding.static(shape, batch)
            step = self._step_fn(static)
            if self.capture:
                step = CapturedStep(step, warmup=1, optimizer=self.optimizer,
                                    inputs=[t for _, t in static.batch.items() if isinstance(t, Tensor)])
            entry = self._steps[shape] = (static, step)
        static, step = entry
        static.fill(batch)
        return step().detach()          # keep no autograd graph alive (see CapturedStep._eager_step)

    def __repr__(self) -> str:
        return f"CapturedGraphSteps({len(self._steps)} shapes, capture={self.capture}, {self.padding})"
