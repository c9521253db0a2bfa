"""Host cost of the pieces of a small graph's translation (issue 9: on graphs under ~1M edges the
translation is host-bound).  Per graph, median microseconds per call over ``--calls`` calls of:

- ``sync``: ``torch.cuda.synchronize()`` with an empty queue;
- ``empty``: one ``torch.empty`` of 1024 int64 on the GPU;
- ``launch``: one ``kernels._launch.launch`` of the window-sizes kernel (host time, no sync);
- ``launch+read``: that launch and the 4 sizes read back (``tolist``: the round trip);
- ``condense``: ``kernels.translate.condense`` of the structure, synchronised;
- ``translate``: ``formats.tiles.translate`` as ``scripts/time_tiles.py`` times it;
- ``unfused``: the same with ``kernels.translate.FUSED_WINDOWS`` off (sorts, scan and slot pass
  in three launches).

With ``--profile N``, also the N functions of most internal time in a cProfile of
``translate`` with edge values (as ``time_tiles.py`` translates), per call::

    PYTHONPATH=src SPARSEGNN_DATA=.data python scripts/probe_host_costs.py cora,deezer,DD
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "src")]
import sparsegnn.kernels.translate as kt  # noqa: E402
from sparsegnn.bench.harness import bench_graph  # noqa: E402
from sparsegnn.datasets.suite import REAL_SUITE  # noqa: E402
from sparsegnn.formats.tiles import translate  # noqa: E402
from sparsegnn.kernels._launch import launch  # noqa: E402


def _median_us(fn, calls: int, sync_each: bool = False) -> float:
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if sync_each:
            torch.cuda.synchronize()
        times.append(1e6 * (time.perf_counter() - t0))
    return statistics.median(times)


def _unfused(*args, **kwargs):
    kt.FUSED_WINDOWS = False
    try:
        return kt.condense(*args, **kwargs)
    finally:
        kt.FUSED_WINDOWS = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graphs")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest functions (own time) of "
                        "translate with edge values, per call")
    args = parser.parse_args()
    for name in args.graphs.split(","):
        g = bench_graph(name, device="cuda", real=name in REAL_SUITE)
        num_windows = -(-g.num_nodes // 16)
        one = num_windows <= kt.SIZES_ONE_PROGRAM
        sizes = torch.zeros(8 + num_windows, dtype=torch.int64, device="cuda")   # as condense's ws

        def sizes_launch():
            launch(kt._window_sizes_kernel, (1 if one else triton.cdiv(num_windows, kt.BLOCK),),
                   (g.rowptr, sizes, g.num_nodes, num_windows, kt.CAPS[-1]), dict(WINDOW=16, ONE=one, BLOCK=kt.BLOCK), 4)

        pieces = {
            "sync": (torch.cuda.synchronize, False),
            "empty": (lambda: torch.empty(1024, dtype=torch.int64, device="cuda"), False),
            "launch": (sizes_launch, False),
            "launch+read": (lambda: (sizes_launch(), sizes.tolist()), False),
            "condense": (lambda: kt.condense(g.rowptr, g.row, g.col, g.num_src, 16, 16), True),
            "translate": (lambda: translate(g.rowptr, g.col, g.num_src, row=g.row, condense=kt.condense), False),
            "unfused": (lambda: translate(g.rowptr, g.col, g.num_src, row=g.row, condense=_unfused), False),
        }
        for fn, _ in pieces.values():
            for _ in range(3):
                fn()
        line = [f"{name:18s} E={g.num_edges:>9d}"]
        for tag, (fn, sync_each) in pieces.items():
            line.append(f"{tag} {_median_us(fn, args.calls, sync_each):7.1f}")
        print("  ".join(line) + "  (us)", flush=True)
        if args.profile:
            _profile(g, args.calls, args.profile)


def _profile(g, calls: int, top: int) -> None:
    """cProfile of ``translate`` with random edge values: the ``top`` functions by own time, us a call."""
    import cProfile
    import pstats

    vals = torch.rand(g.num_edges, device="cuda") + 0.5
    run = lambda: translate(g.rowptr, g.col, g.num_src, vals, row=g.row, condense=kt.condense)  # noqa: E731
    for _ in range(3):
        run()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        run()
    prof.disable()
    stats = pstats.Stats(prof).stats
    rows = sorted(((tt, ct, f"{Path(f).name}:{line} {fn}") for (f, line, fn), (_, _, tt, ct, _) in stats.items()),
                  reverse=True)[:top]
    for tt, ct, where in rows:
        print(f"    own {1e6 * tt / calls:7.1f} us  cumulative {1e6 * ct / calls:7.1f} us  {where}", flush=True)


if __name__ == "__main__":
    main()
