"""Training-epoch time of our GNN models against the same architectures built from PyG's layers.

For every graph of ``--graphs`` (default ``all``: the real suite of
``sparsegnn.datasets.suite.REAL_SUITE`` plus the ``reddit`` and ``amazon0505`` stand-ins) and
every model of ``--models`` it times one full-graph training epoch: forward, cross-entropy on
a set of training nodes (an index tensor), backward and an Adam step. Models (the defaults of
``sparsegnn.nn.models``, mirrored layer by layer with ``torch_geometric.nn``):

* ``gcn``:  drop -> GCNConv(F, 16) -> ReLU -> drop -> GCNConv(16, C)            (cached, dropout 0.5)
* ``sage``: 3 x SAGEConv (mean), hidden 256, LayerNorm + ReLU + drop after the first two (0.5)
* ``gin``:  3 x GINConv(Linear-ReLU-Linear), hidden 256, LayerNorm + ReLU + drop      (0.5)
* ``gat``:  drop -> GATConv(F, 8, heads=8) -> ELU -> drop -> GATConv(64, C, heads=1)
            (dropout 0.6 on features and attention; ``--gat-hidden`` / ``--gat-heads``)
* ``agnn``: drop -> Linear(F, 32) -> ReLU -> AGNNConv (fixed beta) -> AGNNConv -> drop -> Linear(32, C)

Providers (``--providers``):

* ``ours``: our model, eager, given a ``sparsegnn.Graph`` (on CUDA its forward and backward
  replay from CUDA graphs after two calls: ``sparsegnn.nn.replay``);
* ``ours_noreplay``: the same with ``replay=False`` (every op launched from Python);
* ``ours_capture``: the whole step as one CUDA graph replay (``sparsegnn.capture.CapturedStep``,
  Adam with ``capturable=True``; CUDA only);
* ``ours_compile``: model + loss through ``torch.compile`` (default mode, ``--compile-backend``);
* ``pyg``: the PyG model, eager, with ``edge_index`` and (GCN, GraphSAGE, GIN) with a
  ``torch.sparse`` CSR ``adj_t``: one row per input (``variant``), the report keeps the faster;
* ``pyg_compile``: the PyG model through ``torch.compile`` with ``edge_index``, where it runs;
* ``pyg_accel``: the PyG model converted by ``sparsegnn.accelerate`` (our layers, PyG's weights),
  called the PyG way with ``edge_index`` (the target: at least as fast as ``ours``).

The compile providers run on the graphs of ``--compile-graphs`` only (default ``cora``: every
compilation takes seconds to a minute; ``real`` or ``all`` for more).

Features: Cora's own (1,433 columns, its standard 140 training nodes); the stand-ins' widths
and classes from their spec (reddit: 602 / 41, amazon0505: 96 / 22); random with ``--features``
columns (64) elsewhere, and ``--features N`` forces N random columns on every graph but Cora.
Labels are random (``--classes``); training nodes a random ``--train-fraction`` of the nodes.

Each provider starts cold (a fresh Graph object, a fresh model; compiled code reset) and is
timed as the median of ``--epochs`` epochs after ``--warmup`` (CUDA events around each epoch,
``perf_counter`` on the CPU); the first epoch is recorded as ``first_ms`` (compilation, tuning,
capture). Peak memory is ``torch.cuda.max_memory_allocated`` with the peak reset per provider
(``peak_mb``; ``base_mb`` is what was allocated when it started: the shared inputs). Out of
memory is a row with ``error="oom"``; other failures are rows with the error text.

Writes JSON rows + meta to ``--out``, a markdown report to ``--md`` and a plot to ``--plot``
(optional, needs matplotlib), and prints the compact summary table last::

    python -m benchmarks.train --out benchmarks/local/train.json --md benchmarks/local/train.md
    python -m benchmarks.train --graphs reddit --models gat --gat-hidden 64   # GAT 64 x 8 heads
    python -m benchmarks.train --report a.json,b.json --md all.md             # merge runs
    python -m benchmarks.train --quick --device cpu --providers ours,ours_compile   # smoke test
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import platform
import sys
import statistics
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks import layers  # inputs, timing and version helpers shared with it
from sparsegnn import Graph
from sparsegnn import nn as sgnn
from sparsegnn.nn.replay import replay_state
from sparsegnn.training import make_optimizer, make_train_step

MODELS = ("gcn", "sage", "gin", "gat", "agnn")
PROVIDERS = ("ours", "ours_noreplay", "ours_capture", "ours_compile", "pyg", "pyg_compile", "pyg_accel")
#: Providers whose speedup over PyG eager is reported.
SPEED_PROVIDERS = ("ours", "ours_noreplay", "ours_capture", "ours_compile", "pyg_compile", "pyg_accel")
STAND_INS = ("reddit", "amazon0505")
#: Dropout of each model in sparsegnn.nn.models (the PyG mirrors use the same).
DEFAULT_DROPOUT = {"gcn": 0.5, "sage": 0.5, "gin": 0.5, "gat": 0.6, "agnn": 0.5}


# ---------------------------------------------------------------------------- inputs
def all_graphs() -> List[str]:
    """The real suite followed by the stand-ins the acceptance names."""
    return layers.suite_names() + list(STAND_INS)


def load_bench_graph(name: str, device: torch.device, data_dir: Optional[str]) -> Tuple[Graph, str]:
    """``(graph, kind)``: a real-suite graph (kind ``"real"``) or a paper stand-in (``"stand-in"``)."""
    if name.lower() in {n.lower() for n in layers.suite_names()}:
        return layers.bare(layers.load_graph(name, data_dir)).to(device), "real"
    from sparsegnn.benchmark import bench_graph
    from sparsegnn.datasets.synthetic import STAND_INS as SPECS

    if name not in SPECS:
        raise ValueError(f"bench_train(): unknown graph {name!r}; known: {', '.join(all_graphs())} "
                         f"or any stand-in of sparsegnn.datasets.synthetic.STAND_INS")
    return layers.bare(bench_graph(name, device=device)), "stand-in"


def bench_inputs(name: str, kind: str, graph: Graph, features: Optional[int], classes: int,
                 train_fraction: float, device: torch.device, seed: int) -> Dict[str, object]:
    """Features, random labels and training nodes of one graph.

    Shapes:
        -> x: [N, F] float32; y: [N] int64; train_idx: [T] int64 (sorted); y_train: [T].
    """
    gen = torch.Generator().manual_seed(seed)
    n = graph.num_nodes
    if name.lower() == "cora":
        import sparsegnn

        data = sparsegnn.datasets.load("cora")
        if data.x.shape[0] == n:
            train_idx = data.train_mask.nonzero().flatten()
            return {"x": data.x.to(device), "y": data.y.to(device), "train_idx": train_idx.to(device),
                    "y_train": data.y[train_idx].to(device), "classes": data.num_classes,
                    "features": "dataset", "train": "dataset split"}
    width, source = (64 if features is None else features), "random"
    if kind == "stand-in":
        from sparsegnn.datasets.synthetic import STAND_INS as SPECS

        spec = SPECS[name]
        classes = spec.num_classes
        if features is None:
            width, source = spec.num_features, "random (stand-in width)"
    x = torch.randn(n, width, generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen)
    train_idx = torch.randperm(n, generator=gen)[:max(1, int(round(train_fraction * n)))].sort().values
    return {"x": x.to(device), "y": y.to(device), "train_idx": train_idx.to(device),
            "y_train": y[train_idx].to(device), "classes": classes, "features": source,
            "train": f"random {train_fraction:g}"}


# ---------------------------------------------------------------------------- models
def ours_model(model: str, f_in: int, classes: int, dropout: Optional[float], gat_hidden: int,
               gat_heads: int, precision: str = "ieee") -> nn.Module:
    """Our model with its default architecture (``dropout`` None: the model's default;
    ``precision`` of the aggregations, GAT exact only)."""
    d = DEFAULT_DROPOUT[model] if dropout is None else dropout
    p = {} if precision == "ieee" else {"precision": precision}
    if model == "gcn":
        return sgnn.GCN(f_in, classes, dropout=d, **p)
    if model == "sage":
        return sgnn.GraphSAGE(f_in, classes, dropout=d, **p)
    if model == "gin":
        return sgnn.GIN(f_in, classes, dropout=d, **p)
    if model == "gat":
        return sgnn.GAT(f_in, classes, hidden=gat_hidden, heads=gat_heads, dropout=d)
    return sgnn.AGNN(f_in, classes, dropout=d, **p)


class PygGCN(nn.Module):
    """``conv2(drop(relu(conv1(drop(x)))))`` with cached GCNConv (as sparsegnn.nn.GCN)."""

    def __init__(self, pyg_nn, f_in: int, classes: int, dropout: float, hidden: int = 16) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv1 = pyg_nn.GCNConv(f_in, hidden, cached=True)
        self.conv2 = pyg_nn.GCNConv(hidden, classes, cached=True)

    def forward(self, x: Tensor, graph) -> Tensor:
        x = F.dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(x, graph))
        return self.conv2(F.dropout(x, self.dropout, self.training), graph)


class PygStack(nn.Module):
    """Conv layers with LayerNorm + ReLU + dropout after all but the last (as GraphSAGE / GIN)."""

    def __init__(self, convs: Sequence[nn.Module], hidden: int, dropout: float) -> None:
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.norms = nn.ModuleList([nn.LayerNorm(hidden) for _ in convs[:-1]])
        self.dropout = dropout

    def forward(self, x: Tensor, graph) -> Tensor:
        for conv, norm in zip(self.convs[:-1], self.norms):
            x = F.dropout(F.relu(norm(conv(x, graph))), self.dropout, self.training)
        return self.convs[-1](x, graph)


class PygGAT(nn.Module):
    """``conv2(drop(elu(conv1(drop(x)))))``, conv1 with ``heads`` heads, attention dropout (as sparsegnn.nn.GAT)."""

    def __init__(self, pyg_nn, f_in: int, classes: int, dropout: float, hidden: int, heads: int) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv1 = pyg_nn.GATConv(f_in, hidden, heads=heads, dropout=dropout)
        self.conv2 = pyg_nn.GATConv(hidden * heads, classes, heads=1, dropout=dropout)

    def forward(self, x: Tensor, graph) -> Tensor:
        x = F.dropout(x, self.dropout, self.training)
        x = F.elu(self.conv1(x, graph))
        return self.conv2(F.dropout(x, self.dropout, self.training), graph)


class PygAGNN(nn.Module):
    """``lin_out(drop(prop2(prop1(relu(lin_in(drop(x)))))))``, prop1 with fixed beta (as sparsegnn.nn.AGNN)."""

    def __init__(self, pyg_nn, f_in: int, classes: int, dropout: float, hidden: int = 32, num_layers: int = 4) -> None:
        super().__init__()
        self.dropout = dropout
        self.lin_in = nn.Linear(f_in, hidden)
        self.props = nn.ModuleList([pyg_nn.AGNNConv(requires_grad=i > 0) for i in range(num_layers - 2)])
        self.lin_out = nn.Linear(hidden, classes)

    def forward(self, x: Tensor, graph) -> Tensor:
        x = F.relu(self.lin_in(F.dropout(x, self.dropout, self.training)))
        for prop in self.props:
            x = prop(x, graph)
        return self.lin_out(F.dropout(x, self.dropout, self.training))


def pyg_model(pyg_nn, model: str, f_in: int, classes: int, dropout: Optional[float], gat_hidden: int,
              gat_heads: int) -> nn.Module:
    """The PyG mirror of :func:`ours_model`."""
    d = DEFAULT_DROPOUT[model] if dropout is None else dropout
    if model == "gcn":
        return PygGCN(pyg_nn, f_in, classes, d)
    if model == "gat":
        return PygGAT(pyg_nn, f_in, classes, d, gat_hidden, gat_heads)
    if model == "agnn":
        return PygAGNN(pyg_nn, f_in, classes, d)
    hidden, widths = 256, [f_in, 256, 256, classes]
    if model == "sage":
        convs = [pyg_nn.SAGEConv(widths[i], widths[i + 1], aggr="mean") for i in range(3)]
    else:
        convs = [pyg_nn.GINConv(nn.Sequential(nn.Linear(widths[i], widths[i + 1]), nn.ReLU(),
                                              nn.Linear(widths[i + 1], widths[i + 1]))) for i in range(3)]
    return PygStack(convs, hidden, d)


def architecture(model: str, gat_hidden: int, gat_heads: int) -> str:
    return {"gcn": "2 x 16", "sage": "3 x 256 + LayerNorm", "gin": "3 x 256 MLP + LayerNorm",
            "gat": f"{gat_hidden} x {gat_heads} heads, 1 head", "agnn": "Linear, 2 x AGNNConv, Linear (32)"}[model]


# ---------------------------------------------------------------------------- timing
def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is a device out-of-memory error (PyTorch's, cuBLAS's or Triton's)."""
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    text = str(exc).lower()
    return (oom_type is not None and isinstance(exc, oom_type)) or "out of memory" in text or "alloc_failed" in text


