"""Probe: can cuBLAS's FP32 emulation on BF16 tensor cores (``CUBLAS_COMPUTE_32F_EMULATED_16BFX9``,
cuBLAS >= 12.9) run the MaxK epoch's fp32 GEMMs faster than the SIMT fp32 kernels, at fp32's
accuracy, on this GPU?

The k = 32 MaxK epoch spends 11.1 ms in fp32 GEMMs at the SIMT rate (~39 TFLOPS); the 5x-PyG bar
needs ~6 ms off the epoch (``notes/maxk.md``, stop 50).  This times the epoch's GEMM shapes as
torch fp32, torch TF32 and ``cublasGemmEx`` with the emulated compute type (each emulation
strategy), and reports the max error relative to the largest float64 entry.  cuBLAS is reached
through ctypes on the very library torch loaded.  Also reports what else the image offers for
fp32-accurate tensor-core GEMMs (CUTLASS).

    PYTHONPATH=src python scripts/probe_fp32_emulation.py
"""
from __future__ import annotations

import ctypes
import glob
import os
import subprocess
import sys

import torch
from triton.testing import do_bench

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUDA_R_32F = 0
COMPUTE_32F, COMPUTE_32F_EMULATED_16BFX9 = 68, 78
GEMM_DEFAULT = -1


def cublas_library() -> ctypes.CDLL:
    """The libcublas that torch loaded (after a matmul), found in /proc/self/maps."""
    a = torch.ones(8, 8, device="cuda")
    (a @ a).sum().item()
    paths = sorted({line.split()[-1] for line in open("/proc/self/maps")
                    if "libcublas.so" in line and "Lt" not in line})
    print("libcublas loaded by torch:", paths)
    return ctypes.CDLL(paths[0])


def main() -> int:
    print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
    lib = cublas_library()
    handle = ctypes.c_void_p()
    assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
    version = ctypes.c_int()
    lib.cublasGetVersion_v2(handle, ctypes.byref(version))
    print("cuBLAS version", version.value)
    lib.cublasSetStream_v2(handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    has_strategy = hasattr(lib, "cublasSetEmulationStrategy")
    print("cublasSetEmulationStrategy present:", has_strategy)
    workspace = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    if hasattr(lib, "cublasSetWorkspace_v2"):
        lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(workspace.data_ptr()), ctypes.c_size_t(workspace.numel()))

    alpha = ctypes.c_float(1.0)
    beta = ctypes.c_float(0.0)

    def gemm_ex(x, w, out, compute):
        """out[M, N] = x[M, K] @ w[N, K]^T, row-major, by cublasGemmEx."""
        m, k = x.shape
        n = w.shape[0]
        return lib.cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, ctypes.byref(alpha),
                                ctypes.c_void_p(w.data_ptr()), CUDA_R_32F, k,
                                ctypes.c_void_p(x.data_ptr()), CUDA_R_32F, k, ctypes.byref(beta),
                                ctypes.c_void_p(out.data_ptr()), CUDA_R_32F, n, compute, GEMM_DEFAULT)

    def timed(fn):
        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))

    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [("x W_in^T (lin_in)", 232965, 602, 256), ("h W^T (lin_l)", 232965, 256, 256),
              ("dY^T h (dW, K = N)", 256, 232965, 256)]
    print("\n| product | M | K | N | mode | ms | TFLOPS | max err / max |ref| |")
    print("|---|---|---|---|---|---|---|---|")
    for name, m, k, n in shapes:
        x = torch.randn(m, k, device="cuda", generator=g)
        w = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
        ref = x.double() @ w.double().T
        scale = ref.abs().max().item()
        flops = 2.0 * m * k * n
        modes = []
        torch.backends.cuda.matmul.allow_tf32 = False
        modes.append(("torch fp32", lambda: x @ w.T))
        modes.append(("torch tf32", lambda: x @ w.T))
        out = torch.empty(m, n, device="cuda")
        for label, compute in (("gemmEx 32F", COMPUTE_32F), ("gemmEx BF16x9", COMPUTE_32F_EMULATED_16BFX9)):
            strategies = [None] if compute == COMPUTE_32F or not has_strategy else [0, 1, 2]
            for strategy in strategies:
                def run(compute=compute, strategy=strategy):
                    if strategy is not None:
                        lib.cublasSetEmulationStrategy(handle, strategy)
                    status = gemm_ex(x, w, out, compute)
                    if status != 0:
                        raise RuntimeError(f"cublasGemmEx status {status}")
                    return out
                modes.append((label + ("" if strategy is None else f" strategy {strategy}"), run))
        for label, fn in modes:
            torch.backends.cuda.matmul.allow_tf32 = label == "torch tf32"
            try:
                ms = timed(fn)
                y = fn()
                torch.cuda.synchronize()
                err = (y.double() - ref).abs().max().item() / scale
                print(f"| {name} | {m} | {k} | {n} | {label} | {ms:.3f} | {flops / ms / 1e9:.1f} | {err:.2e} |")
            except Exception as exc:  # noqa: BLE001 - a probe: report and go on
                print(f"| {name} | {m} | {k} | {n} | {label} | error: {exc} |")
        torch.backends.cuda.matmul.allow_tf32 = False
        del x, w, ref, out
        torch.cuda.empty_cache()

    print("\nCUTLASS on this image:")
    for probe in ("import cutlass; print('cutlass python', cutlass.__version__)",
                  "import cutlass_library; print('cutlass_library present')"):
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        print(" ", (r.stdout or r.stderr).strip().splitlines()[-1:] or "-")
    headers = glob.glob("/usr/local/cuda*/include/cutlass/cutlass.h") + glob.glob(
        os.path.join(os.path.dirname(torch.__file__), "..", "**", "cutlass", "cutlass.h"), recursive=True)[:3]
    print("  cutlass headers:", headers or "none found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
