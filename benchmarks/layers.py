"""Training-step time of 2-layer GCN and GAT models: sparsegnn layers called with a Graph or
with ``edge_index``, next to the same architectures from ``torch_geometric.nn``.

For every graph of ``--graphs`` (names of ``sparsegnn.datasets.suite.REAL_SUITE``; ``all``
for the whole suite) it times one training step (forward, cross-entropy on random labels,
backward, Adam) of

* GCN: ``GCNConv(F_in, 16) -> ReLU -> GCNConv(16, C)``,
* GAT: ``GATConv(F_in, 8, heads=8) -> ELU -> GATConv(64, C, heads=1)``,

called three ways: ``graph`` (our layers given a Graph object, whose transforms are cached on
it), ``edge_index`` (our layers given the same ``edge_index`` tensor every step, cached=False,
the PyG way) and ``pyg`` (PyG's GCNConv with ``edge_index`` and with a ``torch.sparse`` CSR
``adj_t``, the faster kept; PyG's GATConv with ``edge_index``). Features are the dataset's
where it has them (Cora), else random with ``--features`` columns; labels are random. No
dropout, so that every provider runs the same arithmetic.

Each timing is the median of ``--steps`` steps after ``--warmup`` steps (CUDA events around
each step and one synchronize on CUDA, ``perf_counter`` on CPU). The first warm-up step is
recorded too (``first_ms``: graph build, planning, compilation and tuning). During the timed
steps the script counts graph builds (``sparsegnn.nn._graph_input.graph_builds``) and tuner
invocations (``sparsegnn.tune.tuner_invocations`` where it exists): both must be 0.

Writes JSON rows and meta to ``--out`` and prints a markdown table last::

    python -m benchmarks.layers --graphs cora,citeseer
    python -m benchmarks.layers --device cpu --graphs cora --quick   # smoke test
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

import sparsegnn
from sparsegnn import Graph
from sparsegnn import nn as sgnn
from sparsegnn.nn import _graph_input


# ---------------------------------------------------------------------------- inputs
def suite_names() -> List[str]:
    """Every graph of the real suite (``["cora"]`` when the suite module is not there)."""
    try:
        from sparsegnn.datasets.suite import REAL_SUITE
    except Exception:  # noqa: BLE001 - the module is optional here
        return ["cora"]
    return list(REAL_SUITE)


def load_graph(name: str, data_dir: Optional[str]) -> Graph:
    """The suite's graph ``name``; Cora from the bundled dataset when the suite cannot load it."""
    try:
        from sparsegnn.datasets.suite import load_suite_graph
        return load_suite_graph(name, data_dir)
    except Exception as exc:  # noqa: BLE001
        if name.lower() == "cora":
            return sparsegnn.datasets.load("cora").graph
        raise RuntimeError(f"cannot load graph {name!r}: {exc}") from exc


def bare(graph: Graph) -> Graph:
    """The structure alone (no edge values, no batch boundaries), as a new Graph."""
    return Graph(graph.rowptr, graph.col, None, graph.num_nodes)


def node_inputs(name: str, graph: Graph, features: int, classes: int, device, seed: int):
    """``(x, y, num_classes, source)``: the dataset's features where it has them, random labels."""
    gen = torch.Generator().manual_seed(seed)
    x, source = None, "random"
    if name.lower() == "cora":
        try:
            data = sparsegnn.datasets.load("cora")
            if data.x.shape[0] == graph.num_nodes:
                x, source, classes = data.x, "dataset", data.num_classes
        except Exception:  # noqa: BLE001
            x = None
    if x is None:
        x = torch.randn(graph.num_nodes, features, generator=gen)
    y = torch.randint(0, classes, (graph.num_nodes,), generator=gen)
    return x.to(device), y.to(device), classes, source


