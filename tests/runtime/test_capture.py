"""Captured and compiled training steps (sparsegnn.capture, training.compile) and the
training-epoch benchmark (benchmarks/train.py).

CPU tests check the errors, that every compile mode computes the eager losses (torch.compile
through the ``aot_eager`` backend: no C++ compiler needed) and the benchmark's smoke run and
report. GPU tests check CUDA-graph replays against eager steps, loss for loss.
"""
import json
import math
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import sparsegnn
from sparsegnn.capture import CapturedStep, capture_step
from sparsegnn.datasets import NodeDataset, random_graph
from sparsegnn.optim import LeanAdam
from sparsegnn.training import build_model, make_optimizer, make_train_step, train_node_classifier

import benchmarks.train

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")


@pytest.fixture
def fresh_dynamo():
    """Compiled code of earlier tests must not count against torch.compile's recompile limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def tiny_dataset(num_nodes: int = 60, num_edges: int = 240, features: int = 12, classes: int = 3) -> NodeDataset:
    """A seeded random node-classification graph (self loops and duplicates included)."""
    edge_index, _ = random_graph(num_nodes, num_edges, seed=3, num_self_loops=4, num_duplicates=5)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(num_nodes, features, generator=gen)
    y = torch.randint(0, classes, (num_nodes,), generator=gen)
    split = torch.randperm(num_nodes, generator=gen)
    masks = []
    for part in (split[:20], split[20:40], split[40:]):
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[part] = True
        masks.append(mask)
    graph = sparsegnn.Graph.from_edge_index(edge_index, num_nodes=num_nodes)
    return NodeDataset("tiny", graph, x, y, *masks, classes)


# ---------------------------------------------------------------------------- errors (CPU)
def _linear_step(model, optimizer, x):
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        return loss
    return step


@pytest.mark.parametrize("optim", [torch.optim.Adam, torch.optim.AdamW])
def test_non_capturable_optimizer_is_refused(optim):
    model = torch.nn.Linear(4, 2)
    optimizer = optim(model.parameters(), lr=0.01)
    with pytest.raises(ValueError, match=rf"CapturedStep\(\): {optim.__name__} is not capturable.*capturable=True"):
        CapturedStep(_linear_step(model, optimizer, torch.randn(3, 4)), optimizer=optimizer)


def test_cpu_tensors_are_refused():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"CapturedStep\(\): optimizer parameters must be CUDA tensors"):
        CapturedStep(_linear_step(model, optimizer, x), optimizer=optimizer)
    with pytest.raises(ValueError, match=r"CapturedStep\(\): inputs\[0\] is on cpu"):
        CapturedStep(lambda: x.sum(), inputs=(x,))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"CapturedStep\(\): step_fn must be callable"):
        CapturedStep(None)
    with pytest.raises(ValueError, match=r"CapturedStep\(\): warmup must be an int >= 1"):
        CapturedStep(lambda: torch.zeros(()), warmup=0)
    with pytest.raises(ValueError, match=r"CapturedStep\(\): inputs\[0\] must be a tensor"):
        CapturedStep(lambda: torch.zeros(()), inputs=[3.0])


@pytest.mark.skipif(CUDA, reason="checks the message without a GPU")
def test_no_cuda_device_is_refused():
    with pytest.raises(ValueError, match=r"CapturedStep\(\): CUDA graphs need a CUDA device"):
        capture_step(lambda: torch.zeros(()))


@pytest.mark.parametrize("mode", ["capture", "reduce-overhead"])
def test_cuda_graph_modes_need_cuda(mode):
    with pytest.raises(ValueError, match=rf"train_node_classifier\(\): compile='{mode}' .*needs a CUDA device"):
        train_node_classifier(tiny_dataset(), "gcn", epochs=1, device="cpu", compile=mode, progress=False)


def test_unknown_compile_mode():
    with pytest.raises(ValueError, match=r"train_node_classifier\(\): unknown compile mode 'max'"):
        train_node_classifier(tiny_dataset(), "gcn", epochs=1, compile="max", progress=False)


# ---------------------------------------------------------------------------- same losses (CPU)
def test_index_step_matches_the_boolean_mask_loop():
    """The training step indexes training nodes with an index tensor: same losses as masks."""
    data = tiny_dataset()
    result = train_node_classifier(data, "gcn", epochs=5, lr=0.05, seed=2, progress=False)
    torch.manual_seed(2)
    model = build_model("gcn", data.x.shape[1], data.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05, weight_decay=5e-4)
    expected = []
    for _ in range(5):
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.x, data.graph)[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()
        expected.append(float(loss.detach()))
    assert len(result.losses) == 5 and result.compile == "none"
    assert result.losses == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert result.losses[-1] < result.losses[0]          # it trains (lr 0.05 on 20 nodes)


@pytest.mark.parametrize("model_name", ["gcn", "gat"])
def test_compile_default_matches_eager_on_cpu(model_name, fresh_dynamo):
    from torch._dynamo.utils import counters

    data = tiny_dataset()
    eager = train_node_classifier(data, model_name, epochs=4, lr=0.05, progress=False)
    graphs_before = counters["stats"]["unique_graphs"]
    compiled = train_node_classifier(data, model_name, epochs=4, lr=0.05, progress=False,
                                     compile="default", compile_backend="aot_eager")
    assert compiled.compile == "default"
    assert counters["stats"]["unique_graphs"] > graphs_before            # dynamo did trace the step
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-5, abs=1e-6)
    assert compiled.test_acc == pytest.approx(eager.test_acc, abs=1e-6)


def test_make_train_step_returns_detached_loss_and_steps():
    data = tiny_dataset()
    torch.manual_seed(0)
    model = build_model("sage", data.x.shape[1], data.num_classes, hidden=8, dropout=0.0)
    optimizer = make_optimizer(model, lr=0.05)
    idx = data.train_mask.nonzero().flatten()
    step = make_train_step(model, optimizer, data.x, data.graph, idx, data.y[idx])
    before = [p.detach().clone() for p in model.parameters()]
    loss = step()
    assert loss.shape == () and not loss.requires_grad and math.isfinite(float(loss))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match=r"make_train_step\(\): unknown compile mode"):
        make_train_step(model, optimizer, data.x, data.graph, idx, data.y[idx], compile="fast")


def _adam_steps(model, optimizer, x, steps=3):
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_make_optimizer_fuses_adam_for_eager_cuda_steps_only(device):
    """Eager steps on CUDA get the fused Adam (one launch), with single-tensor Adam's updates; CPU
    parameters and captured steps keep the default implementation."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2)).to(device)
    x = torch.randn(9, 6, device=device)
    eager = make_optimizer(model, lr=0.05, weight_decay=5e-4)
    assert bool(eager.defaults["fused"]) == (device == "cuda")
    assert isinstance(eager, LeanAdam) == (device == "cuda")
    captured = make_optimizer(model, "capture", lr=0.05)
    assert captured.defaults["capturable"] and not captured.defaults["fused"]
    twin = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2)).to(device)
    twin.load_state_dict(model.state_dict())
    reference = torch.optim.Adam(twin.parameters(), lr=0.05, weight_decay=5e-4, foreach=False)
    start = [p.detach().clone() for p in model.parameters()]
    got, want = _adam_steps(model, eager, x), _adam_steps(twin, reference, x)
    assert all(not torch.equal(a, b) for a, b in zip(got, start))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- GPU
