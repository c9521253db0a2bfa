"""MaxK kernels on the GPU: the selection ``sparsegnn.maxk`` (Triton) against ``torch.relu`` and
``torch.topk`` on the same tensor (Reddit's size, 232,965 x 256 by default), per k and dtype,
checked against the reference backend; JSON rows and a markdown table::

    python -m scripts.time_maxk --out /tmp/maxk
    python -m scripts.time_maxk --ln --ks 8,32,64 --out /tmp/maxk   # LayerNorm + MaxK fused
"""
import argparse
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

import sparsegnn as sg


def _write_markdown(path: Path, lines) -> int:
    """Writes the table's lines to ``path``, prints them; 0 (the exit status)."""
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def spgemm_table(args, out: Path) -> int:
    """CBSR aggregation (sum, fp32, edge weights) on a stand-in graph per k: forward
    ``spmm(g, maxk(h, k))`` and backward (the sampled ``A^T dY``) against cuSPARSE's and our
    dense SpMM at F = ``args.cols``; relative error against the dense product of the same
    kept entries."""
    from sparsegnn.benchmark import bench_graph
    from sparsegnn.kernels import cbsr_cuda
    from sparsegnn.ops._common import transposed_weights
    from sparsegnn.ops._triton import plan_of
    from sparsegnn.ops.cbsr import backward_schedule, forward_schedule

    if not cbsr_cuda.available():
        print("--spgemm times the CUDA CBSR kernels: needs CuPy and a GPU", file=sys.stderr)
        return 2
    bench = lambda fn: float(do_bench(fn, warmup=5, rep=40, return_mode="median"))  # noqa: E731
    g = bench_graph(args.spgemm, device="cuda")
    g = g.with_values(torch.rand(g.num_edges, device="cuda") + 0.5)
    h = torch.randn(g.num_nodes, args.cols, device="cuda")
    csr = g.to_torch_sparse_csr()
    cusp = bench(lambda: torch.sparse.mm(csr, h))
    sg.spmm(g, h, edge_weight=g.edge_val)
    ours = bench(lambda: sg.spmm(g, h, edge_weight=g.edge_val))
    plan = plan_of(g)
    t, w_t, _ = transposed_weights(g, g.edge_val, "sum", torch.float32)
    grad = torch.randn(g.num_nodes, args.cols, device="cuda")
    rows = []
    for k in [int(v) for v in args.ks.split(",")]:
        c = sg.maxk(h, k)
        fwd = lambda: cbsr_cuda.spgemm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, g.edge_val, c.values,  # noqa: E731
                                                  c.index, g.num_nodes, args.cols)
        bwd = lambda: cbsr_cuda.sspmm_cbsr_cuda(g.rowptr, plan.rows_by_degree, plan.col32, g.edge_val, grad,  # noqa: E731
                                                 c.index, g.num_src)
        dense_fwd = lambda: sg.spmm(g, c.to_dense(), edge_weight=g.edge_val)  # noqa: E731
        dense_bwd = lambda: sg.spmm(t, grad, edge_weight=w_t).gather(1, c.index.long())  # noqa: E731
        want = torch.sparse.mm(csr, c.to_dense())
        want_b = c.gather(sg.spmm(t, grad, edge_weight=w_t))
        row = dict(graph=args.spgemm, nodes=g.num_nodes, nnz=g.num_edges, F=args.cols, k=k, ms_cusparse=cusp,
                   ms_ours_dense=ours, ms_spgemm=bench(fwd), ms_sspmm=bench(bwd), ms_dense_fwd=bench(dense_fwd),
                   ms_dense_bwd=bench(dense_bwd), err_fwd=float((fwd() - want).norm() / want.norm()),
                   err_bwd=float((bwd() - want_b).norm() / want_b.norm()), cuda_deterministic=bool(torch.equal(fwd(), fwd())),
                   fwd_schedule=forward_schedule(c.values, c.index, args.cols, "triton", g),
                   bwd_schedule=backward_schedule(c.values, c.index, args.cols, grad, "triton", g))
        row["ms_fwd_op"] = row["ms_spgemm"] if row["fwd_schedule"] == "spgemm" else row["ms_dense_fwd"]
        row["ms_bwd_op"] = row["ms_sspmm"] if row["bwd_schedule"] == "outer" else row["ms_dense_bwd"]
        row.update(fwd_vs_cusparse=cusp / row["ms_fwd_op"], bwd_vs_cusparse=cusp / row["ms_bwd_op"],
                   fwd_vs_ours=ours / row["ms_fwd_op"], bwd_vs_ours=ours / row["ms_bwd_op"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "maxk_spgemm.json").write_text(json.dumps({"meta": {"script": "scripts/time_maxk.py --spgemm",
                                                                "device": torch.cuda.get_device_name()}, "rows": rows}, indent=1))
    lines = [f"# CBSR aggregation on {args.spgemm} (N={g.num_nodes:,}, E={g.num_edges:,}), F = {args.cols}, fp32, "
             f"{torch.cuda.get_device_name()}", "",
             "Median ms of `triton.testing.do_bench`. Kernels: SpGEMM = forward `A X` of `maxk(h, k)` (CUDA, shared "
             "memory), outer = backward `(A^T dY)` at the kept entries (CUDA outer product, float4 atomics), dense = "
             "our SpMM of the densified features (forward) / of `A^T dY` then the kept entries gathered (backward). "
             "`op` = what "
             "`sparsegnn.spmm(g, maxk(h, k))` runs (the schedule named), against cuSPARSE and our SpMM of the dense "
             f"[N, {args.cols}] matrix (cuSPARSE {cusp:.3f} ms, ours {ours:.3f} ms). Bar: each >= 3x cuSPARSE and "
             ">= 2x ours at k = 32.", "",
             "| k | SpGEMM | outer | dense fwd | dense bwd | fwd op | bwd op | fwd x cuSPARSE "
             "| bwd x cuSPARSE | fwd x ours | bwd x ours | err fwd | err bwd |", "|" + "---|" * 13]
    lines += [f"| {r['k']} | {r['ms_spgemm']:.3f} | {r['ms_sspmm']:.3f} | {r['ms_dense_fwd']:.3f} | {r['ms_dense_bwd']:.3f} "
              f"| {r['fwd_schedule']} | {r['bwd_schedule']} "
              f"| {r['fwd_vs_cusparse']:.2f}x | {r['bwd_vs_cusparse']:.2f}x | {r['fwd_vs_ours']:.2f}x | "
              f"{r['bwd_vs_ours']:.2f}x | {r['err_fwd']:.1e} | {r['err_bwd']:.1e} |" for r in rows]
    return _write_markdown(out / "maxk_spgemm.md", lines)


def root_table(args, out: Path) -> int:
    """The root term ``X W^T + b`` of CBSR features per k (N = --rows, F_in = F_out = --cols, fp32):
    the CUDA root kernel against cuBLAS on the densified matrix (``F.linear``), and its sampled
    gradient ``(dY W)`` at the kept entries against the cuBLAS product plus a gather."""
    from sparsegnn.kernels import cbsr_cuda
    from sparsegnn.ops.cbsr import root_schedule

    bench = lambda fn: float(do_bench(fn, warmup=5, rep=40, return_mode="median"))  # noqa: E731
    h = torch.randn(args.rows, args.cols, device="cuda")
    w = torch.randn(args.cols, args.cols, device="cuda") / args.cols ** 0.5
    b = torch.randn(args.cols, device="cuda")
    wt = w.t().contiguous()
    up = torch.randn(args.rows, args.cols, device="cuda")
    rows = []
    for k in [int(v) for v in args.ks.split(",")]:
        c = sg.maxk(h, k)
        dense = c.to_dense()
        fwd, dense_fwd = bench(lambda: cbsr_cuda.cbsr_root_cuda(c.values, c.index, wt, b)), \
            bench(lambda: torch.nn.functional.linear(c.to_dense(), w, b))
        bwd, dense_bwd = bench(lambda: cbsr_cuda.cbsr_root_grad_cuda(up, c.index, wt)), \
            bench(lambda: up.mm(w).gather(1, c.index.long()))
        want = torch.nn.functional.linear(dense.double(), w.double(), b.double())
        want_g = up.double().mm(w.double()).gather(1, c.index.long())
        row = dict(rows=args.rows, cols=args.cols, k=k, ms_root=fwd, ms_dense=dense_fwd, ms_root_grad=bwd,
                   ms_dense_grad=dense_bwd, schedule=root_schedule(c.values, c.index, w, "triton"),
                   err=float((cbsr_cuda.cbsr_root_cuda(c.values, c.index, wt, b).double() - want).norm() / want.norm()),
                   err_grad=float((cbsr_cuda.cbsr_root_grad_cuda(up, c.index, wt)[0].double() - want_g).norm()
                                  / want_g.norm()))
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "maxk_root.json").write_text(json.dumps({"meta": {"script": "scripts/time_maxk.py --root",
                                                              "device": torch.cuda.get_device_name()}, "rows": rows}, indent=1))
    lines = [f"# Root term of CBSR features, {args.rows:,} x {args.cols} -> {args.cols}, fp32 ({torch.cuda.get_device_name()})",
             "", "Median ms of `triton.testing.do_bench`. root = the CUDA kernel (`cbsr_root`, W^T tiles in shared memory, "
             "k multiply-adds per output); dense = `F.linear(c.to_dense(), W, b)` (densify + cuBLAS). grad = `dvalues = "
             "(dY W)` at the kept entries: CUDA `cbsr_root_grad` against cuBLAS `dY W` + gather.", "",
             "| k | root | dense | x | root grad | dense grad | x | schedule | err | err grad |", "|" + "---|" * 10]
    lines += [f"| {r['k']} | {r['ms_root']:.3f} | {r['ms_dense']:.3f} | {r['ms_dense'] / r['ms_root']:.2f}x | "
              f"{r['ms_root_grad']:.3f} | {r['ms_dense_grad']:.3f} | {r['ms_dense_grad'] / r['ms_root_grad']:.2f}x | "
              f"{r['schedule']} | {r['err']:.1e} | {r['err_grad']:.1e} |" for r in rows]
    return _write_markdown(out / "maxk_root.md", lines)


