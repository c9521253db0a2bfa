"""Coordinate-descent sweep of the planned SpMM's configs on stand-in graphs (GPU).

For each (graph, F): start from the heuristic config, then try every value of one parameter
at a time (BLOCK_F, BLOCK_E, ROWS, num_warps, chunk), keeping the best.  Prints heuristic vs
best vs cuSPARSE; writes JSON lines to $OUT/sweep.jsonl.  Usage:
    PYTHONPATH=src python scripts/sweep_spmm.py amazon0505,reddit 32,256
"""
import json
import os
import sys

import torch
import triton.testing

from sparsegnn import Graph
from sparsegnn.datasets.synthetic import STAND_INS, stand_in_graph
from sparsegnn.kernels.configs import SPMM_CHUNKS, SPMM_SPACE, spmm_chunk, spmm_plan_config
from sparsegnn.kernels.spmm_csr import spmm_planned

graphs = sys.argv[1].split(",")
dims = [int(d) for d in sys.argv[2].split(",")]
dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.float32
out_path = os.path.join(os.environ.get("OUT", "/tmp"), "sweep.jsonl")
bench = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")  # noqa: E731
summary = []
for name in graphs:
    spec = STAND_INS[name]
    ei = stand_in_graph(name, device="cuda")
    g = Graph.from_edge_index(ei, torch.rand(ei.shape[1], device="cuda") + 0.5, num_nodes=spec.num_nodes)
    del ei
    csr = g.to_torch_sparse_csr()
    for num_feats in dims:
        x = torch.randn(spec.num_nodes, num_feats, device="cuda").to(dtype)
        ref = torch.sparse.mm(csr, x.float()) if dtype != torch.float32 else torch.sparse.mm(csr, x)
        ms_cusparse = bench(lambda: torch.sparse.mm(csr, x.float())) if dtype == torch.float32 else float("nan")
        chunk = spmm_chunk(g.num_nodes, g.num_edges)
        cfg = spmm_plan_config(g.num_nodes, g.num_edges, num_feats, x.element_size())

        def run(c, ch):
            plan = g.row_plan(ch)
            return bench(lambda: spmm_planned(g.rowptr, plan, g.edge_val, x, "sum", config=c))

        heur_ms = run(cfg, chunk)
        out = spmm_planned(g.rowptr, g.row_plan(chunk), g.edge_val, x, "sum", config=cfg).float()
        err = float((out - ref).norm() / ref.norm())
        best, best_ms, best_chunk = dict(cfg), heur_ms, chunk
        space = {key: [v for v in SPMM_SPACE[key] if key != "BLOCK_F" or 32 <= v <= max(32, num_feats)]
                 for key in ("BLOCK_F", "GROUP_E", "GROUP_ROWS", "num_warps", "BLOCK_E", "ROWS")}
        for key, values in space.items():
            for v in values:
                trial = dict(best, **{key: v})
                too_big = trial["GROUP_ROWS"] * trial["GROUP_E"] * trial["BLOCK_F"] > 16384
                if trial["BLOCK_E"] * trial["BLOCK_F"] > 8192 or too_big or trial == best:
                    continue
                ms = run(trial, best_chunk)
                if ms < best_ms:
                    best, best_ms = trial, ms
        for ch in SPMM_CHUNKS:
            if ch != best_chunk:
                ms = run(best, ch)
                if ms < best_ms:
                    best_ms, best_chunk = ms, ch
        import sparsegnn as sg

        op_ms = bench(lambda: sg.spmm(g, x))  # public op, Python overhead included
        row = dict(op_ms=op_ms, graph=name, nodes=g.num_nodes, nnz=g.num_edges, F=num_feats, dtype=str(dtype), heuristic=cfg,
                   chunk=chunk, heur_ms=heur_ms, best=best, best_chunk=best_chunk, best_ms=best_ms,
                   cusparse_ms=ms_cusparse, rel_err_vs_cusparse=err)
        summary.append(row)
        print(json.dumps(row), flush=True)
        with open(out_path, "a") as f:
            f.write(json.dumps(row) + "\n")
    del g, csr
    torch.cuda.empty_cache()
print(f"\n{'graph':16} {'F':>4} {'cusparse':>9} {'op':>8} {'heur':>8} {'best':>8} {'x heur':>7} {'x best':>7}  best config")
for r in summary:
    b = r["best"]
    print(f"{r['graph']:16} {r['F']:>4} {r['cusparse_ms']:9.3f} {r['op_ms']:8.3f} {r['heur_ms']:8.3f} {r['best_ms']:8.3f} "
          f"{r['cusparse_ms'] / r['heur_ms']:7.2f} {r['cusparse_ms'] / r['best_ms']:7.2f}  "
          f"G{b['GROUP_ROWS']}x{b['GROUP_E']} R{b['ROWS']} E{b['BLOCK_E']} F{b['BLOCK_F']} w{b['num_warps']} chunk{r['best_chunk']}")
