import pytest
import torch

from sparsegnn.kernels.configs import SDDMM_SPACE, SPMM_SPACE, in_space, sddmm_candidates, spmm_candidates
from sparsegnn.tune import autotune_enabled, pick_config


def test_pick_config_caches_and_uses_heuristic_without_tuning(monkeypatch):
    monkeypatch.setenv("SPARSEGNN_AUTOTUNE", "0")
    assert not autotune_enabled()
    calls = []
    cache = {}
    cands = [{"A": 1}, {"A": 2}]
    assert pick_config(cache, "k", cands, calls.append) == {"A": 1}
    assert calls == [] and cache["k"] == {"A": 1}
    cache["k"] = {"A": 2}
    assert pick_config(cache, "k", cands, calls.append) == {"A": 2}  # cached answer wins


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing candidates needs CUDA events")
def test_pick_config_picks_fastest_on_gpu():
    import time

    cache = {}
    slow = lambda cfg: time.sleep(0.002 if cfg["A"] == 1 else 0)  # noqa: E731
    assert pick_config(cache, "k", [{"A": 1}, {"A": 2}], slow) == {"A": 2}


@pytest.mark.parametrize("n, e, f", [(2708, 10858, 32), (50515, 1638396, 256), (2449029, 123718280, 64)])
def test_spmm_candidates_are_valid(n, e, f):
    cands = spmm_candidates(n, e, f, 4)
    assert len(cands) == len({tuple(sorted(c.items())) for c in cands})  # no duplicates
    for c in cands:
        assert c["BLOCK_F"] in (16, 32, 64, 128, 256) and c["BLOCK_E"] >= 8
        if not c.get("FLAT"):
            assert c["GROUP_ROWS"] * c["GROUP_E"] * c["BLOCK_F"] <= 4096
    assert all(in_space(c, SPMM_SPACE) for c in cands)
    assert all(in_space(c, SDDMM_SPACE) for c in sddmm_candidates(n, e, f, "dot"))
    assert not in_space({"BLOCK_F": 48}, SPMM_SPACE)


def test_flat_candidates_only_when_the_largest_row_is_short():
    from sparsegnn.kernels.configs import FLAT_MAX_STEPS

    def flat_steps(max_degree):
        cands = spmm_candidates(50_000, 1_600_000, 128, 4, max_degree)
        # a flat launch walks a row whole: the largest row's steps, at HEAVY_E per step if hybrid
        return [-(-max_degree // c.get("HEAVY_E", c["BLOCK_E"])) for c in cands if c.get("FLAT")]

    assert flat_steps(300) and max(flat_steps(300)) <= FLAT_MAX_STEPS
    assert all(s <= FLAT_MAX_STEPS for s in flat_steps(3000))
    assert flat_steps(100_000) == []
    assert not any(c.get("FLAT") for c in spmm_candidates(50_000, 1_600_000, 128, 4))  # degree unknown
