"""Node-classification training, full-batch or on sampled mini-batches (what ``sparsegnn train`` runs)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import nn as sgnn
from .datasets import NodeDataset
from .optim import LeanAdam


def build_model(name: str, in_channels: int, out_channels: int, hidden: Optional[int] = None,
                dropout: Optional[float] = None, backend: str = "auto", precision: str = "ieee",
                maxk: Union[int, str, None] = None, num_layers: Optional[int] = None,
                maxk_linear_first: bool = False) -> nn.Module:
    """Construct a model by name with the papers' defaults (``hidden``/``dropout``, and
    ``num_layers`` for sage, gin and agnn, override them).

    ``precision`` (``"ieee"``, ``"tf32"``, ``"bf16"``) sets every layer's aggregation precision
    (``sparsegnn.spmm``); GAT's multi-head aggregation has exact fp32 only.

    ``maxk`` (``name`` = ``"sage"``, ``"gcn"`` or ``"gin"``): an int ``K`` builds MaxK-GNN's model
    :class:`~sparsegnn.nn.MaxKGNN` with that conv and the MaxK nonlinearity keeping ``K`` of the
    ``hidden`` entries per row (``1 <= K <= hidden``); ``"relu"`` builds its ReLU baseline (the
    same structure with ReLU; its ``lin_in`` keeps a bias, MaxK's has none).  Defaults then are MaxK-GNN's: hidden 256,
    3 layers, dropout 0.5; the aggregation is exact (``precision="ieee"``).  ``maxk_linear_first``
    builds GCN / GIN as the authors' models (``MaxKGNN(linear_first=True)``: MaxK on the output of
    each layer's linear map)."""
    factories: Dict[str, Callable[..., nn.Module]] = {
        "gcn": sgnn.GCN, "agnn": sgnn.AGNN, "sage": sgnn.GraphSAGE, "gin": sgnn.GIN, "gat": sgnn.GAT,
    }
    key = name.lower()
    if key not in factories:
        raise ValueError(f"build_model(): unknown model {name!r}; known: {', '.join(factories)}")
    if maxk is not None:
        if num_layers is not None:
            raise ValueError("build_model(): MaxK-GNN's model has 3 layers; num_layers is not taken with maxk")
        return _maxk_model(key, in_channels, out_channels, hidden, dropout, backend, precision, maxk,
                           maxk_linear_first)
    if maxk_linear_first:
        raise ValueError("build_model(): maxk_linear_first places MaxK in MaxK-GNN's model; pass maxk too")
    kwargs = {"backend": backend}
    if precision != "ieee":
        if key == "gat":
            raise ValueError(f"build_model(): precision={precision!r} is not available for gat (its multi-head "
                             "aggregation is exact fp32); use gcn, agnn, sage or gin")
        kwargs["precision"] = precision
    if hidden is not None:
        kwargs["hidden"] = hidden
    if dropout is not None:
        kwargs["dropout"] = dropout
    if num_layers is not None:
        if key not in ("sage", "gin", "agnn"):
            raise ValueError(f"build_model(): num_layers is fixed for {key} (2 layers); set it for sage, gin or agnn")
        kwargs["num_layers"] = num_layers
    return factories[key](in_channels, out_channels, **kwargs)


def _maxk_model(key: str, in_channels: int, out_channels: int, hidden: Optional[int], dropout: Optional[float],
                backend: str, precision: str, maxk: Union[int, str], linear_first: bool = False) -> nn.Module:
    """:class:`~sparsegnn.nn.MaxKGNN` for ``build_model(..., maxk=...)`` (its checks, its messages)."""
    from .nn.models import MAXK_CONVS

    fn = "build_model"
    if key not in MAXK_CONVS:
        raise ValueError(f"{fn}(): maxk is available for the models {', '.join(MAXK_CONVS)} (MaxK-GNN's), "
                         f"got {key!r}")
    if precision != "ieee":
        raise ValueError(f"{fn}(): maxk models aggregate exactly (precision='ieee'), got precision={precision!r}")
    width = 256 if hidden is None else hidden
    if linear_first and key == "sage":
        raise ValueError(f"{fn}(): maxk_linear_first is for gcn / gin (MaxK after their linear map); sage's "
                         "placement is already the authors'")
    kwargs = dict(conv=key, hidden=width, backend=backend, linear_first=linear_first)
    if dropout is not None:
        kwargs["dropout"] = dropout
    if isinstance(maxk, str) and maxk == "relu":
        return sgnn.MaxKGNN(in_channels, out_channels, nonlinearity="relu", **kwargs)
    if not isinstance(maxk, int) or isinstance(maxk, bool) or not 1 <= maxk <= width:
        raise ValueError(f"{fn}(): maxk must be an int in [1, hidden = {width}] or 'relu', got {maxk!r}")
    return sgnn.MaxKGNN(in_channels, out_channels, k=maxk, nonlinearity="maxk", **kwargs)


#: ``compile`` modes of :func:`train_node_classifier` and ``sparsegnn train --compile``.
COMPILE_MODES = ("none", "capture", "reduce-overhead", "default")


@dataclass
class TrainResult:
    """Final-epoch metrics, the test accuracy at the best validation epoch, timing and losses."""

    model: str
    dataset: str
    device: str
    seed: int
    epochs: int
    train_acc: float
    val_acc: float
    test_acc: float
    best_val_acc: float
    test_acc_at_best_val: float
    mean_epoch_ms: float
    compile: str = "none"
    losses: List[float] = field(default_factory=list)
    maxk: Union[int, str, None] = None

    def as_dict(self) -> dict:
        return asdict(self)


def _accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    return float((logits[mask].argmax(-1) == y[mask]).float().mean()) if bool(mask.any()) else float("nan")


def _evaluate(model: nn.Module, data: NodeDataset):
    """``(train, val, test)`` accuracy of a full-graph forward in eval mode."""
    model.eval()
    with torch.no_grad():
        logits = model(data.x, data.graph)
    return tuple(_accuracy(logits, data.y, mask) for mask in (data.train_mask, data.val_mask, data.test_mask))


class _LossStep(nn.Module):
    """``cross_entropy(model(x, graph)[train_idx], y_train)``: what ``torch.compile`` compiles,
    so the loss is inside the compiled (and, with ``reduce-overhead``, graph-captured) region."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, graph, train_idx: Tensor, y_train: Tensor) -> Tensor:
        return F.cross_entropy(self.model(x, graph).index_select(0, train_idx), y_train)


def _has_sparsegnn_layers(model: nn.Module) -> bool:
    return any(type(m).__module__.startswith("sparsegnn.nn") for m in model.modules())


def check_compile_mode(compile: str, device, fn: str = "train_node_classifier") -> None:
    """Raise ``ValueError`` when ``compile`` is unknown or needs CUDA graphs on a non-CUDA ``device``."""
    if compile not in COMPILE_MODES:
        raise ValueError(f"{fn}(): unknown compile mode {compile!r}; known: {', '.join(COMPILE_MODES)}")
    if compile in ("capture", "reduce-overhead") and torch.device(device).type != "cuda":
        raise ValueError(f"{fn}(): compile={compile!r} replays CUDA graphs and needs a CUDA device, got "
                         f"device {str(device)!r} (use compile='none' or 'default' on the CPU)")


#: Mini-batch models whose steps ``train_minibatch`` captures by default (no per-call graph transform).
CAPTURED_MINIBATCH_MODELS = ("sage", "gin")


def make_optimizer(model: nn.Module, compile: str = "none", lr: float = 0.01,
                   weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """Adam over ``model``'s parameters; ``capturable=True`` for ``compile="capture"``.

    Eager steps on CUDA use PyTorch's fused Adam (one kernel launch for all parameters instead
    of about ten ``foreach`` launches with host work between them) behind a lean step
    (:class:`~sparsegnn.optim.LeanAdam`: the same kernels and updates without ``Adam.step``'s
    per-step Python): an eager step of a small model is host-bound, and the optimiser is a
    large share of it.  The baselines of ``benchmarks/train.py`` build their optimiser here
    too, so they get the same."""
    params = list(model.parameters())
    if compile == "capture":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, capturable=True)
    if params and all(p.is_cuda and p.is_floating_point() for p in params):
        return LeanAdam(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


def make_train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, graph, train_idx: Tensor,
                    y_train: Tensor, compile: str = "none", compile_backend: Optional[str] = None,
                    warmup: int = 3, backward_threads: bool = False) -> Callable[[], Tensor]:
    """A zero-argument full-graph training step (forward, cross-entropy on ``train_idx``,
    backward, ``optimizer.step()``) returning the loss, run as ``compile`` says:

    * ``"none"``: eager;
    * ``"capture"``: a :class:`~sparsegnn.capture.CapturedStep` (``warmup`` eager calls, then one
      CUDA graph replay per call; ``optimizer`` must be capturable, see :func:`make_optimizer`);
    * ``"reduce-overhead"`` / ``"default"``: model and loss through ``torch.compile`` with that
      mode (``compile_backend``, default ``"inductor"``; ``"aot_eager"`` needs no compiler);
      the optimiser step stays eager. A model with sparsegnn layers first goes through
      ``sparsegnn.nn.prepare`` (one eager pass without dropout that builds what compiled code reads).

    The step never synchronises with the host: labels are indexed with ``train_idx`` (an index
    tensor), not a boolean mask.  Its backward runs on the calling thread
    (``torch.autograd.set_multithreading_enabled(False)``; ``backward_threads=True`` keeps the
    autograd engine's per-device worker thread): the same kernels on the same streams, without
    handing the backward to the worker and back, which costs a small step 100-400 us of host
    time on the H100/H200 hosts (``docs/design/replay.md``; a full-graph step of a small model is
    host-bound). ``graph`` is whatever ``model`` takes (a Graph, ``edge_index``,
    a sparse adjacency).

    Shapes:
        x: [N, F]; train_idx: [T] int64; y_train: [T] int64 (the labels of ``train_idx``) -> loss: [].
    """
    check_compile_mode(compile, x.device, "make_train_step")
    loss_fn: Callable[..., Tensor] = _LossStep(model)
    if compile in ("reduce-overhead", "default"):
        if _has_sparsegnn_layers(model):
            sgnn.prepare(model, x, graph)    # graphs, plans and tuned configs built eagerly: compiled code only reads them
        loss_fn = torch.compile(loss_fn, mode=compile, backend=compile_backend or "inductor")
    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    def step() -> Tensor:
        if compile == "reduce-overhead" and mark_step is not None:
            mark_step()     # a new iteration: cudagraph trees may reuse the previous one's outputs
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(x, graph, train_idx, y_train)
        if backward_threads:
            loss.backward()
        else:
            with torch.autograd.set_multithreading_enabled(False):
                loss.backward()
        optimizer.step()
        return loss.detach()

    if compile == "capture":
        from .capture import CapturedStep

        return CapturedStep(step, warmup, optimizer=optimizer, inputs=(x, train_idx, y_train))
    return step


def train_node_classifier(
    data: NodeDataset,
    model_name: str = "gcn",
    epochs: int = 200,
    lr: float = 0.01,
    weight_decay: float = 5e-4,
    hidden: Optional[int] = None,
    dropout: Optional[float] = None,
    seed: int = 0,
    device: str = "cpu",
    backend: str = "auto",
    progress: bool = True,
    compile: str = "none",
    compile_backend: Optional[str] = None,
    reorder: Optional[str] = None,
    precision: str = "ieee",
    maxk: Union[int, str, None] = None,
    maxk_linear_first: bool = False,
) -> TrainResult:
    """Train ``model_name`` on ``data`` with Adam and cross-entropy on the training nodes.

    Epoch time covers forward, backward and the optimiser step (synchronised on CUDA). The
    training step indexes the training nodes with an index tensor (no host sync), so every
    ``compile`` mode computes the same losses:

    * ``"none"``: eager;
    * ``"capture"``: the whole step as one CUDA graph replay (:class:`~sparsegnn.capture.CapturedStep`,
      Adam with ``capturable=True``; the first 3 epochs are the eager warm-up); CUDA only;
    * ``"reduce-overhead"``: ``torch.compile(mode="reduce-overhead")`` (CUDA graphs) of model and
      loss; CUDA only;
    * ``"default"``: ``torch.compile`` of model and loss (CPU too).

    ``compile_backend`` picks the ``torch.compile`` backend (default ``"inductor"``;
    ``"aot_eager"`` traces without generating code). Evaluation (accuracy) runs eagerly.

    ``reorder`` (``"rcm"``, ``"degree"``, ``"lpa"``; see ``Graph.reorder``) renumbers the nodes
    once, before training, for locality: features, labels and masks are permuted with the
    graph, so losses and accuracies are those of the original order (up to rounding).

    ``precision`` (``"tf32"`` / ``"bf16"``) runs the aggregations at reduced precision (see
    :func:`build_model`); the default ``"ieee"`` is exact.

    ``maxk`` (``model_name`` sage, gcn or gin): an int ``K`` trains MaxK-GNN's model with the MaxK
    nonlinearity (``K`` kept of ``hidden``), ``"relu"`` its ReLU baseline (see :func:`build_model`);
    every ``compile`` mode (under ``torch.compile`` MaxK and the CBSR aggregation are the custom ops
    ``sparsegnn::maxk`` / ``spmm_cbsr``).  ``maxk_linear_first``: GCN / GIN as the authors' models
    (see :func:`build_model`).
    """
    if epochs < 1:
        raise ValueError(f"train_node_classifier(): epochs must be >= 1, got {epochs}")
    check_compile_mode(compile, device)
    torch.manual_seed(seed)
    data = data.to(device)
    if reorder is not None:
        data, _ = data.reorder(reorder)
    model = build_model(model_name, data.x.shape[1], data.num_classes, hidden, dropout, backend,
                        precision, maxk, maxk_linear_first=maxk_linear_first).to(device)
    optimizer = make_optimizer(model, compile, lr, weight_decay)
    train_idx = data.train_mask.nonzero().flatten()                # once, outside the step: no sync per step
    y_train = data.y.index_select(0, train_idx)
    model.train()
    step = make_train_step(model, optimizer, data.x, data.graph, train_idx, y_train, compile, compile_backend)
    is_cuda = torch.device(device).type == "cuda"
    best_val, test_at_best = -1.0, float("nan")
    times: List[float] = []
    losses: List[float] = []
    try:
        from tqdm.auto import trange
        epochs_iter = trange(epochs, desc=f"{model_name}/{data.name}", disable=not progress, leave=False)
    except ImportError:  # pragma: no cover
        epochs_iter = range(epochs)
    for _ in epochs_iter:
        if is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        model.train()
        loss = step()
        if is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
        train_acc, val_acc, test_acc = _evaluate(model, data)
        if val_acc > best_val:
            best_val, test_at_best = val_acc, test_acc
        if hasattr(epochs_iter, "set_postfix"):
            epochs_iter.set_postfix(loss=f"{losses[-1]:.3f}", val=f"{val_acc:.3f}")
    # The first epochs include kernel compilation and caching: time the second half.
    steady = times[len(times) // 2:] or times
    return TrainResult(model_name, data.name, str(device), seed, epochs, train_acc, val_acc, test_acc,
                       best_val, test_at_best, 1000.0 * sum(steady) / len(steady), compile, losses, maxk)


def _uncache(model: nn.Module) -> nn.Module:
    """Turn ``cached=True`` layers (one fixed graph) into per-call graphs: every batch has its own."""
    for module in model.modules():
        if getattr(module, "cached", False):
            module.cached = False
            if hasattr(module, "reset_cache"):
                module.reset_cache()
    return model


def _use_trim(trim: Optional[bool], model: nn.Module, model_name: str, fanouts: Sequence[int], in_channels: int,
              capture: bool) -> bool:
    """Whether mini-batch steps run on per-layer graphs (see ``train_minibatch``'s ``trim``)."""
    layers = len(getattr(model, "convs", ()))
    possible = model_name in ("sage", "gin") and 1 <= layers <= len(fanouts)
    if trim is None:
        widths = [m.out_features for m in model.convs[0].modules() if isinstance(m, nn.Linear)] if possible else []
        return possible and capture and bool(widths) and in_channels > widths[0]
    if trim and not possible:
        raise ValueError(f"train_minibatch(): trim=True needs model 'sage' or 'gin' with at most len(fanouts)="
                         f"{len(fanouts)} layers, got {model_name!r} with {layers}")
    return bool(trim)


def train_minibatch(
    data: NodeDataset,
    model_name: str = "sage",
    fanouts: Sequence[int] = (15, 10),
    batch_size: int = 1024,
    epochs: int = 20,
    lr: float = 0.01,
    weight_decay: float = 5e-4,
    hidden: Optional[int] = None,
    dropout: Optional[float] = None,
    seed: int = 0,
    device: str = "cpu",
    backend: str = "auto",
    progress: bool = True,
    capture: Optional[bool] = None,
    num_layers: Optional[int] = None,
    trim: Optional[bool] = None,
) -> TrainResult:
    """Train ``model_name`` on neighbour-sampled mini-batches of the training nodes.

    Each epoch visits the training nodes in a new random order, ``batch_size`` seeds at a time;
    :class:`sparsegnn.sampling.NeighborLoader` samples ``fanouts[h]`` in-neighbours per node and
    hop (uniformly, without replacement; ``-1`` = all) on ``device``, and the model runs on
    the sampled sub-graph (``batch.graph``), its loss on the seeds' outputs
    (``out[:batch_size]``): PyG's ``NeighborLoader`` recipe.  Layers built with
    ``cached=True`` are switched to per-call graphs.  Evaluation is full-graph.

    Epoch time covers sampling, forward, backward and the optimiser steps of every batch
    (synchronised on CUDA); the mean is over the second half of the epochs.

    ``capture`` (default: on CUDA for ``CAPTURED_MINIBATCH_MODELS``, unless ``backend="reference"``;
    the other models transform the sampled graph per call, which a capture cannot take): every sampled batch is padded
    to one of a few shapes (:class:`sparsegnn.sampling.MiniBatchPadding`) and its step (forward,
    loss on the seeds, backward, Adam) replayed as a CUDA graph captured once per shape
    (:class:`sparsegnn.capture.CapturedGraphSteps`); the padding changes no seed's output.

    ``trim`` (SAGE and GIN with ``num_layers <= len(fanouts)``; default: with capture, when the
    input is wider than the hidden layers): each layer computes only the rows later layers read
    (:func:`sparsegnn.sampling.layer_graphs`; :class:`sparsegnn.sampling.TrimmedMiniBatchPadding`
    when captured).  Same seed outputs; the first layer's GEMMs shrink to the seeds' neighbours.
    """
    from .capture import CapturedGraphSteps, use_capture
    from .sampling import MiniBatchPadding, NeighborLoader, TrimmedMiniBatchPadding, layer_graphs, minibatch_loss

    if epochs < 1:
        raise ValueError(f"train_minibatch(): epochs must be >= 1, got {epochs}")
    torch.manual_seed(seed)
    data = data.to(device)
    model = build_model(model_name, data.x.shape[1], data.num_classes, hidden, dropout, backend, num_layers=num_layers)
    model = _uncache(model).to(device)
    is_cuda = torch.device(device).type == "cuda"
    # GCN / GAT / AGNN rebuild their normalised graph per call (data-dependent shapes): not captured by default
    capture = use_capture("train_minibatch", capture, device, backend, model_name in CAPTURED_MINIBATCH_MODELS)
    trim = _use_trim(trim, model, model_name, fanouts, data.x.shape[1], bool(capture))
    optimizer = make_optimizer(model, "capture" if capture else "none", lr, weight_decay)
    padding = TrimmedMiniBatchPadding(len(model.convs)) if trim else MiniBatchPadding()
    steps = CapturedGraphSteps(model, optimizer, minibatch_loss, padding) if capture else None
    generator = torch.Generator(device=device).manual_seed(seed)
    # prefetch on CUDA: the sampler's host syncs (2 per hop) would otherwise stall the step's
    # launches; a background thread samples the next batches on its own stream (24 -> 13 ms/step).
    prefetch = 2 if torch.device(device).type == "cuda" else 0
    loader = NeighborLoader(data.graph, list(fanouts), batch_size=batch_size, input_nodes=data.train_mask,
                            x=data.x, y=data.y, generator=generator, prefetch=prefetch)
    best_val, test_at_best = -1.0, float("nan")
    times: List[float] = []
    losses: List[float] = []
    from tqdm.auto import trange

    epochs_iter = trange(epochs, desc=f"{model_name}/{data.name} (mini-batch)", disable=not progress, leave=False)
    for _ in epochs_iter:
        if is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        model.train()
        total = torch.zeros((), device=device)
        for batch in loader:
            size = batch.batch_size
            if steps is not None:
                loss = steps(batch)
            else:
                graph = layer_graphs(batch, len(model.convs)) if trim else batch.graph
                loss = F.cross_entropy(model(batch.x, graph)[:size], batch.y[:size])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            total += loss.detach() * size
        if is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(total) / loader.input_nodes.numel())
        train_acc, val_acc, test_acc = _evaluate(model, data)
        if val_acc > best_val:
            best_val, test_at_best = val_acc, test_acc
        epochs_iter.set_postfix(loss=f"{losses[-1]:.3f}", val=f"{val_acc:.3f}")
    steady = times[len(times) // 2:] or times
    return TrainResult(model_name, data.name, str(device), seed, epochs, train_acc, val_acc, test_acc,
                       best_val, test_at_best, 1000.0 * sum(steady) / len(steady), "none", losses)
