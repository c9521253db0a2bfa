import json
import subprocess
import sys

import pytest

from sparsegnn.cli import main


def test_train_json_last_line(capsys):
    assert main(["train", "--dataset", "cora", "--model", "gcn", "--epochs", "3", "--device", "cpu", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["model"] == "gcn" and result["epochs"] == 3
    assert 0.0 <= result["test_acc"] <= 1.0 and result["mean_epoch_ms"] > 0


def test_train_human_output(capsys):
    assert main(["train", "--model", "sage", "--hidden", "16", "--epochs", "2", "--device", "cpu"]) == 0
    assert "sage on cora" in capsys.readouterr().out


def test_train_bad_input(capsys):
    assert main(["train", "--dataset", "nope", "--epochs", "1", "--device", "cpu"]) == 2
    assert "unknown dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--model", "transformer"])


def test_info_and_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "sparsegnn", "info"], capture_output=True, text=True, check=True).stdout
    assert "sparsegnn 0.1.0" in out and "torch" in out and "backends: reference" in out


def test_train_compile_flag_parsing():
    from sparsegnn.cli import build_parser

    parse = lambda *argv: build_parser().parse_args(["train", *argv])  # noqa: E731
    assert parse().compile is None                                    # none for nodes, capture on CUDA for graph sets
    assert parse("--compile").compile == "capture"                   # bare --compile: one CUDA graph replay
    assert parse("--compile", "reduce-overhead").compile == "reduce-overhead"
    assert parse("--compile", "default", "--compile-backend", "aot_eager").compile_backend == "aot_eager"
    with pytest.raises(SystemExit):
        parse("--compile", "max-autotune")


@pytest.mark.parametrize("mode", [[], ["reduce-overhead"]])
def test_train_compile_cuda_graphs_on_cpu_is_an_error(capsys, mode):
    assert main(["train", "--epochs", "1", "--device", "cpu", "--compile", *mode]) == 2
    err = capsys.readouterr().err
    assert "error: train_node_classifier(): compile=" in err and "needs a CUDA device" in err


def test_train_compile_default_json(capsys):
    import torch._dynamo

    torch._dynamo.reset()
    argv = ["train", "--epochs", "2", "--device", "cpu", "--json",
            "--compile", "default", "--compile-backend", "aot_eager"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["compile"] == "default" and result["epochs"] == 2 and result["mean_epoch_ms"] > 0


def test_train_minibatch_learns_and_reports(capsys):
    argv = ["train", "--dataset", "cora", "--model", "gcn", "--minibatch", "10,5", "--batch-size", "70",
            "--epochs", "40", "--device", "cpu", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["minibatch"] == [10, 5] and result["batch_size"] == 70
    # 80 sampled steps of a 2-layer GCN: far above Cora's 7-class chance level (~30% for its largest class)
    assert result["test_acc"] > 0.6 and result["mean_epoch_ms"] > 0


def test_train_minibatch_bad_fanouts_and_compile(capsys):
    for bad in ("0,5", "x", "-2"):
        with pytest.raises(SystemExit):
            main(["train", "--minibatch", bad, "--epochs", "1", "--device", "cpu"])
    assert main(["train", "--minibatch", "--compile", "default", "--epochs", "1", "--device", "cpu"]) == 2
    assert "--minibatch trains eagerly" in capsys.readouterr().err


def test_train_reorder_flag(capsys):
    assert main(["train", "--model", "gcn", "--epochs", "2", "--device", "cpu", "--reorder", "rcm", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= result["test_acc"] <= 1.0
    assert main(["train", "--minibatch", "--reorder", "rcm", "--epochs", "1", "--device", "cpu"]) == 2
    assert "--reorder applies to full-graph training" in capsys.readouterr().err
