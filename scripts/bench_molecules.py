"""Graph-level training, ours against the same model built from PyG (issue 11's acceptance runs).

Two modes:

* ``--model chemgcn`` (or ``chemgcn-wide``) ``--dataset tox21``: ChemGCN (2 x GCNConv(64) each
  with BatchNorm + ReLU, mean pooling, Linear(64, 128) - ReLU - dropout 0.2 - Linear(128, 12))
  trained with Adam (lr 1e-3) on the masked BCE of the known labels, on the same split (scaffold
  with RDKit, else random), for every batch size of ``--batch-sizes`` (default 50 and 200).
  Reported per implementation: mean epoch time (epochs after the first; forward, backward,
  Adam and the data loader, synchronised), training molecules/s, test ROC-AUC (mean over the 12
  tasks, at the best validation epoch) and inference molecules/s over all molecules at
  ``--infer-batch`` (200, as the paper).
* ``--model gin --dataset PROTEINS_full`` (or ENZYMES): the GIN paper's model (5 layers of 64,
  MLPs with BatchNorm, sum pooling of every layer, dropout 0.5), Adam lr 0.01 halved every 50
  epochs, batch 32, stratified ``--folds``-fold: test accuracy mean +- std (last epoch) and
  mean epoch time.

Implementations: ``ours`` = ``sparsegnn.graph_training`` (GraphLoader batches, collated on the
device; ChemGCN's normalisation computed once for the dataset; on CUDA every training step a
CUDA graph replay on a batch padded to one of a few shapes); ``ours-eager`` = the same without
capture; ``ours-unfused`` = captured, with GCNConv's fused batched layer off (SpMM + matmul +
bias); ``pyg`` = ``torch_geometric``'s
``GCNConv`` / ``GINConv`` + ``global_mean_pool`` / ``global_add_pool`` + its ``DataLoader``
over a list of ``Data`` (collated on the CPU, moved with ``.to(device)``; the standard recipe).

Writes ``<out>/bench_<model>_<dataset>.json`` (rows + meta) and ``.md`` and prints the table::

    PYTHONPATH=src python scripts/bench_molecules.py --out benchmarks/h100 --device cuda --seeds 0,1,2
    PYTHONPATH=src python scripts/bench_molecules.py --model gin --dataset PROTEINS_full --out benchmarks/h100
    python scripts/bench_molecules.py --quick --device cpu --out /tmp/bench     # smoke test (a few epochs)
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sparsegnn.datasets.loader import GraphDataset  # noqa: E402
from sparsegnn.graph_training import (  # noqa: E402
    masked_bce, masked_roc_auc, resolve_graph_dataset, train_molecules, train_tu_kfold,
)

#: The paper's P100 figures (batched SpMM, TensorFlow ChemGCN, Tox21: 7,862 molecules).
PAPER_P100 = ("paper (P100, TensorFlow ChemGCN, batched): Tox21 training 723.80 s (50 epochs, 5-fold), "
              "inference of all 7,862 molecules 1.97 s = 3,991 molecules/s at batch 200")


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------- PyG side
def pyg_data_list(data: GraphDataset, graph_ids):
    """One ``torch_geometric.data.Data`` per graph (its raw edges, features, label[, mask])."""
    from torch_geometric.data import Data

    out = []
    node_ptr, edge_ptr = data.node_ptr.cpu().tolist(), data.edge_ptr.cpu().tolist()
    row, col = data.row_local.cpu(), data.col_local.cpu()
    x, y = data.x.cpu(), data.y.cpu()
    mask = None if data.y_mask is None else data.y_mask.cpu()
    for g in graph_ids.tolist():
        e0, e1 = edge_ptr[g], edge_ptr[g + 1]
        item = Data(x=x[node_ptr[g]:node_ptr[g + 1]], edge_index=torch.stack([col[e0:e1], row[e0:e1]]))
        if mask is not None:
            item.y, item.y_mask = y[g:g + 1], mask[g:g + 1]
        else:
            item.y = y[g:g + 1]
        out.append(item)
    return out


class PyGChemGCN(nn.Module):
    def __init__(self, in_channels, num_tasks, hidden=64, num_layers=2, head=128, dropout=0.2):
        super().__init__()
        from torch_geometric.nn import GCNConv

        widths = [in_channels] + [hidden] * num_layers
        self.convs = nn.ModuleList(GCNConv(widths[i], hidden) for i in range(num_layers))
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(num_layers))
        self.lin1, self.lin2, self.dropout = nn.Linear(hidden, head), nn.Linear(head, num_tasks), dropout

    def forward(self, batch):
        from torch_geometric.nn import global_mean_pool

        x = batch.x
        for conv, norm in zip(self.convs, self.norms):
            x = F.relu(norm(conv(x, batch.edge_index)))
        z = F.relu(self.lin1(global_mean_pool(x, batch.batch, size=batch.num_graphs)))
        return self.lin2(F.dropout(z, self.dropout, self.training))


class PyGGIN(nn.Module):
    def __init__(self, in_channels, num_classes, hidden=64, num_layers=5, dropout=0.5):
        super().__init__()
        from torch_geometric.nn import GINConv

        widths = [in_channels] + [hidden] * (num_layers - 1)
        mlp = lambda i: nn.Sequential(nn.Linear(widths[i], hidden), nn.BatchNorm1d(hidden), nn.ReLU(),  # noqa: E731
                                      nn.Linear(hidden, hidden))
        self.convs = nn.ModuleList(GINConv(mlp(i)) for i in range(num_layers - 1))
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(num_layers - 1))
        self.heads = nn.ModuleList(nn.Linear(w, num_classes) for w in widths)
        self.dropout = dropout

    def forward(self, batch):
        from torch_geometric.nn import global_add_pool

        pool = lambda h: global_add_pool(h, batch.batch, size=batch.num_graphs)  # noqa: E731
        x = batch.x
        out = F.dropout(self.heads[0](pool(x)), self.dropout, self.training)
        for conv, norm, head in zip(self.convs, self.norms, self.heads[1:]):
            x = F.relu(norm(conv(x, batch.edge_index)))
            out = out + F.dropout(head(pool(x)), self.dropout, self.training)
        return out


@torch.no_grad()
def _pyg_predict(model, loader, device):
    model.eval()
    outs, ys, masks = [], [], []
    for batch in loader:
        batch = batch.to(device, non_blocking=True)
        outs.append(model(batch))
        ys.append(batch.y)
        masks.append(getattr(batch, "y_mask", None))
    return torch.cat(outs).cpu(), torch.cat(ys).cpu(), None if masks[0] is None else torch.cat(masks).cpu()


def _pyg_epoch(model, loader, optimizer, device, loss_fn):
    model.train()
    for batch in loader:
        batch = batch.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(batch), batch).backward()
        optimizer.step()


def pyg_molecules(data, parts, model_name, epochs, batch_size, infer_batch, device, seed):
    from torch_geometric.loader import DataLoader

    torch.manual_seed(seed)
    train, valid, test = (pyg_data_list(data, p) for p in parts)
    wide = model_name == "chemgcn-wide"
    model = PyGChemGCN(data.num_features, data.y.shape[1], hidden=512 if wide else 64,
                       num_layers=3 if wide else 2).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_loader = DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=len(train) % batch_size == 1)
    valid_loader, test_loader = (DataLoader(p, batch_size=infer_batch) for p in (valid, test))
    loss_fn = lambda out, batch: masked_bce(out, batch.y, batch.y_mask)  # noqa: E731
    times, best_val, test_at_best = [], -math.inf, math.nan
    for _ in range(epochs):
        _sync(device)
        start = time.perf_counter()
        _pyg_epoch(model, train_loader, optimizer, device, loss_fn)
        _sync(device)
        times.append(time.perf_counter() - start)
        val_auc, _ = masked_roc_auc(*_pyg_predict(model, valid_loader, device))
        if val_auc > best_val:
            best_val, test_at_best = val_auc, masked_roc_auc(*_pyg_predict(model, test_loader, device))[0]
    every = DataLoader(train + valid + test, batch_size=infer_batch)
    _pyg_predict(model, every, device)
    _sync(device)
    start = time.perf_counter()
    _pyg_predict(model, every, device)
    _sync(device)
    steady = times[1:] or times
    epoch_s = sum(steady) / len(steady)
    return {"epoch_ms": 1e3 * epoch_s, "train_per_s": len(train) / epoch_s, "test_auc": test_at_best,
            "inference_per_s": len(every.dataset) / (time.perf_counter() - start)}


def pyg_kfold(data, folds, epochs, batch_size, device, seed):
    from torch_geometric.loader import DataLoader

    from sparsegnn.datasets.splits import stratified_kfold

    num_classes = int(data.y.max()) + 1
    final, times = [], []
    for fold, (train_idx, test_idx) in enumerate(stratified_kfold(data.labels(), folds, seed)):
        torch.manual_seed(seed + fold)
        model = PyGGIN(data.num_features, num_classes).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
        train_list = pyg_data_list(data, train_idx)
        train_loader = DataLoader(train_list, batch_size=batch_size, shuffle=True,
                                  drop_last=len(train_list) % batch_size == 1)
        test_loader = DataLoader(pyg_data_list(data, test_idx), batch_size=256)
        for epoch in range(epochs):
            _sync(device)
            start = time.perf_counter()
            _pyg_epoch(model, train_loader, optimizer, device, lambda out, batch: F.cross_entropy(out, batch.y))
            _sync(device)
            if epoch > 0 or epochs == 1:
                times.append(time.perf_counter() - start)
            scheduler.step()
        logits, y, _ = _pyg_predict(model, test_loader, device)
        final.append(float((logits.argmax(1) == y).float().mean()))
    return {"epoch_ms": 1e3 * statistics.fmean(times), "test_acc_mean": statistics.fmean(final),
            "test_acc_std": statistics.pstdev(final)}


# ---------------------------------------------------------------------------- runs
class _Fused:
    """``with _Fused(impl):`` GCNConv's fused batched layer off for ``ours-unfused``."""

    def __init__(self, impl):
        self.off = impl == "ours-unfused"

    def __enter__(self):
        import sparsegnn.nn.gcn as gcn

        self.saved = gcn.fused_gcn_applies
        if self.off:
            gcn.fused_gcn_applies = lambda *args, **kwargs: False

    def __exit__(self, *exc):
        import sparsegnn.nn.gcn as gcn

        gcn.fused_gcn_applies = self.saved


