"""Translation cost on the GPU (issue 9's bar: at most one GCN epoch): median ``stats.ms`` of
``formats.tiles.translate`` over 10 calls with the graph's edge values and cached edge rows (as
``scripts/time_tiles.py`` and the library translate), by index-work variant:

- ``tensor ops``: the reference (``formats.tiles._condense``);
- ``triton``: ``kernels.translate.condense`` as shipped;
- ``sorted``: the same with the big windows' bit sets disallowed (graphs with a window over
  ``CAPS[-1]`` edges then take the sorted keys, as before stop 41);
- ``bits8``: bit sets allowed up to 8 words an edge (ogbn-products would take them: slower,
  16.7 ms of ranking against 16.0 ms of sorted keys, stop 42);
- ``triton-bits``: the big windows' bit sets in Triton, not the CUDA kernel;
- ``unfused``: graphs the fused pass would take, by the sorts, the scan and the slot pass
  (three launches); ``look32`` / ``look512`` / ``look1024``: the fused pass's look-back
  reading that many windows a step; ``no-sleep``: its waits without ``nanosleep`` (stop 44);
  ``sizes-one``: the window sizes by one program up to 64k windows, as until stop 44;
  ``caps1024``: windows over 1024 edges ranked by bit sets, not sorted (stop 45);
  ``no-cuda-all``: the Triton sorts where every window's bit set in CUDA would run (stop 46),
  ``cuda-all-256`` / ``cuda-all-512``: that kernel at 256 / 512 threads a block (128 shipped),
  ``cuda-all-w64``: taken up to 64 bit-set words per mean window edge (16 shipped);
  ``cupy-call``: the CUDA kernels launched by CuPy's call, not ``cuLaunchKernel`` (stop 46);
  ``read-sizes``: the window sizes read back where every window goes to the CUDA bit sets (as
  until stop 46; a graph without big windows then takes the fused pass);
  ``no-cuda-windows``: without the whole translation in one CUDA launch (the Triton fused
  pass or the three passes, as until stop 47); ``cuda-windows-all``: that launch at any
  number of waves of blocks (shipped: up to ``CUDA_WINDOWS_WAVES``); ``cuda-windows-any``: also
  at any bit-set words (wherever the bit set fits shared memory); ``cuda-windows-64`` /
  ``cuda-windows-256``: its blocks of 64 / 256 threads; ``cuda-windows-8``: at most 8 waves.

With ``--library`` each call is timed as ``time_tiles.py`` and the library build the tiles:
the structure, then the tile values by ``tiles_of`` (``index_add_``), not in the slot pass.

The edge values are random (as ``time_tiles.py`` gives them), unless ``--no-values``.

Per variant the CUDA kernels and host syncs of one call; with ``--trace DIR`` a Chrome trace of
one profiled call per graph and variant (host launches, syncs and kernels on one time line)::

    PYTHONPATH=src SPARSEGNN_DATA=.data python scripts/probe_translate.py cora,wikipedia [--trace DIR]

A name ``hub:N`` is a synthetic graph of one hub row over N nodes among rows of one edge.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "src")]
import sparsegnn.kernels.translate as kt  # noqa: E402
from sparsegnn.bench.harness import bench_graph  # noqa: E402
from sparsegnn.datasets.suite import REAL_SUITE  # noqa: E402
from sparsegnn.formats.tiles import translate  # noqa: E402


def _patched(**names):
    """``kt.condense`` with module constants of ``kernels.translate`` set for the call."""
    def run(*args, **kwargs):
        saved = {n: getattr(kt, n) for n in names}
        for n, v in names.items():
            setattr(kt, n, v)
        try:
            return kt.condense(*args, **kwargs)
        finally:
            for n, v in saved.items():
                setattr(kt, n, v)
    return run


def _cupy_call(*args, **kwargs):
    """``kt.condense`` with the CUDA kernels launched by CuPy's ``RawKernel`` call (as until stop 46)."""
    from sparsegnn.kernels import _cupy

    saved, _cupy.DIRECT = _cupy.DIRECT, False
    try:
        return kt.condense(*args, **kwargs)
    finally:
        _cupy.DIRECT = saved


VARIANTS = {"tensor ops": None, "triton": kt.condense,
            "sorted": _patched(BIG_WORDS=0, BIG_WORDS_PER_EDGE=0, CUDA_BIG_WINDOWS=False),
            "bits8": _patched(BIG_WORDS_PER_EDGE=8),
            "triton-bits": _patched(CUDA_BIG_WINDOWS=False),     # the big windows' bit sets in Triton, not CUDA
            "unfused": _patched(FUSED_WINDOWS=False),            # no big windows: sorts, scan, slots in 3 launches
            "look32": _patched(LOOK_BACK=32),                    # the fused pass's look-back 32 windows a step (128 shipped)
            "look512": _patched(LOOK_BACK=512),
            "look1024": _patched(LOOK_BACK=1024),
            "no-sleep": _patched(LOOK_BACK_SLEEP_NS=0),         # its waiting programs read again at once (0)
            "sizes-one": _patched(SIZES_ONE_PROGRAM=64 * kt.BLOCK),  # window sizes by one program to 64k windows (stop 44)
            "caps1024": _patched(CAPS=(64, 256, 1024)),         # windows over 1024 edges by bit sets, not 2048-lane sorts
            "no-cuda-all": _patched(CUDA_ALL_WINDOWS=False),     # the Triton sorts, as until stop 45
            "cuda-all-256": _patched(CUDA_ALL_THREADS=256),      # every window's bit set: threads a block
            "cuda-all-512": _patched(CUDA_ALL_THREADS=512),
            "cuda-all-w64": _patched(CUDA_ALL_WORDS_PER_EDGE=64),  # also where words are up to 64x the mean edges
            "cupy-call": _cupy_call,
            "read-sizes": _patched(FUSED_MAX_WINDOWS=10 ** 9, CUDA_WINDOWS=False),
            "no-cuda-windows": _patched(CUDA_WINDOWS=False),     # the Triton passes (and CUDA ranks), as until stop 47
            "cuda-windows-all": _patched(CUDA_WINDOWS_WAVES=10 ** 9),  # the one CUDA launch at any waves
            "cuda-windows-any": _patched(CUDA_WINDOWS_WAVES=10 ** 9, CUDA_WINDOWS_WORDS=10 ** 9),  # and words
            "cuda-windows-64": _patched(CUDA_WINDOWS_THREADS=64),  # its blocks of 64 threads (128 shipped)
            "cuda-windows-256": _patched(CUDA_WINDOWS_THREADS=256),
            "cuda-windows-8": _patched(CUDA_WINDOWS_WAVES=8)}    # at most 8 waves (16 shipped)