def _eager_and_captured(model_name, steps=5, warmup=2, dropout=0.0, lr=0.01):
    """Losses of ``warmup + steps`` eager steps and of the same run with a CapturedStep."""
    data = sparsegnn.datasets.load("cora").to("cuda")
    idx = data.train_mask.nonzero().flatten()
    y_train = data.y.index_select(0, idx)
    runs = []
    for mode in ("none", "capture"):
        torch.manual_seed(0)
        model = build_model(model_name, data.x.shape[1], data.num_classes, dropout=dropout).cuda().train()
        optimizer = make_optimizer(model, mode, lr=lr)
        step = make_train_step(model, optimizer, data.x, data.graph, idx, y_train, compile=mode, warmup=warmup)
        runs.append([float(step()) for _ in range(warmup + steps)])
        if mode == "capture":
            assert step.captured and step.steps_run == warmup + steps
    return runs


@needs_cuda
@pytest.mark.parametrize("model_name", ["gcn", "gat"])
def test_captured_step_matches_eager(model_name):
    eager, captured = _eager_and_captured(model_name)
    assert captured == pytest.approx(eager, rel=1e-5, abs=1e-5)
    assert eager[-1] < eager[0]


@needs_cuda
def test_the_first_warm_up_step_invests_in_the_graph(monkeypatch):
    """The capture keeps its kernels for good: under the ``auto`` policy its first warm-up step
    invests in the graph (a plan built, tuned kernels), which the amortisation rule alone would
    not do for a small graph in a few steps; the captured step still matches eager."""
    from sparsegnn.tune import reuse

    monkeypatch.setenv("SPARSEGNN_INVEST", "auto")
    data = tiny_dataset().to("cuda")
    graph = data.graph                            # a new Graph: no earlier call invested in it
    assert reuse.calls(graph) == 0
    model = build_model("gcn", data.x.shape[1], data.num_classes, dropout=0.0).cuda().train()
    optimizer = make_optimizer(model, "capture", lr=0.01)
    idx = data.train_mask.nonzero().flatten()
    step = make_train_step(model, optimizer, data.x, graph, idx, data.y[idx], compile="capture", warmup=2)
    reuse.reset_reuse_counts()
    step()
    # the GCN aggregates over a normalised graph with self loops of its own: that one is invested in
    counts = reuse.reuse_counts()
    assert counts["invested"] >= 1 and counts["plans"] >= 1
    losses = [float(step()) for _ in range(4)]
    assert step.captured and all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