def run_molecules(args, path):
    from sparsegnn.datasets import load_molecules
    from sparsegnn.datasets.splits import random_split, scaffold_split

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        molecules = load_molecules(path)
    data, smiles = GraphDataset.from_molecules(molecules, name=args.dataset), molecules.smiles
    if args.max_graphs:
        keep = torch.arange(min(args.max_graphs, data.num_graphs))
        from sparsegnn.datasets.loader import collate

        batch = collate(data, keep, transient=False)
        data = GraphDataset(batch.graph, batch.x, batch.y, batch.y_mask, name=args.dataset)
        smiles = smiles[:keep.numel()]
    try:
        parts, split = scaffold_split(smiles), "scaffold"
    except ValueError:
        parts, split = random_split(len(smiles), seed=args.seed), "random"
    rows = []
    for batch_size in args.batch_sizes:
        for seed in args.seeds:
            for impl in args.impls:
                if impl.startswith("ours"):
                    with _Fused(impl):
                        r = train_molecules(None, args.model, epochs=args.epochs, batch_size=batch_size, split=split,
                                            seed=seed, device=args.device, eval_batch_size=args.infer_batch,
                                            progress=False, dataset=(data, smiles),
                                            capture=False if impl == "ours-eager" else None)
                    res = {"epoch_ms": r.mean_epoch_ms, "train_per_s": r.train_molecules_per_s,
                           "test_auc": r.test_auc_at_best_val, "inference_per_s": r.inference_molecules_per_s,
                           "captured_shapes": r.captured_shapes}
                else:
                    res = pyg_molecules(data, parts, args.model, args.epochs, batch_size, args.infer_batch,
                                        args.device, seed)
                rows.append({"impl": impl, "model": args.model, "dataset": args.dataset, "split": split,
                             "batch_size": batch_size, "epochs": args.epochs, "seed": seed, "device": args.device,
                             **res})
                print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def run_tu(args, path):
    data = GraphDataset.from_tu(path)
    rows = []
    for impl in args.impls:
        folds, epochs = (args.pyg_folds or args.folds, args.pyg_epochs or args.epochs) if impl == "pyg" else \
            (args.folds, args.epochs)
        if impl.startswith("ours"):
            r = train_tu_kfold(None, "gin", epochs=epochs, batch_size=32, folds=folds, seed=args.seed,
                               device=args.device, progress=False, dataset=data,
                               capture=False if impl == "ours-eager" else None)
            res = {"epoch_ms": r.mean_epoch_ms, "test_acc_mean": r.test_acc_mean, "test_acc_std": r.test_acc_std,
                   "test_acc_best_epoch_mean": r.test_acc_best_epoch_mean,
                   "test_acc_best_epoch_std": r.test_acc_best_epoch_std, "best_epoch": r.best_epoch,
                   "captured_shapes": r.captured_shapes}
        else:
            res = pyg_kfold(data, folds, epochs, 32, args.device, args.seed)
        rows.append({"impl": impl, "model": "gin", "dataset": args.dataset, "folds": folds, "batch_size": 32,
                     "epochs": epochs, "seed": args.seed, "device": args.device, **res})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def markdown(rows, meta) -> str:
    lines = [f"# {meta['model']} on {meta['dataset']} ({meta['device_name']}, {meta['date']})", ""]
    if "test_auc" in rows[0]:
        groups = {}
        for r in rows:
            groups.setdefault((r["impl"], r["batch_size"]), []).append(r)
        mean = lambda rs, k: statistics.fmean(r[k] for r in rs)  # noqa: E731
        std = lambda rs, k: statistics.pstdev([r[k] for r in rs]) if len(rs) > 1 else 0.0  # noqa: E731
        lines += ["| impl | batch | seeds | epoch ms | train mol/s | inference mol/s | test ROC-AUC (mean +- std) | "
                  "ROC-AUC - PyG | epoch speedup vs PyG |", "|---|---|---|---|---|---|---|---|---|"]
        for (impl, batch), rs in groups.items():
            pyg = groups.get(("pyg", batch))
            speed = f"{mean(pyg, 'epoch_ms') / mean(rs, 'epoch_ms'):.2f}x" if pyg else ""
            delta = f"{mean(rs, 'test_auc') - mean(pyg, 'test_auc'):+.4f}" if pyg and impl != "pyg" else ""
            lines.append(f"| {impl} | {batch} | {len(rs)} | {mean(rs, 'epoch_ms'):.1f} | {mean(rs, 'train_per_s'):,.0f} | "
                         f"{mean(rs, 'inference_per_s'):,.0f} | {mean(rs, 'test_auc'):.4f} +- {std(rs, 'test_auc'):.4f} | "
                         f"{delta} | {speed} |")
        lines += ["", f"Split: {rows[0]['split']}, {rows[0]['epochs']} epochs, seeds "
                  f"{sorted({r['seed'] for r in rows})} (the split is the same for every seed: scaffold). "
                  f"{PAPER_P100}."]
    else:
        pyg = next((r for r in rows if r["impl"] == "pyg"), None)
        lines += ["| impl | folds | epochs | epoch ms | test accuracy (last epoch) | at the best epoch | "
                  "epoch speedup vs PyG |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            speed = f"{pyg['epoch_ms'] / r['epoch_ms']:.2f}x" if pyg else ""
            best = (f"{100 * r['test_acc_best_epoch_mean']:.2f} +- {100 * r['test_acc_best_epoch_std']:.2f}% "
                    f"(epoch {r['best_epoch'] + 1})" if "best_epoch" in r else "")
            lines.append(f"| {r['impl']} | {r['folds']} | {r['epochs']} | {r['epoch_ms']:.1f} | "
                         f"{100 * r['test_acc_mean']:.2f} +- {100 * r['test_acc_std']:.2f}% | {best} | {speed} |")
        lines += ["", "GIN paper: PROTEINS 76.2 +- 2.8%, no ENZYMES figure (10-fold, best epoch of the mean curve)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="chemgcn", choices=["chemgcn", "chemgcn-wide", "gin"])
    parser.add_argument("--dataset", default=None, help="tox21 (chemgcn) or PROTEINS_full / ENZYMES (gin), or a file")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--batch-sizes", default="50,200")
    parser.add_argument("--infer-batch", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=None, help="default 30 (molecules), 100 (gin)")
    parser.add_argument("--folds", type=int, default=10)
    parser.add_argument("--impls", default="ours,pyg")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0, help="TU runs: the fold split's seed")
    parser.add_argument("--seeds", default=None, help="molecules: seeds, comma separated (default: --seed)")
    parser.add_argument("--pyg-folds", type=int, default=None, help="TU: folds of the PyG run (a timing run)")
    parser.add_argument("--pyg-epochs", type=int, default=None, help="TU: epochs of the PyG run")
    parser.add_argument("--max-graphs", type=int, default=None, help="molecules: the first N only")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 epochs, 1,000 molecules, 2 folds")
    parser.add_argument("--out", default="benchmarks/local")
    args = parser.parse_args(argv)
    args.dataset = args.dataset or ("PROTEINS_full" if args.model == "gin" else "tox21")
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.impls = args.impls.split(",")
    args.seeds = [int(v) for v in args.seeds.split(",")] if args.seeds else [args.seed]
    if args.quick:
        args.epochs, args.max_graphs, args.folds = args.epochs or 2, args.max_graphs or 1000, 2
    args.epochs = args.epochs or (100 if args.model == "gin" else 30)
    kind, path = resolve_graph_dataset(args.dataset, args.data_dir)
    if (kind == "molecules") == (args.model == "gin"):
        parser.error(f"--model {args.model} does not go with {kind} dataset {args.dataset}")
    rows = run_tu(args, path) if kind == "tu" else run_molecules(args, path)
    import torch_geometric

    meta = {"model": args.model, "dataset": args.dataset, "device": args.device,
            "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor()
            or "cpu", "torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
            "date": _dt.date.today().isoformat(), "threads": torch.get_num_threads()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"bench_{args.model}_{args.dataset}"
    Path(f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    text = markdown(rows, meta)
    Path(f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
