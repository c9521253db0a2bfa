"""Full-graph training on P processes (``sparsegnn train --nproc P``): partition, spawn, train.

The launcher partitions the graph once (:func:`~sparsegnn.distributed.partition.partition_graph`),
saves one file per rank with its rows of the features, labels and masks, and starts P workers
(``torch.multiprocessing``; NCCL and one GPU per rank on CUDA, gloo on CPUs).  Every worker
loads only its part, builds the same model (same seed, so the same initial weights) and trains:

* forward: each layer exchanges the halo rows it needs (:class:`~sparsegnn.distributed.halo.HaloExchange`);
* loss: cross-entropy summed over the rank's training nodes, divided by the training nodes of
  all ranks (so the sum over ranks is the one-GPU mean);
* backward: halo gradients go back to their owners; parameter gradients are summed over the
  ranks (one ``all_reduce`` of a flat buffer) before ``Adam.step()``: the ranks stay identical.

Losses, accuracies (counts summed over ranks), epoch times and halo bytes come back from rank 0.
GCN's normalisation :math:`\\hat D^{-1/2}(A + I)\\hat D^{-1/2}` is computed on the whole graph
before partitioning (a rank does not know its halo nodes' degrees).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._checks import check

__all__ = ["DistResult", "train_distributed", "prepare_parts"]


@dataclass
class DistResult:
    """A distributed run: per-epoch losses (the global mean), accuracies, timing and traffic."""

    model: str
    dataset: str
    nproc: int
    backend: str
    method: str
    epochs: int
    losses: List[float]
    train_acc: float
    val_acc: float
    test_acc: float
    mean_epoch_ms: float
    halo_bytes_per_epoch: float
    cut_edges: int
    num_edges: int
    part_nodes: List[int] = field(default_factory=list)
    #: ``torch.cuda.max_memory_allocated`` of every rank (bytes; empty on the CPU).
    peak_memory: List[int] = field(default_factory=list)
    #: rows each rank receives per exchange (its halo size).
    halo_sizes: List[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def prepare_parts(data, model: str, nproc: int, directory, method: str = "auto", seed: int = 0,
                  device=None) -> dict:
    """Partition ``data`` (a :class:`~sparsegnn.datasets.NodeDataset`) into ``nproc`` parts and
    save them in ``directory`` (GCN: the normalised graph with self loops).  Returns the stats.

    ``device``: where the partition is computed (default: the CPU).  A GPU builds the parts of a
    graph of hundreds of millions of edges in seconds; its memory is freed before returning.
    """
    from .partition import partition_graph, partition_stats, save_parts

    graph = data.graph.to(device if device is not None else "cpu")
    if model == "gcn":
        graph = graph.remove_self_loops().add_self_loops().normalize("sym")
    else:
        graph = graph.with_values(None)
    parts = partition_graph(graph, nproc, method=method, seed=seed)
    tensors = {"x": data.x.cpu(), "y": data.y.cpu(), "train_mask": data.train_mask.cpu(),
               "val_mask": data.val_mask.cpu(), "test_mask": data.test_mask.cpu()}
    save_parts(parts, directory, tensors)
    stats = partition_stats(parts)
    del parts, graph
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.empty_cache()            # the workers need the whole GPU
    return stats


def _flat_all_reduce(params) -> None:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _sum(value: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value)
    return value


def _worker(rank: int, nproc: int, cfg: dict) -> None:
    from .halo import HaloExchange
    from .models import build_dist_model
    from .partition import load_part

    backend = cfg["backend"]
    dist.init_process_group(backend, init_method=f"file://{cfg['init_file']}", rank=rank, world_size=nproc)
    try:
        device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.set_num_threads(max(1, cfg.get("threads", 1)))
        part, tensors = load_part(cfg["directory"], rank)
        x, y = tensors["x"].to(device), tensors["y"].to(device)
        masks = {k: tensors[f"{k}_mask"].to(device) for k in ("train", "val", "test")}
        train_idx = masks["train"].nonzero().flatten()
        ex = HaloExchange(part, device)
        torch.manual_seed(cfg["seed"])
        model = build_dist_model(cfg["model"], x.shape[1], cfg["hidden"], cfg["num_classes"], cfg["num_layers"],
                                 cfg["dropout"]).to(device)
        torch.manual_seed(cfg["seed"] + 1 + rank)           # dropout masks differ per rank, as rows do
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
        total_train = _sum(torch.tensor(float(train_idx.numel()), device=device))
        losses, times = [], []
        bytes_before = 0
        for epoch in range(cfg["epochs"]):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier()
            start = time.perf_counter()
            model.train()
            optimizer.zero_grad(set_to_none=True)
            out = model(x, ex)
            loss_sum = F.cross_entropy(out.index_select(0, train_idx), y.index_select(0, train_idx), reduction="sum")
            (loss_sum / total_train).backward()
            if nproc > 1:
                _flat_all_reduce(list(model.parameters()))
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier()
            times.append(time.perf_counter() - start)
            losses.append(float(_sum(loss_sum.detach().clone()) / total_train))
            if epoch == 0:
                bytes_before = ex.bytes_sent
        halo_bytes = (ex.bytes_sent - bytes_before) / max(cfg["epochs"] - 1, 1)
        model.eval()
        with torch.no_grad():
            pred = model(x, ex).argmax(1)
        correct = {k: _sum(((pred == y) & m).sum().to(torch.float64)) for k, m in masks.items()}
        count = {k: _sum(m.sum().to(torch.float64)) for k, m in masks.items()}
        traffic = _sum(torch.tensor(float(halo_bytes), device=device, dtype=torch.float64))
        peak = torch.zeros(nproc, dtype=torch.float64, device=device)
        if device.type == "cuda":
            peak[rank] = float(torch.cuda.max_memory_allocated(device))
        peak = _sum(peak)
        if rank == 0:
            steady = times[1:] or times
            result = {"losses": losses, "mean_epoch_ms": 1e3 * sum(steady) / len(steady),
                      "halo_bytes_per_epoch": float(traffic), "peak_memory": [int(v) for v in peak.tolist()],
                      **{f"{k}_acc": float(correct[k] / count[k].clamp(min=1)) for k in masks}}
            Path(cfg["result_file"]).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def train_distributed(data, model: str = "sage", nproc: int = 2, *, epochs: int = 200, hidden: int = 256,
                      num_layers: int = 3, dropout: float = 0.5, lr: float = 0.01, weight_decay: float = 5e-4,
                      seed: int = 0, device: str = "cpu", method: str = "auto", threads: int = 1,
                      workdir: Optional[str] = None, partition_device=None) -> DistResult:
    """Train ``model`` (``"gcn"`` or ``"sage"``) full-graph on ``nproc`` processes.

    Args:
        data: a :class:`~sparsegnn.datasets.NodeDataset`.
        device: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL, one GPU per process: needs ``nproc`` GPUs).
        method: the partitioner (``"auto"``: METIS when pymetis is installed, else contiguous).
        threads: intra-op threads per CPU worker.
        workdir: where the parts are saved (default: a temporary directory).
        partition_device: where the partition is computed (default: the CPU; ``"cuda"`` for
            graphs of 10^8 edges and more).

    Returns:
        :class:`DistResult` (losses: the global training loss of every epoch).
    """
    import torch.multiprocessing as mp

    fn = "train_distributed"
    check(nproc >= 1, fn, f"nproc must be >= 1, got {nproc}")
    check(device in ("cpu", "cuda"), fn, f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        check(torch.cuda.is_available() and torch.cuda.device_count() >= nproc, fn,
              f"nproc={nproc} CUDA processes need {nproc} GPUs, found "
              f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        stats = prepare_parts(data, model, nproc, Path(tmp) / "parts", method, seed, device=partition_device)
        cfg = dict(backend="nccl" if device == "cuda" else "gloo", init_file=os.path.join(tmp, "init"),
                   directory=str(Path(tmp) / "parts"), result_file=os.path.join(tmp, "result.json"), model=model,
                   hidden=hidden, num_layers=num_layers, dropout=dropout, lr=lr, weight_decay=weight_decay, seed=seed,
                   epochs=epochs, num_classes=int(data.y.max()) + 1, threads=threads)
        mp.start_processes(_worker, args=(nproc, cfg), nprocs=nproc, start_method="spawn", join=True)
        result = json.loads(Path(cfg["result_file"]).read_text())
    return DistResult(model, getattr(data, "name", ""), nproc, cfg["backend"], method, epochs, result["losses"],
                      result["train_acc"], result["val_acc"], result["test_acc"], result["mean_epoch_ms"],
                      result["halo_bytes_per_epoch"], stats.get("cut_edges", 0), stats.get("num_edges", 0),
                      stats.get("nodes", []), result["peak_memory"] if device == "cuda" else [],
                      stats.get("halo_sizes", []))