@needs_cuda
def test_replays_draw_new_dropout_masks():
    """lr = 0 keeps the parameters: replays differ only if the RNG advances between them."""
    _, captured = _eager_and_captured("gcn", steps=4, dropout=0.5, lr=0.0)
    replays = captured[2:]
    assert len(set(replays)) == len(replays)


@needs_cuda
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_replays_draw_new_fused_attention_dropout_masks(p):
    """Only GATConv's attention dropout is random here (the fused kernel's Philox seed comes from
    the CUDA generator): with p > 0 every replay differs, with p = 0 every replay is the same."""
    data = sparsegnn.datasets.load("cora").to("cuda")
    torch.manual_seed(0)
    conv = sparsegnn.nn.GATConv(data.x.shape[1], 8, heads=4, dropout=p).cuda().train()
    optimizer = torch.optim.Adam(conv.parameters(), lr=0.0, capturable=True)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = conv(data.x, data.graph).square().mean()
        loss.backward()
        optimizer.step()
        return loss

    captured = capture_step(step, warmup=2, optimizer=optimizer, inputs=(data.x,))
    replays = [float(captured()) for _ in range(4)]
    if p > 0:
        assert len(set(replays)) == len(replays)
    else:
        assert len(set(replays)) == 1


@needs_cuda
def test_replay_reads_copied_inputs():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1, bias=False).cuda()          # loss(2 x) = 4 loss(x)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, capturable=True)
    x = torch.randn(16, 8, device="cuda")
    step = capture_step(_linear_step(model, optimizer, x), warmup=2, optimizer=optimizer, inputs=(x,))
    first = float(step())
    assert first == pytest.approx(float(model(x).square().mean()), rel=1e-5)
    x.copy_(2 * x)
    assert float(step()) == pytest.approx(4 * first, rel=1e-4)


