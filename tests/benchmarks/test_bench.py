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
