"""Mini-batch GraphSAGE epochs: our sampler with our layers against the same sampler with PyG's layers.

For each graph of ``--graphs`` it trains a 2-layer GraphSAGE (mean aggregation, ``--hidden``
256, ReLU, dropout 0.5) on neighbour-sampled mini-batches (``--fanouts`` 15,10, ``--batch-size``
1024 seeds from a random ``--train-fraction`` of the nodes, PyG's ``NeighborLoader`` form: the
sampled sub-graph, outputs sliced to the seeds) with cross-entropy and Adam. Providers, all on
the batches of one sampler (``sparsegnn.sampling.NeighborLoader``, same seed):

* ``ours``: ``sparsegnn.nn.SAGEConv`` given the batch's ready ``Graph`` (``batch.graph``);
* ``ours_edge_index``: ``sparsegnn.nn.SAGEConv`` given ``batch.edge_index`` (a PyG script's call);
* ``pyg``: ``torch_geometric.nn.SAGEConv`` given ``batch.edge_index``.

On CUDA the loader samples ``--prefetch`` batches ahead on a side stream (for every provider).

Every provider starts from the same weights. An epoch is one pass over the training seeds
(``--max-batches`` caps it); the epoch time is the median of ``--epochs`` epochs after
``--warmup`` (synchronised at the epoch's ends only). One more epoch, sampled in the loop without
prefetch, is synchronised after every phase to split it into sampling, forward + loss,
backward and the optimiser step (``shares``, ``phase_ms``).

Writes JSON rows + meta to ``--out`` and a markdown table to ``--md``, and prints the table::

    python -m benchmarks.minibatch --graphs reddit,reddit-threads-10k --out benchmarks/local/minibatch.json
    python -m benchmarks.minibatch --quick --device cpu       # smoke test (cora)
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks import layers
from benchmarks import train
from sparsegnn import Graph
from sparsegnn import nn as sgnn
from sparsegnn.capture import CapturedGraphSteps
from sparsegnn.sampling import (MiniBatchPadding, NeighborLoader, TrimmedMiniBatchPadding, layer_graphs,
                                minibatch_loss)

PROVIDERS = ("ours", "ours_capture", "ours_edge_index", "ours_trim", "ours_trim_capture", "pyg", "pyg_trim")
CAPTURED = ("ours_capture", "ours_trim_capture")
PHASES = ("sample", "forward", "backward", "step")


class Sage(nn.Module):
    """``conv2(drop(relu(conv1(x))))`` from a layer class (ours or PyG's: same parameter names)."""

    def __init__(self, conv_cls, f_in: int, hidden: int, classes: int, dropout: float) -> None:
        super().__init__()
        self.conv1 = conv_cls(f_in, hidden, aggr="mean")
        self.conv2 = conv_cls(hidden, classes, aggr="mean")
        self.dropout = dropout

    def forward(self, x: Tensor, graph) -> Tensor:
        """``graph``: one graph argument for both layers, or (trimmed) one ``(graph, sources,
        targets)`` per layer: each layer then computes its ``targets`` rows only."""
        if isinstance(graph, list):       # our layer graphs (a captured step's padded ones), or (arg, S, T)
            (g1, s1, t1), (g2, s2, t2) = [(g, g.num_src, g.num_nodes) if isinstance(g, Graph) else g for g in graph]
            x = F.dropout(F.relu(self.conv1((x[:s1], x[:t1]), g1)), self.dropout, self.training)
            return self.conv2((x[:s2], x[:t2]), g2)
        x = F.dropout(F.relu(self.conv1(x, graph)), self.dropout, self.training)
        return self.conv2(x, graph)


def ours_trimmed(batch) -> list:
    """Our per-layer CSR prefixes (``sparsegnn.sampling.layer_graphs``)."""
    return layer_graphs(batch, 2)


def pyg_trimmed(batch) -> list:
    """PyG's form of the same trimming (``trim_to_layer``'s slices, with the first layer bipartite
    too): layer ``l`` gets the first edges of ``edge_index`` and the node prefixes."""
    nodes, edges = batch.num_sampled_nodes, batch.num_sampled_edges
    out = []
    for kept in (2, 1):
        num_edges = sum(edges[:kept])
        out.append((batch.edge_index[:, :num_edges], sum(nodes[:kept + 1]), sum(nodes[:kept])))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_epoch(model: nn.Module, loader: NeighborLoader, graph_of: Callable, max_batches: int,
               device: torch.device, optimizer: torch.optim.Optimizer,
               steps=None) -> Callable[[Optional[Dict[str, float]]], float]:
    """An epoch function; with a dict it synchronises after every phase and adds its seconds there.
    ``steps`` (``ours_capture``): each step is a padded CUDA graph replay, all of it timed as
    "forward"."""

    def epoch(phases: Optional[Dict[str, float]] = None) -> float:
        model.train()
        total = 0.0
        batches = iter(loader)
        for b in range(max_batches):
            t0 = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            if phases is not None:
                _sync(device)
                t1 = time.perf_counter()
                phases["sample"] += t1 - t0
            size = batch.batch_size
            if steps is not None:
                loss = steps(batch)
                if phases is not None:
                    _sync(device)
                    phases["forward"] += time.perf_counter() - t1
                    total += float(loss)
                continue
            out = model(batch.x, graph_of(batch))[:size]
            loss = F.cross_entropy(out, batch.y[:size])
            if phases is not None:
                _sync(device)
                t2 = time.perf_counter()
                phases["forward"] += t2 - t1
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if phases is not None:
                _sync(device)
                t3 = time.perf_counter()
                phases["backward"] += t3 - t2
            optimizer.step()
            if phases is not None:
                _sync(device)
                phases["step"] += time.perf_counter() - t3
            total += float(loss.detach()) if phases is not None else 0.0
        return total

    return epoch


def run_provider(provider: str, graph, inputs: Dict[str, object], args: argparse.Namespace,
                 device: torch.device, pyg_nn) -> Dict[str, object]:
    """Time ``--epochs`` epochs of one provider; then one phase-split epoch."""
    f_in, classes = inputs["x"].shape[1], inputs["classes"]
    torch.manual_seed(args.seed)
    reference = Sage(sgnn.SAGEConv, f_in, args.hidden, classes, 0.5)
    if provider in ("pyg", "pyg_trim"):
        model = Sage(pyg_nn.SAGEConv, f_in, args.hidden, classes, 0.5)
        model.load_state_dict(reference.state_dict(), strict=True)       # same start as ours
        graph_of = pyg_trimmed if provider == "pyg_trim" else (lambda batch: batch.edge_index)  # noqa: E731
    else:
        model = reference
        graph_of = {"ours": lambda batch: batch.graph, "ours_capture": lambda batch: batch.graph,
                    "ours_trim": ours_trimmed}.get(provider, lambda batch: batch.edge_index)
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, capturable=provider in CAPTURED)
    padding = TrimmedMiniBatchPadding(2) if provider == "ours_trim_capture" else MiniBatchPadding()
    steps = CapturedGraphSteps(model, optimizer, minibatch_loss, padding) if provider in CAPTURED else None
    gen = torch.Generator(device=device).manual_seed(args.seed)
    mask = torch.zeros(graph.num_nodes, dtype=torch.bool, device=device)
    mask[inputs["train_idx"]] = True
    loader = NeighborLoader(graph, args.fanouts, batch_size=args.batch_size, input_nodes=mask, x=inputs["x"],
                            y=inputs["y"], generator=gen, prefetch=args.prefetch if device.type == "cuda" else 0)
    batches = min(len(loader), args.max_batches)
    epoch = make_epoch(model, loader, graph_of, batches, device, optimizer, steps)
    # the phase split samples in the loop (no prefetch): its "sample" is the sampling cost itself
    split_loader = NeighborLoader(graph, args.fanouts, batch_size=args.batch_size, input_nodes=mask, x=inputs["x"],
                                  y=inputs["y"], generator=gen)
    split_epoch = make_epoch(model, split_loader, graph_of, batches, device, optimizer, steps)
    times: List[float] = []
    row: Dict[str, object] = {"provider": provider, "batches": batches, "error": None}
    try:
        _sync(device)
        t = time.perf_counter()
        epoch(None)
        _sync(device)
        row["first_ms"] = 1000.0 * (time.perf_counter() - t)
        for _ in range(max(args.warmup - 1, 0)):
            epoch(None)
        for _ in range(args.epochs):
            _sync(device)
            t = time.perf_counter()
            epoch(None)
            _sync(device)
            times.append(1000.0 * (time.perf_counter() - t))
        phases = {p: 0.0 for p in PHASES}
        _sync(device)
        t = time.perf_counter()
        row["loss_sum"] = split_epoch(phases)
        split_total = time.perf_counter() - t
        row["phase_ms"] = {p: 1000.0 * v for p, v in phases.items()}
        row["shares"] = {p: v / split_total for p, v in phases.items()}
        row["ms"] = statistics.median(times)
        row["ms_min"] = min(times)
        row["ms_per_batch"] = row["ms"] / batches
        if steps is not None:
            row["shapes"] = len(steps.shapes)          # captured graphs (one per padded shape)
    except Exception as exc:  # noqa: BLE001 - failures and OOM become rows
        row["error"] = "oom" if train.is_oom(exc) else f"{type(exc).__name__}: {str(exc)[:300]}"
        row["ms"] = None
    return row


