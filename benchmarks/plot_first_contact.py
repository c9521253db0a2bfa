"""Plot ``first_contact.json`` (``benchmarks/first_contact.py``): the first call on each never-seen
graph against torch's, and each workflow's speed against PyG.

    python -m benchmarks.plot_first_contact benchmarks/results/h200/first_contact.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path: str) -> Path:
    data = json.loads(Path(path).read_text())
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    ops = data.get("op", [])
    edges = [r["edges"] for r in ops]
    left.scatter(edges, [r["ours_first_ms"] for r in ops], label="ours: Graph.from_edge_index + spmm", s=14)
    left.scatter(edges, [r["torch_first_ms"] for r in ops], label="torch: COO -> CSR + sparse.mm", s=14)
    left.scatter(edges, [r["pyg_first_ms"] for r in ops], label="PyG: gather + scatter", s=14)
    left.set(xscale="log", yscale="log", xlabel="edges", ylabel="first call on a never-seen graph (ms)",
             title="first contact, F = 64")
    left.legend(fontsize=8)
    labels, values = [], []
    for r in data.get("graphclass", []):
        labels.append(f"{r['dataset']} {r['model']}")
        values.append(r["speedup_later"])
    for r in data.get("inductive", []):
        labels += ["inductive epoch", "inference, new graphs"]
        values += [r["speedup_later"], r["speedup_infer"]]
    for r in data.get("transductive", []):
        labels.append(f"transductive {r['graph']}")
        values.append(r["speedup"])
    right.barh(labels, values)
    right.axvline(1.0, color="k", lw=0.8)
    right.set(xlabel="speed vs PyG (later epochs; >1 = faster)", title="workflows through accelerate()")
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1]))
