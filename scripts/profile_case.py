"""Profile one SpMM case under Nsight Compute: the autotuned sparsegnn kernels next to cuSPARSE.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy \\
        python scripts/profile_case.py artist 128
Autotuning runs before the profiled range, so only the chosen kernels and cuSPARSE are captured.
"""
import sys

import torch

import sparsegnn as sg
from sparsegnn.datasets.synthetic import STAND_INS, stand_in_graph

name, num_feats = sys.argv[1], int(sys.argv[2])
spec = STAND_INS[name]
ei = stand_in_graph(name, device="cuda")
g = sg.Graph.from_edge_index(ei, torch.rand(ei.shape[1], device="cuda") + 0.5, num_nodes=spec.num_nodes)
x = torch.randn(spec.num_nodes, num_feats, device="cuda")
csr = g.to_torch_sparse_csr()
for _ in range(3):
    sg.spmm(g, x)
    torch.sparse.mm(csr, x)
torch.cuda.synchronize()
print("chosen config:", {k: v for k, v in g.cache.items() if isinstance(k, tuple) and k[0] == "spmm_config"})
torch.cuda.profiler.start()
sg.spmm(g, x)
torch.sparse.mm(csr, x)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
