"""Where the host time of one op call goes (GPU machine): per-call wall time of the public op,
the launcher alone and cuSPARSE on a small real graph (the GPU is faster than the host here,
so back-to-back calls measure the host), then a cProfile of the op's calls and of a fresh
first GCN step.

    PYTHONPATH=src python scripts/profile_host.py --graph cora --dim 64
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch


def per_call_us(fn, n=200):
    """Host time per call: the GPU is held busy by a sleep kernel queued first, so the calls
    only enqueue (n stays below the launch queue's depth) and the host clock sees host work."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return best


def top(profile, n=25):
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(n)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph", default="cora")
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args()
    t0 = time.perf_counter()
    import sparsegnn as sg
    from sparsegnn.bench.harness import bench_graph
    from sparsegnn.kernels.spmm_csr import spmm_planned
    from sparsegnn.ops._dispatch import plan_of
    from sparsegnn.tune import lookup
    from sparsegnn.ops._dispatch import spmm_detail
    print(f"import sparsegnn: {time.perf_counter() - t0:.2f} s")
    base = bench_graph(args.graph, device="cuda", real=True)
    g = base.with_values(torch.rand(base.num_edges, device="cuda") + 0.5)
    x = torch.randn(g.num_nodes, args.dim, device="cuda")
    prof_first = cProfile.Profile()
    prof_first.enable()
    t0 = time.perf_counter()
    sg.spmm(g, x)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    prof_first.disable()
    cfg = lookup("spmm", g, spmm_detail(g.edge_val, "sum"), args.dim, x.dtype, "cuda")["config"]
    plan = plan_of(g)
    csr = g.to_torch_sparse_csr()
    rows = {
        "sparsegnn.spmm (op)": per_call_us(lambda: sg.spmm(g, x)),
        "spmm_planned (launcher)": per_call_us(lambda: spmm_planned(g.rowptr, plan, g.edge_val, x, "sum", config=cfg)),
        "torch.sparse.mm": per_call_us(lambda: torch.sparse.mm(csr, x)),
        "torch.empty_like": per_call_us(lambda: torch.empty_like(x)),
    }
    # the launch path piece by piece, on the flat kernel (cora-like graphs pick it)
    from sparsegnn.kernels import _launch
    from sparsegnn.kernels.spmm_csr import _spmm_rows_kernel
    out = torch.empty_like(x)
    flat_args = (g.rowptr, plan.col32, g.edge_val, g.rowptr, x, out, g.rowptr, 0, 0, x.shape[1], x.stride(0), out.stride(0), 1)
    flat_cons = dict(REDUCE=0, HAS_VAL=True, BLOCK_E=4, BLOCK_F=64, HEAVY_E=0, HEAD_DIM=0)
    grid = (g.num_nodes, 1)
    _launch.launch(_spmm_rows_kernel, grid, flat_args, flat_cons, 1)
    _launch.launch(_spmm_rows_kernel, grid, flat_args, flat_cons, 1)
    compiled = next(v for k, v in _launch._COMPILED.items() if k[0] == id(_spmm_rows_kernel))
    tail = _launch._tail(_spmm_rows_kernel, len(flat_args), flat_cons)
    stream = _launch._current_stream(0)
    rows["launch() flat kernel"] = per_call_us(lambda: _launch.launch(_spmm_rows_kernel, grid, flat_args, flat_cons, 1))
    rows["compiled.run direct"] = per_call_us(lambda: compiled.run(grid[0], 1, 1, stream, compiled.function,
                                                                  compiled.packed_metadata, None, None, None,
                                                                  *flat_args, *tail))
    rows["spec tuple (12 args)"] = per_call_us(lambda: tuple(_launch._spec(a) for a in flat_args))
    rows["current_device+stream"] = per_call_us(lambda: _launch._current_stream(torch.cuda.current_device()))
    rows["kernel[grid](...) (Triton)"] = per_call_us(lambda: _spmm_rows_kernel[grid](*flat_args, **flat_cons, num_warps=1))
    print(f"first call {first:.3f} s, config {cfg}")
    for name, us in rows.items():
        print(f"{name:28s} {us:8.1f} us/call (host)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        sg.spmm(g, x)
    prof.disable()
    torch.cuda.synchronize()
    print(top(prof, 30))
    print("==== first call")
    print(top(prof_first, 30))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
