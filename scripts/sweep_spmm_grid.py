"""Grid sweep of SpMM (sum, fp32) schedules on stand-in graphs, timed as the benchmark times
(``triton.testing.do_bench`` median, L2 flushed before every call), next to cuSPARSE.

For each case it times every flat single-launch config, every single-launch row-group config
and the planned (multi-launch) candidates.  Prints, per case: cuSPARSE, the public op (fresh
graph, so the autotuner picks), the best overall, the best of the autotuning candidates
(``configs.spmm_candidates``) and of each family; writes JSON lines to $OUT/sweep_grid.jsonl.
Usage:

    PYTHONPATH=src python scripts/sweep_spmm_grid.py pubmed:64,128 artist:128,256
"""
import json
import os
import sys
import time

import torch
import triton.testing

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.datasets.synthetic import STAND_INS, stand_in_graph
from sparsegnn.kernels.configs import SPMM_SPACE, in_space, next_pow2, spmm_candidates, spmm_chunk
from sparsegnn.kernels.spmm_csr import spmm_planned

bench = lambda fn: triton.testing.do_bench(fn, warmup=5, rep=15, return_mode="median")  # noqa: E731


def grid(num_feats):
    full = min(max(next_pow2(num_feats), 16), 256)
    widths = [w for w in (32, 64, 128, 256) if w <= max(full, 32)]
    fits = lambda tile, nw: 256 * nw <= tile <= 4096 * nw and tile <= 8192  # noqa: E731
    flat = [{"FLAT": 1, "ROWS": 1, "BLOCK_E": e, "BLOCK_F": w, "num_warps": nw}
            for w in widths for e in (4, 8, 16, 32) for nw in (1, 2, 4) if fits(e * w, nw)]
    grouped = [{"GROUP_ROWS": r, "GROUP_E": e, "BLOCK_F": w, "ROWS": 1, "BLOCK_E": min(max(2048 // w, 8), 32),
                "num_warps": nw, "SEG_WARPS": 4, "LIGHT_STEPS": 64}
               for w in widths if w <= 128 for r in (4, 8, 16, 32, 64) for e in (1, 2) for nw in (1, 2, 4)
               if fits(r * e * w, nw)]
    return {"flat": flat, "grouped": grouped}


def main():
    out_path = os.path.join(os.environ.get("OUT", "/tmp"), "sweep_grid.jsonl")
    summary = []
    for spec_arg in sys.argv[1:]:
        name, _, dims = spec_arg.partition(":")
        spec = STAND_INS[name]
        ei = stand_in_graph(name, device="cuda")
        weight = torch.rand(ei.shape[1], device="cuda") + 0.5
        g = Graph.from_edge_index(ei, weight, num_nodes=spec.num_nodes)
        g = Graph(g.rowptr, g.col, g.edge_val, g.num_nodes)
        del ei, weight
        plan = g.row_plan(spmm_chunk(g.num_nodes, g.num_edges))
        csr = g.to_torch_sparse_csr()
        for num_feats in [int(d) for d in dims.split(",")]:
            x = torch.randn(spec.num_nodes, num_feats, device="cuda")
            ref = torch.sparse.mm(csr.double(), x.double()) if g.num_edges < 3e6 else torch.sparse.mm(csr, x).double()
            cusparse_ms = bench(lambda: torch.sparse.mm(csr, x))
            fams = grid(num_feats)
            fams["planned"] = [c for c in spmm_candidates(g.num_nodes, g.num_edges, num_feats, 4, plan.max_degree)
                                if "LIGHT_STEPS" not in c and not c.get("FLAT")]
            results = []
            t0 = time.time()
            for fam, configs in fams.items():
                for cfg in configs:
                    assert in_space(cfg, SPMM_SPACE), cfg
                    fn = lambda c=cfg: spmm_planned(g.rowptr, plan, g.edge_val, x, "sum", config=c)  # noqa: E731
                    err = float((fn().double() - ref).norm() / ref.norm())
                    assert err < 1e-5, (cfg, err)
                    results.append((bench(fn), fam, cfg))
            results.sort(key=lambda r: r[0])
            cands = spmm_candidates(g.num_nodes, g.num_edges, num_feats, 4, plan.max_degree)
            best_candidate = min((ms, cfg) for ms, _, cfg in results if cfg in cands) if any(
                cfg in cands for _, _, cfg in results) else (float("nan"), None)
            fresh = Graph(g.rowptr, g.col, g.edge_val, g.num_nodes)
            t1 = time.perf_counter()
            sg.spmm(fresh, x)
            torch.cuda.synchronize()
            tune_s = time.perf_counter() - t1
            op_ms = bench(lambda: sg.spmm(fresh, x))
            from sparsegnn.ops._dispatch import spmm_detail
            from sparsegnn.tune import lookup

            record = lookup("spmm", fresh, spmm_detail(fresh.edge_val, "sum"), num_feats, x.dtype, x.device)
            picked = record["config"] if record else None
            best_by_family = {}
            for ms, fam, cfg in results:
                best_by_family.setdefault(fam, (ms, cfg))
            row = dict(graph=name, F=num_feats, nodes=g.num_nodes, nnz=g.num_edges, cusparse_ms=cusparse_ms, op_ms=op_ms,
                       tune_s=tune_s, picked=picked, best_ms=results[0][0], best=results[0][2], best_family=results[0][1],
                       families={f: {"ms": m, "config": c} for f, (m, c) in best_by_family.items()},
                       best_candidate_ms=best_candidate[0], best_candidate=best_candidate[1], candidates=cands,
                       top8=[(m, f, c) for m, f, c in results[:8]], n_configs=len(results), sweep_s=time.time() - t0)
            summary.append(row)
            with open(out_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{name} F={num_feats}: cusparse {cusparse_ms:.4f} op {op_ms:.4f} best {results[0][0]:.4f} "
                  f"({results[0][1]} {results[0][2]}) picked {picked}", flush=True)
            del x, ref
        del g, csr, plan
        torch.cuda.empty_cache()
    print(f"\n{'graph':16} {'F':>4} {'cusparse':>9} {'op':>8} {'x op':>6} {'best':>8} {'x best':>6} "
          f"{'cand':>8} {'flat':>8} {'grouped':>8} {'planned':>8}  best family")
    for r in summary:
        fam = r["families"]
        get = lambda k: min([v["ms"] for f, v in fam.items() if f.startswith(k)], default=float("nan"))  # noqa: E731
        print(f"{r['graph']:16} {r['F']:>4} {r['cusparse_ms']:9.4f} {r['op_ms']:8.4f} {r['cusparse_ms'] / r['op_ms']:6.2f} "
              f"{r['best_ms']:8.4f} {r['cusparse_ms'] / r['best_ms']:6.2f} {r['best_candidate_ms']:8.4f} "
              f"{get('flat'):8.4f} {get('grouped'):8.4f} "
              f"{get('planned'):8.4f}  {r['best_family']}")


if __name__ == "__main__":
    main()
