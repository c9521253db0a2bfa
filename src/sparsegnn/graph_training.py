"""Graph-level training on batches of small graphs (what ``sparsegnn train --dataset tox21|PROTEINS_full`` runs).

* Molecules (Tox21 or any MoleculeNet-style CSV): multi-task binary classification with
  missing labels; masked BCE-with-logits; scaffold or random 80/10/10 split; test ROC-AUC
  (mean over tasks) at the best validation epoch; training and inference molecules per second.
* TU collections (PROTEINS_full, ENZYMES): stratified k-fold (10) graph classification with
  cross-entropy; test accuracy per fold, mean and std (final epoch, and the GIN paper's
  protocol: the epoch of best mean accuracy over the folds).

Batches come from :class:`~sparsegnn.datasets.loader.GraphLoader` (block-diagonal graphs).
On CUDA each training step is captured as a CUDA graph and replayed (``capture=True``, the
default there): :class:`CapturedGraphSteps` pads every batch to one of a few shapes
(:mod:`sparsegnn.datasets.padding`) and keeps one captured step per shape, so a step costs one
replay instead of a few hundred kernel launches from Python.  The padding changes no result
(padding nodes and graphs are weighed out of losses and BatchNorm statistics).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import nn as sgnn
from ._checks import check
from .capture import CapturedGraphSteps, use_capture
from .datasets.loader import GraphBatch, GraphDataset, GraphLoader
from .datasets.padding import BatchPadding

__all__ = ["GRAPH_MODELS", "GRAPH_DATASETS", "build_graph_model", "roc_auc_score", "masked_roc_auc",
           "resolve_graph_dataset", "train_molecules", "train_tu_kfold", "MoleculeResult", "KFoldResult",
           "CapturedGraphSteps", "masked_bce", "graph_cross_entropy", "set_lr"]

#: ``--model`` names of the graph-level models.
GRAPH_MODELS = ("chemgcn", "chemgcn-wide", "gin")
#: Named graph-level datasets (in the data folder: ``molecules/tox21.csv``, ``tu/<NAME>.zip``).
GRAPH_DATASETS = {"tox21": "molecules/tox21.csv", "proteins_full": "tu/PROTEINS_full.zip", "enzymes": "tu/ENZYMES.zip"}


def is_graph_dataset(name: str) -> bool:
    """A named graph-level dataset or a file of one (``.csv`` / ``.csv.gz`` molecules, ``.zip`` TU)."""
    lower = name.lower()
    return lower in GRAPH_DATASETS or lower.endswith((".csv", ".csv.gz", ".zip"))


def resolve_graph_dataset(name: str, data_dir=None) -> Tuple[str, Path]:
    """``(kind, path)``: kind ``"molecules"`` or ``"tu"`` for a dataset name or file path."""
    from .datasets.suite import default_data_dir

    fn = "resolve_graph_dataset"
    lower = name.lower()
    if lower in GRAPH_DATASETS:
        root = Path(data_dir) if data_dir is not None else default_data_dir()
        check(root is not None, fn, f"{name!r} needs the data folder: set SPARSEGNN_DATA or pass --data-dir")
        path = root / GRAPH_DATASETS[lower]
    else:
        path = Path(name)
    check(path.exists(), fn, f"{path} does not exist")
    return ("molecules" if path.name.lower().endswith((".csv", ".csv.gz")) else "tu"), path


def build_graph_model(name: str, in_channels: int, out_channels: int, hidden: Optional[int] = None,
                      dropout: Optional[float] = None, normalize: bool = True, backend: str = "auto") -> nn.Module:
    """``"chemgcn"`` (:class:`~sparsegnn.nn.ChemGCN`, 2 x 64), ``"chemgcn-wide"`` (3 x 512) or
    ``"gin"`` (:class:`~sparsegnn.nn.GINClassifier`, 5 layers of 64); ``hidden`` / ``dropout``
    override the defaults; ``normalize=False``: ChemGCN on ``gcn_normalized()`` graphs."""
    key = name.lower()
    check(key in GRAPH_MODELS, "build_graph_model", f"unknown model {name!r}; known: {', '.join(GRAPH_MODELS)}")
    kwargs = {"backend": backend}
    if hidden is not None:
        kwargs["hidden"] = hidden
    if dropout is not None:
        kwargs["dropout"] = dropout
    if key == "gin":
        return sgnn.GINClassifier(in_channels, out_channels, **kwargs)
    make = sgnn.ChemGCN.wide if key == "chemgcn-wide" else sgnn.ChemGCN
    return make(in_channels, out_channels, normalize=normalize, **kwargs)


# ---------------------------------------------------------------------------- metrics
def _exact_roc_auc(y_true: Tensor, y_score: Tensor) -> float:
    """Mann-Whitney: (rank sum of the positives - n+(n+ + 1)/2) / (n+ n-), ties at their average rank."""
    y, s = y_true.to(torch.float64), y_score.to(torch.float64)
    _, inverse, counts = torch.unique(s, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).to(torch.float64)
    ranks = (ends - (counts - 1) / 2.0)[inverse]          # 1-based average ranks
    n_pos = float(y.sum())
    n_neg = y.numel() - n_pos
    return (float((ranks * y).sum()) - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def roc_auc_score(y_true: Tensor, y_score: Tensor) -> float:
    """Area under the ROC curve of binary labels ``y_true`` (0/1) and scores ``y_score``
    (sklearn's ``roc_auc_score`` when installed, else the exact rank statistic, which equals it).

    Raises:
        ValueError: ``y_true`` holds only one class (the AUC is undefined).

    Shapes:
        y_true, y_score: [n].
    """
    y_true, y_score = torch.as_tensor(y_true).flatten().cpu(), torch.as_tensor(y_score).flatten().cpu()
    check(y_true.numel() == y_score.numel(), "roc_auc_score", f"{y_true.numel()} labels but {y_score.numel()} scores")
    positives = int((y_true == 1).sum())
    check(bool(((y_true == 0) | (y_true == 1)).all()), "roc_auc_score", "y_true must hold 0 and 1 only")
    check(0 < positives < y_true.numel(), "roc_auc_score", "y_true needs both classes (the AUC is undefined)")
    try:
        from sklearn.metrics import roc_auc_score as sk_roc_auc  # noqa: PLC0415 - optional
    except ImportError:
        return _exact_roc_auc(y_true, y_score)
    return float(sk_roc_auc(y_true.numpy(), y_score.to(torch.float64).numpy()))


def masked_roc_auc(logits: Tensor, y: Tensor, mask: Tensor) -> Tuple[float, List[float]]:
    """Mean ROC-AUC over the tasks (columns) with both classes among their known labels, and the
    per-task values (NaN for a task without both).

    Shapes:
        logits, y, mask: [G, T] -> (float, [T] floats).
    """
    per_task = []
    for t in range(y.shape[1]):
        known = mask[:, t]
        labels = y[known, t]
        both = bool((labels == 1).any()) and bool((labels == 0).any())
        per_task.append(roc_auc_score(labels, logits[known, t]) if both else math.nan)
    valid = [a for a in per_task if not math.isnan(a)]
    return (sum(valid) / len(valid) if valid else math.nan), per_task


def masked_bce(logits: Tensor, y: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Mean binary cross-entropy with logits over the known labels (no host sync)."""
    if mask is None:
        return F.binary_cross_entropy_with_logits(logits, y)
    weight = mask.to(logits.dtype)
    return F.binary_cross_entropy_with_logits(logits, y, weight=weight, reduction="sum") / weight.sum().clamp(min=1.0)


def graph_cross_entropy(logits: Tensor, batch: GraphBatch) -> Tensor:
    """Mean cross-entropy over the batch's graphs; on a padded batch over the real graphs only
    (weighed by ``batch.graph_weight``: the same value as on the unpadded batch, no host sync).

    Shapes:
        logits: [B, C]; batch.y: [B] int64 -> [].
    """
    if batch.graph_weight is None:
        return F.cross_entropy(logits, batch.y)
    weight = batch.graph_weight.to(logits.dtype)
    return (F.cross_entropy(logits, batch.y, reduction="none") * weight).sum() / weight.sum().clamp(min=1.0)


def _molecule_loss(logits: Tensor, batch: GraphBatch) -> Tensor:
    """``masked_bce`` over the known labels of the real graphs (a padded ``y_mask`` is 0 on the
    padding slots; without a mask, ``graph_weight`` masks them)."""
    mask = batch.y_mask
    if mask is None and batch.graph_weight is not None:
        shape = (-1,) + (1,) * (batch.y.dim() - 1)
        mask = batch.graph_weight.view(shape).expand_as(batch.y)
    return masked_bce(logits, batch.y, mask)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every group's learning rate; a tensor one (a captured step's) is filled in place."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def _optimizer(model: nn.Module, lr: float, weight_decay: float, capture: bool, device) -> torch.optim.Optimizer:
    """Adam; for captured steps capturable, with its learning rate a tensor on the device."""
    if not capture:
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    return torch.optim.Adam(model.parameters(), lr=torch.tensor(lr, device=device), weight_decay=weight_decay,
                            capturable=True)


