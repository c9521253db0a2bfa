"""Multi-GPU scaling (issue 13, item 4): fit the epoch-time model on the 1- and 2-GPU runs of
``bench_distributed.py`` and predict 4 and 8 GPUs; plot measured and predicted epochs.

Model (per epoch, P ranks, contiguous partition):

    T(P) = T(1) / P + V(P) / B

* ``T(1) / P``: the compute (SpMM over a rank's edges, dense transforms of its rows) splits
  evenly: the partition balances edges to within 0.02 %.
* ``V(P)``: bytes a rank sends per epoch = its halo rows x (sum of the columns sent forward +
  the columns sent back by layers whose input needs a gradient) x 4.  The halo rows at P = 4 and
  8 come from the partition alone (``partition_report.py``, CPU), no GPU run needed.
* ``B``: the effective exchange bandwidth, the part of the exchange not hidden behind the inner
  aggregation, fitted as ``V(2) / (T(2) - T(1) / 2)``.

    python scripts/plot_distributed.py benchmarks/h200x2 --partition benchmarks/h100/partition_reddit_contiguous.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def bytes_per_row(row: dict) -> float:
    """Bytes one halo row costs per epoch: forward at every layer, backward where the layer's
    input needs a gradient (all layers but a first one that aggregates the raw features)."""
    widths = row["sent_widths"]
    first_backward = widths[0] != row["features"]        # the first layer sent projected rows
    return 4.0 * (sum(widths) + sum(widths[1:]) + (widths[0] if first_backward else 0))


def fit(rows: list, partition: list) -> dict:
    """``T(1)``, ``B`` and the predicted ``T(P)`` for the partition sizes given."""
    by = {r["nproc"]: r for r in rows if "epoch_ms" in r}
    t1, t2 = by[1]["epoch_ms"], by[2]["epoch_ms"]
    per_row = bytes_per_row(by[2])
    v2 = by[2]["halo_rows"] / 2 * per_row
    measured_v2 = by[2]["halo_mb_per_epoch"] * 1e6 / 2
    bandwidth = v2 / ((t2 - t1 / 2) * 1e-3)              # bytes / s
    predicted = {}
    for p in partition:
        v = p["halo_nodes"] / p["parts"] * per_row
        predicted[p["parts"]] = {"epoch_ms": t1 / p["parts"] + v / bandwidth * 1e3, "bytes_per_rank": v}
    return {"t1_ms": t1, "t2_ms": t2, "bytes_per_rank_2": v2, "measured_bytes_per_rank_2": measured_v2,
            "bandwidth_gbs": bandwidth / 1e9, "predicted": predicted}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--graph", default="reddit")
    parser.add_argument("--partition", type=Path, required=True, help="partition_report.py JSON (P = 2, 4, 8)")
    args = parser.parse_args(argv)
    rows = json.loads((args.folder / f"distributed_{args.graph}.json").read_text())
    model = fit(rows, json.loads(args.partition.read_text()))
    print(json.dumps(model, indent=1))
    (args.folder / f"scaling_{args.graph}.json").write_text(json.dumps(model, indent=1) + "\n")

    fig, ax = plt.subplots(figsize=(6, 4))
    measured = sorted((r["nproc"], r["epoch_ms"]) for r in rows if "epoch_ms" in r)
    ax.plot([p for p, _ in measured], [t for _, t in measured], "o-", label="measured (H200)")
    pred = sorted((p, v["epoch_ms"]) for p, v in model["predicted"].items())
    ax.plot([1] + [p for p, _ in pred], [model["t1_ms"]] + [t for _, t in pred], "s--",
            label=f"model: T(1)/P + V(P)/B, B = {model['bandwidth_gbs']:.0f} GB/s")
    ideal = [1, 2, 4, 8]
    ax.plot(ideal, [model["t1_ms"] / p for p in ideal], ":", color="grey", label="T(1)/P")
    for p, t in measured + pred:
        ax.annotate(f"{model['t1_ms'] / t:.2f}x", (p, t), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ideal, [str(p) for p in ideal])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("epoch (ms)")
    ax.set_title(f"Full-graph GraphSAGE 3 x 256, {args.graph} stand-in, contiguous partition", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.folder / f"scaling_{args.graph}.png", dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
