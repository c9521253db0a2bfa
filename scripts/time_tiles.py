"""First look at the tile SpMM (issue 9): translation cost, block statistics and SpMM time vs
cuSPARSE (``torch.sparse.mm`` on CSR) and our CUDA-core SpMM, per graph and width::

    python scripts/time_tiles.py --graphs wikipedia,deezer --dims 64,256
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from sparsegnn import sddmm, spmm  # noqa: E402
from sparsegnn.bench.harness import bench_graph  # noqa: E402
from sparsegnn.formats.tiles import translate  # noqa: E402
from sparsegnn.kernels.spmm_tiles import sddmm_tiles, spmm_tiles  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default="cora,wikipedia,deezer,reddit-threads-10k")
    parser.add_argument("--dims", default="64,256")
    args = parser.parse_args()
    from triton.testing import do_bench

    print("| graph | F | windows | blocks plain | blocks | fill | translate ms | tiles tf32 ms | tiles ieee ms "
          "| ours CUDA-core ms | cuSPARSE ms | rel err tf32 | SDDMM tiles tf32 ms | SDDMM row-wise ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.graphs.split(","):
        g = bench_graph(name, device="cuda", real=True)
        g = g.with_values(torch.rand(g.num_edges, device="cuda") + 0.5)
        tiles = translate(g.rowptr, g.col, g.num_src, g.edge_val)
        csr = g.to_torch_sparse_csr()
        for f in [int(v) for v in args.dims.split(",")]:
            x = torch.randn(g.num_src, f, device="cuda")
            ref = torch.sparse.mm(csr.double(), x.double())
            out = spmm_tiles(tiles, x, precision="tf32")
            err = float((out.double() - ref).norm() / ref.norm())
            t_tf32 = do_bench(lambda: spmm_tiles(tiles, x, precision="tf32"))
            t_ieee = do_bench(lambda: spmm_tiles(tiles, x, precision="ieee"))
            t_ours = do_bench(lambda: spmm(g, x, edge_weight=g.edge_val))
            t_cusp = do_bench(lambda: torch.sparse.mm(csr, x))
            y = torch.randn(g.num_nodes, f, device="cuda")
            t_sd_tiles = do_bench(lambda: sddmm_tiles(tiles, y, x, precision="tf32"))
            t_sd_rows = do_bench(lambda: sddmm(g, y, x))
            s = tiles.stats
            print(f"| {name} | {f} | {s.windows} | {s.blocks_plain} | {s.blocks} | {s.fill:.3f} | {s.ms:.1f} "
                  f"| {t_tf32:.3f} | {t_ieee:.3f} | {t_ours:.3f} | {t_cusp:.3f} | {err:.1e} | {t_sd_tiles:.3f} "
                  f"| {t_sd_rows:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
