"""Acceptance: Cora accuracy averaged over 3 seeds with the default settings (200 epochs).

Three seeds, not five: a seed's final test accuracy varies by about 0.5 points (GCN on this
code: 0.804-0.825 over seeds 0-4), so the mean of three has a standard error near 0.3 points,
and each threshold sits 1-2 points under the published accuracy (GCN 81.5, GAT 83.0, AGNN 83.1):
a model that trains worse than its paper by a point or more still fails."""
import pytest
import torch

from sparsegnn.datasets import load
from sparsegnn.training import train_node_classifier

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEEDS = 3


@pytest.fixture(scope="module")
def cora():
    return load("cora")


@pytest.mark.slow
@pytest.mark.parametrize("model, threshold", [("gcn", 0.805), ("agnn", 0.81), ("gat", 0.81)])
def test_cora_accuracy_over_three_seeds(cora, model, threshold):
    accs = [train_node_classifier(cora, model, seed=s, device=DEVICE, progress=False).test_acc for s in range(SEEDS)]
    assert sum(accs) / SEEDS >= threshold, accs
