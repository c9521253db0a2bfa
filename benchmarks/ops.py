"""The op benchmark suites: SpMM / SDDMM against cuSPARSE, PyG and torch.sparse on the GPU, or
forward and backward of every op against torch.sparse / PyG on the CPU (``--device cpu``).

    python -m benchmarks.ops --suite paper --ops spmm --dims 32,64,128,256 --tag paper_spmm_fp32
    python -m benchmarks.ops --suite real --dtypes bfloat16 --tag real_spmm_bf16   # SPARSEGNN_DATA
    python -m benchmarks.ops --device cpu --tag ops

Writes ``<out>/<tag>.json``, ``.md`` and ``.png`` (with matplotlib) and prints the markdown.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

import torch

from benchmarks import run_command
from sparsegnn.cli import _float_in, _Parser, _path_problem


#: Defaults of ``bench`` options that differ between the GPU and the CPU benchmark.
_BENCH_DEFAULTS = {
    "cuda": {"suite": "small", "ops": "spmm,sddmm", "dims": "32,64,128,256", "tag": "bench"},
    "cpu": {"suite": "real", "ops": "spmm,spmm-w,spmm-mean,spmm-max,sddmm,softmax", "dims": "16,64", "tag": "bench-cpu"},
}


def _bench_graphs(args: argparse.Namespace) -> List[str]:
    """The graph names of a bench run: ``--graphs`` or the ``--suite``'s, checked."""
    from sparsegnn.datasets.suite import REAL_SUITE
    from sparsegnn.datasets.synthetic import STAND_INS, SUITES

    suites = dict(SUITES, real=REAL_SUITE)
    graphs = args.graphs.split(",") if args.graphs else list(suites[args.suite])
    unknown = [g for g in graphs if g not in STAND_INS and g not in REAL_SUITE]
    if unknown:
        raise ValueError(f"bench(): unknown graphs {unknown}; known: {', '.join(list(STAND_INS) + list(REAL_SUITE))}")
    return graphs


def _write_bench_outputs(args: argparse.Namespace, rows, meta, write_json, markdown, plot) -> int:
    """``<out>/<tag>.json``, ``.md`` and ``.png`` (when matplotlib is there) of a bench run; prints the markdown."""
    from pathlib import Path

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / args.tag
    write_json(rows, f"{stem}.json", meta)
    dict_rows = json.loads(Path(f"{stem}.json").read_text())["rows"]
    text = markdown(dict_rows, meta)
    Path(f"{stem}.md").write_text(text)
    try:
        plot(dict_rows, f"{stem}.png")
    except ImportError:
        print("benchmarks.ops: matplotlib not installed, no plot", file=sys.stderr)
    print(text)
    return 0


def _run(args: argparse.Namespace) -> int:
    problem = _path_problem(args, outputs=[("--out", "out")])
    if problem is not None:
        print(f"benchmarks.ops: {problem}", file=sys.stderr)
        return 2
    for key, value in _BENCH_DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"bench(): --threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.device == "cpu":
        return _run_cpu(args)
    import datetime

    from . import report
    from .harness import run, write_json

    if not torch.cuda.is_available():
        print("benchmarks.ops: needs a CUDA device (the baselines and kernels are GPU code); "
              "--device cpu runs the CPU benchmark", file=sys.stderr)
        return 2
    graphs = _bench_graphs(args)
    import triton

    rows = run(graphs, args.ops.split(","), [int(d) for d in args.dims.split(",")], args.dtypes.split(","),
               providers=args.providers.split(",") if args.providers else None, progress=True,
               data_dir=args.data_dir, real=args.suite == "real")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.date.today().isoformat(), "suite": args.suite, "graphs": graphs}
    return _write_bench_outputs(args, rows, meta, write_json, report.markdown, report.plot)


def _run_cpu(args: argparse.Namespace) -> int:
    """``bench --device cpu``: forward and backward of every op vs torch.sparse / PyG on CPU."""
    import os
    import time

    from . import cpu

    graphs = _bench_graphs(args)
    try:
        dims = [int(d) for d in args.dims.split(",")]
    except ValueError:
        raise ValueError(f"bench(): --dims must be comma-separated integers, got {args.dims!r}") from None
    load_before, start, health = list(os.getloadavg()), time.perf_counter(), {}
    rows = cpu.run(graphs, args.ops.split(","), dims, args.dtypes.split(","),
                   providers=args.providers.split(",") if args.providers else None, progress=True,
                   data_dir=args.data_dir, real=args.suite == "real", budget_s=args.budget_ms / 1e3, health=health)
    meta = cpu.meta(suite=args.suite, graphs=graphs, budget_ms=args.budget_ms, load_avg_before=load_before,
                    wall_s=time.perf_counter() - start, canary_ms=health)
    return _write_bench_outputs(args, rows, meta, cpu.write_json, cpu.markdown, cpu.plot)


def build_parser() -> argparse.ArgumentParser:
    bench = _Parser(prog="python -m benchmarks.ops", description=__doc__.splitlines()[0])
    bench.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                       help="cuda (default): the GPU benchmark; cpu: the CPU benchmark (benchmarks/cpu.py)")
    bench.add_argument("--suite", default=None, choices=["small", "paper", "large", "structure", "real"],
                       help="real = the real-graph suite (needs the datasets: --data-dir or SPARSEGNN_DATA); "
                            "default small (cuda), real (cpu)")
    bench.add_argument("--data-dir", default=None, help="directory of the real datasets (default: SPARSEGNN_DATA, ../shared/datasets)")
    bench.add_argument("--graphs", default=None, help="comma-separated graph names (overrides --suite)")
    bench.add_argument("--ops", default=None, help="cuda: spmm, spmm-mean, spmm-max, sddmm (default spmm,sddmm); "
                                                   "cpu: spmm, spmm-w, spmm-mean, spmm-max, sddmm, softmax (default all)")
    bench.add_argument("--dims", default=None, help="feature widths (default 32,64,128,256 on cuda, 16,64 on cpu)")
    bench.add_argument("--dtypes", default="float32")
    bench.add_argument("--providers", default=None, help="comma-separated subset of providers")
    bench.add_argument("--threads", type=int, default=None, help="torch.set_num_threads before the run (CPU threads)")
    bench.add_argument("--budget-ms", type=_float_in(0.0, open_low=True), default=200.0,
                       help="cpu: milliseconds of repeats per timing (at least 5 calls; default 200)")
    bench.add_argument("--out", default="benchmarks/local",
                       help="output folder (default benchmarks/local, git-ignored; the snapshot: benchmarks/results/<device>)")
    bench.add_argument("--tag", default=None, help="output file stem (default bench on cuda, bench-cpu on cpu)")
    return bench



def main(argv: Optional[List[str]] = None) -> int:
    return run_command(build_parser(), _run, argv)


if __name__ == "__main__":
    sys.exit(main())
