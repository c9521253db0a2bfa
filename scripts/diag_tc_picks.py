"""Why a ``spmm(precision=...)`` pick differs from the fastest kernel (GPU): for each case the
``spmm_tc`` candidates timed the tuner's way (``tune.autotune._time_candidates``, single calls
after an L2 flush, three rounds) and as CUDA-graph replays (no host work), then the stored pick::

    PYTHONPATH=src SPARSEGNN_DATA=.data python scripts/diag_tc_picks.py paper:com-amazon:128:bf16 real:cora:32:tf32
"""
import sys

import torch
from triton.testing import do_bench

sys.path[:0] = ["src", "scripts"]
from sparsegnn.bench.harness import bench_graph  # noqa: E402
from sparsegnn.ops import tiles as T  # noqa: E402
from sparsegnn.tune import autotune as A  # noqa: E402
from sparsegnn.tune import lookup  # noqa: E402
from time_tiles import _captured as captured  # noqa: E402


for spec in sys.argv[1:]:
    suite, name, f, precision = spec.split(":")
    f = int(f)
    g = bench_graph(name, device="cuda", real=suite == "real")
    g = g.with_values(torch.rand(g.num_edges, device="cuda") + 0.5)
    x = torch.randn(g.num_src, f, device="cuda")
    if precision == "bf16":
        x = x.bfloat16()
    half = x.dtype == torch.bfloat16
    T.precise_aggregate(g, x, g.edge_val, "sum", precision)        # the decision, as a user's call makes it
    rec = lookup(T.TC_FAMILY, g, precision, f, x.dtype, x.device) or {}
    cands = T.tc_candidates(f, half, g.num_edges <= g.num_nodes * g.num_src, g.num_edges * f >= T.PACKED_MIN_WORK)
    run = lambda cfg: T._run_sum(g, x, g.edge_val, precision, cfg)  # noqa: E731
    rounds = [A._time_candidates(run, cands, x.device) for _ in range(3)]
    print(f"{spec}: pick {rec.get('config')} ({rec.get('ms')} ms, {rec.get('source')})")
    for i, cfg in enumerate(cands):
        eager = do_bench(lambda c=cfg: run(c), warmup=10, rep=30, return_mode="median")
        cap = do_bench(captured(lambda c=cfg: run(c)), warmup=10, rep=30, return_mode="median")
        print(f"   {str(cfg):70s} tuner {' '.join('%.4f' % r[i] for r in rounds)}  do_bench {eager:.4f}  captured {cap:.4f}",
              flush=True)
