"""What a user waits for when a script starts: import to the end of the first training step.

In a fresh Python subprocess (``PYTHONPATH=src``) it times, on Cora: ``import sparsegnn``,
loading the dataset, and the first and second training steps (forward, backward, Adam) of a
2-layer GCN of ``sparsegnn.nn.GCNConv`` layers called with ``edge_index`` (the PyG way). The
headline number is the time from before ``import sparsegnn`` to the end of the first step
(``import torch`` is timed separately). The same step with PyG's ``GCNConv``, and with plain
linear layers and no aggregation (the floor of what torch itself pays on a first step: cuBLAS,
autograd, cross entropy and Adam's first use), run in the same harness; and ours timed after the
floor's step in the same process (what our layers add to torch's own first uses). In that row
our prewarm threads are waited for before the floor's step (``prewarm_wait_s``), so their work is
in neither step; ``floor_step_s`` is the floor's step alone, outside ``load_s`` and
``first_step_s``, while the ``import ... -> first step`` columns include both. The PyG and floor
children run with ``SPARSEGNN_PREWARM=0``: they import sparsegnn only to load the data. Ours runs at least twice:

1. ``cold``: ``TRITON_CACHE_DIR``, ``SPARSEGNN_CACHE`` and ``SPARSEGNN_TUNE_CACHE`` point into
   a fresh temporary directory, so every kernel compiles and every config is tuned;
2. ``warm``: a new process with the same, now filled, directories.

``PYTHONDONTWRITEBYTECODE`` is dropped from the children's environment, so modules without a
``.pyc`` are byte-compiled once, as a normal install has them: by a first process with caches of
its own, run before ``cold`` and reported as the machine's first process.

Prints both and writes JSON to ``--out``::

    python -m scripts.first_call                  # cuda when available
    python -m scripts.first_call --device cpu     # smoke test
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]

# Runs in the subprocess; prints one JSON line. argv: device.
CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
import torch
library = sys.argv[2]
if sys.argv[3] == "preload":  # torch's own lazy imports that any training step pays (Adam -> torch._dynamo)
    import torch._dynamo  # noqa: F401
t_torch = time.perf_counter()
import sparsegnn as sg
import torch.nn.functional as F
if library == "pyg":
    import torch_geometric.nn as pyg_nn
t_import = time.perf_counter()
triton_key_state = sg.kernels._prewarm.state()   # Triton's key: stored and installed, hashed, or neither
device = torch.device(sys.argv[1])

def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)

data = sg.datasets.load("cora")
x, y = data.x.to(device), data.y.to(device)
edge_index = data.graph.edge_index().contiguous().to(device)
sync()
t_load = t_step = time.perf_counter()     # t_step: where the timed first step starts
torch.manual_seed(0)
class _DenseOnly(torch.nn.Module):  # the "torch" floor: the same step without aggregation
    def __init__(self, fin, fout):
        super().__init__()
        self.lin = torch.nn.Linear(fin, fout)

    def forward(self, x, edge_index):
        return self.lin(x)

floor_step_s = prewarm_wait_s = None
if library == "after-floor":  # torch's own first uses paid first, by the floor's step; then ours is timed
    t_wait = time.perf_counter()      # our prewarm threads finish first, outside both steps: their
    sg.kernels._prewarm.wait()        # work would otherwise hide in the floor's step (reported apart)
    prewarm_wait_s = time.perf_counter() - t_wait
    lin1, lin2 = torch.nn.Linear(x.shape[1], 16).to(device), torch.nn.Linear(16, data.num_classes).to(device)
    floor_opt = torch.optim.Adam(list(lin1.parameters()) + list(lin2.parameters()), lr=0.01)
    t_floor = time.perf_counter()
    floor_opt.zero_grad()
    F.cross_entropy(lin2(F.relu(lin1(x))), y).backward()
    floor_opt.step()
    sync()
    floor_step_s = time.perf_counter() - t_floor
    t_step = time.perf_counter()
if library == "pyg":
    layers = pyg_nn
elif library == "torch":
    import types
    layers = types.SimpleNamespace(GCNConv=_DenseOnly)
else:
    layers = sg.nn
conv1 = layers.GCNConv(x.shape[1], 16).to(device)
conv2 = layers.GCNConv(16, data.num_classes).to(device)
opt = torch.optim.Adam(list(conv1.parameters()) + list(conv2.parameters()), lr=0.01)

def step(mark=lambda part: None):  # mark(part) after each part: a no-op unless timed in parts
    opt.zero_grad()
    h = F.relu(conv1(x, edge_index))
    mark("layer 1 forward + relu")
    out = conv2(h, edge_index)
    mark("layer 2 forward")
    loss = F.cross_entropy(out, y)
    mark("cross entropy")
    loss.backward()
    mark("backward")
    opt.step()
    sync()
    mark("Adam step")

def step_parts():  # the same step with a sync after each part: where the first step's time goes
    marks = [("start", time.perf_counter())]
    def mark(name):
        sync()
        marks.append((name, time.perf_counter()))
    step(mark)
    return {name: t - marks[i][1] for i, (name, t) in enumerate(marks[1:])}

import os
first_step_parts = None
_prof_out = os.environ.get("FIRST_CALL_PROFILE")
_ops_out = os.environ.get("FIRST_CALL_OPS")
if os.environ.get("FIRST_CALL_PARTS"):
    first_step_parts = step_parts()
elif _ops_out:  # torch.profiler: each op's host time in the first step (a first launch loads its module)
    from torch.profiler import ProfilerActivity, profile as _profile
    _acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with _profile(activities=_acts) as _p:
        step()
    _avg = _p.key_averages()
    _kernels = sorted({e.name for e in _p.events() if e.device_type.name == "CUDA"})
    open(_ops_out, "w").write(_avg.table(sort_by="self_cpu_time_total", row_limit=45, max_name_column_width=90)
                              + "\nCUDA kernels launched (%d):\n" % len(_kernels) + "\n".join(_kernels) + "\n")
elif _prof_out:  # where the first step's time goes (cProfile, top entries by cumulative and own time)
    import cProfile, io, pstats
    _prof = cProfile.Profile()
    _prof.runcall(step)
    _buf = io.StringIO()
    _stats = pstats.Stats(_prof, stream=_buf)
    _stats.sort_stats("cumulative").print_stats(110)
    _stats.sort_stats("tottime").print_stats(60)
    open(_prof_out, "w").write(_buf.getvalue())
else:
    step()
t_first = time.perf_counter()
step()
t_second = time.perf_counter()
print(json.dumps({
    "import_torch_s": t_torch - t_start,
    "import_sparsegnn_s": t_import - t_torch,
    "load_s": t_load - t_import,
    "first_step_s": t_first - t_step,
    "second_step_ms": 1000.0 * (t_second - t_first),
    "floor_step_s": floor_step_s,
    "prewarm_wait_s": prewarm_wait_s,
    "first_step_parts_s": first_step_parts,
    "import_sparsegnn_to_first_step_s": t_first - t_torch,
    "import_torch_to_first_step_s": t_first - t_start,
    "triton_key": triton_key_state,
    "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    "torch": torch.__version__,
}))
"""


