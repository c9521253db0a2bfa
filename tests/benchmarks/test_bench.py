"""Benchmark report arithmetic and the bench CLI's refusal without a GPU (the runs need one)."""
import math

import pytest
import torch

from benchmarks.harness import compulsory_bytes
from benchmarks.report import markdown, plot, speedups
from benchmarks.ops import main


def _rows():
    def row(graph, f, provider, ms, note=""):
        return dict(op="spmm", graph=graph, nodes=10, nnz=100, F=f, dtype="float32", provider=provider,
                    ms=ms, rel_err=1e-7 if ms else None, note=note)
    return [row("a", 32, "sparsegnn", 1.0), row("a", 32, "cusparse", 2.0),
            row("b", 32, "sparsegnn", 4.0), row("b", 32, "cusparse", 2.0),
            row("b", 32, "pyg-scatter", None, "OOM")]


def test_speedups_and_geomean():
    sp = speedups(_rows(), "spmm", "cusparse")
    assert sp == {("a", 32, "float32"): 2.0, ("b", 32, "float32"): 0.5}
    text = markdown(_rows(), {"device": "test"})
    assert "Geomean speedup of sparsegnn over cusparse: 1.00x" in text  # sqrt(2 * 0.5)
    assert "worst 0.50x (b, F=32, float32)" in text
    assert "| OOM |" in text


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    plot(_rows(), tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_compulsory_bytes():
    # indices + values (8 B/edge), rowptr, x read once and y written once
    assert compulsory_bytes("spmm", 10, 100, 4, 4) == 100 * 8 + 11 * 8 + 2 * 10 * 4 * 4
    assert math.isclose(compulsory_bytes("sddmm", 10, 100, 4, 4), 100 * 4 + 11 * 8 + 2 * 10 * 4 * 4 + 100 * 4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_bench_cli_needs_gpu(capsys):
    assert main(["--suite", "small"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_markdown_names_the_cases_that_ran_cusparse():
    rows = _rows()
    rows[2]["extra"] = {"kernel": "cusparse", "tuned_ms": 4.5}      # b: the tuner chose the vendor kernel
    rows[0]["extra"] = {"kernel": "sparsegnn", "tuned_ms": 1.0}
    text = markdown(rows, {"device": "test"})
    listed = text.split("Cases where sparsegnn ran cuSPARSE")[1]
    assert "- b, F=32, float32: our schedule 4.500 ms" in listed and "- a," not in listed
    assert "ran cuSPARSE" not in markdown(_rows(), {"device": "test"})


def test_choices_renders_the_sections_of_its_runs(tmp_path):
    """``benchmarks.choices --from-json``: the summary's figures come from the rows (geomeans,
    the reduced picks' worst case, the exact picks' spread, the >= 1M-edge subset), each
    section with its own run."""
    import json

    from benchmarks.choices import main as choices_main

    run = {"device": "GPU-A", "torch": "2.x", "date": "2026-01-01"}
    rows = [{"graph": g, "edges": e, "F": 64, "precision": p, "dtype": "float32", "pick": {"path": path},
             "pick_ms": 1.0, "best_ms": 1.0, "exact_timed_ms": 1.0, "exact_call_ms": 1.0,
             "precision_call_ms": 1.0 / s, "speedup": s}
            for g, e, p, s, path in [("small", 10_000, "tf32", 0.5, 0), ("big", 2_000_000, "tf32", 2.0, 3),
                                     ("big", 2_000_000, "bf16", 4.0, 4)]]
    exact = [{"graph": "big", "edges": 2_000_000, "F": 128, "fp32_ours_ms": 1.0, "fp32_cusparse_ms": 3.0,
              "fp32_speedup": 3.0, "fp32_err": 1e-7, "bf16_ours_ms": 1.0, "bf16_cusparse_ms": 2.0,
              "bf16_speedup": 2.0, "bf16_err": 2e-3}]
    (tmp_path / "a.json").write_text(json.dumps({"meta": {"precision": run}, "precision": rows}))
    (tmp_path / "b.json").write_text(json.dumps({"meta": {"exact": dict(run, device="GPU-B")}, "exact": exact}))
    assert choices_main(["--from-json", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out",
                         str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "choices.md").read_text()
    assert "precision: GPU-A" in text and "exact: GPU-B" in text
    # an exact pick's ratio (the same call timed twice) is reported apart from the reduced picks'
    assert "`tf32`: 2 cases, geomean 1.00x the exact call; graphs of >= 1M edges: geomean 2.00x over 1 cases; " \
           "1 reduced picks (geomean 2.00x, worst 2.00x, big F=64); 1 exact picks (the same call timed twice: " \
           "0.50x-0.50x)" in text
    assert "`bf16`: 1 cases, geomean 4.00x" in text
    assert "fp32, F >= 128: geomean 3.00x cuSPARSE" in text and "bf16: geomean 2.00x cuSPARSE bf16" in text
    saved = json.loads((tmp_path / "out" / "choices.json").read_text())
    assert saved["precision"] == rows and saved["meta"]["exact"]["device"] == "GPU-B"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the tuning report times CUDA kernels")
def test_tuning_report_rows_for_every_policy():
    from sparsegnn.benchmark import POLICIES, tuning_markdown, tuning_report

    rows = tuning_report(["cora"], [32], [torch.float32], real=False)
    assert sorted(r["policy"] for r in rows) == sorted(POLICIES)
    for r in rows:
        assert r["config"] is not None and r["ms"] > 0 and r["tune_s"] > 0
        assert 1 <= r["model_rank_of_best"] <= r["candidates"]
    assert next(r for r in rows if r["policy"] == "exhaustive")["vs_exhaustive"] == 1.0
    assert "| cora | 32 | float32 |" in tuning_markdown(rows)


def test_paired_eager_timing_alternates_the_sides_and_pairs_each_round():
    """``paired_eager_ms``: every round times one group of each side, the order reversed every
    other round, each group synchronised at its end; the groups' per-call times follow the
    calls' cost (one side sleeps twice as long), so the paired ratios give the speedup."""
    import statistics
    import time

    from sparsegnn.benchmark import paired_eager_ms

    order, syncs = [], []
    fns = {"slow": lambda: (order.append("slow"), time.sleep(0.002)),
           "fast": lambda: (order.append("fast"), time.sleep(0.001))}
    times = paired_eager_ms(fns, rounds=4, target_ms=3.0, sync=lambda: syncs.append(order[-1]))
    assert [len(times["slow"]), len(times["fast"])] == [4, 4]
    t0 = time.perf_counter()                 # timed groups and warm calls: ~20 ms; the warm-up adds 40
    warmed = paired_eager_ms(fns, rounds=2, target_ms=3.0, warmup_ms=40.0, sync=lambda: None)
    assert len(warmed["slow"]) == 2 and time.perf_counter() - t0 >= 0.040
    assert order[:4] == ["slow", "slow", "fast", "fast"]     # two warm-up calls of each
    assert syncs[4:] == ["slow", "fast", "fast", "slow", "slow", "fast", "fast", "slow"]   # each group's end
    ratio = statistics.median(s / f for s, f in zip(times["slow"], times["fast"]))
    assert 1.4 < ratio < 2.6
