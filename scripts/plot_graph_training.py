"""Plot the graph-level training benchmarks (``bench_molecules.py`` JSONs): epoch time of ours
against PyG per dataset and batch size, with the speedup on each pair.

    python scripts/plot_graph_training.py benchmarks/h100
"""
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def groups(folder: Path):
    """``[(label, ours_ms, pyg_ms)]`` from every bench_*.json in ``folder``."""
    out = []
    for path in sorted(folder.glob("bench_*.json")):
        rows = json.loads(path.read_text())["rows"]
        by = {}
        for r in rows:
            by.setdefault((r["impl"], r["batch_size"]), []).append(r["epoch_ms"])
        for (impl, batch), times in sorted(by.items()):
            if impl == "ours" and ("pyg", batch) in by:
                label = f"{rows[0]['model']} {rows[0]['dataset']}\nbatch {batch}"
                out.append((label, statistics.fmean(times), statistics.fmean(by[("pyg", batch)])))
    return out


def main(folder: str) -> None:
    folder = Path(folder)
    data = groups(folder)
    fig, ax = plt.subplots(figsize=(1.9 * len(data) + 2, 4))
    xs = range(len(data))
    ax.bar([x - 0.2 for x in xs], [d[2] for d in data], 0.4, label="PyG 2.8 (eager)")
    ax.bar([x + 0.2 for x in xs], [d[1] for d in data], 0.4, label="sparsegnn (captured steps)")
    for x, (_, ours, pyg) in zip(xs, data):
        ax.text(x + 0.2, ours, f"{pyg / ours:.1f}x", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(list(xs), [d[0] for d in data], fontsize=8)
    ax.set_ylabel("training epoch (ms)")
    ax.set_yscale("log")
    ax.set_title("Graph-level training epochs, H100 (forward, backward, Adam, loader)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "graph_training.png", dpi=120)
    print(folder / "graph_training.png")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/h100")
