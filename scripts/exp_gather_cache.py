"""Experiment (GPU): does the cache path of the gathered ``x`` rows limit the flat row SpMM on
L2-resident mid-size graphs (artist, pubmed, ppi: L1/TEX 90% busy, L1 hit 18% in ncu)?  A copy
of the flat row kernel with the gather's ``cache_modifier`` / ``eviction_policy`` as
parameters, every variant over a few widths and edge blocks, against cuSPARSE::

    PYTHONPATH=src python scripts/exp_gather_cache.py artist:128 pubmed:128 ppi:64
"""
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, "src")
import sparsegnn as sg  # noqa: E402
from sparsegnn.bench.harness import bench_graph  # noqa: E402


@triton.jit
def _rows(rowptr_ptr, col_ptr, val_ptr, x_ptr, out_ptr, num_feats, stride_x, stride_out,
          BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, MODE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    feat = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    feat_mask = feat < num_feats
    start = tl.load(rowptr_ptr + row)
    end = tl.load(rowptr_ptr + row + 1)
    acc = tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.float32)
    for edge0 in range(start, end, BLOCK_E):
        edge = edge0 + tl.arange(0, BLOCK_E)
        edge_mask = edge < end
        src = tl.load(col_ptr + edge, mask=edge_mask, other=0).to(tl.int64)
        w = tl.load(val_ptr + edge, mask=edge_mask, other=0.0)
        ptrs = x_ptr + src[:, None] * stride_x + feat[None, :]
        mask = edge_mask[:, None] & feat_mask[None, :]
        if MODE == 0:
            tile = tl.load(ptrs, mask=mask, other=0.0)
        elif MODE == 1:
            tile = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
        elif MODE == 2:
            tile = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_last")
        elif MODE == 3:
            tile = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
        else:   # edge mask only on the edge axis: whole rows (num_feats % BLOCK_F == 0)
            tile = tl.load(ptrs, mask=edge_mask[:, None], other=0.0)
        acc += tile * w[:, None]
    tl.store(out_ptr + row * stride_out + feat, tl.sum(acc, axis=0), mask=feat_mask)


def main():
    for spec in sys.argv[1:]:
        name, f = spec.split(":")
        f = int(f)
        g = bench_graph(name, device="cuda", real=False)
        g = g.with_values(torch.rand(g.num_edges, device="cuda") + 0.5)
        x = torch.randn(g.num_src, f, device="cuda")
        csr = g.to_torch_sparse_csr()
        ref = torch.sparse.mm(csr, x)
        col32 = g.col.to(torch.int32)
        out = torch.empty_like(ref)
        base = do_bench(lambda: torch.sparse.mm(csr, x), warmup=10, rep=40, return_mode="median")
        sg.spmm(g, x, edge_weight=g.edge_val)
        ours = do_bench(lambda: sg.spmm(g, x, edge_weight=g.edge_val), warmup=10, rep=40, return_mode="median")
        res = []
        for be in (8, 16, 32):
            for bf in (32, 64, 128):
                if bf > f:
                    continue
                for warps in (1, 2, 4):
                    for mode in range(5):
                        grid = (g.num_nodes, triton.cdiv(f, bf))
                        fn = lambda: _rows[grid](g.rowptr, col32, g.edge_val, x, out, f, x.stride(0), out.stride(0),  # noqa: E731
                                                 BLOCK_E=be, BLOCK_F=bf, MODE=mode, num_warps=warps)
                        fn()
                        err = float((out - ref).norm() / ref.norm())
                        assert err < 1e-5, (spec, be, bf, warps, mode, err)
                        res.append((do_bench(fn, warmup=10, rep=40, return_mode="median"), be, bf, warps, mode))
        res.sort()
        best_by_mode = {}
        for ms, be, bf, warps, mode in res:
            best_by_mode.setdefault(mode, (ms, be, bf, warps))
        print(f"{spec}: cuSPARSE {base:.4f} ms, ours tuned {ours:.4f}; best per mode (ms, BLOCK_E, BLOCK_F, warps): "
              + "; ".join(f"m{m} {v[0]:.4f} {v[1:]} {base / v[0]:.2f}x" for m, v in sorted(best_by_mode.items())), flush=True)


if __name__ == "__main__":
    main()
