"""MaxK-GNN training epochs: MaxK GraphSAGE against our ReLU models and PyG's.

One full-graph training epoch (forward, cross-entropy on the training nodes, backward, Adam) on
the Reddit stand-in (or ``--graph``) for

* ``ours_maxk_k{K}``: ``sparsegnn.nn.MaxKGNN(conv="sage", k=K)`` for every ``--ks``, as built
  (replayed from CUDA graphs where its activations fit the replay budget, eager otherwise: the
  Reddit stand-in is over it)
  (MaxK-GNN's structure: ``lin_in -> 3 x [maxk -> dropout -> SAGEConv -> LayerNorm] -> lin_out``,
  hidden 256: CBSR aggregations, SpGEMM forward, SSpMM backward);
* ``ours_maxk_k32_capture``: the same at k = 32, the whole step as one CUDA graph replay;
* ``ours_maxk_k32_unfused`` (``--unfused``): the same with each LayerNorm and the next selection as two
  ops (``maxk(F.layer_norm(h))``, as before ``layer_norm_maxk``), the A/B row of that fusion;
* ``ours_relu``: the same structure with ReLU (MaxK-GNN's baseline), our SAGEConv;
* ``ours_graphsage``: our stock ``sparsegnn.nn.GraphSAGE`` (3 x SAGEConv, hidden 256,
  LayerNorm; the model of ``benchmarks/results/h100/train.md``);
* ``pyg_relu``: the ReLU structure built from ``torch_geometric.nn.SAGEConv``;
* ``pyg_graphsage``: the stock GraphSAGE built from PyG's layers (``bench_train.pyg_model``).

``--conv gcn`` / ``gin`` (``--linear-first``: the authors' GCN / GIN) times those MaxKGNN models and
their ReLU twins instead of SAGE; PyG's rows, SAGE models, are left out then.

PyG gets ``--pyg-inputs`` (default ``adj_t``: a torch.sparse CSR adjacency, its fast input;
``edge_index`` materialises [E, 256] messages, 117 GB on the Reddit stand-in). Features and
labels are random (the stand-in's widths: 602 features, 41 classes); dropout 0.5 everywhere.
Each provider is timed as in ``bench_train.measure`` (median of ``--epochs`` epochs after
``--warmup``). ``--matmul-precision high`` lets cuBLAS use TF32 for every provider's fp32
GEMMs (ours and PyG's alike; the default ``highest`` keeps them fp32). Writes ``maxk_train.json`` (rows + meta), ``maxk_train.md`` and
``maxk_train.png`` under ``--out``::

    python -m benchmarks.maxk_train --out /tmp/maxk
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks import layers
from benchmarks import train as bt
from sparsegnn import nn as sgnn
from sparsegnn.training import make_optimizer, make_train_step


class PygMaxKStructure(nn.Module):
    """MaxK-GNN's ReLU baseline from PyG layers: ``lin_in -> L x [relu -> dropout -> SAGEConv(mean)
    -> LayerNorm] -> lin_out`` (as ``sparsegnn.nn.MaxKGNN(nonlinearity="relu")``)."""

    def __init__(self, pyg_nn, f_in: int, classes: int, hidden: int = 256, num_layers: int = 3,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.lin_in, self.lin_out = nn.Linear(f_in, hidden), nn.Linear(hidden, classes)
        self.convs = nn.ModuleList([pyg_nn.SAGEConv(hidden, hidden, aggr="mean") for _ in range(num_layers)])
        self.norms = nn.ModuleList([nn.LayerNorm(hidden) for _ in range(num_layers)])
        self.dropout = dropout

    def forward(self, x: Tensor, graph) -> Tensor:
        x = self.lin_in(x)
        for conv, norm in zip(self.convs, self.norms):
            x = norm(conv(F.dropout(F.relu(x), self.dropout, self.training), graph))
        return self.lin_out(x)


class UnfusedMaxKGNN(sgnn.MaxKGNN):
    """``MaxKGNN`` with every LayerNorm on its own and the next conv selecting from its output."""

    def forward(self, x: Tensor, graph) -> Tensor:
        import sparsegnn.nn.models as models

        fused, models.layer_norm_maxk = models.layer_norm_maxk, _layer_norm_then_maxk
        try:
            return super().forward(x, graph)
        finally:
            models.layer_norm_maxk = fused


def _layer_norm_then_maxk(x: Tensor, k: int, weight, bias, eps: float, backend: str = "auto"):
    import sparsegnn

    return sparsegnn.maxk(F.layer_norm(x, (x.shape[1],), weight, bias, eps), k, backend=backend)


def providers(ks: List[int], with_pyg: bool, compiled: bool = False, unfused: bool = False) -> List[str]:
    out = [f"ours_maxk_k{k}" for k in ks] + ["ours_maxk_k32_capture"] + (["ours_maxk_k32_unfused"] if unfused else [])
    out += ["ours_maxk_k32_compile"] if compiled else []
    out += ["ours_relu", "ours_graphsage"]
    return out + (["pyg_relu", "pyg_graphsage"] if with_pyg else [])


def build_model(provider: str, f_in: int, classes: int, pyg_nn, hidden: int, layers_: int, conv: str = "sage",
                linear_first: bool = False) -> nn.Module:
    kw = dict(conv=conv, hidden=hidden, num_layers=layers_, linear_first=linear_first)
    if provider.startswith("ours_maxk_k"):
        k = int(provider[len("ours_maxk_k"):].split("_")[0])
        return (UnfusedMaxKGNN if provider.endswith("_unfused") else sgnn.MaxKGNN)(f_in, classes, k=k, **kw)
    if provider == "ours_relu":
        return sgnn.MaxKGNN(f_in, classes, nonlinearity="relu", **kw)
    if provider == "ours_graphsage":
        return sgnn.GraphSAGE(f_in, classes, hidden=hidden, num_layers=layers_)
    if provider == "pyg_relu":
        return PygMaxKStructure(pyg_nn, f_in, classes, hidden, layers_)
    return bt.pyg_model(pyg_nn, "sage", f_in, classes, None, 8, 8)


def run(args: argparse.Namespace) -> List[Dict[str, object]]:
    device = torch.device("cuda")
    graph, kind = bt.load_bench_graph(args.graph, device, args.data_dir)
    inputs = bt.bench_inputs(args.graph, kind, graph, None, 16, args.train_fraction, device, args.seed)
    x, train_idx, y_train = inputs["x"], inputs["train_idx"], inputs["y_train"]
    try:
        import torch_geometric.nn as pyg_nn
    except Exception:  # noqa: BLE001 - PyG is optional
        pyg_nn = None
    rows: List[Dict[str, object]] = []
    # PyG's models here are the SAGE structure: compared only when ours is SAGE too
    for provider in providers([int(k) for k in args.ks.split(",")], pyg_nn is not None and args.conv == "sage",
                              args.compiled, args.unfused):
        variants = ([(v, f) for v, f in bt.pyg_variants("sage", graph) if v in args.pyg_inputs.split(",")]
                    if provider.startswith("pyg") else [("graph", lambda: layers.bare(graph))])
        for variant, make_graph in variants:
            mode = {"_capture": "capture", "_compile": "default"}.get(provider[provider.rfind("_"):], "none")

            def build(provider=provider, make_graph=make_graph, mode=mode) -> Callable[[], Tensor]:
                torch.manual_seed(args.seed)
                net = build_model(provider, x.shape[1], inputs["classes"], pyg_nn, args.hidden, args.layers,
                                  args.conv, args.linear_first).to(device)
                net.train()
                opt = make_optimizer(net, mode, lr=0.01, weight_decay=5e-4)
                return make_train_step(net, opt, x, make_graph(), train_idx, y_train, compile=mode)

            row = dict(graph=args.graph, nodes=graph.num_nodes, edges=graph.num_edges, provider=provider,
                       variant=variant, features=x.shape[1], classes=inputs["classes"], hidden=args.hidden,
                       layers=args.layers)
            row.update(bt.measure(build, device, args.warmup, args.epochs, uses_compile=mode == "default"))
            rows.append(row)
            print(json.dumps({key: row[key] for key in ("provider", "variant", "ms", "first_ms", "peak_mb", "error")}),
                  flush=True)
    return rows


def best(rows: List[dict], provider: str) -> Optional[dict]:
    ok = [r for r in rows if r["provider"] == provider and r.get("ms") is not None]
    return min(ok, key=lambda r: r["ms"]) if ok else None


def markdown(rows: List[dict], meta: Dict[str, object]) -> str:
    k32, relu, stock = best(rows, "ours_maxk_k32"), best(rows, "ours_relu"), best(rows, "ours_graphsage")
    pyg = [r for r in (best(rows, "pyg_relu"), best(rows, "pyg_graphsage")) if r is not None]
    lines = [f"# MaxK-GNN training epochs, {meta['graph']} (N={meta['nodes']:,}, E={meta['edges']:,}), {meta['device']}",
             "", "Median ms of one full-graph epoch (forward, loss, backward, Adam); `python -m benchmarks.maxk_train`. "
             f"MaxK / ReLU rows: MaxK-GNN's structure with conv `{meta.get('conv', 'sage')}`"
             f"{' (linear first: the authors GCN / GIN)' if meta.get('linear_first') else ''} "
             "(lin_in, 3 x [nonlinearity, dropout 0.5, conv, "
             "LayerNorm], lin_out; hidden 256); `ours_graphsage`: our stock GraphSAGE (3 x SAGEConv, hidden 256); "
             "PyG with its fast `adj_t` input. Random features (602) and labels (41). "
             f"fp32 GEMMs at matmul precision `{meta.get('matmul_precision', 'highest')}` for every provider "
             "(`high`: TF32).", "",
             "| provider | input | epoch ms | first epoch ms | peak MB | x ours_relu | x ours_graphsage | x fastest PyG | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    fastest_pyg = min((r["ms"] for r in pyg), default=None)
    ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"  # noqa: E731
    for r in rows:
        ms = r.get("ms")
        lines.append(f"| {r['provider']} | {r['variant']} | {ms:.2f} | {r['first_ms']:.0f} | {r['peak_mb']:.0f} | "
                     f"{ratio(relu and relu['ms'], ms)} | {ratio(stock and stock['ms'], ms)} | {ratio(fastest_pyg, ms)} | |"
                     if ms is not None else f"| {r['provider']} | {r['variant']} | - | - | - | - | - | - | {r['error']} |")
    if k32 is not None:
        lines += ["", "Acceptance (k = 32):"]
        if relu is not None:
            lines.append(f"- >= 2x our ReLU model (same structure): {relu['ms'] / k32['ms']:.2f}x "
                         f"({relu['ms']:.1f} vs {k32['ms']:.1f} ms)")
        if stock is not None:
            lines.append(f"- against our stock GraphSAGE: {stock['ms'] / k32['ms']:.2f}x ({stock['ms']:.1f} ms)")
        if fastest_pyg is not None:
            lines.append(f"- >= 5x PyG's SAGEConv model (fastest PyG row): {fastest_pyg / k32['ms']:.2f}x "
                         f"({fastest_pyg:.1f} ms)")
    return "\n".join(lines) + "\n"


def plot(rows: List[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        print("(no matplotlib: plot skipped)")
        return
    ok = [r for r in rows if r.get("ms") is not None]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh([f"{r['provider']} ({r['variant']})" for r in ok], [r["ms"] for r in ok],
            color=["tab:green" if "maxk" in r["provider"] else ("tab:blue" if r["provider"].startswith("ours")
                                                                  else "tab:gray") for r in ok])
    ax.set_xlabel("epoch ms (lower is better)")
    ax.set_title(f"MaxK-GNN training epoch, {ok[0]['graph'] if ok else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="reddit")
    parser.add_argument("--ks", default="8,16,32,64,128")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--conv", default="sage", choices=["sage", "gcn", "gin"],
                        help="MaxKGNN's conv (PyG's models, SAGE only, are left out for gcn / gin)")
    parser.add_argument("--linear-first", action="store_true",
                        help="GCN / GIN as the authors' models (MaxKGNN(linear_first=True))")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--pyg-inputs", default="adj_t", help="comma-separated: adj_t, edge_index")
    parser.add_argument("--train-fraction", type=float, default=0.66)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="/tmp/sparsegnn-out")
    parser.add_argument("--unfused", action="store_true",
                        help="also time k = 32 with LayerNorm and the next selection unfused (ours_maxk_k32_unfused)")
    parser.add_argument("--compiled", action="store_true",
                        help="also the k = 32 model under torch.compile (inductor, mode 'default')")
    parser.add_argument("--matmul-precision", default="highest", choices=["highest", "high"],
                        help="torch.set_float32_matmul_precision for every provider, ours and PyG's alike: "
                             "'high' lets cuBLAS use TF32 for the fp32 GEMMs (default: %(default)s, true fp32)")
    args = parser.parse_args(argv)
    torch.set_float32_matmul_precision(args.matmul_precision)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = run(args)
    first = rows[0] if rows else {}
    meta = {"script": "benchmarks/maxk_train.py", "device": torch.cuda.get_device_name(), "graph": args.graph,
            "nodes": first.get("nodes", 0), "edges": first.get("edges", 0), "warmup": args.warmup,
            "epochs": args.epochs, "matmul_precision": args.matmul_precision, "conv": args.conv,
            "linear_first": args.linear_first, "versions": layers.versions()}
    (out / "maxk_train.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    text = markdown(rows, meta)
    (out / "maxk_train.md").write_text(text)
    plot(rows, out / "maxk_train.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
