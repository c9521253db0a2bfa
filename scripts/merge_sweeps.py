"""Merge repeated sweeps of the same cases into one label file: each (case, config)'s ``ms`` is
the minimum over every reading of every file (``ms_reps`` keeps them all), ``cusparse_ms`` the
minimum too.  A timing is a true time plus non-negative noise (clock transients, a slow host),
so more readings in fresh random orders move the minimum toward the true time.

    python scripts/merge_sweeps.py benchmarks/h100/tune_sweep.jsonl benchmarks/h100/tune_sweep_repeat.jsonl \\
        --out benchmarks/h100/tune_sweep_merged.jsonl
"""
from __future__ import annotations

import argparse
import json


def row_key(row: dict) -> tuple:
    return (row["group"], row["graph"], row["F"], row["dtype"], json.dumps(row["config"], sort_keys=True))


def merge(paths) -> list:
    """Rows of the first file, in its order, with every file's readings of the same config merged;
    configs only some files have are kept as they are."""
    merged, order = {}, []
    for path in paths:
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                key = row_key(row)
                if key not in merged:
                    merged[key] = dict(row, ms_reps=list(row.get("ms_reps") or [row["ms"]]))
                    order.append(key)
                    continue
                have = merged[key]
                have["ms_reps"] += list(row.get("ms_reps") or [row["ms"]])
                have["ms"] = min(have["ms"], row["ms"])
                if row.get("cusparse_ms") is not None:
                    have["cusparse_ms"] = min(have.get("cusparse_ms") or float("inf"), row["cusparse_ms"])
                have["rel_err"] = max(have["rel_err"], row["rel_err"])
    return [merged[k] for k in order]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = merge(args.paths)
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    reps = sum(len(r["ms_reps"]) for r in rows) / max(len(rows), 1)
    print(f"{len(rows)} configs, {reps:.1f} readings each on average -> {args.out}")


if __name__ == "__main__":
    main()