def markdown(rows: List[dict], meta: Dict[str, object]) -> str:
    head = ("| graph | nodes | edges | F | batches | provider | epoch ms | ms / batch | x PyG | sample | fwd+loss "
            "| bwd | step | sampling < fwd+bwd |")
    lines = [f"# Mini-batch GraphSAGE epochs ({meta.get('device')})", "",
             f"2 x SAGEConv(mean), hidden {meta.get('hidden')}, fanouts {meta.get('fanouts')}, "
             f"{meta.get('batch_size')} seeds a batch, Adam; one sampler (sparsegnn.sampling.NeighborLoader) for "
             f"every provider; median of {meta.get('epochs')} epochs after {meta.get('warmup')}; torch "
             f"{meta.get('versions', {}).get('torch')}, PyG {meta.get('versions', {}).get('torch_geometric')}, "
             f"{meta.get('date')}; CUDA: {meta.get('prefetch')} batches prefetched on a side stream. Shares from one "
             f"more epoch without prefetch, synchronised after every phase (captured providers: the whole captured step, "
             f"forward, backward and Adam, is in fwd+loss). x PyG: against the faster of pyg and pyg_trim (the same "
             f"per-layer trimming in PyG's form: edge_index prefixes, bipartite (x_src, x_dst) layers).", "",
             head, "|" + "---|" * (head.count("|") - 1)]
    checks = []
    for graph in dict.fromkeys(r["graph"] for r in rows):
        grows = {r["provider"]: r for r in rows if r["graph"] == graph}
        # PyG in its fastest form: the faster of its untrimmed and trimmed model
        pygs = [r for name, r in grows.items() if name.startswith("pyg") and r.get("ms")]
        pyg = min(pygs, key=lambda r: r["ms"]) if pygs else None
        for provider, r in grows.items():
            if r.get("error"):
                lines.append(f"| {graph} | | | | | {provider} | {r['error'][:60]} | | | | | | | |")
                continue
            speed = pyg["ms"] / r["ms"] if pyg and pyg.get("ms") else None
            shapes = "" if r.get("shapes") is None else f" ({r['shapes']} shapes)"
            sh = r["shares"]
            ph = r["phase_ms"]
            lines.append(
                f"| {graph} | {r['num_nodes']:,} | {r['num_edges']:,} | {r['f_in']} | {r['batches']} | {provider}{shapes} "
                f"| {r['ms']:.1f} | {r['ms_per_batch']:.2f} | {'-' if speed is None else f'{speed:.2f}'} "
                f"| {100 * sh['sample']:.0f}% | {100 * sh['forward']:.0f}% | {100 * sh['backward']:.0f}% "
                f"| {100 * sh['step']:.0f}% | {'yes' if ph['sample'] < ph['forward'] + ph['backward'] else 'no'} |")
        for name in ("ours", "ours_capture", "ours_trim", "ours_trim_capture"):
            ours = grows.get(name)
            if not (ours and pyg and not ours.get("error") and not pyg.get("error")):
                continue
            speed = pyg["ms"] / ours["ms"]
            model_ms = ours["phase_ms"]["forward"] + ours["phase_ms"]["backward"]
            checks.append(f"- {graph} ({ours['num_edges']:,} edges), {name}: {ours['ms']:.1f} ms vs PyG layers "
                          f"({pyg['provider']}) {pyg['ms']:.1f} ms per epoch: {speed:.2f}x (bar 1.3x): {'PASS' if speed >= 1.3 else 'FAIL'}; "
                          f"sampling {ours['phase_ms']['sample']:.1f} ms < forward + backward {model_ms:.1f} ms: "
                          f"{'PASS' if ours['phase_ms']['sample'] < model_ms else 'FAIL'}")
    return "\n".join(lines + ["", "## Acceptance (mini-batch)", ""] + checks) + "\n"


