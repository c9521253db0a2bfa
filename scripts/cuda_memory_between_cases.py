"""CUDA memory left between benchmark cases (stop 40's open question, explained at stop 41):
runs ``bench_train.py`` (GCN tf32, ours and PyG, a few graphs, 3 rounds), prints every case's
``base_mb_rounds`` (memory allocated before the case is built), then what stays allocated after
the run, how many live CUDA tensors ``gc`` still sees, and what is left once PyTorch's cuBLAS
workspaces are freed (``torch._C._cuda_clearCublasWorkspaces``)::

    PYTHONPATH=src SPARSEGNN_DATA=.data python scripts/cuda_memory_between_cases.py [--out FILE.json]
"""
import argparse
import gc
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "src")]
import bench_train as bt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default="cora,citeseer,deezer,wikipedia")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    bt.main(["--models", "gcn", "--providers", "ours,pyg", "--precision", "tf32", "--graphs", args.graphs,
             "--rounds", "3", "--epochs", "5", "--warmup", "3", "--out", "/tmp/cuda_memory_cases.json"])
    cases = [dict(graph=r["graph"], provider=r["provider"], variant=r.get("variant"),
                  base_mb_rounds=[round(b) for b in r.get("base_mb_rounds", []) if b is not None])
             for r in json.load(open("/tmp/cuda_memory_cases.json"))["rows"]]
    gc.collect()
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated() / 2 ** 20
    live = sum(1 for o in gc.get_objects() if torch.is_tensor(o) and o.is_cuda)
    torch._C._cuda_clearCublasWorkspaces()
    cleared = torch.cuda.memory_allocated() / 2 ** 20
    result = dict(device=torch.cuda.get_device_name(), cases=cases, allocated_mb_after_run=after,
                  live_cuda_tensors=live, allocated_mb_after_clearing_cublas_workspaces=cleared)
    for c in cases:
        print(c["graph"], c["provider"], c["variant"], c["base_mb_rounds"])
    print(f"allocated after the run {after:.0f} MB, live CUDA tensors {live}, "
          f"after clearing cuBLAS workspaces {cleared:.0f} MB")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