def _use_capture(capture: Optional[bool], device, backend: str = "auto") -> bool:
    """Capture by default on CUDA with the Triton kernels (``capture.use_capture``)."""
    return use_capture("train", capture, device, backend)


# ---------------------------------------------------------------------------- loops
def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _bar(total: int, desc: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not progress, leave=False)


def _lone_last(index: Tensor, batch_size: int) -> bool:
    """Drop the last batch when it would hold one graph (BatchNorm over a one-node graph fails)."""
    return index.numel() % batch_size == 1 and index.numel() > 1


def _train_epoch(model: nn.Module, loader: GraphLoader, optimizer: torch.optim.Optimizer, loss_fn,
                 steps: Optional[CapturedGraphSteps] = None) -> Tensor:
    """One pass over ``loader`` (eager steps, or ``steps``' padded / captured ones); the mean
    loss per graph as a device tensor (read it after timing)."""
    model.train()
    total = torch.zeros((), device=loader.device)
    count = 0
    for batch in loader:
        if steps is not None:
            loss = steps(batch)
        else:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(batch.x, batch.graph), batch)
            loss.backward()
            optimizer.step()
        total += loss.detach() * batch.num_graphs
        count += batch.num_graphs
    return total / max(count, 1)


@torch.no_grad()
def _predict(model: nn.Module, loader: GraphLoader) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """``(logits, y, y_mask)`` of every batch of ``loader`` (eval mode), concatenated on the CPU."""
    model.eval()
    outs, ys, masks = [], [], []
    for batch in loader:
        outs.append(model(batch.x, batch.graph))
        ys.append(batch.y)
        masks.append(batch.y_mask)
    mask = None if masks[0] is None else torch.cat(masks).cpu()
    return torch.cat(outs).cpu(), torch.cat(ys).cpu(), mask