def _mb(nbytes: int) -> float:
    return nbytes / 2 ** 20


def measure(build: Callable[[], Callable[[], Tensor]], device: torch.device, warmup: int, epochs: int,
            uses_compile: bool) -> Dict[str, object]:
    """Build a step (``build()``), time it with :func:`bench_layers.time_steps`, record peak
    memory, the first and last losses, and any error; free everything before returning."""
    if uses_compile:
        torch._dynamo.reset()
    gc.collect()
    is_cuda = device.type == "cuda"
    if is_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    result: Dict[str, object] = {"ms": None, "ms_min": None, "first_ms": None, "graph_builds": None,
                                 "tuner_invocations": None, "loss_first": None, "loss_last": None, "error": None}
    losses: List[Optional[Tensor]] = [None, None]
    error: Optional[str] = None
    try:
        step = build()

        def run() -> Tensor:
            if losses[0] is None and hasattr(step, "capture"):
                step.capture()           # CapturedStep: its eager warm-up and the capture count as the first epoch
            loss = step()
            if losses[0] is None:
                losses[0] = loss.detach().clone()
            losses[1] = loss
            return loss

        result.update(layers.time_steps(run, device, warmup, epochs))
        result["loss_first"], result["loss_last"] = float(losses[0]), float(losses[1])
        if not math.isfinite(result["loss_last"]):
            error = f"non-finite loss {result['loss_last']}"
    except Exception as exc:  # noqa: BLE001 - out of memory and unsupported cases become rows
        error = "oom" if is_oom(exc) else f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
    step = run = None  # noqa: F841 - drop the model, optimiser state, captured graph
    losses.clear()
    if uses_compile:
        torch._dynamo.reset()
    gc.collect()
    if error is not None:
        for key in ("ms", "ms_min"):
            result[key] = None
    result["error"] = error
    if is_cuda:
        torch.cuda.synchronize(device)
        result["base_mb"] = _mb(base)
        result["peak_mb"] = _mb(torch.cuda.max_memory_allocated(device))
        result["peak_extra_mb"] = result["peak_mb"] - result["base_mb"]
        torch.cuda.empty_cache()
    else:
        result["base_mb"] = result["peak_mb"] = result["peak_extra_mb"] = None
    return result


