"""Issue 9's translation bar: translation time against one GCN training epoch, graph by graph,
from one GPU run's ``time_tiles.py --no-spmm`` rows and ``bench_train.py --models gcn`` JSON::

    python scripts/translate_vs_epoch.py TILES_ROWS.jsonl TRAIN.json OUT.md

A plot of the two ratios per graph goes beside ``OUT.md`` (``OUT.png``) where matplotlib imports.

Paper stand-ins named like a real graph (cora, citeseer, PROTEINS_full) are held to that real
graph's epoch (bench_train resolves those names to the real graphs; same sizes).
"""
import json
import sys


def _spread(row: dict) -> str:
    """`` (p25-p75)`` of a row that has them (rows before stop 41 have only the median)."""
    q = row.get("translate_ms_quartiles")
    return f" ({q[0]:.2f}-{q[1]:.2f})" if q else ""


def main(rows_path: str, train_path: str, out_path: str) -> None:
    translate = {}
    for line in open(rows_path):
        r = json.loads(line)
        if r.get("op") == "translate" and r.get("order", "natural") == "natural":
            translate[(r["suite"], r["graph"])] = r
    train = json.load(open(train_path))
    epochs = {}
    for r in train["rows"] if isinstance(train, dict) else train:
        if r.get("model") == "gcn" and r.get("provider") in ("ours", "pyg") and r.get("ms"):
            seen = epochs.setdefault(r["graph"], {})        # PyG: the faster of its inputs
            seen[r["provider"]] = min(r["ms"], seen.get(r["provider"], float("inf")))
    out = ["# Translation vs a GCN (2 x 16) training epoch, same GPU run", "",
           "Translation: `scripts/time_tiles.py --no-spmm`, median (25th-75th percentile) of 11 calls after a warm one, as "
           "`ops.tiles.translate_graph` translates (Triton index work, the graph's cached edge rows), with edge "
           "values (their tiles built too). Epoch: `scripts/bench_train.py --models gcn`, median of 20 (ours: "
           "eager steps, replayed where `sparsegnn.nn.replay` records them; PyG: the faster of edge_index and "
           "adj_t). " + __doc__.split("\n\n")[1].replace("\n", " ").strip(), "",
           "| suite | graph | edges | blocks plain -> condensed | fill | translate ms | our epoch ms "
           "| translate / our epoch | PyG epoch ms | translate / PyG epoch |", "|" + "---|" * 10]
    ratios = []
    for (suite, graph), r in translate.items():
        if not {"ours", "pyg"} <= epochs.get(graph, {}).keys():
            print(f"no GCN epoch of ours and PyG for {graph}: left out")
            continue
        ours, pyg = epochs[graph]["ours"], epochs[graph]["pyg"]
        ratios.append((r["ms"] / ours, r["ms"] / pyg, f"{suite} {graph}"))
        out.append(f"| {suite} | {graph} | {r['nnz']:,} | {r['blocks_plain']:,} -> {r['blocks']:,} | {r['fill']:.3f} "
                   f"| {r['ms']:.2f}{_spread(r)} | {ours:.3f} | {r['ms'] / ours:.2f} | {pyg:.3f} | {r['ms'] / pyg:.2f} |")
    if not ratios:
        raise SystemExit("translate_vs_epoch: no graph has both a translation row and GCN epochs")
    worst = max(ratios)
    out += ["", f"- translation at most one of our epochs on {sum(x[0] <= 1 for x in ratios)} of {len(ratios)} "
                f"graphs; worst {worst[0]:.2f}x ({worst[2]})",
            f"- at most one PyG epoch on {sum(x[1] <= 1 for x in ratios)} of {len(ratios)}; worst "
            f"{max(x[1] for x in ratios):.2f}x"]
    open(out_path, "w").write("\n".join(out) + "\n")
    print("\n".join(out[-2:]))
    _plot(ratios, out_path.rsplit(".", 1)[0] + ".png")


def _plot(ratios, path: str) -> None:
    """Horizontal bars: translation / our epoch and translation / PyG's epoch per graph (log scale),
    the bar of one epoch marked."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = [r[2] for r in ratios]
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(names) + 1.2))
    ys = range(len(names))
    ax.barh([y + 0.2 for y in ys], [r[0] for r in ratios], height=0.4, label="translation / our GCN epoch")
    ax.barh([y - 0.2 for y in ys], [r[1] for r in ratios], height=0.4, label="translation / PyG's GCN epoch")
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(list(ys))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("translation time / one training epoch (same GPU run)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:4])