@dataclass
class MoleculeResult:
    """A molecule run: ROC-AUCs (mean over tasks), throughput, split sizes and losses."""

    model: str
    dataset: str
    device: str
    split: str
    seed: int
    epochs: int
    batch_size: int
    num_train: int
    num_valid: int
    num_test: int
    val_auc: float
    test_auc: float
    best_val_auc: float
    test_auc_at_best_val: float
    test_auc_per_task: List[float]
    mean_epoch_ms: float
    train_molecules_per_s: float
    inference_molecules_per_s: float
    inference_batch_size: int
    losses: List[float] = field(default_factory=list)
    captured_shapes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def train_molecules(
    path,
    model_name: str = "chemgcn",
    epochs: int = 50,
    batch_size: int = 50,
    split: str = "scaffold",
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    hidden: Optional[int] = None,
    dropout: Optional[float] = None,
    seed: int = 0,
    device: str = "cpu",
    backend: str = "auto",
    eval_batch_size: int = 200,
    progress: bool = True,
    smiles_backend: str = "auto",
    dataset: Optional[Tuple[GraphDataset, Sequence[str]]] = None,
    capture: Optional[bool] = None,
) -> MoleculeResult:
    """Train a graph-level model on a MoleculeNet-style CSV and report ROC-AUC and molecules/s.

    The molecules are loaded with :func:`~sparsegnn.datasets.load_molecules` (RDKit when
    installed) and split 80/10/10 (``split="scaffold"``: DeepChem's Bemis-Murcko scaffold split,
    needs RDKit; ``"random"``: seeded).  Adam on the masked BCE with logits of the known labels,
    ``batch_size`` molecules per step in a new order every epoch.  After every epoch the
    validation ROC-AUC (mean over tasks) is measured; the test ROC-AUC is reported at the
    best validation epoch and at the last.  ChemGCN's GCN normalisation is computed once for
    the dataset (``GraphDataset.gcn_normalized``), not per batch.

    Throughput: training molecules/s = training molecules / mean epoch time (epochs after the
    first; forward, backward, optimiser and collation, synchronised on CUDA); inference
    molecules/s = all molecules / one timed eval-mode pass at ``eval_batch_size`` (after a warm-up pass).

    ``dataset``: a ready ``(GraphDataset, smiles)`` instead of reading ``path`` (tests, benchmarks).
    ``capture``: run the training steps as CUDA graph replays on padded batches
    (:class:`CapturedGraphSteps`; default: on CUDA unless backend="reference"); False trains eagerly.
    """
    from .datasets import load_molecules
    from .datasets.splits import random_split, scaffold_split

    fn = "train_molecules"
    check(epochs >= 1, fn, f"epochs must be >= 1, got {epochs}")
    check(split in ("scaffold", "random"), fn, f"split must be 'scaffold' or 'random', got {split!r}")
    torch.manual_seed(seed)
    if dataset is None:
        molecules = load_molecules(path, backend=smiles_backend)
        data, smiles = GraphDataset.from_molecules(molecules, name=Path(path).name.split(".")[0]), molecules.smiles
    else:
        data, smiles = dataset
    parts = scaffold_split(smiles) if split == "scaffold" else random_split(len(smiles), seed=seed)
    chem = model_name.lower().startswith("chemgcn")
    if chem:
        data = data.gcn_normalized()
    data = data.to(device)
    model = build_graph_model(model_name, data.num_features, data.y.shape[1], hidden, dropout,
                              normalize=not chem, backend=backend).to(device)
    capture = _use_capture(capture, device, backend)
    optimizer = _optimizer(model, lr, weight_decay, capture, device)
    generator = torch.Generator().manual_seed(seed)
    train_loader = GraphLoader(data, batch_size, index=parts[0], shuffle=True, generator=generator, device=device,
                               drop_last=_lone_last(parts[0], batch_size))
    valid_loader, test_loader = (GraphLoader(data, eval_batch_size, index=p, device=device) for p in parts[1:])
    loss_fn = _molecule_loss
    steps = (CapturedGraphSteps(model, optimizer, loss_fn, BatchPadding.for_dataset(data, batch_size))
             if capture else None)

    best_val, test_at_best = -math.inf, math.nan
    times: List[float] = []
    losses: List[float] = []
    with _bar(epochs, f"{model_name}/{data.name}", progress) as bar:
        for _ in range(epochs):
            _sync(device)
            start = time.perf_counter()
            loss = _train_epoch(model, train_loader, optimizer, loss_fn, steps)
            _sync(device)
            times.append(time.perf_counter() - start)
            losses.append(float(loss))
            val_auc, _ = masked_roc_auc(*_predict(model, valid_loader))
            test_auc, per_task = masked_roc_auc(*_predict(model, test_loader))
            if val_auc > best_val:
                best_val, test_at_best = val_auc, test_auc
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", val_auc=f"{val_auc:.3f}")
    steady = times[1:] or times
    epoch_s = sum(steady) / len(steady)
    every = GraphLoader(data, eval_batch_size, device=device)
    _predict(model, every)                                           # warm-up
    _sync(device)
    start = time.perf_counter()
    _predict(model, every)
    _sync(device)
    inference_s = time.perf_counter() - start
    return MoleculeResult(model_name, data.name, str(device), split, seed, epochs, batch_size,
                          *(p.numel() for p in parts), val_auc, test_auc, best_val, test_at_best, per_task,
                          1000.0 * epoch_s, parts[0].numel() / epoch_s, data.num_graphs / inference_s,
                          eval_batch_size, losses, 0 if steps is None else len(steps.shapes))


