"""Find what breaks a captured graph-level step: every batch of one epoch runs its padded step
eagerly under ``torch.cuda.set_sync_debug_mode("error")`` (a host sync raises, with its stack),
then each shape is captured alone; the first failure is printed with the shape.

    PYTHONPATH=src python scripts/debug_capture.py --dataset PROTEINS_full --model gin
"""
import argparse
import sys
import traceback

import torch

from sparsegnn.datasets.loader import GraphDataset, GraphLoader
from sparsegnn.datasets.padding import BatchPadding
from sparsegnn.graph_training import (CapturedGraphSteps, _molecule_loss, _optimizer, build_graph_model,
                                      graph_cross_entropy, resolve_graph_dataset)

parser = argparse.ArgumentParser()
parser.add_argument("--dataset", default="PROTEINS_full")
parser.add_argument("--model", default="gin")
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()
kind, path = resolve_graph_dataset(args.dataset)
if kind == "tu":
    data, loss_fn, out = GraphDataset.from_tu(path), graph_cross_entropy, None
    out = int(data.y.max()) + 1
else:
    from sparsegnn.datasets import load_molecules

    data = GraphDataset.from_molecules(load_molecules(path)).gcn_normalized()
    loss_fn, out = _molecule_loss, data.y.shape[1]
data = data.to("cuda")
model = build_graph_model(args.model, data.num_features, out, normalize=kind == "tu").cuda()
opt = _optimizer(model, 0.01, 0.0, True, "cuda")
padding = BatchPadding.for_dataset(data, args.batch_size)
print(padding)
eager = CapturedGraphSteps(model, opt, loss_fn, padding, capture=False)
loader = GraphLoader(data, args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
for i, batch in enumerate(loader):
    shape = padding.shape_of(batch)
    try:
        torch.cuda.set_sync_debug_mode("error")
        eager(batch)
    except Exception:
        print(f"batch {i} shape {shape}: eager padded step syncs:")
        traceback.print_exc()
        sys.exit(1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
print(f"eager padded steps: no host sync over {len(eager.shapes)} shapes")
captured = CapturedGraphSteps(model, opt, loss_fn, padding)
for i, batch in enumerate(loader):
    shape = padding.shape_of(batch)
    try:
        captured(batch)
        torch.cuda.synchronize()
    except Exception:
        print(f"batch {i} shape {shape}: capture failed")
        traceback.print_exc()
        sys.exit(1)
print(f"captured {len(captured.shapes)} shapes: ok")
