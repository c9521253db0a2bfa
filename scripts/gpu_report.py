"""GPU correctness + timing report for what changed (run by scripts/gpu_check.sh on the device).

1. Triton CSR SpMM vs the float64 reference on graphs several times the L2 size, every dtype,
   forward and backward (max relative error).
2. Median time (do_bench) of the Triton SpMM next to torch.sparse.mm (cuSPARSE), same inputs.
3. GCN / AGNN on Cora, 5 seeds each: test accuracy and mean epoch time.

Prints a short table last; writes JSON rows to $OUT/gpu_report.json when OUT is set.
"""
import json
import os
import sys

import torch
import triton.testing

import sparsegnn as sg
from sparsegnn.datasets import load, random_graph
from sparsegnn.training import train_node_classifier

assert torch.cuda.is_available(), "needs a GPU"
dev = "cuda"
rows = []


def rel_err(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


lines = []
for name, n, e in [("uniform-100k/2M", 100_000, 2_000_000), ("uniform-400k/4M", 400_000, 4_000_000)]:
    ei, w = random_graph(n, e, seed=1, num_isolated=100, num_empty_rows=100, num_self_loops=1000,
                         num_duplicates=1000, weighted=True, device=dev)
    g = sg.Graph.from_edge_index(ei, w, num_nodes=n)
    csr = g.to_torch_sparse_csr()
    for num_feats in (32, 128, 256):
        x32 = torch.randn(n, num_feats, device=dev)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = x32.to(dtype)
            ref = sg.spmm(g.with_values(g.edge_val.double()), x.double(), backend="reference")
            out = sg.spmm(g, x, backend="triton")
            fwd = rel_err(out, ref)
            xg = x.detach().clone().requires_grad_(True)
            up = torch.randn(n, num_feats, device=dev).to(dtype)
            sg.spmm(g, xg, backend="triton").backward(up)
            ref_b = sg.spmm(g.t().with_values(g.t().edge_val.double()), up.double(), backend="reference")
            bwd = rel_err(xg.grad, ref_b)
            ms_triton = triton.testing.do_bench(lambda: sg.spmm(g, x, backend="triton"), return_mode="median")
            ms_cusparse = None
            if dtype == torch.float32:
                ms_cusparse = triton.testing.do_bench(lambda: torch.sparse.mm(csr, x), return_mode="median")
            row = dict(graph=name, nodes=n, nnz=g.num_edges, F=num_feats, dtype=str(dtype).replace("torch.", ""),
                       fwd_rel_err=fwd, bwd_rel_err=bwd, ms_triton=ms_triton, ms_cusparse=ms_cusparse)
            rows.append(row)
            print(json.dumps(row), flush=True)
    del g, csr, ei, w
    torch.cuda.empty_cache()

train_rows = []
data = load("cora")
for model in ("gcn", "agnn"):
    res = [train_node_classifier(data, model, seed=s, device=dev, progress=False) for s in range(5)]
    train_rows.append(dict(model=model, test_acc=[r.test_acc for r in res],
                           mean_test_acc=sum(r.test_acc for r in res) / 5,
                           mean_epoch_ms=sum(r.mean_epoch_ms for r in res) / 5))
    print(json.dumps(train_rows[-1]), flush=True)

if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "gpu_report.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "spmm": rows, "train": train_rows}, f, indent=1)

print(f"\n{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
print(f"{'graph':18} {'F':>4} {'dtype':9} {'fwd err':>9} {'bwd err':>9} {'triton ms':>10} {'cusparse ms':>11}")
for r in rows:
    cs = f"{r['ms_cusparse']:.3f}" if r["ms_cusparse"] is not None else "-"
    print(f"{r['graph']:18} {r['F']:>4} {r['dtype']:9} {r['fwd_rel_err']:9.2e} {r['bwd_rel_err']:9.2e} {r['ms_triton']:10.3f} {cs:>11}")
for t in train_rows:
    print(f"{t['model']:5} cora 5 seeds: mean test acc {100 * t['mean_test_acc']:.2f}%  "
          f"({', '.join(f'{100 * a:.1f}' for a in t['test_acc'])})  epoch {t['mean_epoch_ms']:.2f} ms")
worst = max(r["fwd_rel_err"] if r["dtype"] == "float32" else 0 for r in rows)
sys.exit(0 if worst < 1e-5 else 1)
