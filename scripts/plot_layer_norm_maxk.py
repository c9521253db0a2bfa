"""Plot of ``time_maxk.py --ln``'s rows: fused ``layer_norm_maxk`` against LayerNorm then maxk,
forward and backward, per dtype and k (needs matplotlib only)::

    python scripts/plot_layer_norm_maxk.py benchmarks/h100/stop52/layer_norm_maxk/layer_norm_maxk.json
"""
import json
import sys
from pathlib import Path


def plot(rows, path: Path, title: str) -> bool:
    """Grouped bars (ms) of fused / plain forward and backward per (dtype, k); False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - the plot is optional
        print("(no matplotlib: plot skipped)")
        return False
    labels = [f"{r['dtype']}\nk={r['k']}" for r in rows]
    series = [("fused fwd", "ms_fused_fwd", "tab:green"), ("plain fwd", "ms_plain_fwd", "tab:gray"),
              ("fused bwd", "ms_fused_bwd", "tab:olive"), ("plain bwd", "ms_plain_bwd", "silver")]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.2
    for i, (name, key, color) in enumerate(series):
        ax.bar([j + (i - 1.5) * width for j in range(len(rows))], [r[key] for r in rows], width, label=name, color=color)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("ms (lower is better)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None) -> int:
    src = Path((argv or sys.argv[1:])[0])
    data = json.loads(src.read_text())
    rows = data["rows"]
    title = f"LayerNorm + MaxK, {rows[0]['rows']:,} x {rows[0]['cols']} ({data['meta']['device']})"
    plot(rows, src.with_suffix(".png"), title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
