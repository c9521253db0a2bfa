"""Host time of one launch of a CuPy kernel (``kernels._cupy.launch``) by ``cuLaunchKernel``
directly (``DIRECT``) and by CuPy's ``RawKernel`` call, beside a Triton launch through
``kernels._launch.launch``: microseconds a launch over ``--calls`` back-to-back launches of
``translate_cuda``'s ranking on a graph of one small window (GPU work ~2 us), and the result
of each path checked equal::

    PYTHONPATH=src python scripts/probe_cupy_launch.py [--calls 2000]
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "src")]
from sparsegnn.kernels import _cupy, translate_cuda  # noqa: E402
import sparsegnn.kernels.translate as kt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    dev = torch.device("cuda")
    rowptr = torch.tensor([0, 3, 5, 9], dtype=torch.int64, device=dev)
    col = torch.tensor([4, 1, 4, 7, 0, 3, 3, 9, 1], dtype=torch.int64, device=dev)
    outs = {}

    def cuda_rank():
        code = torch.empty(9, dtype=torch.int32, device=dev)
        blocks = torch.empty(2, dtype=torch.int64, device=dev)
        counts = torch.empty(1, dtype=torch.int32, device=dev)
        return code, blocks, counts

    bufs = cuda_rank()
    ws = torch.empty(16, dtype=torch.int64, device=dev)
    for label, direct in (("cupy call", False), ("direct", True), ("cupy call", False), ("direct", True)):
        _cupy.DIRECT = direct
        code, blocks, counts = cuda_rank()
        translate_cuda.rank_big_windows(rowptr, col, code, blocks, counts, 1, -1, 4, 16, 1, 128)
        outs[label] = (code.tolist(), blocks.tolist(), counts.tolist())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            translate_cuda.rank_big_windows(rowptr, col, *bufs, 1, -1, 4, 16, 1, 128)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"{label:10s} {1e6 * (t1 - t0) / args.calls:6.1f} us a launch (host)", flush=True)
    kt.launch(kt._window_sizes_kernel, (1,), (rowptr, ws, 3, 1, 2048), dict(WINDOW=4, ONE=True, BLOCK=1024), 4)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        kt.launch(kt._window_sizes_kernel, (1,), (rowptr, ws, 3, 1, 2048), dict(WINDOW=4, ONE=True, BLOCK=1024), 4)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"{'triton':10s} {1e6 * (t1 - t0) / args.calls:6.1f} us a launch (host, _launch.launch)", flush=True)
    assert outs["direct"] == outs["cupy call"], outs
    print("same result:", outs["direct"], flush=True)


if __name__ == "__main__":
    main()