def merge_rounds(results: List[Dict[str, object]]) -> Dict[str, object]:
    """One row from the rounds of one case: the first round's fields, ``ms`` the median of the
    rounds' medians, ``ms_min`` their minimum, ``ms_rounds`` each round's median, the memory
    fields of the round with the highest peak (``base_mb_rounds``: every round's base); a round
    that failed makes the row fail (its error)."""
    out = dict(results[0])
    failed = [r for r in results if r.get("error")]
    if failed:
        out.update(error=failed[0]["error"], ms=None, ms_min=None)
        return out
    if len(results) > 1:
        ms = [float(r["ms"]) for r in results]
        peak = max(results, key=lambda r: r.get("peak_mb") or 0)      # memory fields of one round
        out.update({k: peak[k] for k in ("base_mb", "peak_mb", "peak_extra_mb") if k in peak})
        out.update(ms=statistics.median(ms), ms_min=min(float(r["ms_min"]) for r in results), ms_rounds=ms,
                   base_mb_rounds=[r.get("base_mb") for r in results])
    return out


def pyg_variants(model: str, graph: Graph) -> List[Tuple[str, Callable[[], object]]]:
    """The graph inputs PyG gets: ``edge_index`` for all, a torch.sparse CSR ``adj_t`` for GCN/SAGE/GIN."""
    variants: List[Tuple[str, Callable[[], object]]] = [("edge_index", lambda: graph.edge_index().contiguous())]
    if model in ("gcn", "sage", "gin"):
        variants.append(("adj_t", lambda: layers.pyg_adj_t(graph.edge_index().contiguous(), graph.num_nodes)))
    return variants