@needs_cuda
def test_host_sync_in_the_step_is_a_clear_error():
    # A failed capture can leave the CUDA context unusable: run it in its own process.
    code = textwrap.dedent("""
        import torch
        from sparsegnn.capture import capture_step
        model = torch.nn.Linear(4, 2).cuda()
        opt = torch.optim.Adam(model.parameters(), capturable=True)
        x = torch.randn(10, 4, device="cuda")
        mask = torch.rand(10, device="cuda") > 0.5
        def step():
            opt.zero_grad(set_to_none=True)
            loss = model(x)[mask].sum()        # boolean mask: a host sync
            loss.backward()
            opt.step()
            return loss
        try:
            capture_step(step, warmup=1, optimizer=opt)
        except ValueError as exc:
            print("VALUEERROR", exc)
        # the generator is not left marked as capturing: an eager step's dropout still works
        torch.nn.functional.dropout(x, 0.5)
        print("DROPOUT OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "VALUEERROR CapturedStep(): capturing the step failed" in out.stdout, out.stdout + out.stderr
    assert "DROPOUT OK" in out.stdout, out.stdout + out.stderr


@needs_cuda
def test_failed_captures_give_their_memory_back_and_leave_the_thread_on_its_stream():
    """A step that allocates 64 MB and then syncs fails to capture, five times: before, each
    failure kept its capture's pool (torch frees only a pool whose capture ended) and left
    the thread on torch's capture stream."""
    w = torch.ones(1, device="cuda", requires_grad=True)

    def step():
        buf = torch.ones(16 << 20, device="cuda")          # 64 MB in the capture's pool
        loss = (buf * w).sum()
        loss.backward()
        float(loss)                                         # a host sync: not capturable
        return loss

    def fail_once():
        with pytest.raises(ValueError, match=r"CapturedStep\(\): capturing the step failed"):
            capture_step(step, warmup=1)
        assert torch.cuda.current_stream() == torch.cuda.default_stream()

    fail_once()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    for _ in range(5):
        fail_once()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= reserved + (16 << 20)
    assert 0 < int((torch.nn.functional.dropout(torch.ones(256, device="cuda"), 0.5) == 0).sum()) < 256


@needs_cuda
@pytest.mark.slow
def test_capture_training_reaches_eager_accuracy_on_cora():
    data = sparsegnn.datasets.load("cora")
    eager = train_node_classifier(data, "gcn", device="cuda", progress=False)
    captured = train_node_classifier(data, "gcn", device="cuda", progress=False, compile="capture")
    assert captured.compile == "capture" and len(captured.losses) == 200
    assert captured.losses[0] == pytest.approx(eager.losses[0], rel=1e-5)      # warm-up step: eager
    assert captured.test_acc_at_best_val > 0.75
    assert abs(captured.test_acc_at_best_val - eager.test_acc_at_best_val) <= 0.03


@needs_cuda
@pytest.mark.parametrize("mode", ["reduce-overhead", "default"])
def test_torch_compile_matches_eager_on_gpu(mode, fresh_dynamo):
    data = sparsegnn.datasets.load("cora")
    eager = train_node_classifier(data, "gcn", epochs=6, dropout=0.0, device="cuda", progress=False)
    compiled = train_node_classifier(data, "gcn", epochs=6, dropout=0.0, device="cuda", progress=False,
                                     compile=mode)
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-4, abs=1e-5)


# ---------------------------------------------------------------------------- bench_train.py
def _bench_module():
    return benchmarks.train


def test_bench_train_quick_smoke(tmp_path, fresh_dynamo, capsys):
    bench = _bench_module()
    out = tmp_path / "train.json"
    argv = ["--quick", "--device", "cpu", "--models", "gcn", "--providers", "ours,ours_compile",
            "--out", str(out), "--md", str(tmp_path / "train.md")]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    rows = {r["provider"]: r for r in doc["rows"]}
    assert set(rows) == {"ours", "ours_compile"} and doc["meta"]["compile_backend"] == "aot_eager"
    for row in rows.values():
        assert row["error"] is None, row["error"]
        assert row["graph"] == "cora" and row["f_in"] == 1433 and row["train_nodes"] == 140
        assert row["ms"] > 0 and row["epochs"] == 2 and math.isfinite(row["loss_last"])
    # Same seed, same model, same dropout masks: the compiled step computes the eager loss.
    assert rows["ours_compile"]["loss_first"] == pytest.approx(rows["ours"]["loss_first"], rel=1e-5)
    assert rows["ours"]["loss_first"] == pytest.approx(math.log(7), rel=0.1)
    text = (tmp_path / "train.md").read_text()
    assert "### GCN (2 x 16)" in text and "## Summary" in text
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("| gcn | 1 |")


