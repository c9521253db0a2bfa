"""The MaxK-against-ReLU-twin benchmark: its ratio arithmetic, and a tiny CPU run of the CLI."""
import json
import math

import pytest

from benchmarks.maxk_twins import main, markdown, ratios, summary


def _rows():
    def row(graph, conv, k, mode, ms):
        return dict(graph=graph, kind="stand-in", nodes=10, edges=100, conv=conv, k=k, mode=mode, ms=ms,
                    error=None if ms else "boom")
    return [row("a", "sage", None, "default", 4.0), row("a", "sage", 16, "default", 2.0),
            row("a", "sage", 32, "default", 8.0), row("a", "sage", None, "eager", 4.0),
            row("a", "sage", 16, "eager", None), row("b", "gin", None, "default", 3.0),
            row("b", "gin", 16, "default", 3.0)]


def test_ratios_are_twin_over_maxk_per_mode():
    got = {(r["graph"], r["conv"], r["k"]): r["x_relu"] for r in ratios(_rows())}
    assert got == {("a", "sage", 16): 2.0, ("a", "sage", 32): 0.5, ("b", "gin", 16): 1.0}
    assert [r["x_relu"] for r in ratios(_rows(), "eager")] == [None]      # the failed MaxK run


def test_summary_geomean_worst_and_cases_below_one():
    s = summary(_rows())
    assert s["cases"] == 3 and s["failed"] == 0
    assert math.isclose(s["geomean"], 1.0)        # (2 * 0.5 * 1) ** (1/3)
    assert (s["worst"]["graph"], s["worst"]["k"]) == ("a", 32)
    assert [(r["graph"], r["k"]) for r in s["below"]] == [("a", 32)]
    assert summary(_rows(), "eager") == {"cases": 0, "geomean": None, "worst": None, "below": [], "failed": 1}
    text = markdown(_rows(), {"device": "test", "modes": ["default", "eager"]})
    assert "geomean 1.00x ReLU, worst 0.50x (a sage k=32); below 1.0x: 1 (a sage k=32 0.50x)" in text
    assert "- a sage k=16 eager: boom" in text


def test_fastest_step_ratios_and_the_run_note_in_the_markdown():
    """With ``ms_min`` the ratios of each config's fastest step get their own line; a meta note is printed."""
    rows = _rows()
    for r, fastest in zip(rows, (2.0, 4.0, 1.0, 4.0, None, 3.0, 1.5)):
        r["ms_min"] = fastest
    got = {(r["graph"], r["k"]): r["x_relu"] for r in ratios(rows, key="ms_min")}
    assert got == {("a", 16): 0.5, ("a", 32): 2.0, ("b", 16): 2.0}
    text = markdown(rows, {"device": "test", "modes": ["default"], "note": "Two runs."})
    assert "by each one's fastest step: geomean 1.26x, worst 0.50x (a sage k=16), below 1.0x: 1" in text
    assert "\nTwo runs.\n" in text


def test_cli_runs_every_config_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "tw"
    assert main(["--graphs", "pubmed", "--convs", "sage,gcn", "--ks", "2",
                 "--hidden", "8", "--warmup", "1", "--steps", "1", "--device", "cpu", "--modes", "eager",
                 "--out", str(out)]) == 0
    rows = json.loads((out / "maxk_twins.json").read_text())["rows"]
    assert [(r["conv"], r["k"], r["mode"]) for r in rows] == [("sage", None, "eager"), ("sage", 2, "eager"),
                                                               ("gcn", None, "eager"), ("gcn", 2, "eager")]
    assert all(r["ms"] > 0 and r["error"] is None for r in rows)
    table = [line for line in (out / "maxk_twins.md").read_text().splitlines() if line.startswith("| pubmed")]
    assert len(table) == 2


def test_cli_rejects_unknown_convs(tmp_path):
    with pytest.raises(SystemExit):
        main(["--convs", "gat", "--device", "cpu", "--out", str(tmp_path)])


def test_interleaved_rotates_the_order_stops_on_budget_and_keeps_failures():
    import torch

    from benchmarks.maxk_twins import interleaved

    calls = []

    def step(name):
        def run():
            calls.append(name)
            return torch.tensor(1.0)
        return run

    def broken():
        raise RuntimeError("no kernel")

    out = interleaved({"a": step("a"), "b": step("b"), "c": broken}, torch.device("cpu"), warmup=1, steps=2,
                      rounds=3, budget_ms=1e9)
    timed = calls[4:]                   # after the first call and one warm-up step of a and b
    assert timed == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]
    assert out["a"]["rounds"] == out["b"]["rounds"] == 3 and out["a"]["ms"] >= 0.0 and out["a"]["error"] is None
    assert out["c"]["ms"] is None and out["c"]["error"] == "RuntimeError: no kernel"
    calls.clear()
    out = interleaved({"a": step("a")}, torch.device("cpu"), warmup=0, steps=1, rounds=5, budget_ms=0.0)
    assert out["a"]["rounds"] == 1 and calls == ["a", "a"]      # the budget spent after one round


def test_a_failure_in_a_timed_round_fails_that_config_only():
    import torch

    from benchmarks.maxk_twins import interleaved

    calls = {"flaky": 0}

    def flaky():
        calls["flaky"] += 1
        if calls["flaky"] > 2:                      # the first call and the warm-up pass
            raise RuntimeError("lost the device")
        return torch.tensor(1.0)

    out = interleaved({"flaky": flaky, "ok": lambda: torch.tensor(1.0)}, torch.device("cpu"), warmup=1, steps=2,
                      rounds=3, budget_ms=1e9)
    assert out["flaky"]["ms"] is None and out["flaky"]["error"] == "RuntimeError: lost the device"
    assert out["ok"]["rounds"] == 3 and out["ok"]["error"] is None and out["ok"]["replay"] is None


def test_captured_mode_needs_cuda(tmp_path):
    with pytest.raises(SystemExit):
        main(["--modes", "captured", "--device", "cpu", "--out", str(tmp_path)])


def test_markdown_adds_the_captured_columns_when_a_run_has_them():
    rows = [dict(graph="g", edges=10, conv="sage", k=k, mode=mode, ms=ms * (3.0 if mode == "captured" else 1.0),
                 replay=None) for mode in ("default", "eager", "captured") for k, ms in ((None, 2.0), (4, 1.0))]
    text = markdown(rows, {"device": "test", "modes": ["default", "eager", "captured"]})
    line = next(row for row in text.splitlines() if row.startswith("| g |"))
    assert line.endswith("| 6.00 | 3.00 | 2.00 |") and "ReLU captured ms" in text
    assert "ReLU captured ms" not in markdown([r for r in rows if r["mode"] != "captured"],
                                              {"device": "test", "modes": ["default", "eager"]})
