"""Translation cost on the GPU (issue 9's bar: at most one GCN epoch): median ``stats.ms`` of
``formats.tiles.translate`` over 10 calls, the index work by tensor ops and by the Triton
``kernels.translate.condense``, with the CUDA kernels and host syncs of one call and,
for the graphs named second, the profiler's table of host time per op.  The graphs come without
edge values, so no tile values are built (``scripts/time_tiles.py`` builds them: its times are
the ones to hold against an epoch)::

    PYTHONPATH=src SPARSEGNN_DATA=.data python scripts/probe_translate.py cora,deezer,yelp [cora]
"""
import statistics
import sys

import torch

sys.path[:0] = ["src"]
from sparsegnn.bench.harness import bench_graph  # noqa: E402
from sparsegnn.datasets.suite import REAL_SUITE  # noqa: E402
from sparsegnn.formats.tiles import translate  # noqa: E402
from sparsegnn.kernels.translate import condense  # noqa: E402

names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(REAL_SUITE)
profile = sys.argv[2].split(",") if len(sys.argv) > 2 else []
for name in names:
    g = bench_graph(name, device="cuda", real=name in REAL_SUITE)
    line = [f"{name:22s} E={g.num_edges:>9d}"]
    for tag, index_work in (("tensor ops", None), ("triton", condense)):
        run = lambda: translate(g.rowptr, g.col, g.num_src, g.edge_val, condense=index_work)  # noqa: E731
        for _ in range(2):
            run()
        ms = statistics.median(run().stats.ms for _ in range(10))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            run()
        kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        syncs = sum(1 for e in prof.events() if "Synchronize" in e.name)
        line.append(f"{tag} {ms:6.2f} ms ({kernels} kernels, {syncs} syncs)")
        if name in profile and index_work is not None:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14), flush=True)
    print("  ".join(line), flush=True)
