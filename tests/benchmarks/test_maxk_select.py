"""benchmarks/maxk_select.py: each model's setting is chosen on validation only, and the gap is paired by seed."""
import pytest

import benchmarks.maxk_select


@pytest.fixture(scope="module")
def script():
    return benchmarks.maxk_select


def _run(seed, val, test):
    return {"seed": seed, "best_val_acc": val, "test_acc_at_best_val": test, "mean_epoch_ms": 1.0}


def test_choose_reads_validation_never_test(script):
    grid = {"0.2,0.0005": [_run(0, 0.60, 0.90), _run(1, 0.62, 0.90)],      # best test, worse validation
            "0.5,0.0005": [_run(0, 0.70, 0.50), _run(1, 0.68, 0.50)],
            "0.7,0.005": [_run(0, 0.69, 0.60), _run(1, 0.69, 0.60)]}
    assert script.choose(grid) == (0.5, 0.0005)
    grid["0.7,0.005"] = [_run(0, 0.71, 0.10), _run(1, 0.71, 0.10)]
    assert script.choose(grid) == (0.7, 0.005)


def test_paired_gap_is_per_seed_in_points(script):
    relu = [_run(100, 0, 0.70), _run(101, 0, 0.60), _run(102, 0, 0.65)]
    maxk = [_run(100, 0, 0.69), _run(101, 0, 0.62), _run(102, 0, 0.62)]
    gap, se, diffs = script.paired_gap(maxk, relu)
    assert diffs == pytest.approx([-1.0, 2.0, -3.0])
    assert gap == pytest.approx(-2.0 / 3.0)
    # sample std of (-1, 2, -3) is sqrt(19/3); se = that / sqrt(3)
    assert se == pytest.approx((19.0 / 3.0) ** 0.5 / 3 ** 0.5)
    with pytest.raises(ValueError, match="same seeds"):
        script.paired_gap(maxk[::-1], relu)
