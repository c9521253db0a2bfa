"""GPU time of the batched layer pieces of issue 11: the fused GCN layer (``ops.gcn_fused``) against
SpMM + matmul + bias + ReLU, and the Triton ``global_pool`` against ``torch.segment_reduce``.

Kernel (GPU) time by ``triton.testing.do_bench_cudagraph`` (forward, and forward + backward);
wall time per eager forward + backward call (host included) for the layer.  Batches from
``small_graph_batch``: molecules 200 x 25-50 and 1000 x 15-30 atoms, dense 200 x 25-50 nodes.
Writes ``<out>/batched_layer.json`` and ``.md``::

    PYTHONPATH=src python scripts/time_batched_layer.py --out benchmarks/h100
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sparsegnn import Graph, spmm  # noqa: E402
from sparsegnn.datasets.synthetic import small_graph_batch  # noqa: E402
from sparsegnn.kernels.gcn_batched import gcn_config  # noqa: E402
from sparsegnn.ops.gcn_fused import batched_gcn  # noqa: E402
from sparsegnn.ops.pool import global_pool  # noqa: E402

CASES = [("molecule", 200, 25, 50), ("molecule", 1000, 15, 30), ("dense", 200, 25, 50)]
WIDTHS = [(48, 64), (64, 64), (512, 512)]


def bench(fn) -> float:
    """Microseconds of GPU time per call (CUDA graph replays)."""
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=100)


def wall(fn, reps=50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - start) / reps


def unfused(x, g, w, b):
    out = spmm(g, x @ w) if w.shape[1] <= w.shape[0] else spmm(g, x) @ w
    return torch.relu(out + b)


def batch_graph(kind, num, lo, hi):
    ei, ptr = small_graph_batch(num, lo, hi, kind, seed=0, device="cuda")
    g = Graph.from_edge_index(ei, num_nodes=int(ptr[-1]))
    g.ptr = ptr
    g.set_batch_stats(hi)
    return g


def layer_rows():
    rows = []
    for kind, num, lo, hi in CASES:
        g = batch_graph(kind, num, lo, hi)
        for f_in, f_out in WIDTHS:
            x = torch.randn(g.num_nodes, f_in, device="cuda")
            w = torch.randn(f_in, f_out, device="cuda") / f_in ** 0.5
            b = torch.randn(f_out, device="cuda")
            row = {"kind": kind, "graphs": f"{num} x {lo}-{hi}", "f_in": f_in, "f_out": f_out,
                   "unfused_fwd_us": bench(lambda: unfused(x, g, w, b))}
            for pack in (0, 1):
                cfg = dict(gcn_config(hi, f_in, f_out), PACK=pack)
                row[f"fused_pack{pack}_fwd_us"] = bench(lambda: batched_gcn(x, g, w, b, "relu", config=cfg))
            xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
            step_u = lambda: unfused(xg, g, wg, bg).sum().backward()  # noqa: E731
            step_f = lambda: batched_gcn(xg, g, wg, bg, "relu").sum().backward()  # noqa: E731
            row.update(unfused_fwdbwd_us=bench(step_u), fused_fwdbwd_us=bench(step_f),
                       unfused_fwdbwd_wall_us=wall(step_u), fused_fwdbwd_wall_us=wall(step_f))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def pool_rows():
    rows = []
    for kind, num, lo, hi in CASES[:2] + [("molecule", 32, 20, 60)]:
        g = batch_graph(kind, num, lo, hi)
        for f in (64, 512):
            x = torch.randn(g.num_nodes, f, device="cuda")
            xg = x.clone().requires_grad_()
            for reduce in ("sum", "mean", "max"):
                row = {"graphs": f"{num} x {lo}-{hi}", "F": f, "reduce": reduce}
                for backend in ("triton", "reference"):
                    row[f"{backend}_fwd_us"] = bench(lambda: global_pool(x, g.ptr, reduce, backend=backend))
                    row[f"{backend}_fwdbwd_us"] = bench(
                        lambda: global_pool(xg, g.ptr, reduce, backend=backend).sum().backward())
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def markdown(layer, pool) -> str:
    lines = [f"# Batched layer pieces ({torch.cuda.get_device_name()})", "",
             "GPU time per call by CUDA-graph replays (us); wall = eager forward + backward call, host included.", "",
             "## Fused GCN layer act(A X W + b) vs SpMM + matmul + bias + ReLU", "",
             "| batch | F_in -> F_out | unfused fwd | fused fwd | fused PACK=1 | unfused fwd+bwd | fused fwd+bwd | "
             "unfused wall | fused wall |", "|---|---|---|---|---|---|---|---|---|"]
    for r in layer:
        lines.append(f"| {r['kind']} {r['graphs']} | {r['f_in']} -> {r['f_out']} | {r['unfused_fwd_us']:.1f} | "
                     f"{r['fused_pack0_fwd_us']:.1f} | {r['fused_pack1_fwd_us']:.1f} | {r['unfused_fwdbwd_us']:.1f} | "
                     f"{r['fused_fwdbwd_us']:.1f} | {r['unfused_fwdbwd_wall_us']:.0f} | {r['fused_fwdbwd_wall_us']:.0f} |")
    lines += ["", "## global_pool: Triton vs torch.segment_reduce", "",
              "| batch | F | reduce | triton fwd | segment_reduce fwd | triton fwd+bwd | segment_reduce fwd+bwd |",
              "|---|---|---|---|---|---|---|"]
    for r in pool:
        lines.append(f"| {r['graphs']} | {r['F']} | {r['reduce']} | {r['triton_fwd_us']:.1f} | "
                     f"{r['reference_fwd_us']:.1f} | {r['triton_fwdbwd_us']:.1f} | {r['reference_fwdbwd_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/sparsegnn-out")
    parser.add_argument("--parts", default="layer,pool")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    layer = layer_rows() if "layer" in parts else []
    pool = pool_rows() if "pool" in parts else []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batched_layer.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "layer": layer,
                                                        "pool": pool}, indent=1))
    text = markdown(layer, pool)
    (out / "batched_layer.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