@dataclass
class KFoldResult:
    """A k-fold run: test accuracy per fold (final epoch), the GIN paper's best-epoch accuracy, timing."""

    model: str
    dataset: str
    device: str
    folds: int
    seed: int
    epochs: int
    batch_size: int
    test_acc_mean: float
    test_acc_std: float
    test_acc_per_fold: List[float]
    best_epoch: int
    test_acc_best_epoch_mean: float
    test_acc_best_epoch_std: float
    mean_epoch_ms: float
    train_graphs_per_s: float
    losses_first_fold: List[float] = field(default_factory=list)
    captured_shapes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def _accuracy(model: nn.Module, loader: GraphLoader) -> float:
    logits, y, _ = _predict(model, loader)
    return float((logits.argmax(1) == y).float().mean())


def train_tu_kfold(
    path,
    model_name: str = "gin",
    epochs: int = 350,
    batch_size: int = 32,
    folds: int = 10,
    lr: float = 0.01,
    weight_decay: float = 0.0,
    hidden: Optional[int] = None,
    dropout: Optional[float] = None,
    seed: int = 0,
    device: str = "cpu",
    backend: str = "auto",
    progress: bool = True,
    node_attributes: bool = False,
    dataset: Optional[GraphDataset] = None,
    capture: Optional[bool] = None,
) -> KFoldResult:
    """Stratified ``folds``-fold graph classification of a TU collection (the GIN paper's protocol).

    Per fold a new model (seed ``seed + fold``) trains with Adam (``lr``, halved every 50
    epochs), cross-entropy, ``batch_size`` graphs per step; the test fold's accuracy is measured
    after every epoch.  Reported: the final-epoch accuracy per fold (mean, std) and, as in the
    GIN paper, the accuracy of the epoch whose mean over the folds is best.

    Node features: one-hot node labels (``node_attributes=False``, the GIN paper's and PyG's
    default) or also the standardised continuous attributes (see ``GraphDataset.from_tu``).

    Timing: mean epoch time (epochs after the first, training only; synchronised on CUDA) and
    training graphs per second.  ``dataset``: a ready :class:`GraphDataset` instead of ``path``.
    ``capture``: CUDA graph replays of padded steps (:class:`CapturedGraphSteps`; default: on CUDA unless
    ``backend="reference"``).
    """
    from .datasets.splits import stratified_kfold

    fn = "train_tu_kfold"
    check(epochs >= 1, fn, f"epochs must be >= 1, got {epochs}")
    data = GraphDataset.from_tu(path, node_attributes) if dataset is None else dataset
    check(data.y.dim() == 1 and not data.y.is_floating_point(), fn, "needs one integer class per graph")
    num_classes = int(data.y.max()) + 1
    splits = stratified_kfold(data.labels(), folds, seed)
    chem = model_name.lower().startswith("chemgcn")
    if chem:
        data = data.gcn_normalized()
    data = data.to(device)
    curves: List[List[float]] = []
    times: List[float] = []
    losses_first: List[float] = []
    trained = 0
    shapes = 0
    loss_fn = graph_cross_entropy
    capture = _use_capture(capture, device, backend)
    with _bar(folds * epochs, f"{model_name}/{data.name} ({folds}-fold)", progress) as bar:
        for fold, (train_idx, test_idx) in enumerate(splits):
            torch.manual_seed(seed + fold)
            model = build_graph_model(model_name, data.num_features, num_classes, hidden, dropout,
                                      normalize=not chem, backend=backend).to(device)
            optimizer = _optimizer(model, lr, weight_decay, capture, device)
            generator = torch.Generator().manual_seed(seed + fold)
            train_loader = GraphLoader(data, batch_size, index=train_idx, shuffle=True, generator=generator,
                                       device=device, drop_last=_lone_last(train_idx, batch_size))
            test_loader = GraphLoader(data, 256, index=test_idx, device=device)
            steps = (CapturedGraphSteps(model, optimizer, loss_fn, BatchPadding.for_dataset(data, batch_size))
                     if capture else None)
            curve = []
            for epoch in range(epochs):
                _sync(device)
                start = time.perf_counter()
                set_lr(optimizer, lr * 0.5 ** (epoch // 50))       # halved every 50 epochs
                loss = _train_epoch(model, train_loader, optimizer, loss_fn, steps)
                _sync(device)
                if epoch > 0 or epochs == 1:
                    times.append(time.perf_counter() - start)
                    trained += train_idx.numel()
                if fold == 0:
                    losses_first.append(float(loss))
                curve.append(_accuracy(model, test_loader))
                bar.update(1)
                bar.set_postfix(fold=fold, loss=f"{float(loss):.3f}", acc=f"{curve[-1]:.3f}")
            curves.append(curve)
            shapes += 0 if steps is None else len(steps.shapes)
    final = [c[-1] for c in curves]
    per_epoch = torch.tensor(curves).mean(0)
    best = int(per_epoch.argmax())
    at_best = [c[best] for c in curves]
    std = lambda v: statistics.pstdev(v) if len(v) > 1 else 0.0  # noqa: E731
    return KFoldResult(model_name, data.name, str(device), folds, seed, epochs, batch_size,
                       statistics.fmean(final), std(final), final, best, statistics.fmean(at_best), std(at_best),
                       1000.0 * sum(times) / len(times), trained / sum(times), losses_first, shapes)