def ln_table(args, out: Path) -> int:
    """``layer_norm_maxk`` (one Triton pass) against ``maxk(F.layer_norm(x))`` per dtype and k, forward and
    backward (the gradients of x, weight and bias from a gradient of the kept values), with the error of
    the kept values against float64 LayerNorm and whether every dropped entry is at most the smallest kept
    one (float64, within 1e-6 of the row's scale)."""
    from sparsegnn.kernels.maxk import layer_norm_maxk_backward, layer_norm_maxk_select

    bench = lambda fn: float(do_bench(fn, warmup=10, rep=50, return_mode="median"))  # noqa: E731
    rows, f = [], args.cols
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(args.rows, f, device="cuda", generator=gen) * 2 + 0.5).to(dtype).requires_grad_(True)
        w = (torch.randn(f, device="cuda", generator=gen) * 0.3 + 1).to(dtype).requires_grad_(True)
        b = (torch.randn(f, device="cuda", generator=gen) * 0.1).to(dtype).requires_grad_(True)
        y64 = torch.nn.functional.layer_norm(x.detach().double(), (f,), w.detach().double(), b.detach().double())
        for k in [int(v) for v in args.ks.split(",")]:
            fused = lambda: sg.layer_norm_maxk(x, k, w, b)  # noqa: E731
            plain = lambda: sg.maxk(torch.nn.functional.layer_norm(x, (f,), w, b), k)  # noqa: E731
            cf, cp = fused(), plain()
            up = torch.randn(args.rows, k, device="cuda", generator=gen).to(dtype)
            idx = cf.index.long()
            kept = y64.gather(1, idx)
            scale = y64.abs().amax(1, keepdim=True).clamp_min(1.0)
            dropped = y64.scatter(1, idx, -float("inf")).amax(1)
            grads_f = torch.autograd.grad(cf.values, (x, w, b), up, retain_graph=True)
            ref = [t.detach().double().requires_grad_(True) for t in (x, w, b)]
            yr = torch.nn.functional.layer_norm(ref[0], (f,), ref[1], ref[2])
            want = torch.autograd.grad(yr.gather(1, idx), ref, up.double())
            row = dict(rows=args.rows, cols=f, k=k, dtype=str(dtype).replace("torch.", ""),
                       ms_fused_fwd=bench(fused), ms_plain_fwd=bench(plain),
                       ms_fused_bwd=bench(lambda: torch.autograd.grad(cf.values, (x, w, b), up, retain_graph=True)),
                       ms_plain_bwd=bench(lambda: torch.autograd.grad(cp.values, (x, w, b), up, retain_graph=True)),
                       err_values=float(((cf.values.double() - kept).abs() / scale).max()),
                       selection_valid=bool((dropped <= kept.amin(1) + 1e-6 * scale[:, 0]).all()),
                       same_index_as_plain=float((cf.index == cp.index).all(1).float().mean()),
                       err_dx=float((grads_f[0].double() - want[0]).norm() / want[0].norm()),
                       err_dw=float((grads_f[1].double() - want[1]).norm() / want[1].norm()),
                       err_db=float((grads_f[2].double() - want[2]).norm() / want[2].norm()))
            _, _, center, rstd = layer_norm_maxk_select(x.detach(), w.detach(), b.detach(), 1e-5, k, torch.uint8)
            row["ms_bwd_kernel"] = bench(lambda: layer_norm_maxk_backward(up, cf.index, x.detach(), w.detach(),
                                                                          center, rstd))
            if dtype == torch.float32 and k == 32:
                row["ms_bwd_kernel_by_programs"] = {
                    p: bench(lambda: layer_norm_maxk_backward(up, cf.index, x.detach(), w.detach(), center, rstd,
                                                              programs=p))
                    for p in (132 * 8, 132 * 16, 132 * 32, 132 * 64)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "layer_norm_maxk.json").write_text(json.dumps({"meta": {"script": "scripts/time_maxk.py --ln",
                                                                    "device": torch.cuda.get_device_name()},
                                                           "rows": rows}, indent=1))
    lines = [f"# LayerNorm + MaxK, {args.rows:,} x {f} ({torch.cuda.get_device_name()})", "",
             "Median ms of `triton.testing.do_bench`. fused = `sparsegnn.layer_norm_maxk(x, k, w, b)` (one Triton pass; "
             "its backward one pass from the k gradients a row); plain = `maxk(F.layer_norm(x, (F,), w, b), k)` (torch's "
             "LayerNorm, our selection; backward: densify + torch's LayerNorm backward). bwd = the gradients of x, w, b "
             "from a gradient of the kept values (its kernels: `layer_norm_maxk_backward` called directly, no autograd). err = max |kept - float64| / row scale; valid = no dropped entry above "
             "the smallest kept one (float64); same = rows whose kept columns equal plain's.", "",
             "| dtype | k | fused fwd | plain fwd | x | fused bwd | (its kernels) | plain bwd | x | err | valid | same | err dx |",
             "|" + "---|" * 13]
    lines += [f"| {r['dtype']} | {r['k']} | {r['ms_fused_fwd']:.3f} | {r['ms_plain_fwd']:.3f} | "
              f"{r['ms_plain_fwd'] / r['ms_fused_fwd']:.2f}x | {r['ms_fused_bwd']:.3f} | {r['ms_bwd_kernel']:.3f} | "
              f"{r['ms_plain_bwd']:.3f} | "
              f"{r['ms_plain_bwd'] / r['ms_fused_bwd']:.2f}x | {r['err_values']:.1e} | {r['selection_valid']} | "
              f"{r['same_index_as_plain']:.4f} | {r['err_dx']:.1e} |" for r in rows]
    plot(rows, out / "layer_norm_maxk.png", f"LayerNorm + MaxK, {args.rows:,} x {f} ({torch.cuda.get_device_name()})")
    return _write_markdown(out / "layer_norm_maxk.md", lines)


