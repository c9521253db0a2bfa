"""Translation cost on the GPU (issue 9's bar: at most one GCN epoch): median ``stats.ms`` of
``formats.tiles.translate`` over 10 calls, with the CUDA kernels and host syncs of one call and,
for the graphs named second, the profiler's table of host time per op::

    PYTHONPATH=src SPARSEGNN_DATA=.data python scripts/probe_translate.py cora,deezer,yelp [cora]
"""
import statistics
import sys

import torch

sys.path[:0] = ["src"]
from sparsegnn.bench.harness import bench_graph  # noqa: E402
from sparsegnn.datasets.suite import REAL_SUITE  # noqa: E402
from sparsegnn.formats.tiles import translate  # noqa: E402

names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(REAL_SUITE)
profile = sys.argv[2].split(",") if len(sys.argv) > 2 else []
for name in names:
    g = bench_graph(name, device="cuda", real=name in REAL_SUITE)
    for _ in range(2):
        translate(g.rowptr, g.col, g.num_src, g.edge_val)
    ms = statistics.median(translate(g.rowptr, g.col, g.num_src, g.edge_val).stats.ms for _ in range(10))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        translate(g.rowptr, g.col, g.num_src, g.edge_val)
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    syncs = sum(1 for e in prof.events() if "Synchronize" in e.name)
    print(f"{name:22s} E={g.num_edges:>9d}  {ms:6.2f} ms ({kernels} kernels, {syncs} syncs)", flush=True)
    if name in profile:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14), flush=True)
