"""``kernels._cupy.launch``'s direct ``cuLaunchKernel`` path: the arguments packed by ctypes (CPU,
a stand-in CuPy driver that reads the packed values back), its fallbacks, and on a GPU the same
results as CuPy's own kernel call."""
import ctypes
import sys
import types

import numpy as np
import pytest
import torch

from conftest import DEVICE


class _Kernel:
    """A CuPy ``RawKernel`` stand-in: its ``CUfunction`` and shared-memory attribute."""

    def __init__(self):
        self.kernel = types.SimpleNamespace(ptr=0xABC)
        self.max_dynamic_shared_size_bytes = 1000


@pytest.fixture
def fake_cupy(monkeypatch):
    """A ``cupy`` module whose driver records each launch with its arguments read back from the
    packed parameter array (as the driver reads them: one pointer per argument)."""
    from sparsegnn.kernels import _cupy

    launches, context = [], [1]
    types_in_order = (ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint32, ctypes.c_float,
                      ctypes.c_double)

    def launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = (ctypes.c_void_p * len(types_in_order)).from_address(params)
        values = [t.from_address(p).value for t, p in zip(types_in_order, pointers)]
        launches.append(dict(function=function, grid=(gx, gy, gz), block=(bx, by, bz), shared=shared,
                             stream=stream, values=values, extra=extra))

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    driver = types.SimpleNamespace(launchKernel=launch_kernel, ctxGetCurrent=lambda: context[0])
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(driver=driver, Device=Device)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(_cupy, "_FUNCTIONS", {})
    monkeypatch.setattr(_cupy, "current_stream_key", lambda device: 4321)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return launches, context


ARGS = (np.uint64(2 ** 40 + 5), np.int64(-3), np.int32(-7), np.uint32(2 ** 31 + 9), np.float32(1.5),
        np.float64(-2.25))


def test_direct_launch_packs_each_argument_by_its_type(fake_cupy):
    from sparsegnn.kernels import _cupy

    launches, _ = fake_cupy
    kernel = _Kernel()
    assert _cupy._direct(kernel, 0, 128, ARGS, torch.device("cuda", 0), 0)
    assert _cupy._direct(kernel, 7, 64, ARGS, torch.device("cuda", 0), 4000)     # more shared memory: raised
    assert [ln["values"] for ln in launches] == [[2 ** 40 + 5, -3, -7, 2 ** 31 + 9, 1.5, -2.25]] * 2
    assert [ln["grid"] for ln in launches] == [(1, 1, 1), (7, 1, 1)]             # an empty grid launches one block
    assert [ln["block"] for ln in launches] == [(128, 1, 1), (64, 1, 1)]
    assert [ln["shared"] for ln in launches] == [0, 4000]
    assert all(ln["function"] == 0xABC and ln["stream"] == 4321 and ln["extra"] == 0 for ln in launches)
    assert kernel.max_dynamic_shared_size_bytes == 4000


def test_direct_launch_falls_back_where_it_cannot_run(fake_cupy, monkeypatch):
    """Nothing launched (False: CuPy's call runs instead) for a Python int argument, another
    current device, or no current CUDA context on the thread."""
    from sparsegnn.kernels import _cupy

    launches, context = fake_cupy
    kernel = _Kernel()
    assert not _cupy._direct(kernel, 1, 32, ARGS[:5] + (3,), torch.device("cuda", 0), 0)
    assert not _cupy._direct(kernel, 1, 32, ARGS, torch.device("cuda", 1), 0)
    context[0] = 0
    assert not _cupy._direct(kernel, 1, 32, ARGS, torch.device("cuda", 0), 0)
    assert launches == []


@pytest.mark.skipif(DEVICE != "cuda", reason="CuPy kernels need a GPU")
def test_direct_launch_gives_cupys_results(monkeypatch):
    """``translate_cuda``'s ranking launched directly and by CuPy's call: the same codes and counts."""
    from sparsegnn.kernels import _cupy, translate_cuda

    if not _cupy.available():
        pytest.skip("CuPy missing")
    rowptr = torch.tensor([0, 3, 5, 9, 9], dtype=torch.int64, device="cuda")
    col = torch.tensor([4, 1, 4, 7, 0, 3, 3, 9, 1], dtype=torch.int64, device="cuda")
    got = {}
    for direct in (True, False):
        monkeypatch.setattr(_cupy, "DIRECT", direct)
        code = torch.full((9,), -1, dtype=torch.int32, device="cuda")
        blocks = torch.full((3,), -1, dtype=torch.int64, device="cuda")
        counts = torch.full((2,), -1, dtype=torch.int32, device="cuda")
        translate_cuda.rank_big_windows(rowptr, col, code, blocks, counts, 2, -1, 2, 4, 1, 64)
        got[direct] = (code.tolist(), blocks.tolist(), counts.tolist())
    # window 0 (rows 0-1): columns {1, 4, 7, 0}; window 1 (rows 2-3): {3, 9, 1}
    assert got[True] == got[False] == ([5, 3, 5, 7, 1, 3, 3, 5, 1], [0, 1, 1], [4, 3])