def _hub_graph(name: str):
    """``hub:N``: N nodes, node 0's row holding an edge to every node, every other row one edge
    (to ``7919 i mod N``): one huge window among windows of 16 edges, whose mean passes the
    one-launch path's size checks."""
    from sparsegnn import Graph

    n = int(name.split(":", 1)[1])
    rest = torch.arange(1, n)
    edge_index = torch.stack([torch.cat([torch.arange(n), (rest * 7919) % n]),       # sources
                              torch.cat([torch.zeros(n, dtype=torch.long), rest])])  # targets: the CSR rows
    return Graph.from_edge_index(edge_index.cuda(), num_nodes=n)


def _print_timeline(prof, label: str) -> None:
    """One profiled call as ``start us, duration us, host|gpu, name`` rows, from the first event:
    the CUDA runtime calls (launches, copies, syncs) and allocations on the host, kernels and
    copies on the GPU; where the host waits and where the GPU idles shows in the gaps."""
    rows = []
    for e in prof.events():
        gpu = e.device_type == torch.autograd.DeviceType.CUDA
        if gpu or e.name.startswith(("cuda", "cu", "aten::empty", "aten::_local_scalar", "aten::item",
                                     "aten::to", "aten::copy_", "aten::zeros", "aten::cumsum")):
            rows.append((e.time_range.start, e.time_range.end - e.time_range.start, "gpu " if gpu else "host",
                         e.name[:70]))
    rows.sort()
    t0 = rows[0][0] if rows else 0
    print(f"  timeline {label}:", flush=True)
    for start, dur, side, name in rows:
        print(f"    {start - t0:8.1f} {dur:7.1f} {side} {name}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graphs", help="comma-separated suite names")
    parser.add_argument("--variants", default="tensor ops,triton,sorted")
    parser.add_argument("--trace", default="", help="directory for Chrome traces of one call each")
    parser.add_argument("--no-values", action="store_true", help="translate the structure only")
    parser.add_argument("--library", action="store_true",
                        help="as the library and time_tiles.py: the structure, then the tile values by tiles_of")
    parser.add_argument("--top", type=int, default=0, help="print the N costliest kernels of each profiled call")
    parser.add_argument("--timeline", action="store_true",
                        help="print one profiled call's host calls (CUDA runtime, syncs) and kernels on one time line")
    args = parser.parse_args()
    for name in args.graphs.split(","):
        g = _hub_graph(name) if name.startswith("hub:") else bench_graph(name, device="cuda", real=name in REAL_SUITE)
        if not args.no_values:
            g = g.with_values(torch.rand(g.num_edges, device="cuda") + 0.5)
        line = [f"{name:20s} E={g.num_edges:>9d}"]
        for tag in args.variants.split(","):
            index_work = VARIANTS[tag]
            def run(index_work=index_work):
                if not args.library:
                    return translate(g.rowptr, g.col, g.num_src, g.edge_val, row=g.row, condense=index_work)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                tiles = translate(g.rowptr, g.col, g.num_src, row=g.row, condense=index_work)
                if g.edge_val is not None:
                    tiles.block_vals = tiles.tiles_of(g.edge_val)
                torch.cuda.synchronize()
                tiles.stats.ms = 1e3 * (time.perf_counter() - t0)
                return tiles
            for _ in range(2):
                run()
            ms = statistics.median(run().stats.ms for _ in range(10))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                run()
            kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
            syncs = sum(1 for e in prof.events() if "Synchronize" in e.name)
            line.append(f"{tag} {ms:6.3f} ms ({kernels} kernels, {syncs} syncs)")
            if args.top:
                gpu = {}
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        gpu[e.name[:60]] = gpu.get(e.name[:60], 0.0) + e.device_time / 1000.0
                for kname, kms in sorted(gpu.items(), key=lambda kv: -kv[1])[:args.top]:
                    print(f"    {name} {tag}: {kms:7.3f} ms  {kname}", flush=True)
            if args.timeline:
                _print_timeline(prof, f"{name} {tag}")
            if args.trace:
                Path(args.trace).mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(str(Path(args.trace) / f"{name}_{tag.replace(' ', '_')}.json"))
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