def plot(rows: List[dict], path: str) -> None:
    """Epoch ms per graph and provider, split into its phases' shares (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    providers = [p for p in PROVIDERS if any(r["provider"] == p for r in rows)]
    fig, ax = plt.subplots(figsize=(2.6 * len(graphs) + 2, 3.6))
    width = 0.8 / max(len(providers), 1)
    colors = {"sample": "#999999", "forward": "#1f77b4", "backward": "#ff7f0e", "step": "#2ca02c"}
    for k, provider in enumerate(providers):
        for i, graph in enumerate(graphs):
            row = next((r for r in rows if r["graph"] == graph and r["provider"] == provider), None)
            if row is None or row.get("error"):
                continue
            x, bottom = i + width * (k - (len(providers) - 1) / 2), 0.0
            for phase in PHASES:
                height = row["ms"] * row["shares"][phase]
                ax.bar(x, height, width=width, bottom=bottom, color=colors[phase],
                       label=phase if (k, i) == (0, 0) else None, edgecolor="black", linewidth=0.3)
                bottom += height
            ax.text(x, bottom, provider.replace("_edge_index", "\n(edge_index)"), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(graphs)))
    ax.set_xticklabels(graphs)
    ax.set_ylabel("epoch ms (phase shares)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default="reddit,reddit-threads-10k,wikipedia")
    parser.add_argument("--providers", default=None,
                        help=f"comma-separated, of {','.join(PROVIDERS)} (default: all; ours_capture on CUDA only)")
    parser.add_argument("--fanouts", default="15,10")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--features", type=int, default=None, help="random feature width (default: as bench_train)")
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--train-fraction", type=float, default=0.1)
    parser.add_argument("--prefetch", type=int, default=2, help="batches sampled ahead on a side stream (CUDA)")
    parser.add_argument("--max-batches", type=int, default=64, help="batches per epoch at most (default 64)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke test: cora, 2 batches, 1 epoch")
    parser.add_argument("--out", default="benchmarks/local/minibatch.json")
    parser.add_argument("--md", default=None)
    parser.add_argument("--plot", default=None, help="PNG of the epochs and their phases (matplotlib)")
    parser.add_argument("--report", default=None, help="re-render --md / --plot from this JSON instead of running")
    args = parser.parse_args(argv)
    if args.report:
        doc = json.loads(Path(args.report).read_text())
        text = markdown(doc["rows"], doc["meta"])
        if args.md:
            Path(args.md).write_text(text)
        if args.plot:
            plot(doc["rows"], args.plot)
        print(text)
        return 0
    args.fanouts = [int(v) for v in args.fanouts.split(",")]
    if args.quick:
        args.graphs, args.max_batches, args.epochs, args.warmup, args.batch_size = "cora", 2, 1, 1, 64
    device = torch.device(args.device)
    if args.providers is None:      # CUDA graphs need a GPU
        args.providers = ",".join(p for p in PROVIDERS if args.device.startswith("cuda") or p not in CAPTURED)
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = set(providers) - set(PROVIDERS)
    if unknown:
        raise SystemExit(f"bench_minibatch: unknown providers {sorted(unknown)}; known: {', '.join(PROVIDERS)}")
    try:
        import torch_geometric.nn as pyg_nn
    except ImportError:
        pyg_nn = None
        providers = [p for p in providers if not p.startswith("pyg")]
    rows: List[dict] = []
    for name in [g.strip() for g in args.graphs.split(",") if g.strip()]:
        graph, kind = train.load_bench_graph(name, device, args.data_dir)
        inputs = train.bench_inputs(name, kind, graph, args.features, args.classes, args.train_fraction, device,
                                    args.seed)
        for provider in providers:
            row = run_provider(provider, graph, inputs, args, device, pyg_nn)
            row.update(graph=name, kind=kind, num_nodes=graph.num_nodes, num_edges=graph.num_edges,
                       f_in=int(inputs["x"].shape[1]))
            rows.append(row)
            print(f"{name} {provider}: {row.get('ms')} ms {row.get('error') or ''}", file=sys.stderr)
    meta = {"device": layers.device_name(device),
            "date": _dt.date.today().isoformat(), "fanouts": args.fanouts, "batch_size": args.batch_size,
            "hidden": args.hidden, "epochs": args.epochs, "warmup": args.warmup, "prefetch": args.prefetch,
            "versions": layers.versions()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    text = markdown(rows, meta)
    if args.md:
        Path(args.md).write_text(text)
    if args.plot:
        try:
            plot(rows, args.plot)
        except ImportError:
            print("matplotlib not installed: no plot", file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
