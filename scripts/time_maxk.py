"""MaxK selection on the GPU (issue 10): ``sparsegnn.maxk`` (Triton) against ``torch.relu`` and
``torch.topk`` on the same tensor (Reddit's size, 232,965 x 256 by default), per k and dtype,
checked against the reference backend; JSON rows and a markdown table::

    PYTHONPATH=src python scripts/time_maxk.py --out /tmp/maxk
"""
import argparse
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, "src")
import sparsegnn as sg  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=232_965)
    parser.add_argument("--cols", type=int, default=256)
    parser.add_argument("--ks", default="8,16,32,64,128")
    parser.add_argument("--out", default="/tmp/sparsegnn-out")
    parser.add_argument("--configs", action="store_true", help="also time every (ROWS, num_warps) at k = 32, fp32")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    bench = lambda fn: float(do_bench(fn, warmup=10, rep=50, return_mode="median"))  # noqa: E731
    for dtype, kind in ((torch.float32, "normal"), (torch.bfloat16, "normal"), (torch.float32, "ties")):
        x = torch.randn(args.rows, args.cols, device="cuda").to(dtype)
        if kind == "ties":          # integers in about [-3, 3]: the k-th value is tied in most rows
            x = x.round()
        relu = bench(lambda: torch.relu(x))
        for k in [int(v) for v in args.ks.split(",")]:
            got = sg.maxk(x, k, backend="triton")
            ref = sg.maxk(x, k, backend="reference")
            same = bool(torch.equal(got.index, ref.index) and torch.equal(got.values, ref.values))
            ours = bench(lambda: sg.maxk(x, k, backend="triton"))
            topk = bench(lambda: torch.topk(x, k, dim=1))
            row = dict(rows=args.rows, cols=args.cols, k=k, dtype=str(dtype).replace("torch.", ""), data=kind, ms_maxk=ours,
                       ms_relu=relu, ms_topk=topk, maxk_over_relu=ours / relu, matches_reference=same)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.configs:
        from sparsegnn.kernels.maxk import maxk_select

        x = torch.randn(args.rows, args.cols, device="cuda")
        ref = sg.maxk(x, 32, backend="reference")
        for rows_per in (1, 2, 4, 8, 16):
            for warps in (1, 2, 4, 8):
                cfg = {"ROWS": rows_per, "num_warps": warps}
                vals, idx = maxk_select(x, 32, torch.uint8, cfg)
                ok = bool(torch.equal(idx, ref.index))
                ms = bench(lambda: maxk_select(x, 32, torch.uint8, cfg))
                print(f"config {cfg}: {ms:.3f} ms, {ms / rows[0]['ms_relu']:.2f}x relu, matches {ok}", flush=True)
    (out / "maxk.json").write_text(json.dumps({"meta": {"script": "scripts/time_maxk.py",
                                                         "device": torch.cuda.get_device_name()}, "rows": rows}, indent=1))
    lines = [f"# MaxK selection, {args.rows:,} x {args.cols} ({torch.cuda.get_device_name()})", "",
             "Median ms of `triton.testing.do_bench` (L2 flushed). `maxk` = `sparsegnn.maxk(x, k)` (Triton, CBSR out); "
             "bar: at most 1.5x `torch.relu` on the same tensor. `normal`: N(0, 1) entries; `ties`: the same rounded "
             "to integers (the k-th value tied in most rows).", "",
             "| dtype | data | k | maxk | relu | torch.topk | maxk / relu | same as reference |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['data']} | {r['k']} | {r['ms_maxk']:.3f} | {r['ms_relu']:.3f} | {r['ms_topk']:.3f} | "
              f"{r['maxk_over_relu']:.2f}x | {r['matches_reference']} |" for r in rows]
    (out / "maxk.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