# ---------------------------------------------------------------------------- models
class TwoLayer(nn.Module):
    """``conv2(act(conv1(x, *graph)), *graph)``; ``graph`` is whatever the layers take."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, act: Callable) -> None:
        super().__init__()
        self.conv1, self.conv2, self.act = conv1, conv2, act

    def forward(self, x, graph):
        return self.conv2(self.act(self.conv1(x, graph)), graph)


def ours(model: str, f_in: int, classes: int) -> nn.Module:
    if model == "gcn":
        return TwoLayer(sgnn.GCNConv(f_in, 16), sgnn.GCNConv(16, classes), F.relu)
    return TwoLayer(sgnn.GATConv(f_in, 8, heads=8), sgnn.GATConv(64, classes, heads=1), F.elu)


def theirs(pyg_nn, model: str, f_in: int, classes: int) -> nn.Module:
    if model == "gcn":
        return TwoLayer(pyg_nn.GCNConv(f_in, 16), pyg_nn.GCNConv(16, classes), F.relu)
    return TwoLayer(pyg_nn.GATConv(f_in, 8, heads=8), pyg_nn.GATConv(64, classes, heads=1), F.elu)


# ---------------------------------------------------------------------------- timing
def tuner_invocations() -> Optional[int]:
    try:
        import sparsegnn.tune as tune
    except Exception:  # noqa: BLE001
        return None
    fn = getattr(tune, "tuner_invocations", None)
    return int(fn()) if callable(fn) else None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[], None], device: torch.device, warmup: int, steps: int) -> Dict[str, object]:
    """Median ms of ``steps`` steps after ``warmup`` ones, the first step's ms, and what the
    timed steps built (graphs) and tuned."""
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    first_ms = 1000.0 * (time.perf_counter() - t0)
    for _ in range(max(warmup - 1, 0)):
        step()
    sync(device)
    builds0, tuned0 = _graph_input.graph_builds(), tuner_invocations()
    times: List[float] = []
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        for i in range(steps):
            starts[i].record()
            step()
            ends[i].record()
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        for _ in range(steps):
            t = time.perf_counter()
            step()
            times.append(1000.0 * (time.perf_counter() - t))
    tuned1 = tuner_invocations()
    return {
        "ms": statistics.median(times),
        "ms_min": min(times),
        "first_ms": first_ms,
        "graph_builds": _graph_input.graph_builds() - builds0,
        "tuner_invocations": None if tuned0 is None or tuned1 is None else tuned1 - tuned0,
    }


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x, y, graph_arg) -> Callable[[], None]:
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, graph_arg), y)
        loss.backward()
        opt.step()
    return step


def measure(make_model: Callable[[], nn.Module], graph_arg, x, y, device, warmup: int, steps: int,
            seed: int) -> Dict[str, object]:
    torch.manual_seed(seed)
    try:
        model = make_model().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        result = time_steps(train_step(model, opt, x, y, graph_arg), device, warmup, steps)
        result["error"] = None
    except Exception as exc:  # noqa: BLE001 - out of memory and the like: record, keep going
        result = {"ms": None, "ms_min": None, "first_ms": None, "graph_builds": None, "tuner_invocations": None,
                  "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def pyg_adj_t(edge_index: torch.Tensor, num_nodes: int):
    """PyG's ``adj_t`` as a ``torch.sparse`` CSR tensor: row = target, column = source."""
    from torch_geometric.utils import to_torch_csr_tensor
    return to_torch_csr_tensor(edge_index.flip(0), size=(num_nodes, num_nodes))