def cases(model: str, providers: Sequence[str], pyg_nn, compile_here: bool = True) -> List[Tuple[str, str]]:
    """``(provider, variant)`` pairs to run for ``model``: PyG eager with every input it takes,
    ``pyg_compile`` with ``edge_index`` (the input PyG documents for torch.compile); the
    compile providers only where ``compile_here``."""
    out: List[Tuple[str, str]] = []
    for provider in providers:
        if provider.endswith("_compile") and not compile_here:
            continue
        if provider.startswith("ours"):
            out.append((provider, "graph"))
        elif provider == "pyg_accel" and pyg_nn is not None:
            out.append((provider, "edge_index"))
        elif pyg_nn is not None:
            adj_t = provider == "pyg" and model in ("gcn", "sage", "gin")
            out += [(provider, "edge_index")] + ([(provider, "adj_t")] if adj_t else [])
    return out


def run_case(provider: str, variant: str, model: str, graph: Graph, inputs: Dict[str, object], pyg_nn,
             args: argparse.Namespace, device: torch.device) -> Dict[str, object]:
    """Time one (provider, input variant) on one graph and model."""
    f_in, classes = inputs["x"].shape[1], inputs["classes"]
    x, train_idx, y_train = inputs["x"], inputs["train_idx"], inputs["y_train"]
    mode = {"ours": "none", "ours_noreplay": "none", "ours_capture": "capture", "ours_compile": "default", "pyg": "none",
            "pyg_compile": "default", "pyg_accel": "none"}[provider]
    if mode == "capture" and device.type != "cuda":
        return {"ms": None, "error": "skipped: CUDA graphs need a CUDA device"}

    built: Dict[str, nn.Module] = {}

    def build() -> Callable[[], Tensor]:
        torch.manual_seed(args.seed)
        if provider.startswith("ours"):
            net = ours_model(model, f_in, classes, args.dropout, args.gat_hidden, args.gat_heads,
                             args.precision).to(device)
            if provider == "ours_noreplay":
                net.replay = False
            graph_arg = layers.bare(graph)           # a fresh Graph: its caches are built (and counted) here
        else:
            net = pyg_model(pyg_nn, model, f_in, classes, args.dropout, args.gat_hidden, args.gat_heads).to(device)
            if provider == "pyg_accel":
                from sparsegnn.nn.accelerate import accelerate

                net, report = accelerate(net, inplace=True, return_report=True)
                if report.skipped:
                    raise RuntimeError(f"accelerate() left {len(report.skipped)} PyG layer(s): {report.skipped[0]}")
            graph_arg = dict(pyg_variants(model, graph))[variant]()
        net.train()
        built["net"] = net
        optimizer = make_optimizer(net, mode, lr=0.01, weight_decay=5e-4)
        return make_train_step(net, optimizer, x, graph_arg, train_idx, y_train, compile=mode,
                               backward_threads=args.backward_threads,
                               compile_backend=args.compile_backend)

    result = measure(build, device, args.warmup, args.epochs, uses_compile=mode == "default")
    if "net" in built:     # whether the eager forward / backward replayed (sparsegnn.nn.replay)
        result["replay"] = replay_state(built.pop("net"))
    return result


