"""Can a MaxK SAGE layer's aggregation overlap its other work on a second stream? (H100 probe.)

On the Reddit stand-in (k = 32, F = 256, fp32) it times, each alone and then both at once on two
streams (CUDA events around the pair, medians of ``--reps``):

- backward: the SSpMM (outer product, L2 atomics) against the rest of the layer's backward that
  does not wait for it (root gradient kernel, the dense ``dW_r`` / ``dW_l`` GEMMs);
- forward: the SpGEMM against the root term (``cbsr_root``).

With ``--sms-blocks B`` the SSpMM / SpGEMM launch at most ``B`` blocks an SM (default 8, the
shipped grid), leaving room on each SM for the other stream's kernels::

    PYTHONPATH=src python scripts/probe_overlap.py --sms-blocks 8,4,2
"""
import argparse
import statistics
import sys

import torch

sys.path.insert(0, "src")
import sparsegnn as sg  # noqa: E402
from sparsegnn.bench.harness import bench_graph  # noqa: E402
from sparsegnn.kernels import cbsr_cuda  # noqa: E402
from sparsegnn.ops._dispatch import plan_of  # noqa: E402


def timed(fn, reps):
    """Median ms of ``fn`` (which may use several streams; it joins them itself)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph", default="reddit")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--sms-blocks", default="8,4,2")
    args = parser.parse_args()
    g = bench_graph(args.graph, device="cuda")
    n, f = g.num_nodes, 256
    plan = plan_of(g)
    h = torch.randn(n, f, device="cuda")
    c = sg.maxk(h, args.k)
    dz = torch.randn(n, f, device="cuda")
    w_l, w_r = torch.randn(f, f, device="cuda") / 16, torch.randn(f, f, device="cuda") / 16
    w_rt = w_r.t().contiguous()
    agg = torch.randn(n, f, device="cuda")
    scale = g.inv_degree(torch.float32)
    main_stream, side = torch.cuda.current_stream(), torch.cuda.Stream()
    sspmm = lambda: cbsr_cuda.sspmm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, None, dz, c.index, n,  # noqa
                                              scale)
    spgemm = lambda: cbsr_cuda.spgemm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, None, c.values,  # noqa
                                                c.index, n, f, scale)

    def bwd_rest():
        cbsr_cuda.cbsr_root_grad_cuda(dz, c.index, w_rt, bias_grad=True)
        dz.t().mm(cbsr_cuda.densify_cuda(c.values, c.index, f))      # dW_r
        dz.t().mm(agg)                                               # dW_l

    fwd_rest = lambda: cbsr_cuda.cbsr_root_cuda(c.values, c.index, w_rt, None)  # noqa: E731

    def pair(a, b):
        def both():
            side.wait_stream(main_stream)
            with torch.cuda.stream(side):
                a()
            b()
            main_stream.wait_stream(side)
        return both

    print(f"{args.graph}: N={n:,} E={g.num_edges:,} k={args.k} F={f}")
    print("| blocks/SM | SSpMM | bwd rest | sum | both | saved | SpGEMM | root | sum | both | saved |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for bps in [int(v) for v in args.sms_blocks.split(",")]:
        cbsr_cuda.BLOCKS_PER_SM = bps
        try:
            for fn in (sspmm, bwd_rest, spgemm, fwd_rest):
                fn()
            t = [timed(fn, args.reps) for fn in (sspmm, bwd_rest, pair(sspmm, bwd_rest), spgemm, fwd_rest,
                                                  pair(spgemm, fwd_rest))]
        finally:
            cbsr_cuda.BLOCKS_PER_SM = 8
        print(f"| {bps} | {t[0]:.3f} | {t[1]:.3f} | {t[0] + t[1]:.3f} | {t[2]:.3f} | {t[0] + t[1] - t[2]:.3f} "
              f"| {t[3]:.3f} | {t[4]:.3f} | {t[3] + t[4]:.3f} | {t[5]:.3f} | {t[3] + t[4] - t[5]:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
