"""Full-batch node-classification training (what ``sparsegnn train`` runs)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import nn as sgnn
from .datasets import NodeDataset


def build_model(name: str, in_channels: int, out_channels: int, hidden: Optional[int] = None,
                dropout: Optional[float] = None, backend: str = "auto") -> nn.Module:
    """Construct a model by name with the papers' defaults (``hidden``/``dropout`` override them)."""
    factories: Dict[str, Callable[..., nn.Module]] = {
        "gcn": sgnn.GCN, "agnn": sgnn.AGNN, "sage": sgnn.GraphSAGE, "gin": sgnn.GIN, "gat": sgnn.GAT,
    }
    key = name.lower()
    if key not in factories:
        raise ValueError(f"build_model(): unknown model {name!r}; known: {', '.join(factories)}")
    kwargs = {"backend": backend}
    if hidden is not None:
        kwargs["hidden"] = hidden
    if dropout is not None:
        kwargs["dropout"] = dropout
    return factories[key](in_channels, out_channels, **kwargs)


@dataclass
class TrainResult:
    """Final-epoch metrics, the test accuracy at the best validation epoch, and timing."""

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

    def as_dict(self) -> dict:
        return asdict(self)


def _accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    return float((logits[mask].argmax(-1) == y[mask]).float().mean()) if bool(mask.any()) else float("nan")


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
) -> TrainResult:
    """Train ``model_name`` on ``data`` with Adam and cross-entropy on the training mask.

    Epoch time covers forward, backward and the optimiser step (synchronised on CUDA).
    """
    if epochs < 1:
        raise ValueError(f"train_node_classifier(): epochs must be >= 1, got {epochs}")
    torch.manual_seed(seed)
    data = data.to(device)
    model = build_model(model_name, data.x.shape[1], data.num_classes, hidden, dropout, backend).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    is_cuda = torch.device(device).type == "cuda"
    best_val, test_at_best = -1.0, float("nan")
    times = []
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
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.x, data.graph)[data.train_mask], data.y[data.train_mask])
        loss.backward()
        loss = loss.detach()
        optimizer.step()
        if is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        model.eval()
        with torch.no_grad():
            logits = model(data.x, data.graph)
        train_acc = _accuracy(logits, data.y, data.train_mask)
        val_acc = _accuracy(logits, data.y, data.val_mask)
        test_acc = _accuracy(logits, data.y, data.test_mask)
        if val_acc > best_val:
            best_val, test_at_best = val_acc, test_acc
        if hasattr(epochs_iter, "set_postfix"):
            epochs_iter.set_postfix(loss=f"{loss.item():.3f}", val=f"{val_acc:.3f}")
    # The first epochs include kernel compilation and caching: time the second half.
    steady = times[len(times) // 2:] or times
    return TrainResult(model_name, data.name, str(device), seed, epochs, train_acc, val_acc, test_acc,
                       best_val, test_at_best, 1000.0 * sum(steady) / len(steady))
