"""The tile SpMM's two encodings side by side, from ``scripts/time_tiles.py``'s rows: per graph,
width and precision the fastest config of the dense tile values (``tiles``) and of the runs
with per-edge values (``tiles-runs``), cuSPARSE fp32 beside them, and the geomean ratio::

    python scripts/compare_tile_encodings.py OUT/tiles_rows.jsonl [OUT.md]
"""
import json
import math
import sys
from collections import defaultdict


def main() -> None:
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    best = defaultdict(dict)
    for r in rows:
        if r.get("op") != "spmm" or "ms" not in r or r.get("order", "natural") != "natural":
            continue
        key = (r["graph"], r["F"])
        name = (r["provider"], r["precision"])
        if name not in best[key] or r["ms"] < best[key][name]["ms"]:
            best[key][name] = r
    lines = ["| graph | F | cuSPARSE fp32 ms | dense tf32 ms | runs tf32 ms | runs / dense | dense bf16 ms "
             "| runs bf16 ms | runs / dense | max rel err (runs) |", "|" + "---|" * 10]
    ratios = {"tf32": [], "bf16": []}
    for (graph, f), got in sorted(best.items()):
        cells = [graph, str(f), f"{got[('cusparse', 'fp32')]['ms']:.4f}" if ("cusparse", "fp32") in got else "-"]
        errs = []
        for prec in ("tf32", "bf16"):
            dense, runs = got.get(("tiles", prec)), got.get(("tiles-runs", prec))
            cells += [f"{dense['ms']:.4f}" if dense else "-", f"{runs['ms']:.4f}" if runs else "-"]
            if dense and runs:
                ratios[prec].append(runs["ms"] / dense["ms"])
                cells.append(f"{runs['ms'] / dense['ms']:.2f}")
                errs.append(runs.get("rel_err", float("nan")))
            else:
                cells.append("-")
        cells.append(f"{max(errs):.1e}" if errs else "-")
        lines.append("| " + " | ".join(cells) + " |")
    for prec, vals in ratios.items():
        if vals:
            geo = math.exp(sum(math.log(v) for v in vals) / len(vals))
            lines.append(f"\n{prec}: runs / dense geomean {geo:.3f} over {len(vals)} cases, "
                         f"range {min(vals):.2f}-{max(vals):.2f}")
    text = "\n".join(lines)
    print(text)
    if len(sys.argv) > 2:
        open(sys.argv[2], "w").write(text + "\n")


if __name__ == "__main__":
    main()
