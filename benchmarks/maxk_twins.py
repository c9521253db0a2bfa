"""MaxK against its ReLU twin on many graphs: one full-graph training step, every conv and ``k``.

For every graph of ``--graphs`` (real-suite names and stand-ins), every conv of ``--convs``
(``sage``, ``gcn``, ``gin``) and every ``k`` of ``--ks`` it times the training step (forward,
cross-entropy on the training nodes, backward, Adam) of ``sparsegnn.nn.MaxKGNN(conv=..., k=k)``
and of its ReLU twin ``MaxKGNN(conv=..., nonlinearity="relu")`` (the same structure: lin_in,
3 x [nonlinearity, dropout 0.5, conv, LayerNorm], lin_out; hidden 256), both

* as the model runs by default (``replay=None``: its forward and backward replayed from CUDA
  graphs once the same inputs come back, where the activations fit the replay budget; eager
  otherwise, e.g. on the 115M-edge Reddit stand-in), the column of record; and
* eager (``replay=False``), to show what the replay is worth on each side;
* on request (``--modes ...,captured``, CUDA only), the whole step captured as one CUDA graph
  (``make_train_step(compile="capture")``, a capturable Adam): no host time left, so the
  ratio is the two steps' GPU work (a small graph's default steps are host-bound).

The twin and every ``k`` of one conv and mode are timed side by side (:func:`interleaved`: after
each one's first call and ``--warmup`` steps, ``--rounds`` rounds of ``--steps`` steps each in a
rotated order; ``ms`` the median of every timed step, the first step's ms kept). The ratio is
ReLU ms / MaxK ms (> 1: MaxK is faster).
Features are the graph's (Cora) or random with the stand-in's width (64 for real graphs without
features); labels random. Writes ``maxk_twins.json`` (``{"meta", "rows"}``), ``maxk_twins.md``
and ``maxk_twins.png`` under ``--out``::

    python -m benchmarks.maxk_twins --data .data --out benchmarks/results/h200
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from benchmarks import layers
from benchmarks import train as bt
from sparsegnn import nn as sgnn
from sparsegnn.nn.replay import replay_state
from sparsegnn.training import make_optimizer, make_train_step

#: Real-suite graphs and stand-ins timed by default (the Reddit stand-in first: the 115M-edge
#: MaxK-GNN figure).
DEFAULT_GRAPHS = ("reddit", "cora", "citeseer", "deezer", "lastfm", "twitch", "wikipedia", "roadnet-pa-excerpt",
                  "reddit-threads-10k", "PROTEINS_full", "ENZYMES", "pubmed", "ppi", "flickr", "artist", "yelp")
MODES = ("default", "eager")
#: Every mode a run may ask for (``captured``: CUDA only, not run by default).
ALL_MODES = MODES + ("captured",)


def configs(ks: Sequence[int]) -> List[Optional[int]]:
    """The twin (None) first, then every ``k``."""
    return [None, *ks]


def _steps_of(graph, inputs: Dict[str, object], conv: str, k: Optional[int], mode: str, hidden: int, seed: int,
              device: torch.device) -> Callable[[], torch.Tensor]:
    """The training step of MaxK (``k``) or its twin (``k`` None), as ``mode`` runs it, on a new
    Graph of ``graph``'s structure: each model meets the graph as a script of its own would
    (its own use counts, plan and decisions), not after another config has invested in it.
    The model is the step's ``model`` attribute."""
    torch.manual_seed(seed)
    x = inputs["x"]
    kw = {"nonlinearity": "relu"} if k is None else {"k": k}
    net = sgnn.MaxKGNN(x.shape[1], inputs["classes"], conv=conv, hidden=hidden,
                       replay=None if mode == "default" else False, **kw).to(device).train()
    compile = "capture" if mode == "captured" else "none"
    step = make_train_step(net, make_optimizer(net, compile, lr=0.01, weight_decay=5e-4), x, layers.bare(graph),
                           inputs["train_idx"], inputs["y_train"], compile=compile)
    step.model = net
    return step


def _timed(step: Callable[[], torch.Tensor], device: torch.device, steps: int) -> List[float]:
    """ms of each of ``steps`` steps issued back to back (CUDA events; wall clock on the CPU)."""
    if device.type != "cuda":
        out = []
        for _ in range(steps):
            t = time.perf_counter()
            step()
            out.append(1000.0 * (time.perf_counter() - t))
        return out
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in events]