def plot(rows, path: Path, title: str) -> bool:
    """Grouped bars (ms) of fused / plain forward and backward per (dtype, k); False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - the plot is optional
        print("(no matplotlib: plot skipped)")
        return False
    labels = [f"{r['dtype']}\nk={r['k']}" for r in rows]
    series = [("fused fwd", "ms_fused_fwd", "tab:green"), ("plain fwd", "ms_plain_fwd", "tab:gray"),
              ("fused bwd", "ms_fused_bwd", "tab:olive"), ("plain bwd", "ms_plain_bwd", "silver")]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.2
    for i, (name, key, color) in enumerate(series):
        ax.bar([j + (i - 1.5) * width for j in range(len(rows))], [r[key] for r in rows], width, label=name, color=color)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("ms (lower is better)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=232_965)
    parser.add_argument("--cols", type=int, default=256)
    parser.add_argument("--ks", default="8,16,32,64,128")
    parser.add_argument("--out", default="/tmp/sparsegnn-out")
    parser.add_argument("--configs", action="store_true", help="also time every num_warps at k = 32, fp32")
    parser.add_argument("--spgemm", default="", help="a stand-in graph: time the CBSR forward / backward at F = --cols "
                                                     "against cuSPARSE and our SpMM (no selection timing)")
    parser.add_argument("--root", action="store_true", help="time the CBSR root term (X W^T + b) and its gradient "
                                                             "against cuBLAS on the densified matrix")
    parser.add_argument("--ln", action="store_true", help="time layer_norm_maxk (fused) against LayerNorm then maxk")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    if args.ln:
        return ln_table(args, out)
    if args.root:
        return root_table(args, out)
    if args.spgemm:
        return spgemm_table(args, out)
    bench = lambda fn: float(do_bench(fn, warmup=10, rep=50, return_mode="median"))  # noqa: E731
    for dtype, kind in ((torch.float32, "normal"), (torch.bfloat16, "normal"), (torch.float32, "ties")):
        x = torch.randn(args.rows, args.cols, device="cuda").to(dtype)
        if kind == "ties":          # integers in about [-3, 3]: the k-th value is tied in most rows
            x = x.round()
        relu = bench(lambda: torch.relu(x))
        for k in [int(v) for v in args.ks.split(",")]:
            got = sg.maxk(x, k, backend="triton")
            ref = sg.maxk(x, k, backend="reference")
            same = bool(torch.equal(got.index, ref.index) and torch.equal(got.values, ref.values))
            ours = bench(lambda: sg.maxk(x, k, backend="triton"))
            topk = bench(lambda: torch.topk(x, k, dim=1))
            row = dict(rows=args.rows, cols=args.cols, k=k, dtype=str(dtype).replace("torch.", ""), data=kind, ms_maxk=ours,
                       ms_relu=relu, ms_topk=topk, maxk_over_relu=ours / relu, matches_reference=same)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.configs:
        from sparsegnn.kernels.maxk import maxk_select

        x = torch.randn(args.rows, args.cols, device="cuda")
        ref = sg.maxk(x, 32, backend="reference")
        for warps in (1, 2, 4, 8):
            cfg = {"num_warps": warps}
            vals, idx = maxk_select(x, 32, torch.uint8, cfg)
            ok = bool(torch.equal(idx, ref.index))
            ms = bench(lambda: maxk_select(x, 32, torch.uint8, cfg))
            print(f"config {cfg}: {ms:.3f} ms, {ms / rows[0]['ms_relu']:.2f}x relu, matches {ok}", flush=True)
    (out / "maxk.json").write_text(json.dumps({"meta": {"script": "scripts/time_maxk.py",
                                                         "device": torch.cuda.get_device_name()}, "rows": rows}, indent=1))
    lines = [f"# MaxK selection, {args.rows:,} x {args.cols} ({torch.cuda.get_device_name()})", "",
             "Median ms of `triton.testing.do_bench` (L2 flushed). `maxk` = `sparsegnn.maxk(x, k)` (Triton, CBSR out); "
             "bar: at most 1.5x `torch.relu` on the same tensor. `normal`: N(0, 1) entries; `ties`: the same rounded "
             "to integers (the k-th value tied in most rows).", "",
             "| dtype | data | k | maxk | relu | torch.topk | maxk / relu | same as reference |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['data']} | {r['k']} | {r['ms_maxk']:.3f} | {r['ms_relu']:.3f} | {r['ms_topk']:.3f} | "
              f"{r['maxk_over_relu']:.2f}x | {r['matches_reference']} |" for r in rows]
    (out / "maxk.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
