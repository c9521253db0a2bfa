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
