"""Multi-process full-graph training (CPU, gloo): P ranks compute the losses of one, to 1e-5.

Each run spawns processes (a few seconds each); the models are small."""
import pytest
import torch

import sparsegnn as sg
from sparsegnn.datasets import default_data_dir
from sparsegnn.distributed.train import train_distributed

DATA = default_data_dir()
pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")


def _runs(data, model, nprocs, method="contiguous", epochs=10, **kw):
    kw = dict(epochs=epochs, hidden=16, num_layers=2, dropout=0.0, lr=0.01, seed=0, method=method, **kw)
    return [train_distributed(data, model, n, **kw) for n in nprocs]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_two_and_three_ranks_train_like_one_on_cora(model):
    data = sg.datasets.load("cora")
    one, two, three = _runs(data, model, [1, 2, 3])
    assert one.nproc == 1 and two.nproc == 2 and len(one.losses) == 10
    assert one.losses[-1] < one.losses[0]                                   # it trains
    for other in (two, three):
        assert max(abs(a - b) for a, b in zip(one.losses, other.losses)) < 1e-5, (one.losses, other.losses)
        assert abs(one.test_acc - other.test_acc) <= 2e-3                     # same predictions (ties aside)
        assert other.cut_edges > 0 and other.halo_bytes_per_epoch > 0
        # every layer sends its narrower side (16 then 7 columns) forward and its gradient back
        assert len(other.halo_sizes) == other.nproc and other.peak_memory == []
        assert other.halo_bytes_per_epoch == sum(other.halo_sizes) * (16 + 7) * 2 * 4
    assert one.halo_bytes_per_epoch == 0 and one.cut_edges == 0


@pytest.mark.skipif(DATA is None or not (DATA / "real" / "lastfm.npz").exists(),
                    reason="no shared datasets folder with real/lastfm.npz (set SPARSEGNN_DATA)")
@pytest.mark.slow
def test_two_ranks_train_like_one_on_a_real_graph():
    data = sg.datasets.load("lastfm", data_dir=DATA)
    one, two = _runs(data, "sage", [1, 2], method="auto")
    assert max(abs(a - b) for a, b in zip(one.losses, two.losses)) < 1e-5, (one.losses, two.losses)
    assert abs(one.test_acc - two.test_acc) <= 2e-3


def test_errors():
    data = sg.datasets.load("cora")
    with pytest.raises(ValueError, match=r"train_distributed\(\): nproc must be >= 1"):
        train_distributed(data, "gcn", 0)
    with pytest.raises(ValueError, match=r"train_distributed\(\): device must be"):
        train_distributed(data, "gcn", 2, device="tpu")
    with pytest.raises(ValueError, match=r"build_dist_model\(\): model must be one of"):
        from sparsegnn.distributed.models import build_dist_model

        build_dist_model("gat", 3, 4, 2, 2, 0.0)
