"""Host cost of each part of an eager training step (GPU machine), in microseconds.

The GPU is held busy by a sleep kernel while the host runs, so the clock sees host work only
(no profiler overhead).  Few steps per timed batch (``--n``): a batch must stay below the
CUDA launch queue's depth (~1000 launches), or the host blocks on the sleeping GPU and the
figure is the sleep's.  Reported:

* the step's timeline per segment (zero_grad, model, loss forward, backward, optimiser),
  ours (replayed GCN) and PyG's, with the autograd engine's device threads on and off;
* the replay's pieces (signature, graph launches, output copy, gradient copy-out);
* backward of a loss on a leaf with and without a Python autograd node before it;
* the optimiser step: torch's fused Adam vs LeanAdam.

    PYTHONPATH=src python scripts/step_costs.py --graph cora
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train as bt  # noqa: E402
import bench_layers as layers  # noqa: E402

from sparsegnn.nn import replay as rp  # noqa: E402
from sparsegnn.optim import LeanAdam  # noqa: E402

SLEEP = 400_000_000     # cycles of GPU sleep per timed batch (~0.2 s)


class _Noop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def timeline(parts, n, reps=5):
    """Per segment, host us per step (min over ``reps`` batches of ``n`` steps, GPU busy)."""
    for _ in range(10):
        for _, fn in parts:
            fn()
    torch.cuda.synchronize()
    best = [float("inf")] * len(parts)
    for _ in range(reps):
        acc = [0.0] * len(parts)
        torch.cuda._sleep(SLEEP)
        for _ in range(n):
            for j, (_, fn) in enumerate(parts):
                t = time.perf_counter()
                fn()
                acc[j] += time.perf_counter() - t
        torch.cuda.synchronize()
        best = [min(b, a / n * 1e6) for b, a in zip(best, acc)]
    return best


def per_call(fn, n, reps=5, setup=None):
    """Host us per call of ``fn(item)`` over ``n`` items made by ``setup`` (untimed), GPU busy."""
    best = float("inf")
    for _ in range(reps + 1):
        items = [setup() if setup else None for _ in range(n)]
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP)
        t = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, (time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--graph", default="cora")
    p.add_argument("--n", type=int, default=10, help="steps per timed batch")
    args = p.parse_args()
    device = torch.device("cuda")
    graph, kind = bt.load_bench_graph(args.graph, device, None)
    inputs = bt.bench_inputs(args.graph, kind, graph, None, 16, 0.1, device, 0)
    x, idx, y = inputs["x"], inputs["train_idx"], inputs["y_train"]
    print(f"threads: {[t.name for t in threading.enumerate()]}; switch interval {sys.getswitchinterval()} s")
    rows = []

    def add(name, us):
        rows.append((name, us))
        print(f"{name:<64} {us:8.1f} us", flush=True)

    try:
        import torch_geometric.nn as pyg_nn
    except ImportError:
        pyg_nn = None
    models = {}
    torch.manual_seed(0)
    models["ours"] = (bt.ours_model("gcn", x.shape[1], inputs["classes"], None, 8, 8, "tf32").to(device),
                      layers.bare(graph))
    if pyg_nn is not None:
        torch.manual_seed(0)
        models["pyg"] = (bt.pyg_model(pyg_nn, "gcn", x.shape[1], inputs["classes"], None, 8, 8).to(device),
                         graph.edge_index().contiguous())
    for name, (net, g) in models.items():
        for opt_name, opt in (("Adam(fused)", torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=5e-4,
                                                                fused=True)),
                              ("LeanAdam", LeanAdam(net.parameters(), lr=0.01, weight_decay=5e-4))):
            for threads in (True, False):
                state = {}

                def zero(opt=opt):
                    opt.zero_grad(set_to_none=True)

                def model(net=net, g=g):
                    state["out"] = net(x, g)

                def loss():
                    state["loss"] = F.cross_entropy(state.pop("out").index_select(0, idx), y)

                def backward():
                    state.pop("loss").backward()

                parts = [("zero_grad", zero), ("model", model), ("loss fwd", loss), ("backward", backward),
                         ("opt.step", opt.step)]
                with torch.autograd.set_multithreading_enabled(threads):
                    us = timeline(parts, args.n)
                tag = f"{name}, {opt_name}, device threads {'on' if threads else 'off'}"
                add(f"{tag}: whole step", sum(us))
                for (part, _), v in zip(parts, us):
                    add(f"  {part}", v)
    # per-step spread as bench_train times it (CUDA events around each step, no sync between)
    import gc
    import statistics

    for name, (net, g) in models.items():
        opt = LeanAdam(net.parameters(), lr=0.01, weight_decay=5e-4)
        step = bt.make_train_step(net, opt, x, g, idx, y, compile="none")
        for variant in ("default", "gc off"):
            if variant == "gc off":
                gc.collect()
                gc.disable()
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            n = 200
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            host = []
            for a, b in ev:
                t = time.perf_counter()
                a.record()
                step()
                b.record()
                host.append((time.perf_counter() - t) * 1e3)
            torch.cuda.synchronize()
            gc.enable()
            gpu = sorted(a.elapsed_time(b) for a, b in ev)
            host.sort()
            q = lambda v: " / ".join(f"{v[int(f * (len(v) - 1))]:.3f}" for f in (0.1, 0.5, 0.9))  # noqa: E731
            add(f"{name} per-step ms p10/p50/p90, {variant}: events {q(gpu)}; host {q(host)}",
                statistics.median(gpu) * 1e3)
    net, g = models["ours"]
    rec = net._replay.rec
    assert rec is not None, rp.replay_state(net)
    add("ours replay: _active", per_call(lambda _: net._replay._active(net, x), 200))
    add("ours: model(x, g) alone (replayed forward, output dropped)", per_call(lambda _: net(x, g), 200))
    add("ours replay: _model_state + _signature",
        per_call(lambda _: rp._signature((x, g), {}, *rp._model_state(net, net._replay.watched)), 200))
    add("ours replay: fwd graph replay", per_call(lambda _: rec.fwd.replay(), 200))
    add("ours replay: bwd graph replay", per_call(lambda _: rec.bwd.replay(), 200))
    add("ours replay: out.clone()", per_call(lambda _: rec.out.clone(), 200))
    add("ours replay: grad_out.copy_(out)", per_call(lambda _: rec.grad_out.copy_(rec.out), 200))
    add("ours replay: _foreach_mul(grads, 1.0)", per_call(lambda _: torch._foreach_mul(rec.grads, 1.0), 200))
    leaf = rec.out.detach().clone().requires_grad_(True)
    for threads in (True, False):
        with torch.autograd.set_multithreading_enabled(threads):
            on = "on" if threads else "off"
            add(f"backward of CE(leaf[idx]) (C++ nodes), threads {on}",
                per_call(lambda loss: loss.backward(), 40,
                         setup=lambda: F.cross_entropy(leaf.index_select(0, idx), y)))
            add(f"backward of CE(Noop(leaf)[idx]) (+1 Python node), threads {on}",
                per_call(lambda loss: loss.backward(), 40,
                         setup=lambda: F.cross_entropy(_Noop.apply(leaf).index_select(0, idx), y)))
    print("\n| part | host us |\n|---|---|")
    for name, us in rows:
        print(f"| {name.strip()} | {us:.1f} |")


if __name__ == "__main__":
    main()
