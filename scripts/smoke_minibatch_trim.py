"""Smoke check of ``train_minibatch`` on the GPU with and without per-layer graphs (``trim``):
accuracy and epoch time of a 2-layer SAGE on Cora (captured steps on CUDA)::

    python scripts/smoke_minibatch_trim.py
"""
import sys

import torch

import sparsegnn
from sparsegnn.training import train_minibatch


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = sparsegnn.datasets.load("cora")
    for trim in (False, True, None):
        r = train_minibatch(data, "sage", fanouts=(10, 5), batch_size=64, epochs=6, num_layers=2, device=device,
                            progress=False, trim=trim)
        print(f"cora sage trim={trim}: test acc at best val {r.test_acc_at_best_val:.3f}, "
              f"{r.mean_epoch_ms:.1f} ms/epoch, last loss {r.losses[-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
