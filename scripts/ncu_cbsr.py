"""Run the CBSR SpGEMM forward and SSpMM backward (k = --k, F = 256) twice each on the Reddit
stand-in, for Nsight Compute to profile (GPU machine)::

    ncu --kernel-name regex:cbsr_ --launch-count 2 --section SpeedOfLight \
        python scripts/ncu_cbsr.py --k 32
"""
import argparse
import sys

import torch

sys.path.insert(0, "src")
import sparsegnn as sg  # noqa: E402
from sparsegnn.bench.harness import bench_graph  # noqa: E402
from sparsegnn.kernels import cbsr_cuda  # noqa: E402
from sparsegnn.ops._dispatch import plan_of  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--graph", default="reddit")
parser.add_argument("--k", type=int, default=32)
parser.add_argument("--cols", type=int, default=256)
args = parser.parse_args()
g = bench_graph(args.graph, device="cuda")
h = torch.randn(g.num_nodes, args.cols, device="cuda")
grad = torch.randn(g.num_nodes, args.cols, device="cuda")
c = sg.maxk(h, args.k)
plan = plan_of(g)
scale = g.inv_degree if hasattr(g, "inv_degree") else None
for _ in range(2):
    cbsr_cuda.spgemm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, None, c.values, c.index, g.num_nodes,
                               args.cols)
    cbsr_cuda.sspmm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, None, grad, c.index, g.num_src)
torch.cuda.synchronize()
print("done")
