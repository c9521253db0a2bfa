"""The CPU benchmark harness (``bench --device cpu``) on a tiny synthetic graph: rows, the float64
check (an injected wrong provider is flagged and never the best baseline), report and CLI."""
import importlib.util
import json
import sys

import pytest
import torch

from sparsegnn import Graph
from benchmarks import cpu
from benchmarks.ops import main

HAVE_PYG = importlib.util.find_spec("torch_geometric") is not None
FAST = 0.002  # seconds of repeats per timing: the tests check the plumbing, not the speed


def _tiny_graph(num_nodes=30, seed=0):
    """No duplicate edges (torch's CSR value gradient needs that), a few rows without edges."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(num_nodes, num_nodes, generator=gen) < 0.15
    mask[:3] = False  # targets 0..2 have no incoming edges
    target, source = mask.nonzero().t()
    return Graph.from_edge_index(torch.stack([source, target]), num_nodes=num_nodes)


def _wrong(case):
    """Ours, 1 % off: output and gradients are wrong."""
    (fn,) = cpu.PROVIDERS[case.op][cpu.OURS](case).values()
    return {"": lambda: fn() * 1.01}


def _no_grad(case):
    """Right output, but detached: a baseline that cannot give a gradient."""
    (fn,) = cpu.PROVIDERS[case.op][cpu.OURS](case).values()
    return {"": lambda: fn().detach()}


def _rows(**kw):
    graph = _tiny_graph()
    rows = cpu.run(["tiny"], progress=False, budget_s=FAST, loader=lambda name: graph, **kw)
    return [r.__dict__ for r in rows]


@pytest.fixture(scope="module")
def rows():
    extra = {"spmm-w": {"wrong": _wrong, "no-grad": _no_grad}}
    return _rows(ops=["spmm-w", "softmax"], dims=[8], extra_providers=extra)


def _row(rows, op, provider, direction):
    (row,) = [r for r in rows if (r["op"], r["provider"], r["direction"]) == (op, provider, direction)]
    return row


def test_rows_every_provider_both_directions(rows):
    expected = {("spmm-w", p) for p in ("sparsegnn", "torch.sparse.mm", "torch.sparse.mm-reduce", "pyg-scatter",
                                        "wrong", "no-grad")}
    expected |= {("softmax", p) for p in ("sparsegnn", "pyg-softmax-index", "pyg-softmax-ptr")}
    assert {(r["op"], r["provider"]) for r in rows} == expected
    assert len(rows) == 2 * len(expected)
    for op, provider in expected:
        for direction in ("fwd", "bwd"):
            r = _row(rows, op, provider, direction)
            assert (r["graph"], r["F"], r["dtype"], r["nodes"]) == ("tiny", 8, "float32", 30)
            if provider in ("wrong", "no-grad"):
                continue
            if provider.startswith("pyg") and not HAVE_PYG:
                assert r["ms"] is None and r["note"].startswith("unavailable")
                continue
            assert r["ok"] is True, r
            assert r["ms"] > 0 and r["rel_err"] < cpu.TOLERANCE["float32"] and r["note"] == ""
            assert r["extra"]["first_call_ms"] > 0
            assert len(r["extra"]["ms_runs"]) == 2 and r["ms"] == min(r["extra"]["ms_runs"])
    # torch.sparse.mm keeps the faster of its int32 / int64 CSR forms; both were measured
    r = _row(rows, "spmm-w", "torch.sparse.mm", "bwd")
    assert r["extra"]["variant"] in ("int32", "int64")
    assert set(r["extra"]["variants"]) == {"int32", "int64"}
    assert r["ms"] == min(r["extra"]["ms_runs"])
    assert r["extra"]["variants"][r["extra"]["variant"]]["ms"] <= r["extra"]["variants"][
        {"int32": "int64", "int64": "int32"}[r["extra"]["variant"]]]["ms"]


def test_wrong_provider_is_flagged(rows):
    for direction in ("fwd", "bwd"):
        r = _row(rows, "spmm-w", "wrong", direction)
        assert r["ok"] is False and r["ms"] > 0
        assert 5e-3 < r["rel_err"] < 2e-2  # 1 % off
        assert r["note"].startswith("WRONG")
    text = cpu.markdown(rows, {"device": "test"})
    assert "- wrong spmm-w fwd: WRONG" in text and "- wrong spmm-w bwd: WRONG" in text
    for key, comp in cpu.comparisons(rows).items():
        assert comp.best_name not in ("wrong", "no-grad"), key


def test_baseline_without_gradient_is_noted(rows):
    assert _row(rows, "spmm-w", "no-grad", "fwd")["ok"] is True
    r = _row(rows, "spmm-w", "no-grad", "bwd")
    assert r["ms"] is None and r["ok"] is None and r["note"].startswith("no gradient: RuntimeError")


def test_markdown_tables_and_acceptance_last(rows):
    text = cpu.markdown(rows, cpu.meta())
    for op in ("spmm-w", "softmax"):
        assert f"## {op}\n" in text
    assert "| graph | nodes | nnz | F | dtype | fwd ms | fwd best baseline ms | fwd speedup | bwd ms |" in text
    section = text.split("## spmm-w\n")[1].split("## softmax\n")[0]
    (line,) = [ln for ln in section.splitlines() if ln.startswith("| tiny |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:5] == ["tiny", "30", f"{rows[0]['nnz']:,}", "8", "float32"]
    for ours, best, speedup in (cells[5:8], cells[8:11]):  # fwd, then bwd
        ours_ms, best_ms, name = float(ours), float(best.split()[0]), best.split()[1].strip("()")
        assert name in ("torch.sparse.mm", "torch.sparse.mm-reduce", "pyg-scatter")  # never wrong / no-grad
        # the cells show ms to 3 decimals: the speedup lies within what their rounding allows
        low, high = (best_ms - 5e-4) / (ours_ms + 5e-4), (best_ms + 5e-4) / max(ours_ms - 5e-4, 1e-9)
        assert low - 0.005 <= float(speedup[:-1]) <= high + 0.005
    last = [ln for ln in text.splitlines() if ln.strip()][-2:]
    assert last[0].startswith("- [") and "every op fwd and bwd >= 1.0x the faster baseline" in last[0]
    assert last[1].startswith("- [") and "geomean >= 1.2x" in last[1]
    assert "**Overall: geomean" in text


def _case_rows(ours_ms, base_ms, ok=True):
    """Handmade JSON rows: one spmm case per (graph, direction) with ours and one baseline."""
    rows = []
    for i, (ours, base) in enumerate(zip(ours_ms, base_ms)):
        for direction in ("fwd", "bwd"):
            common = {"op": "spmm", "graph": f"g{i}", "nodes": 10, "nnz": 10 * (i + 1), "F": 16, "dtype": "float32",
                      "direction": direction, "rel_err": 1e-7, "note": "", "extra": {}}
            rows.append({**common, "provider": "sparsegnn", "ms": ours, "ok": ok})
            rows.append({**common, "provider": "torch.sparse.mm", "ms": base, "ok": True})
    return rows


def test_acceptance_arithmetic():
    lines = cpu.acceptance(_case_rows([1.0, 1.0], [2.0, 1.5]))
    assert lines[0].startswith("- [PASS] every op") and "0 of 4 cases below 1.0x" in lines[0]
    assert lines[1] == f"- [PASS] geomean >= 1.2x: {(2.0 * 1.5) ** 0.5:.2f}x over 4 cases"
    lines = cpu.acceptance(_case_rows([1.0, 1.0], [3.0, 0.9]))
    assert lines[0].startswith("- [FAIL]") and "2 of 4 cases below 1.0x; worst 0.90x (spmm fwd, g1, F=16)" in lines[0]
    assert lines[1].startswith("- [PASS] geomean >= 1.2x: 1.64x")
    lines = cpu.acceptance(_case_rows([1.0], [5.0], ok=False))  # fast but wrong: fails both
    assert lines[0].startswith("- [FAIL]") and "where ours failed the check" in lines[0]
    assert lines[1].startswith("- [FAIL]")


def test_max_ties_left_out_of_the_gradient_check():
    # 1 -> 0 and 2 -> 0 with equal messages in feature 0: a tie, whose gradient may go to either
    # source (ours: the first edge; amax: split evenly); feature 1 has a unique maximum (source 2).
    graph = Graph.from_edge_index(torch.tensor([[1, 2, 0], [0, 0, 1]]), num_nodes=3).with_values(torch.ones(3))
    x = torch.tensor([[0.5, 0.1], [2.0, 1.0], [2.0, 3.0]])
    assert cpu.max_ties(graph, x, graph.edge_val).tolist() == [[False, False], [True, False], [True, False]]
    grad_out = torch.ones(3, 2)
    ref_out, ref_grads = cpu.oracle("spmm-max", graph, {"x": x}, grad_out)
    case = cpu.Case("spmm-max", graph, {"x": x}, grad_out, ref_out, ref_grads, {"x": ~cpu.max_ties(graph, x, graph.edge_val)})
    # node 1's output comes from source 0 (both features); node 2 has no incoming edge
    first_edge = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])  # the tie's gradient all to source 1
    split = torch.tensor([[1.0, 1.0], [0.5, 0.0], [0.5, 1.0]])  # ... split evenly
    assert cpu._error_vs_oracle("bwd", (first_edge,), case) == 0.0
    assert cpu._error_vs_oracle("bwd", (split,), case) == 0.0
    wrong = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])  # feature 1's gradient to the wrong source
    assert cpu._error_vs_oracle("bwd", (wrong,), case) > 0.5


def test_dense_value_gradient_baseline_skipped(monkeypatch):
    monkeypatch.setattr(cpu, "DENSE_GRAD_LIMIT_GB", 1e-9)
    rows = _rows(ops=["spmm-w"], dims=[4], providers=["sparsegnn", "torch.sparse.mm"])
    assert _row(rows, "spmm-w", "torch.sparse.mm", "fwd")["ok"] is True
    r = _row(rows, "spmm-w", "torch.sparse.mm", "bwd")
    assert r["ms"] is None and r["note"].startswith("skipped: torch's gradient for CSR values goes through a dense")
    assert _row(rows, "spmm-w", "sparsegnn", "bwd")["ok"] is True


def test_canary_warning():
    rows = _case_rows([1.0], [2.0])
    calm = cpu.markdown(rows, {"canary_ms": {"start": 0.005, "g0": 0.006}})
    assert "Canary" in calm and "Warning" not in calm
    slowed = cpu.markdown(rows, {"canary_ms": {"start": 0.005, "g0": 8.0}})
    assert "**Warning: the process slowed down during the run" in slowed and "8.0000 ms at worst (g0)" in slowed
    assert [ln for ln in slowed.splitlines() if ln.strip()][-1].startswith("- [PASS] geomean")


def test_wrong_baseline_never_best():
    rows = _case_rows([1.0], [2.0])
    rows.append({**rows[0], "provider": "fast-but-wrong", "ms": 0.1, "ok": False, "note": "WRONG: rel_err 1e-2"})
    comp = cpu.comparisons(rows)[("spmm", "fwd", "g0", 16, "float32")]
    assert (comp.best_name, comp.best_ms, comp.speedup) == ("torch.sparse.mm", 2.0, 2.0)


def test_case_over_memory_limit_is_skipped():
    rows = _rows(ops=["spmm"], dims=[8], memory_limit_gb=1e-9)
    assert len(rows) == 2 and all(r["provider"] == "sparsegnn" and r["ms"] is None for r in rows)
    assert rows[0]["note"].startswith("skipped: needs")
    assert "skipped: needs" in cpu.markdown(rows, {})


def test_pyg_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_geometric", None)
    monkeypatch.setitem(sys.modules, "torch_geometric.utils", None)
    rows = _rows(ops=["softmax"], dims=[4])
    ours = [r for r in rows if r["provider"] == "sparsegnn"]
    assert len(ours) == 2 and all(r["ok"] for r in ours)
    pyg = [r for r in rows if r["provider"].startswith("pyg")]
    assert len(pyg) == 4 and all(r["ms"] is None and r["note"].startswith("unavailable") for r in pyg)
    assert "without a baseline left out" in cpu.acceptance(rows)[0]


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"bench\(\): unknown ops \['spmm-min'\]"):
        _rows(ops=["spmm-min"], dims=[8])
    with pytest.raises(ValueError, match=r"bench\(\): unknown dtypes"):
        _rows(ops=["spmm"], dims=[8], dtypes=["int8"])
    with pytest.raises(ValueError, match=r"bench\(\): unknown providers"):
        _rows(ops=["spmm"], dims=[8], providers=["cusparse"])


def test_cli_device_cpu(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        code = main(["--device", "cpu", "--graphs", "cora", "--ops", "sddmm", "--dims", "4",
                     "--budget-ms", "2", "--threads", "1", "--out", str(tmp_path)])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith("- [") and "geomean >= 1.2x" in out.rstrip().splitlines()[-1]
    data = json.loads((tmp_path / "bench-cpu.json").read_text())
    assert data["meta"]["threads"] == 1 and data["meta"]["suite"] == "real"
    assert set(data["meta"]["canary_ms"]) == {"start", "cora"} and data["meta"]["canary_ms"]["start"] > 0
    assert {r["provider"] for r in data["rows"]} == {"sparsegnn", "torch.sparse.sampled_addmm", "gather"}
    assert all(r["ok"] for r in data["rows"])
    assert (tmp_path / "bench-cpu.md").read_text().startswith("# CPU benchmarks")
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "bench-cpu.png").stat().st_size > 1000


def test_cli_errors(capsys):
    assert main(["--device", "cpu", "--graphs", "cora", "--ops", "spmm-min", "--dims", "4"]) == 2
    assert "bench(): unknown ops" in capsys.readouterr().err
    assert main(["--device", "cpu", "--graphs", "cora", "--threads", "0"]) == 2
    assert "bench(): --threads must be >= 1" in capsys.readouterr().err
