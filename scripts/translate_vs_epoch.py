"""Issue 9's translation bar: translation time against one GCN training epoch, graph by graph,
from one GPU run's ``time_tiles.py --no-spmm`` rows and ``bench_train.py --models gcn`` JSON::

    python scripts/translate_vs_epoch.py TILES_ROWS.jsonl TRAIN.json OUT.md

Paper stand-ins named like a real graph (cora, citeseer, PROTEINS_full) are held to that real
graph's epoch (bench_train resolves those names to the real graphs; same sizes).
"""
import json
import sys


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
           "Translation: `scripts/time_tiles.py --no-spmm`, median of 5 calls after a warm one, as "
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
                   f"| {r['ms']:.2f} | {ours:.3f} | {r['ms'] / ours:.2f} | {pyg:.3f} | {r['ms'] / pyg:.2f} |")
    if not ratios:
        raise SystemExit("translate_vs_epoch: no graph has both a translation row and GCN epochs")
    worst = max(ratios)
    out += ["", f"- translation at most one of our epochs on {sum(x[0] <= 1 for x in ratios)} of {len(ratios)} "
                f"graphs; worst {worst[0]:.2f}x ({worst[2]})",
            f"- at most one PyG epoch on {sum(x[1] <= 1 for x in ratios)} of {len(ratios)}; worst "
            f"{max(x[1] for x in ratios):.2f}x"]
    open(out_path, "w").write("\n".join(out) + "\n")
    print("\n".join(out[-2:]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