def run_child(device: str, cache_root: Path, timeout: float, library: str = "sparsegnn",
              preload: bool = False, profile: Optional[str] = None, parts: bool = False,
              ops: Optional[str] = None) -> Dict[str, object]:
    """One fresh process with the caches under ``cache_root``; its JSON, or an ``error``.

    With ``profile``, the first step runs under cProfile and the statistics go to that file. With
    ``parts``, the first step synchronises after each part (forward of each layer, loss, backward,
    Adam) and reports their times (``first_step_parts_s``). With ``ops``, the first step runs under
    ``torch.profiler`` and its op table (by own host time) and CUDA kernel names go to that file."""
    env = dict(os.environ)
    env.pop("FIRST_CALL_PROFILE", None)
    env.pop("FIRST_CALL_PARTS", None)
    env.pop("FIRST_CALL_OPS", None)
    if ops:
        env["FIRST_CALL_OPS"] = ops
    if profile:
        env["FIRST_CALL_PROFILE"] = profile
    if parts:
        env["FIRST_CALL_PARTS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    env["TRITON_CACHE_DIR"] = str(cache_root / "triton")
    env["SPARSEGNN_CACHE"] = str(cache_root / "sparsegnn")
    env["SPARSEGNN_TUNE_CACHE"] = str(cache_root / "tune")
    # byte-compiled modules as a normal install has them: an image that sets
    # PYTHONDONTWRITEBYTECODE makes every process recompile the Python sources it imports that
    # have no .pyc (triton's gluon: 0.1 s); the cold process writes them, the warm ones read them
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if library in ("torch", "pyg"):
        # these children import sparsegnn only for its dataset loader and launch none of our
        # kernels: our prewarm threads would only take the GIL during their step
        env["SPARSEGNN_PREWARM"] = "0"
    wall = _dt.datetime.now()
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, device, library, "preload" if preload else "-"],
                              env=env, cwd=str(ROOT),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    result: Dict[str, object] = {"process_wall_s": (_dt.datetime.now() - wall).total_seconds()}
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        result["error"] = f"exit {proc.returncode}: " + " | ".join(tail)
        return result
    result.update(json.loads(lines[-1]))
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_device = "cpu"
    try:
        import torch
        default_device = "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    parser.add_argument("--device", default=default_device)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per subprocess (default 600)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary cache directory")
    parser.add_argument("--no-pyg", action="store_true", help="skip the torch_geometric GCNConv comparison")
    parser.add_argument("--out", default="benchmarks/local/first_call.json")
    parser.add_argument("--repeat", type=int, default=1,
                        help="warm processes of each kind (ours, PyG, the torch floor; the spread between them is "
                             "the host's noise)")
    parser.add_argument("--profile", default=None,
                        help="also run a warm and a cold process whose first step is profiled; statistics to this "
                             "file and to its name with .cold.txt")
    parser.add_argument("--parts", action="store_true",
                        help="also run ours, PyG's and the floor's warm step with a sync after each part "
                             "(forwards, loss, backward, Adam) and print where the first step's time goes")
    parser.add_argument("--ops", default=None,
                        help="also run ours' and the floor's warm step under torch.profiler; the op tables to this "
                             "file's name with .ours.txt and .floor.txt")
    args = parser.parse_args(argv)

    cache_root = Path(tempfile.mkdtemp(prefix="sparsegnn-first-call-"))
    try:
        # a first process with caches of its own: on a fresh machine it byte-compiles the modules
        # the step imports lazily (where the environment had PYTHONDONTWRITEBYTECODE; pip install
        # does that once) and reads the libraries into the page cache; reported, not a cache state
        runs = {"machine's first process": run_child(args.device, cache_root / "first-process", args.timeout)}
        runs["cold"] = run_child(args.device, cache_root, args.timeout)
        runs["warm"] = run_child(args.device, cache_root, args.timeout)
        # torch's lazy torch._dynamo import (Adam's first step pulls it in: seconds) imported
        # before the clock starts, so the rows show what the library itself costs
        runs["warm, torch._dynamo preloaded"] = run_child(args.device, cache_root, args.timeout, preload=True)
        if args.profile:
            runs["warm, profiled"] = run_child(args.device, cache_root, args.timeout, profile=args.profile)
            cold_root = cache_root / "cold-profiled"           # empty caches again, for the cold profile
            runs["cold, profiled"] = run_child(args.device, cold_root, args.timeout,
                                               profile=str(Path(args.profile).with_suffix(".cold.txt")))
        for extra in range(2, args.repeat + 1):
            runs[f"warm #{extra}"] = run_child(args.device, cache_root, args.timeout)
        if not args.no_pyg:
            for extra in range(1, args.repeat + 1):
                runs["PyG" + (f" #{extra}" if extra > 1 else "")] = run_child(args.device, cache_root, args.timeout,
                                                                            "pyg")
            runs["PyG, torch._dynamo preloaded"] = run_child(args.device, cache_root, args.timeout, "pyg", True)
        # ours after the floor's step in the same process: only the first uses torch's own step
        # does not pay (our kernels, structure builds, the torch ops the floor does not use) and
        # that our prewarm threads did not do before it (their wait is reported apart)
        for extra in range(1, args.repeat + 1):
            runs["ours after the floor's step" + (f" #{extra}" if extra > 1 else "")] = run_child(
                args.device, cache_root, args.timeout, "after-floor")
        if args.profile:
            runs["ours after the floor's step, profiled"] = run_child(
                args.device, cache_root, args.timeout, "after-floor",
                profile=str(Path(args.profile).with_suffix(".after_floor.txt")))
        # what torch alone pays in the same step (cuBLAS, autograd, cross entropy and Adam's first
        # use): the two linear layers without any aggregation
        for extra in range(1, args.repeat + 1):
            runs["torch floor (no aggregation)" + (f" #{extra}" if extra > 1 else "")] = run_child(
                args.device, cache_root, args.timeout, "torch")
        if args.ops:
            for label, library in (("ours", "sparsegnn"), ("floor", "torch")):
                runs[f"{label}, ops profiled"] = run_child(args.device, cache_root, args.timeout, library,
                                                           ops=str(Path(args.ops).with_suffix(f".{label}.txt")))
        if args.parts:
            for extra in range(1, args.repeat + 1):
                for label, library in (("ours", "sparsegnn"), ("PyG", "pyg"), ("torch floor", "torch")):
                    if library == "pyg" and args.no_pyg:
                        continue
                    runs[f"{label}, parts" + (f" #{extra}" if extra > 1 else "")] = run_child(
                        args.device, cache_root, args.timeout, library, parts=True)
    finally:
        if args.keep:
            print(f"caches kept in {cache_root}", file=sys.stderr)
        else:
            shutil.rmtree(cache_root, ignore_errors=True)

    meta = {"device": args.device, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "argv": sys.argv[1:]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    print(f"first call on Cora, 2-layer GCNConv with edge_index (sparsegnn unless PyG), device {args.device}")
    print("| caches | import torch s | import sparsegnn s | load s | first step s | import sparsegnn -> first step s "
          "| second step ms | Triton key |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in runs.items():
        if r.get("error"):
            print(f"| {name} | error: {r['error']} |")
            continue
        print(f"| {name} | {r['import_torch_s']:.2f} | {r['import_sparsegnn_s']:.2f} | {r['load_s']:.2f} "
              f"| {r['first_step_s']:.2f} | {r['import_sparsegnn_to_first_step_s']:.2f} | {r['second_step_ms']:.1f} "
              f"| {r.get('triton_key', '')} |"
              + (f" (the floor's step first: {r['floor_step_s']:.2f} s, after a prewarm wait of "
                 f"{r.get('prewarm_wait_s') or 0:.2f} s)" if r.get("floor_step_s") else ""))
    parted = {name: r["first_step_parts_s"] for name, r in runs.items() if r.get("first_step_parts_s")}
    if parted:
        names = list(next(iter(parted.values())))
        print("\nwarm first step in parts (a sync after each; ms)")
        print("| process | " + " | ".join(names) + " | sum |")
        print("|---" * (len(names) + 2) + "|")
        for name, p in parted.items():
            print(f"| {name} | " + " | ".join(f"{1000 * p[n]:.1f}" for n in names) + f" | {1000 * sum(p.values()):.1f} |")
    return 0 if not any(r.get("error") for name, r in runs.items() if not name.startswith("PyG")) else 1


if __name__ == "__main__":
    sys.exit(main())
