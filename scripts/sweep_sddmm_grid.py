"""Grid sweep of the row-wise SDDMM (dot, fp32) on stand-in graphs, timed as the benchmark times
(``triton.testing.do_bench`` median, L2 flushed before every call), next to
``torch.sparse.sampled_addmm``.

Prints per case: sampled_addmm, the public op (fresh graph, so the autotuner picks), the best
config overall and the best of the autotuning candidates (``configs.sddmm_candidates``);
writes JSON lines to $OUT/sweep_sddmm.jsonl.  Usage:

    PYTHONPATH=src python scripts/sweep_sddmm_grid.py pubmed:32,128 reddit:32
"""
import json
import os
import sys

import torch
import triton.testing

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.datasets.synthetic import STAND_INS, stand_in_graph
from sparsegnn.kernels.configs import SDDMM_SPACE, in_space, next_pow2, sddmm_candidates, spmm_chunk
from sparsegnn.kernels.sddmm_csr import sddmm_csr

bench = lambda fn: triton.testing.do_bench(fn, warmup=5, rep=15, return_mode="median")  # noqa: E731


def grid(num_feats):
    full = min(max(next_pow2(num_feats), 16), 256)
    return [{"ROWS": r, "BLOCK_E": e, "BLOCK_F": w, "num_warps": nw}
            for w in (32, 64, 128, 256) if w <= max(full, 32) for e in (4, 8, 16, 32) for r in (1, 2, 4)
            for nw in (1, 2, 4) if 128 * nw <= e * w <= 4096 * nw]


def main():
    out_path = os.path.join(os.environ.get("OUT", "/tmp"), "sweep_sddmm.jsonl")
    summary = []
    for spec_arg in sys.argv[1:]:
        name, _, dims = spec_arg.partition(":")
        spec = STAND_INS[name]
        ei = stand_in_graph(name, device="cuda")
        g = Graph.from_edge_index(ei, num_nodes=spec.num_nodes)
        g = Graph(g.rowptr, g.col, None, g.num_nodes)
        del ei
        plan = g.row_plan(spmm_chunk(g.num_nodes, g.num_edges))
        template = torch.sparse_csr_tensor(g.rowptr, g.col, torch.zeros(g.num_edges, device="cuda"),
                                           (g.num_nodes, g.num_nodes))
        for num_feats in [int(d) for d in dims.split(",")]:
            a = torch.randn(spec.num_nodes, num_feats, device="cuda")
            b = torch.randn(spec.num_nodes, num_feats, device="cuda")
            ref = torch.sparse.sampled_addmm(template, a, b.t(), beta=0.0).values().double()
            base_ms = bench(lambda: torch.sparse.sampled_addmm(template, a, b.t(), beta=0.0))
            cands = sddmm_candidates(g.num_nodes, g.num_edges, num_feats, "dot")
            configs = grid(num_feats)
            configs += [c for c in cands if c not in configs]
            results = []
            for cfg in configs:
                assert in_space(cfg, SDDMM_SPACE), cfg
                fn = lambda c=cfg: sddmm_csr(plan, a, b, "dot", config=c)  # noqa: E731
                err = float((fn().double() - ref).norm() / ref.norm())
                assert err < 1e-5, (cfg, err)
                results.append((bench(fn), cfg))
            results.sort(key=lambda r: r[0])
            fresh = Graph(g.rowptr, g.col, None, g.num_nodes)
            sg.sddmm(fresh, a, b, "dot")
            op_ms = bench(lambda: sg.sddmm(fresh, a, b, "dot"))
            picked = next(v for k, v in fresh.cache.items() if isinstance(k, tuple) and k[0] == "sddmm_config")
            best_cand = min((ms, c) for ms, c in results if c in cands)
            row = dict(graph=name, F=num_feats, nodes=g.num_nodes, nnz=g.num_edges, sampled_addmm_ms=base_ms,
                       op_ms=op_ms, picked=picked, best_ms=results[0][0], best=results[0][1],
                       best_candidate_ms=best_cand[0], best_candidate=best_cand[1], top6=results[:6])
            summary.append(row)
            with open(out_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{name} F={num_feats}: sampled_addmm {base_ms:.4f} op {op_ms:.4f} best {results[0][0]:.4f} "
                  f"{results[0][1]} picked {picked}", flush=True)
            del a, b, ref
        del g, plan, template
        torch.cuda.empty_cache()
    print(f"\n{'graph':16} {'F':>4} {'sampled':>9} {'op':>8} {'x op':>6} {'best':>8} {'x best':>6} {'cand':>8}  best")
    for r in summary:
        print(f"{r['graph']:16} {r['F']:>4} {r['sampled_addmm_ms']:9.4f} {r['op_ms']:8.4f} "
              f"{r['sampled_addmm_ms'] / r['op_ms']:6.2f} {r['best_ms']:8.4f} {r['sampled_addmm_ms'] / r['best_ms']:6.2f} "
              f"{r['best_candidate_ms']:8.4f}  {r['best']}")


if __name__ == "__main__":
    main()