# ---------------------------------------------------------------------------- report
def versions() -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {"torch": torch.__version__, "sparsegnn": getattr(sparsegnn, "__version__", None)}
    for mod in ("triton", "torch_geometric"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            out[mod] = None
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _fmt(v, digits=3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def markdown(rows: List[Dict[str, object]]) -> str:
    """One line per (graph, model): ms per way, edge_index/graph and ours/PyG ratios, builds, tunings."""
    head = ("| graph | model | graph ms | edge_index ms | ei/graph | PyG ms (variant) | graph/PyG | ei/PyG "
            "| first step ms (graph / ei) | builds | tunings |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    keys = list(dict.fromkeys((r["graph"], r["model"]) for r in rows))     # in the order measured
    for g, m in keys:
        sel = {r["mode"]: r for r in rows if r["graph"] == g and r["model"] == m}
        ours_g, ours_e = sel.get("graph", {}).get("ms"), sel.get("edge_index", {}).get("ms")
        pyg = [r for r in rows if r["graph"] == g and r["model"] == m and r["mode"].startswith("pyg") and r["ms"] is not None]
        best = min(pyg, key=lambda r: r["ms"]) if pyg else None
        pyg_ms = best["ms"] if best else None
        ratio = lambda a, b: None if a is None or b is None else a / b  # noqa: E731
        builds = "/".join(str(sel.get(k, {}).get("graph_builds", "-")) for k in ("graph", "edge_index"))
        tun = "/".join("n/a" if sel.get(k, {}).get("tuner_invocations") is None else str(sel[k]["tuner_invocations"])
                       for k in ("graph", "edge_index"))
        errors = [f"{k}: {r['error']}" for k, r in sel.items() if r.get("error")]
        lines.append(
            f"| {g} | {m} | {_fmt(ours_g)} | {_fmt(ours_e)} | {_fmt(ratio(ours_e, ours_g), 2)} "
            f"| {_fmt(pyg_ms)} ({best['mode'] if best else 'n/a'}) | {_fmt(ratio(ours_g, pyg_ms), 2)} "
            f"| {_fmt(ratio(ours_e, pyg_ms), 2)} | {_fmt(sel.get('graph', {}).get('first_ms'), 1)} / "
            f"{_fmt(sel.get('edge_index', {}).get('first_ms'), 1)} | {builds} | {tun} |"
            + (f" errors: {'; '.join(errors)}" if errors else "")
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main
def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default="cora", help="comma-separated suite names, or 'all' (default: cora)")
    parser.add_argument("--models", default="gcn,gat", help="comma-separated subset of gcn,gat")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-dir", default=None, help="data folder for load_suite_graph (default: its own search)")
    parser.add_argument("--features", type=int, default=64, help="F_in of random features (default 64)")
    parser.add_argument("--classes", type=int, default=16, help="classes of random labels where the dataset has none")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="3 warm-up and 5 timed steps (smoke test)")
    parser.add_argument("--no-pyg", action="store_true", help="skip torch_geometric even when it imports")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/local/layers.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup, args.steps = 3, 5
    device = torch.device(args.device)
    names = suite_names() if args.graphs.strip().lower() in ("all", "suite") else [n.strip() for n in args.graphs.split(",") if n.strip()]
    models = [m.strip().lower() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in ("gcn", "gat")]
    if bad:
        parser.error(f"unknown models {bad}; known: gcn, gat")
    pyg_nn = None
    if not args.no_pyg:
        try:
            import torch_geometric.nn as pyg_nn  # noqa: F811
        except Exception as exc:  # noqa: BLE001
            print(f"torch_geometric not importable ({type(exc).__name__}): PyG rows skipped", file=sys.stderr)

    rows: List[Dict[str, object]] = []
    for name in names:
        try:
            graph = bare(load_graph(name, args.data_dir)).to(device)
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: skipped ({exc})", file=sys.stderr)
            continue
        x, y, classes, source = node_inputs(name, graph, args.features, args.classes, device, args.seed)
        edge_index = graph.edge_index().contiguous()         # [2, E] (source, target), one tensor for every step
        n, f_in = graph.num_nodes, x.shape[1]
        base = {"graph": name, "num_nodes": n, "num_edges": graph.num_edges, "f_in": f_in, "features": source,
                "classes": classes, "warmup": args.warmup, "steps": args.steps}
        for model in models:
            ways = [("graph", "sparsegnn", lambda m=model: ours(m, f_in, classes), graph),
                    ("edge_index", "sparsegnn", lambda m=model: ours(m, f_in, classes), edge_index)]
            if pyg_nn is not None:
                ways.append(("pyg_edge_index", "pyg", lambda m=model: theirs(pyg_nn, m, f_in, classes), edge_index))
                if model == "gcn":
                    try:
                        ways.append(("pyg_adj_t", "pyg", lambda m=model: theirs(pyg_nn, m, f_in, classes),
                                     pyg_adj_t(edge_index, n)))
                    except Exception as exc:  # noqa: BLE001
                        print(f"{name}: no torch.sparse adj_t for PyG ({exc})", file=sys.stderr)
            for mode, provider, make, arg in ways:
                _graph_input.clear_graph_cache()    # every way starts cold; warm-up steps then fill the caches
                result = measure(make, arg, x, y, device, args.warmup, args.steps, args.seed)
                row = dict(base, model=model, mode=mode, provider=provider, **result)
                rows.append(row)
                print(f"{name:>12} {model} {mode:>14}: {_fmt(row['ms'])} ms (first {_fmt(row['first_ms'], 1)} ms, "
                      f"builds {row['graph_builds']}, tunings {row['tuner_invocations']})"
                      + (f" ERROR {row['error']}" if row["error"] else ""), file=sys.stderr)

    meta = {"device": device_name(device), "device_type": device.type, "versions": versions(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv[1:], "python": platform.python_version()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    print(f"\n{meta['device']}; torch {meta['versions']['torch']}, triton {meta['versions']['triton']}, "
          f"pyg {meta['versions']['torch_geometric']}; median of {args.steps} steps after {args.warmup}\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