def interleaved(steps_by_config: Dict[object, Callable[[], torch.Tensor]], device: torch.device, warmup: int,
                steps: int, rounds: int, budget_ms: float) -> Dict[object, Dict[str, object]]:
    """Time several steps side by side: each one's first call and ``warmup`` more, then up to
    ``rounds`` rounds in which every step runs ``steps`` times, in an order rotated each round
    (a drift of the host's speed, which moves a host-bound step by 1.5x here, falls on all of
    them alike); rounds stop once ``budget_ms`` of timed steps is spent (at least one round).
    Per config: ``ms`` (median of every timed step), ``ms_min``, ``first_ms``, ``rounds``, ``error``
    and ``replay`` (``nn.replay.replay_state`` of the step's ``model`` where it has one: recorded,
    over budget, failed, off)."""
    out: Dict[object, Dict[str, object]] = {}
    live = {}
    for config, step in steps_by_config.items():
        try:
            layers.sync(device)
            t = time.perf_counter()
            loss = step()
            layers.sync(device)
            out[config] = {"first_ms": 1000.0 * (time.perf_counter() - t), "times": [], "error": None}
            for _ in range(warmup):
                loss = step()
            if not math.isfinite(float(loss)):
                raise RuntimeError(f"non-finite loss {float(loss)}")
            live[config] = step
        except Exception as exc:  # noqa: BLE001 - out of memory and unsupported cases become rows
            out[config] = {"first_ms": None, "times": [],
                           "error": "oom" if bt.is_oom(exc) else f"{type(exc).__name__}: {str(exc)[:200]}"}
    spent = 0.0
    order = list(live)
    for r in range(rounds):
        if not order or (r and spent >= budget_ms):
            break
        for config in order[r % len(order):] + order[:r % len(order)]:
            try:
                times = _timed(live[config], device, steps)
            except Exception as exc:  # noqa: BLE001 - a failure in a later round fails that config only
                out[config].update(times=[], error="oom" if bt.is_oom(exc) else f"{type(exc).__name__}: {str(exc)[:200]}")
                order.remove(config)
                continue
            out[config]["times"] += times
            spent += sum(times)
    for config, result in out.items():
        model = getattr(steps_by_config[config], "model", None)
        result["replay"] = replay_state(model) if model is not None else None
        times = result.pop("times")
        result.update(ms=statistics.median(times) if times else None, ms_min=min(times) if times else None,
                      rounds=len(times) // max(steps, 1))
    return out


def run(graphs: Sequence[str], convs: Sequence[str], ks: Sequence[int], device: torch.device,
        data_dir: Optional[str], warmup: int = 3, steps: int = 10, hidden: int = 256, seed: int = 0,
        modes: Sequence[str] = MODES, rounds: int = 5, budget_ms: float = 2000.0,
        log: Callable[[str], None] = print) -> List[Dict[str, object]]:
    """One row per graph x conv x config x mode (module doc): ``ms``, ``ms_min``, ``first_ms``,
    ``rounds``, ``error``; the twin and every ``k`` of one conv and mode timed side by side
    (:func:`interleaved`)."""
    rows: List[Dict[str, object]] = []
    for name in graphs:
        graph, kind = bt.load_bench_graph(name, device, data_dir)
        inputs = bt.bench_inputs(name, kind, graph, None, 16, 0.66, device, seed)
        for conv in convs:
            for mode in modes:
                cfgs = [k for k in configs(ks) if k is None or k <= hidden]
                steps_by_config = {k: _steps_of(graph, inputs, conv, k, mode, hidden, seed, device) for k in cfgs}
                timed = interleaved(steps_by_config, device, warmup, steps, rounds, budget_ms)
                steps_by_config.clear()             # the models, their recordings and optimiser state
                for k in cfgs:
                    row = dict(graph=name, kind=kind, nodes=graph.num_nodes, edges=graph.num_edges, conv=conv,
                               k=k, mode=mode, features=inputs["x"].shape[1], hidden=hidden, **timed[k])
                    rows.append(row)
                    log(json.dumps({key: row[key] for key in ("graph", "conv", "k", "mode", "ms", "rounds", "replay",
                                                              "error")}))
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        del graph, inputs
    return rows


def ratios(rows: List[dict], mode: str = "default", key: str = "ms") -> List[dict]:
    """Per graph x conv x k of ``mode``: the twin's ms over MaxK's (``x_relu``; None where either
    failed); ``key="ms_min"``: of each one's fastest step instead of its median."""
    twin = {(r["graph"], r["conv"]): r.get(key) for r in rows if r["k"] is None and r["mode"] == mode}
    twin_replay = {(r["graph"], r["conv"]): r.get("replay") for r in rows if r["k"] is None and r["mode"] == mode}
    out = []
    for r in rows:
        if r["k"] is None or r["mode"] != mode:
            continue
        base = twin.get((r["graph"], r["conv"]))
        x = base / r[key] if base and r.get(key) else None
        out.append(dict(graph=r["graph"], edges=r["edges"], conv=r["conv"], k=r["k"], relu_ms=base,
                        maxk_ms=r.get(key), x_relu=x, relu_replay=twin_replay.get((r["graph"], r["conv"])),
                        maxk_replay=r.get("replay")))
    return out


def summary(rows: List[dict], mode: str = "default", key: str = "ms") -> Dict[str, object]:
    """Geomean and worst ``x_relu`` of ``mode`` (``ratios``' ``key``), the cases below 1.0 and the failures."""
    got = [r for r in ratios(rows, mode, key) if r["x_relu"] is not None]
    if not got:
        return {"cases": 0, "geomean": None, "worst": None, "below": [], "failed": len(ratios(rows, mode, key))}
    worst = min(got, key=lambda r: r["x_relu"])
    return {"cases": len(got), "geomean": math.exp(sum(math.log(r["x_relu"]) for r in got) / len(got)),
            "worst": worst, "below": [r for r in got if r["x_relu"] < 1.0],
            "failed": len(ratios(rows, mode, key)) - len(got)}


def _case(r: dict) -> str:
    return f"{r['graph']} {r['conv']} k={r['k']}"


def markdown(rows: List[dict], meta: Dict[str, object]) -> str:
    """Summary lines per mode, then one table row per graph x conv x k."""
    lines = [f"# MaxK against its ReLU twin, {meta['device']}", "",
             "Median ms of one full-graph training step (forward, loss, backward, Adam) of "
             f"`MaxKGNN(conv, k)` and `MaxKGNN(conv, nonlinearity=\"relu\")` (hidden {meta.get('hidden', 256)}, "
             "3 layers, dropout 0.5); "
             "`python -m benchmarks.maxk_twins`. x ReLU = ReLU ms / MaxK ms (> 1: MaxK faster). "
             "`default`: the model as built (`replay=None`: forward and backward replayed from CUDA graphs once "
             "the inputs repeat and the activations fit the budget); `eager`: `replay=False`"
             + ("; `captured`: the whole step (forward, loss, backward, Adam) one CUDA graph "
                "(`make_train_step(compile=\"capture\")`), no host time" if "captured" in meta.get("modes", MODES)
                else "") + ". The graph is reused every step.", ""]
    for mode in meta.get("modes", MODES):
        s = summary(rows, mode)
        if not s["cases"]:
            continue
        below = ", ".join(f"{_case(r)} {r['x_relu']:.2f}x" for r in s["below"][:12]) or "none"
        lines.append(f"- **{mode}**: {s['cases']} cases, geomean {s['geomean']:.2f}x ReLU, worst "
                     f"{s['worst']['x_relu']:.2f}x ({_case(s['worst'])}); below 1.0x: {len(s['below'])} ({below})"
                     + (f"; {s['failed']} failed" if s["failed"] else ""))
        fast = summary(rows, mode, "ms_min")
        if fast["cases"]:       # host-bound steps: the median moves with the host's speed, the fastest less
            lines.append(f"  - by each one's fastest step: geomean {fast['geomean']:.2f}x, worst "
                         f"{fast['worst']['x_relu']:.2f}x ({_case(fast['worst'])}), below 1.0x: {len(fast['below'])}")
    if meta.get("note"):
        lines += ["", str(meta["note"])]
    captured = any(r["mode"] == "captured" for r in rows)
    lines += ["", "| graph | edges | conv | k | ReLU ms | MaxK ms | x ReLU | replayed (ReLU / MaxK) | ReLU eager ms | "
              "MaxK eager ms | x ReLU eager |" + (" ReLU captured ms | MaxK captured ms | x ReLU captured |"
                                                 if captured else ""),
              "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if captured else "")]
    short = lambda state: "-" if not state else state.split(",")[0].split(":")[0]  # noqa: E731
    by_mode = {mode: {(r["graph"], r["conv"], r["k"]): r for r in ratios(rows, mode)} for mode in ALL_MODES}
    fmt = lambda v: format(v, ".2f") if v is not None else "-"  # noqa: E731
    cases = dict.fromkeys((r["graph"], r["conv"], r["k"], r["edges"]) for r in rows if r["k"] is not None)
    for graph, conv, k, edges in cases:
        d, e = by_mode["default"].get((graph, conv, k), {}), by_mode["eager"].get((graph, conv, k), {})
        c = by_mode["captured"].get((graph, conv, k), {})
        lines.append(f"| {graph} | {edges:,} | {conv} | {k} | {fmt(d.get('relu_ms'))} | {fmt(d.get('maxk_ms'))} | "
                     f"{fmt(d.get('x_relu'))} | {short(d.get('relu_replay'))} / {short(d.get('maxk_replay'))} | "
                     f"{fmt(e.get('relu_ms'))} | {fmt(e.get('maxk_ms'))} | {fmt(e.get('x_relu'))} |"
                     + (f" {fmt(c.get('relu_ms'))} | {fmt(c.get('maxk_ms'))} | {fmt(c.get('x_relu'))} |" if captured
                        else ""))
    errors = [r for r in rows if r.get("error")]
    if errors:
        lines += ["", "Errors:"] + [f"- {_case(r)} {r['mode']}: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"


def plot(rows: List[dict], path: Path) -> None:
    """x ReLU per case (the default mode where timed, else eager), one marker per conv; the 1.0 line drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - the plot is optional
        print("(no matplotlib: plot skipped)", file=sys.stderr)
        return
    mode = "default" if any(r["mode"] == "default" for r in rows) else "eager"
    got = [r for r in ratios(rows, mode) if r["x_relu"] is not None]
    if not got:
        print("(no case timed: plot skipped)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(9, 4))
    for conv, marker in (("sage", "o"), ("gcn", "s"), ("gin", "^")):
        pts = [r for r in got if r["conv"] == conv]
        ax.scatter([r["edges"] for r in pts], [r["x_relu"] for r in pts], marker=marker, label=conv, alpha=0.7)
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("edges")
    ax.set_ylabel("ReLU step ms / MaxK step ms")
    ax.set_title(f"MaxK against its ReLU twin ({mode})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ints(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive ints, got {text!r}")
    return values


def _names(text: str) -> List[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=_names, default=list(DEFAULT_GRAPHS))
    parser.add_argument("--convs", type=_names, default=["sage", "gcn", "gin"])
    parser.add_argument("--ks", type=_ints, default=[16, 32, 64])
    parser.add_argument("--modes", type=_names, default=list(MODES))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per config and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (fewer once --budget-ms is spent)")
    parser.add_argument("--budget-ms", type=float, default=2000.0,
                        help="timed step ms per conv and mode after which no further round starts")
    parser.add_argument("--data", default=None, help="the real suite's folder (default: the shared datasets)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="benchmarks/local")
    args = parser.parse_args(argv)
    bad = [c for c in args.convs if c not in ("sage", "gcn", "gin")] + [m for m in args.modes if m not in ALL_MODES]
    if bad:
        parser.error(f"unknown conv / mode: {', '.join(bad)}")
    if "captured" in args.modes and not args.device.startswith("cuda"):
        parser.error("--modes captured needs a CUDA device (the step is captured as a CUDA graph)")
    if not (args.graphs and args.convs and args.modes):
        parser.error("--graphs, --convs and --modes need at least one name each")
    device = torch.device(args.device)
    meta = {"script": "benchmarks/maxk_twins.py", "device": layers.device_name(device), "graphs": args.graphs,
            "convs": args.convs, "ks": args.ks, "modes": args.modes, "warmup": args.warmup, "steps": args.steps,
            "rounds": args.rounds, "budget_ms": args.budget_ms,
            "hidden": args.hidden, "versions": layers.versions()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: List[Dict[str, object]] = []
    for name in args.graphs:        # the report rewritten after every graph: a cut-short run keeps what it timed
        rows += run([name], args.convs, args.ks, device, args.data, args.warmup, args.steps, args.hidden,
                    modes=args.modes, rounds=args.rounds, budget_ms=args.budget_ms)
        (out / "maxk_twins.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        text = markdown(rows, meta)
        (out / "maxk_twins.md").write_text(text)
    plot(rows, out / "maxk_twins.png")
    print(text.split("| graph |")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