def test_train_step_backward_threads_same_updates_and_the_flag_is_restored():
    """``backward_threads`` only picks the thread the backward runs on: both settings give the
    same losses and parameters, and the thread-local engine flag is left as it was."""
    data = sparsegnn.datasets.load("cora")
    idx = data.train_mask.nonzero().flatten()
    runs = []
    for threads in (False, True):
        torch.manual_seed(0)
        model = build_model("gcn", data.x.shape[1], data.num_classes, dropout=0.0)
        optimizer = make_optimizer(model, lr=0.05)
        step = make_train_step(model, optimizer, data.x, data.graph, idx, data.y[idx], backward_threads=threads)
        assert torch._C._is_multithreading_enabled()
        losses = [float(step()) for _ in range(3)]
        assert torch._C._is_multithreading_enabled()
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0] and runs[0][0][2] < runs[0][0][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        assert torch.equal(a, b)


def test_bench_train_merges_rounds_into_the_median_of_round_medians():
    bench = _bench_module()
    rounds = [{"ms": 3.0, "ms_min": 2.5, "error": None, "first_ms": 9.0, "peak_mb": 4.0, "base_mb": 1.0,
               "peak_extra_mb": 3.0},
              {"ms": 1.0, "ms_min": 0.9, "error": None, "first_ms": 1.0, "peak_mb": 5.0, "base_mb": 2.0,
               "peak_extra_mb": 3.0},
              {"ms": 2.0, "ms_min": 1.8, "error": None, "first_ms": 1.0, "peak_mb": 3.0, "base_mb": 1.0,
               "peak_extra_mb": 2.0}]
    row = bench.merge_rounds(rounds)
    assert (row["ms"], row["ms_min"], row["ms_rounds"], row["first_ms"]) == (2.0, 0.9, [3.0, 1.0, 2.0], 9.0)
    assert (row["base_mb"], row["peak_mb"], row["peak_extra_mb"]) == (2.0, 5.0, 3.0)     # one round's
    failed = bench.merge_rounds(rounds[:2] + [{"ms": None, "ms_min": None, "error": "oom"}])
    assert failed["error"] == "oom" and failed["ms"] is None
    assert bench.merge_rounds(rounds[:1]) == rounds[0]


def _row(graph, provider, ms, kind="real", variant="edge_index", error=None, model="gcn"):
    return {"graph": graph, "kind": kind, "model": model, "provider": provider, "variant": variant, "ms": ms,
            "error": error, "num_nodes": 10, "num_edges": 20, "f_in": 4, "arch": "2 x 16", "peak_mb": 1.0}


def test_bench_train_report_speedups():
    bench = _bench_module()
    rows = [
        _row("a", "ours", 1.0), _row("a", "pyg", 4.0), _row("a", "pyg", 2.0, variant="adj_t"),
        _row("a", "ours_capture", 0.5), _row("a", "pyg_compile", None, error="Unsupported: sparse"),
        _row("b", "ours", 2.0), _row("b", "pyg", 1.0), _row("b", "ours_capture", 0.25),
        _row("big", "ours", 10.0, kind="stand-in"), _row("big", "pyg", None, kind="stand-in", error="oom"),
        _row("c", "ours", None, error="RuntimeError: boom"), _row("c", "pyg", 3.0),
        _row("a", "pyg_accel", 0.8), _row("b", "pyg_accel", 2.5),
    ]
    s = bench.summarize(rows)["gcn"]
    graphs = s["graphs"]
    assert graphs["a"]["best"]["pyg"]["variant"] == "adj_t"            # the faster PyG input is kept
    assert graphs["a"]["speedup"]["ours"] == pytest.approx(2.0)
    assert graphs["a"]["speedup"]["ours_capture"] == pytest.approx(4.0)
    assert graphs["a"]["speedup"]["pyg_compile"] is None
    assert graphs["b"]["speedup"]["ours"] == pytest.approx(0.5)
    assert graphs["big"]["speedup"]["ours"] is None and s["pyg_oom"] == ["big"]
    assert graphs["c"]["speedup"]["ours"] == 0.0                       # ours failing where PyG runs: worst
    assert s["ours"]["worst"] == ("c", 0.0)
    assert s["ours"]["geomean"] == pytest.approx(1.0)                   # sqrt(2 * 0.5); 0 and OOM left out
    assert s["ours_capture"]["geomean_real"] == pytest.approx(math.sqrt(4.0 * 4.0))
    text = bench.markdown(rows, {"device": "test", "versions": {}})
    assert "| big | 10 | 20 | 4 | 10.000 | OOM |" in text
    assert "gcn eager >= 1.5x geomean, no case < 1.0x: 1.00x, worst 0.00x (c): FAIL" in text
    assert "| gcn | 4 | 1.00 | 0.00 (c) | 4.00 |" in text
    # the accelerated PyG model against ours (ours ms / accelerated ms)
    assert graphs["a"]["speedup"]["accel_vs_ours"] == pytest.approx(1.25)
    assert graphs["a"]["speedup"]["pyg_accel"] == pytest.approx(2.5)          # 2.0 (adj_t) / 0.8
    assert s["accel_vs_ours"]["worst"] == ("b", pytest.approx(0.8))
    assert "accelerate(PyG model) at least as fast as ours" in text and "worst 0.80x (b)" in text
    assert "worst 0.80x (b); accelerated x PyG eager geomean 1.00x: FAIL" in text   # sqrt(2.5 * 0.4)
