"""Acceptance: Cora accuracy averaged over 5 seeds with the default settings (200 epochs)."""
import pytest
import torch

from sparsegnn.datasets import load
from sparsegnn.training import train_node_classifier

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.slow
@pytest.mark.parametrize("model, threshold", [("gcn", 0.805), ("agnn", 0.81), ("gat", 0.81)])
def test_cora_accuracy_over_five_seeds(model, threshold):
    data = load("cora")
    accs = [train_node_classifier(data, model, seed=s, device=DEVICE, progress=False).test_acc for s in range(5)]
    assert sum(accs) / 5 >= threshold, accs
