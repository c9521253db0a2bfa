"""Careless command lines: every bad argument ends with exit status 2 and one line on stderr,
before any work; ``info`` names every backend and what ``auto`` picks."""
import subprocess
import sys
import time

import pytest

from benchmarks.maxk_sweep import main as sweep_main
from benchmarks.ops import main as ops_main
from sparsegnn.cli import main

DRIVERS = {"maxk-sweep": sweep_main, "ops": ops_main}   # python -m benchmarks.<name>


def _one_line_error(capsys, argv, code=2):
    """Run ``argv``; its exit status (argparse exits, commands return) and stderr's one line."""
    try:
        run = DRIVERS.get(argv[0])
        status = run(argv[1:]) if run else main(argv)
    except SystemExit as exc:
        status = exc.code
    err = capsys.readouterr().err.strip()
    assert status == code, (argv, status, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv, message", [
    (["train", "--hidden", "-3"], "--hidden: expected an integer >= 1, got -3"),
    (["train", "--hidden", "0"], "--hidden: expected an integer >= 1, got 0"),
    (["train", "--epochs", "0"], "--epochs: expected an integer >= 1"),
    (["train", "--runs", "-1"], "--runs: expected an integer >= 1"),
    (["train", "--batch-size", "0"], "--batch-size: expected an integer >= 1"),
    (["train", "--folds", "0"], "--folds: expected an integer >= 1"),
    (["train", "--nproc", "0"], "--nproc: expected an integer >= 1"),
    (["train", "--seed", "-2"], "--seed: expected an integer >= 0"),
    (["train", "--dropout", "1.5"], "--dropout: expected a number in [0, 1)"),
    (["train", "--lr", "nan"], "--lr: expected a number in (0, inf)"),
    (["train", "--lr", "0"], "--lr: expected a number in (0, inf)"),
    (["train", "--weight-decay", "-1"], "--weight-decay: expected a number in [0, inf)"),
    (["train", "--hidden", "abc"], "--hidden: expected an integer >= 1, got 'abc'"),
    (["maxk-sweep", "--hidden", "-3"], "--hidden: expected an integer >= 1"),
    (["maxk-sweep", "--epochs", "0"], "--epochs: expected an integer >= 1"),
    (["ops", "--budget-ms", "-5"], "--budget-ms: expected a number in (0, inf)"),
    (["train", "--model", "transformer"], "--model: invalid choice"),
    (["tune", "--precision", "fp8"], "--precision: expected tf32 and / or bf16, comma-separated, got 'fp8'"),
    (["tune", "--precision", "tf32,half"], "--precision: expected tf32 and / or bf16"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    assert message in _one_line_error(capsys, argv)


def test_bench_output_path_is_checked_before_the_run(capsys):
    start = time.perf_counter()
    err = _one_line_error(capsys, ["ops", "--device", "cpu", "--graphs", "cora", "--ops", "spmm", "--dims", "4",
                                   "--budget-ms", "1", "--out", "/proc/nope/x.json"])
    assert err.startswith("benchmarks.ops: --out /proc/nope/x.json: cannot write there")
    assert time.perf_counter() - start < 2.0     # nothing benchmarked first


@pytest.mark.parametrize("argv", [
    ["maxk-sweep", "--out", "/proc/nope"],
    ["tune", "--out", "/proc/nope/rows.json"],
])
def test_other_outputs_are_checked_first(capsys, argv):
    assert "--out /proc/nope" in _one_line_error(capsys, argv)


def test_output_path_that_is_a_file(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    err = _one_line_error(capsys, ["ops", "--device", "cpu", "--graphs", "cora", "--out", str(blocker / "sub")])
    assert "cannot write there" in err


@pytest.mark.parametrize("command", ["train", "bench", "ops", "maxk-sweep", "tune"])
def test_missing_data_dir_is_refused_at_once(capsys, command, tmp_path):
    start = time.perf_counter()
    argv = [command, "--data-dir", str(tmp_path / "nonexistent")]
    if command in ("bench", "ops"):
        argv += ["cora"] * (command == "bench") + ["--device", "cpu"]
    err = _one_line_error(capsys, argv)
    assert f"--data-dir {tmp_path / 'nonexistent'}: no such directory" in err
    assert time.perf_counter() - start < 2.0


def test_train_missing_root_is_refused(capsys, tmp_path):
    assert "--root" in _one_line_error(capsys, ["train", "--root", str(tmp_path / "none"), "--device", "cpu"])


def test_info_lists_every_backend_and_the_auto_pick():
    from sparsegnn.kernels.cpu import numba_available

    out = subprocess.run([sys.executable, "-m", "sparsegnn", "info"], capture_output=True, text=True,
                         check=True).stdout
    backends = next(line for line in out.splitlines() if line.startswith("backends: "))
    listed = backends[len("backends: "):].split(", ")
    assert "reference" in listed and ("cpu" in listed) == numba_available()
    auto = next(line for line in out.splitlines() if line.startswith("auto: "))
    assert f"cpu -> {'cpu' if numba_available() else 'reference'}" in auto
