"""cProfile of the first GCN training step of a fresh process (Cora, edge_index input): what a
user waits for.  Run it twice with the same TRITON_CACHE_DIR / SPARSEGNN_TUNE_CACHE to see the
warm-cache case.

    PYTHONPATH=src python scripts/profile_first_step.py
"""
import cProfile
import io
import pstats
import time

t_start = time.perf_counter()
import torch  # noqa: E402

t_torch = time.perf_counter()
prof = cProfile.Profile()
prof.enable()
import sparsegnn as sg  # noqa: E402

data = sg.datasets.load("cora").to("cuda")
ei = data.graph.edge_index()
model = torch.nn.ModuleList([sg.nn.GCNConv(data.x.shape[1], 16), sg.nn.GCNConv(16, 7)]).cuda()
opt = torch.optim.Adam(model.parameters(), lr=0.01)


def step():
    opt.zero_grad()
    h = torch.relu(model[0](data.x, ei))
    loss = torch.nn.functional.cross_entropy(model[1](h, ei)[data.train_mask], data.y[data.train_mask])
    loss.backward()
    opt.step()
    torch.cuda.synchronize()


t0 = time.perf_counter()
step()
t1 = time.perf_counter()
prof.disable()
step()
t2 = time.perf_counter()
print(f"import torch {t_torch - t_start:.2f} s, import+load {t0 - t_torch:.2f} s, first step {t1 - t0:.2f} s, "
      f"second step {1e3 * (t2 - t1):.1f} ms")
out = io.StringIO()
pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(35)
print(out.getvalue()[:9000])
