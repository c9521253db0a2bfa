"""Markdown table of an SDDMM sweep of ``scripts/time_tiles.py --no-spmm`` (rows jsonl):
sampled_addmm, our row-wise kernel (tuned: segment or edge-parallel schedule), the best tile
config and ``sddmm(..., precision="tf32")``.  A second argument names the run in the header.

    python scripts/sddmm_report.py benchmarks/h100/sddmm_precision_rows.jsonl "stop 13" > benchmarks/h100/sddmm_precision.md
"""
import collections
import json
import math
import sys


def main(path: str, run: str = "") -> None:
    rows = [json.loads(line) for line in open(path)]
    by = collections.defaultdict(dict)
    for r in rows:
        if r.get("op") == "sddmm" and r.get("ms"):
            by[(r["suite"], r["graph"], r["F"], r["nnz"])][(r["provider"], r["config"])] = r["ms"]
    print('# SDDMM (dot, fp32 inputs) with `sddmm(..., precision="tf32")` on the H100\n')
    print("`scripts/time_tiles.py --graphs real,paper --max-edges 20000000 --no-spmm` (one run" + (f", {run}" if run else "") + "). Median ms of "
          "`triton.testing.do_bench` (L2 flushed), two passes, lower kept. `addmm` = `torch.sparse.sampled_addmm` with a "
          "column-major second operand; `rows` = our exact row-wise SDDMM as tuned (segment or edge-parallel schedule); `tiles` = the better tile config (tf32); "
          '`auto` = `sddmm(g, a, b, precision="tf32")` as a user calls it (tuned rows / tiles, host cost included); '
          "`auto pick` = the kernel whose time `auto` matches, where both kernels take over 0.05 ms (below that a "
          "call is host-bound on this device host).\n")
    print("| suite | graph | E | F | addmm | rows | tiles | auto | auto pick | best x addmm | auto x addmm |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    geo = collections.defaultdict(list)
    for k, v in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][3], kv[0][2])):
        base, rw, au = v[("sampled_addmm", "")], v[("ours", "rowwise")], v[("ours", "auto-tf32")]
        t = min(v.get(("tiles", "tf32-bf32"), math.inf), v.get(("tiles", "tf32-bf64"), math.inf))
        large = min(t, rw) > 0.05
        pick = ("tiles" if abs(au - t) < abs(au - rw) else "rows") if large else "(host-bound)"
        print(f"| {k[0]} | {k[1]} | {k[3]:,} | {k[2]} | {base:.3f} | {rw:.3f} | {t:.3f} | {au:.3f} | {pick} "
              f"| {base / min(rw, t):.2f}x | {base / au:.2f}x |")
        geo[(k[0], "best of rows/tiles x addmm")].append(base / min(rw, t))
        geo[(k[0], "rows x addmm")].append(base / rw)
        geo[(k[0], "auto x addmm")].append(base / au)
        if large:
            geo[(k[0], "auto / best, cases over 0.05 ms")].append(min(rw, t) / au)
    print()
    for (suite, tag), vals in sorted(geo.items()):
        g = math.exp(sum(map(math.log, vals)) / len(vals))
        print(f"- {suite} {tag}: geomean {g:.2f}x, min {min(vals):.2f}x over {len(vals)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