# ---------------------------------------------------------------------------- report
def _geomean(values: List[float]) -> Optional[float]:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _fmt(v, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _best(rows: List[dict], provider: str) -> Optional[dict]:
    """The fastest successful row of ``provider`` (over its input variants), else its first row."""
    sel = [r for r in rows if r["provider"] == provider]
    ok = [r for r in sel if r.get("ms") is not None and not r.get("error")]
    return min(ok, key=lambda r: r["ms"]) if ok else (sel[0] if sel else None)


def _cell(row: Optional[dict], digits: int = 3) -> str:
    if row is None:
        return "n/a"
    if row.get("error"):
        return {"oom": "OOM"}.get(row["error"], "skip" if str(row["error"]).startswith("skipped") else "error")
    return _fmt(row.get("ms"), digits)


def summarize(rows: List[dict]) -> Dict[str, Dict[str, object]]:
    """Per model: per-graph speedups over PyG eager (``pyg_ms / provider_ms``) and their geomeans.

    A graph where PyG runs out of memory and ours does not is counted in ``pyg_oom`` and left
    out of the geomeans; a graph where ours fails and PyG runs counts as speedup 0 (worst).
    """
    out: Dict[str, Dict[str, object]] = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        mrows = [r for r in rows if r["model"] == model]
        per_graph: Dict[str, Dict[str, object]] = {}
        for graph in dict.fromkeys(r["graph"] for r in mrows):
            grows = [r for r in mrows if r["graph"] == graph]
            best = {p: _best(grows, p) for p in PROVIDERS}
            pyg = best["pyg"]
            pyg_ok = pyg is not None and pyg.get("ms") is not None and not pyg.get("error")
            speed: Dict[str, object] = {}
            for p in SPEED_PROVIDERS:
                row = best[p]
                if row is None or not pyg_ok:
                    speed[p] = None
                elif row.get("error") or row.get("ms") is None:
                    speed[p] = 0.0 if p == "ours" else None
                else:
                    speed[p] = pyg["ms"] / row["ms"]
            ours, accel = best["ours"], best["pyg_accel"]
            both = all(r is not None and r.get("ms") and not r.get("error") for r in (ours, accel))
            speed["accel_vs_ours"] = ours["ms"] / accel["ms"] if both else None
            per_graph[graph] = {"kind": grows[0].get("kind"), "best": best, "speedup": speed,
                                "pyg_oom": pyg is not None and pyg.get("error") == "oom"}
        summary: Dict[str, object] = {"graphs": per_graph}
        for p in SPEED_PROVIDERS + ("accel_vs_ours",):
            vals = {g: v["speedup"][p] for g, v in per_graph.items() if v["speedup"][p] is not None}
            real = [v for g, v in vals.items() if per_graph[g]["kind"] == "real"]
            summary[p] = {"geomean": _geomean(list(vals.values())), "geomean_real": _geomean(real),
                          "worst": min(vals.items(), key=lambda kv: kv[1]) if vals else None, "n": len(vals)}
        summary["pyg_oom"] = [g for g, v in per_graph.items() if v["pyg_oom"]]
        out[model] = summary
    return out


def markdown_details(rows: List[dict]) -> str:
    """Per model, one line per graph: ms of every provider, speedups over PyG eager, peak memory."""
    summ = summarize(rows)
    parts = []
    for model, s in summ.items():
        arch = next((r.get("arch") for r in rows if r["model"] == model), "")
        head = ("| graph | nodes | edges | F | ours ms | PyG ms (input) | ours x | no-replay ms | no-replay x "
                "| capture ms | capture x "
                "| compile ms | compile x | PyG compile ms | PyG compile x | accelerate(PyG) ms | accel x "
                "| ours / accel | peak MB ours / PyG |")
        lines = [f"### {model.upper()} ({arch})", "", head, "|" + "---|" * (head.count("|") - 1)]
        for graph, g in s["graphs"].items():
            b, sp = g["best"], g["speedup"]
            r0 = next(r for r in rows if r["model"] == model and r["graph"] == graph)
            pyg = b["pyg"]
            variant = f" ({pyg.get('variant')})" if pyg is not None and not pyg.get("error") else ""
            peak = " / ".join(_fmt((b[p] or {}).get("peak_mb"), 0) for p in ("ours", "pyg"))
            lines.append(
                f"| {graph} | {r0['num_nodes']:,} | {r0['num_edges']:,} | {r0['f_in']} | {_cell(b['ours'])} "
                f"| {_cell(pyg)}{variant} | {_fmt(sp['ours'])} | {_cell(b['ours_noreplay'])} "
                f"| {_fmt(sp['ours_noreplay'])} | {_cell(b['ours_capture'])} "
                f"| {_fmt(sp['ours_capture'])} | {_cell(b['ours_compile'])} | {_fmt(sp['ours_compile'])} "
                f"| {_cell(b['pyg_compile'])} | {_fmt(sp['pyg_compile'])} | {_cell(b['pyg_accel'])} "
                f"| {_fmt(sp['pyg_accel'])} | {_fmt(sp['accel_vs_ours'])} | {peak} |")
        for label, key in (("geomean (all)", "geomean"), ("geomean (real suite)", "geomean_real")):
            lines.append(f"| **{label}** | | | | | | {_fmt(s['ours'][key])} | | {_fmt(s['ours_noreplay'][key])} "
                         f"| | {_fmt(s['ours_capture'][key])} | "
                         f"| {_fmt(s['ours_compile'][key])} | | {_fmt(s['pyg_compile'][key])} | "
                         f"| {_fmt(s['pyg_accel'][key])} | {_fmt(s['accel_vs_ours'][key])} | |")
        worst = {p: s[p]["worst"] for p in SPEED_PROVIDERS + ("accel_vs_ours",)}
        wcell = lambda w: "-" if w is None else f"{w[1]:.2f} ({w[0]})"  # noqa: E731
        lines.append(f"| **worst** | | | | | | {wcell(worst['ours'])} | | {wcell(worst['ours_noreplay'])} "
                     f"| | {wcell(worst['ours_capture'])} | "
                     f"| {wcell(worst['ours_compile'])} | | {wcell(worst['pyg_compile'])} | "
                     f"| {wcell(worst['pyg_accel'])} | {wcell(worst['accel_vs_ours'])} | |")
        errors = sorted({f"{r['provider']}/{r.get('variant')} on {r['graph']}: {r['error']}" for r in rows
                         if r["model"] == model and r.get("error") and r["error"] != "oom"
                         and not str(r["error"]).startswith("skipped")})
        if errors:
            lines += ["", "Errors: " + "; ".join(errors)]
        states = {}
        for r in rows:
            if r["model"] == model and r["provider"] in ("ours", "pyg_accel") and r.get("replay"):
                key = r["replay"].split(",")[0]
                states.setdefault((r["provider"], key), []).append(r["graph"])
        if states:
            lines += ["", "Replay of the eager steps (`sparsegnn.nn.replay`): " + "; ".join(
                f"{prov} {state} on {len(gs)} ({', '.join(gs)})" for (prov, state), gs in sorted(states.items()))]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def markdown_summary(rows: List[dict]) -> str:
    """One line per model: eager geomean / worst over PyG, capture and compile geomeans, Cora, OOMs."""
    summ = summarize(rows)
    head = ("| model | graphs | ours x PyG (geomean) | worst | capture x (real geomean) | capture x Cora "
            "| compile x (real geomean) | PyG compile x PyG | PyG OOM |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for model, s in summ.items():
        cora = s["graphs"].get("cora", {}).get("speedup", {})
        worst = s["ours"]["worst"]
        lines.append(
            f"| {model} | {len(s['graphs'])} | {_fmt(s['ours']['geomean'])} "
            f"| {'-' if worst is None else f'{worst[1]:.2f} ({worst[0]})'} "
            f"| {_fmt(s['ours_capture']['geomean_real'])} | {_fmt(cora.get('ours_capture'))} "
            f"| {_fmt(s['ours_compile']['geomean_real'])} | {_fmt(s['pyg_compile']['geomean'])} "
            f"| {', '.join(s['pyg_oom']) or '-'} |")
    return "\n".join(lines)


def acceptance(rows: List[dict]) -> List[str]:
    """The acceptance criteria against PyG, each checked on the rows at hand (PASS / FAIL / n/a)."""
    summ = summarize(rows)
    _x = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    verdict = lambda ok: "n/a" if ok is None else ("PASS" if ok else "FAIL")  # noqa: E731
    lines = []
    for model, s in summ.items():
        geo, worst = s["ours"]["geomean"], s["ours"]["worst"]
        ok = None if geo is None else geo >= 1.5 and worst[1] >= 1.0
        lines.append(f"- {model} eager >= 1.5x geomean, no case < 1.0x: {_x(geo)}, worst "
                     f"{'-' if worst is None else f'{worst[1]:.2f}x ({worst[0]})'}: {verdict(ok)}")
    for model in ("gat", "agnn"):
        if model in summ:
            geo = summ[model]["ours"]["geomean"]
            lines.append(f"- {model} eager >= 2x geomean (fused attention): {_x(geo)}: "
                         f"{verdict(None if geo is None else geo >= 2.0)}")
    if "gcn" in summ:
        cora = summ["gcn"]["graphs"].get("cora", {}).get("speedup", {})
        best = max([v for v in (cora.get("ours_capture"), cora.get("ours_compile")) if v], default=None)
        lines.append(f"- gcn Cora captured/compiled >= 3x PyG eager: {_x(best)}: "
                     f"{verdict(None if best is None else best >= 3.0)}")
        per_graph = [max([v for v in (g["speedup"]["ours_capture"], g["speedup"]["ours_compile"]) if v], default=None)
                     for g in summ["gcn"]["graphs"].values() if g["kind"] == "real"]
        geo = _geomean([v for v in per_graph if v is not None])
        lines.append(f"- gcn captured/compiled >= 2x geomean over the real suite: {_x(geo)}: "
                     f"{verdict(None if geo is None else geo >= 2.0)}")
    for model, s in summ.items():   # PyG's models converted by accelerate() vs ours
        geo, worst = s["accel_vs_ours"]["geomean"], s["accel_vs_ours"]["worst"]
        if geo is not None:
            lines.append(f"- {model}: accelerate(PyG model) at least as fast as ours (ours ms / accelerated ms, "
                         f"noise allowance 5%): geomean {_x(geo)}, worst {worst[1]:.2f}x ({worst[0]}); "
                         f"accelerated x PyG eager geomean {_x(s['pyg_accel']['geomean'])}: "
                         f"{verdict(worst[1] >= 0.95)}")
    for r in rows:
        if r["model"] == "gat" and r["provider"] == "ours" and r.get("kind") == "stand-in":
            pyg = _best([q for q in rows if q["model"] == "gat" and q["graph"] == r["graph"]], "pyg")
            lines.append(f"- gat on the {r['graph']} stand-in ({r.get('arch')}): ours {_cell(r)} ms, peak "
                         f"{_fmt(r.get('peak_mb'), 0)} MB; PyG {_cell(pyg)}"
                         + ("" if pyg is None or pyg.get("error") else f" ms, peak {_fmt(pyg.get('peak_mb'), 0)} MB"))
    return lines


def markdown(rows: List[dict], meta: Dict[str, object]) -> str:
    """The whole report: header, per-model details, summary last."""
    versions = meta.get("versions", {})
    header = (f"# Training epoch (forward + backward + Adam) vs PyG\n\n{meta.get('device')}; torch "
              f"{versions.get('torch')}, triton {versions.get('triton')}, PyG {versions.get('torch_geometric')}; "
              f"{meta.get('date')}. Median of {meta.get('epochs')} epochs after {meta.get('warmup')}"
              + (f", median of {meta['rounds']} rounds run round-robin over the providers"
                 if meta.get("rounds", 1) > 1 else "")
              + ({True: "; every backward on the autograd engine's device thread",
                  False: "; every provider's backward on the calling thread (make_train_step)"}
                 .get(meta.get("backward_threads"), "")) + "; "
              f"x = PyG eager ms / provider ms (PyG: the faster of edge_index and torch.sparse adj_t); "
              f"compile backend {meta.get('compile_backend')}; peak MB = torch.cuda.max_memory_allocated "
              f"(inputs included); our aggregation precision {meta.get('precision', 'ieee')} (PyG: fp32).")
    checks = "\n".join(acceptance(rows))
    return (f"{header}\n\n{markdown_details(rows)}\n\n## Acceptance\n\n{checks}\n\n"
            f"## Summary\n\n{markdown_summary(rows)}\n")


def plot(rows: List[dict], path: str) -> None:
    """Speedup over PyG eager per graph, one panel per model (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = summarize(rows)
    fig, axes = plt.subplots(len(summ), 1, figsize=(12, 2.8 * len(summ)), squeeze=False)
    for ax, (model, s) in zip(axes[:, 0], summ.items()):
        graphs = list(s["graphs"])
        shown = [1.0]
        shown_providers = ("ours", "ours_capture", "ours_compile", "pyg_compile", "pyg_accel")
        width = 0.8 / len(shown_providers)
        for k, p in enumerate(shown_providers):
            vals = [s["graphs"][g]["speedup"][p] or float("nan") for g in graphs]   # missing / failed: no bar
            shown += [v for v in vals if v == v]
            ax.bar([i + width * (k - (len(shown_providers) - 1) / 2) for i in range(len(graphs))], vals, width=width,
                   label=p)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylim(min(shown) / 1.5, max(shown) * 1.5)
        ax.set_xticks(range(len(graphs)))
        ax.set_xticklabels(graphs, rotation=20, fontsize=8)
        ax.set_ylabel(f"{model}: x PyG")
    axes[0, 0].legend(ncol=5, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------- main
def _split(text: str) -> List[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def write_outputs(rows: List[dict], meta: Dict[str, object], args: argparse.Namespace) -> str:
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(markdown(rows, meta))
        print(f"wrote {args.md}", file=sys.stderr)
    if args.plot:
        try:
            plot(rows, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
        except ImportError:
            print("matplotlib not installed: no plot", file=sys.stderr)
    details = markdown_details(rows)
    checks = "\n".join(acceptance(rows))
    print(f"\n{details}\n\n{checks}\n\n{markdown_summary(rows)}")
    return details


def write_json(path: Path, meta: Dict[str, object], rows: List[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default="all", help="comma-separated real-suite or stand-in names, or 'all' "
                        "(the real suite + reddit, amazon0505), 'real' (the real suite)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}")
    parser.add_argument("--providers", default=",".join(PROVIDERS), help=f"subset of {','.join(PROVIDERS)}")
    parser.add_argument("--epochs", type=int, default=20, help="timed epochs (median reported; default 20)")
    parser.add_argument("--backward-threads", action="store_true", help="every provider's backward on the autograd "
                        "engine's device worker thread (default: on the calling thread, make_train_step's default)")
    parser.add_argument("--rounds", type=int, default=1, help="measure every case this many times, round-robin "
                        "over the providers of a graph, and report the median of the rounds' medians (default 1)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed epochs first (compilation, tuning; default 5)")
    parser.add_argument("--compile-graphs", default="cora", help="graphs on which the compile providers run "
                        "(comma-separated, 'real' or 'all'; default cora: each compilation takes seconds)")
    parser.add_argument("--features", type=int, default=None, help="random feature width (default: Cora's own, "
                        "the stand-ins' spec width, else 64)")
    parser.add_argument("--classes", type=int, default=16, help="classes of random labels (real graphs without labels)")
    parser.add_argument("--train-fraction", type=float, default=0.1, help="training nodes (random) where no split")
    parser.add_argument("--dropout", type=float, default=None, help="dropout of every model (default: the models')")
    parser.add_argument("--precision", default="ieee", choices=["ieee", "tf32", "bf16"],
                        help="aggregation precision of our GCN / SAGE / GIN / AGNN (GAT stays exact; PyG is fp32)")
    parser.add_argument("--gat-hidden", type=int, default=8, help="GAT hidden channels per head (default 8)")
    parser.add_argument("--gat-heads", type=int, default=8, help="GAT heads of the first layer (default 8)")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend (default inductor; aot_eager with --quick on the CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-dir", default=None, help="real datasets (default: SPARSEGNN_DATA or its search)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-pyg", action="store_true", help="skip torch_geometric even when it imports")
    parser.add_argument("--quick", action="store_true", help="smoke test: cora only, 1 warm-up and 2 timed epochs")
    parser.add_argument("--out", default="benchmarks/local/train.json", help="JSON rows + meta")
    parser.add_argument("--md", default=None, help="markdown report")
    parser.add_argument("--plot", default=None, help="PNG of the speedups (matplotlib)")
    parser.add_argument("--report", default=None, help="comma-separated JSON files of earlier runs: merge them "
                        "and write --md / --plot without running anything")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.report:
        rows, metas = [], []
        for path in _split(args.report):
            doc = json.loads(Path(path).read_text())
            rows += doc["rows"]
            metas.append(doc["meta"])
        meta = dict(metas[0], merged=_split(args.report))
        for key in ("rounds", "backward_threads"):       # said in the header only when every run agrees
            if len({json.dumps(m.get(key)) for m in metas}) > 1:
                meta.pop(key, None)
        write_outputs(rows, meta, args)
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_train: --device cuda but no CUDA device is available")
    if args.quick:
        args.graphs, args.warmup, args.epochs = "cora", 1, 2
        if args.compile_backend is None and device.type == "cpu":
            args.compile_backend = "aot_eager"
    args.compile_backend = args.compile_backend or "inductor"
    if args.rounds < 1:
        raise SystemExit(f"bench_train: --rounds must be >= 1, got {args.rounds}")
    if args.warmup < 0 or args.epochs < 1:
        raise SystemExit("bench_train: need --warmup >= 0 and --epochs >= 1")
    named = {"all": all_graphs(), "real": layers.suite_names()}
    graphs = named.get(args.graphs.strip().lower(), _split(args.graphs))
    compile_graphs = {g.lower() for g in named.get(args.compile_graphs.strip().lower(), _split(args.compile_graphs))}
    models = [m.lower() for m in _split(args.models)]
    providers = _split(args.providers)
    for kind, given, known in (("models", models, MODELS), ("providers", providers, PROVIDERS)):
        bad = [v for v in given if v not in known]
        if bad:
            raise SystemExit(f"bench_train: unknown {kind} {bad}; known: {', '.join(known)}")
    pyg_nn = None
    if not args.no_pyg and any(p.startswith("pyg") for p in providers):
        try:
            import torch_geometric.nn as pyg_nn  # noqa: F811
        except Exception as exc:  # noqa: BLE001
            print(f"torch_geometric not importable ({type(exc).__name__}): PyG providers skipped", file=sys.stderr)

    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    todo = {g: [(m, c) for m in models for c in cases(m, providers, pyg_nn, g.lower() in compile_graphs)]
            for g in graphs}
    total = sum(len(v) for v in todo.values())
    bar = tqdm(total=total, desc="bench_train", file=sys.stderr) if tqdm is not None else None
    say = bar.write if bar is not None else (lambda s: print(s, file=sys.stderr))
    meta = {"device": layers.device_name(device), "device_type": device.type, "versions": layers.versions(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "argv": sys.argv[1:],
            "python": platform.python_version(), "epochs": args.epochs, "warmup": args.warmup,
            "rounds": args.rounds, "backward_threads": args.backward_threads, "compile_backend": args.compile_backend, "compile_graphs": sorted(compile_graphs),
            "precision": args.precision,
            "dropout": "model defaults" if args.dropout is None else args.dropout,
            "gat": f"{args.gat_hidden} x {args.gat_heads} heads", "seed": args.seed}
    out = Path(args.out)
    rows: List[Dict[str, object]] = []
    for name in graphs:
        try:
            graph, kind = load_bench_graph(name, device, args.data_dir)
            inputs = bench_inputs(name, kind, graph, args.features, args.classes, args.train_fraction, device,
                                  args.seed)
        except Exception as exc:  # noqa: BLE001
            say(f"{name}: skipped ({type(exc).__name__}: {exc})")
            if bar is not None:
                bar.update(len(todo[name]))
            continue
        base = {"graph": name, "kind": kind, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                "f_in": inputs["x"].shape[1], "features": inputs["features"], "classes": inputs["classes"],
                "train_nodes": int(inputs["train_idx"].numel()), "train": inputs["train"],
                "warmup": args.warmup, "epochs": args.epochs}
        results: Dict[int, List[Dict[str, object]]] = {i: [] for i in range(len(todo[name]))}
        for _ in range(args.rounds):      # round-robin: host noise lands on every provider alike
            for i, (model, (provider, variant)) in enumerate(todo[name]):
                results[i].append(run_case(provider, variant, model, graph, inputs, pyg_nn, args, device))
        for i, (model, (provider, variant)) in enumerate(todo[name]):
            result = merge_rounds(results[i])
            row = dict(base, model=model, arch=architecture(model, args.gat_hidden, args.gat_heads),
                       provider=provider, variant=variant, **result)
            rows.append(row)
            say(f"{name:>18} {model:>4} {provider:>12}/{variant:<10} {_fmt(row.get('ms'), 3):>9} ms  "
                f"first {_fmt(row.get('first_ms'), 1)} ms  peak {_fmt(row.get('peak_mb'), 0)} MB"
                + (f"  ERROR {row['error']}" if row.get("error") else ""))
            if bar is not None:
                bar.update(1)
        del graph, inputs
        write_json(out, meta, rows)     # after every graph: a run cut short keeps what it measured
    if bar is not None:
        bar.close()
    print(f"wrote {out}", file=sys.stderr)
    write_outputs(rows, meta, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
