"""``kernels._cupy.launch``'s direct ``cuLaunchKernel`` path: the arguments packed into one buffer
(CPU, a stand-in CuPy driver that reads the values back from ``extra`` as the driver does, at C
struct alignment), its fallbacks, and on a GPU the same results as CuPy's own kernel call."""
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
    ``extra`` buffer (``CU_LAUNCH_PARAM_BUFFER_POINTER`` 1, ``_SIZE`` 2, ``_END`` 0) as a C struct
    of the kernel's parameter types (``signature[0]``, set by the test)."""
    from sparsegnn.kernels import _cupy

    launches, context, signature = [], [1], [None]

    def launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        markers = (ctypes.c_void_p * 5).from_address(extra)
        assert (markers[0], markers[2], markers[4]) == (1, 2, None) and params == 0
        size = ctypes.c_size_t.from_address(markers[3]).value
        blob = ctypes.string_at(markers[1], size)
        fields = [(f"a{i}", t) for i, t in enumerate(signature[0])]
        struct_type = type("Args", (ctypes.Structure,), {"_fields_": fields})
        assert size <= ctypes.sizeof(struct_type)      # no more bytes than the parameters take
        args = struct_type.from_buffer_copy(blob + bytes(ctypes.sizeof(struct_type) - size))
        values = [getattr(args, f"a{i}") for i in range(len(signature[0]))]
        launches.append(dict(function=function, grid=(gx, gy, gz), block=(bx, by, bz), shared=shared,
                             stream=stream, values=values))

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
    return launches, context, signature


ARGS = (np.uint64(2 ** 40 + 5), np.int64(-3), np.int32(-7), np.uint32(2 ** 31 + 9), np.float32(1.5),
        np.float64(-2.25))
ARG_TYPES = (ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint32, ctypes.c_float, ctypes.c_double)


def test_direct_launch_packs_each_argument_by_its_type(fake_cupy):
    from sparsegnn.kernels import _cupy

    launches, _, signature = fake_cupy
    signature[0] = ARG_TYPES
    kernel = _Kernel()
    assert _cupy._direct(kernel, 0, 128, ARGS, torch.device("cuda", 0), 0, None)
    assert _cupy._direct(kernel, 7, 64, ARGS, torch.device("cuda", 0), 4000, None)   # more shared memory: raised
    assert [ln["values"] for ln in launches] == [[2 ** 40 + 5, -3, -7, 2 ** 31 + 9, 1.5, -2.25]] * 2
    assert [ln["grid"] for ln in launches] == [(1, 1, 1), (7, 1, 1)]             # an empty grid launches one block
    assert [ln["block"] for ln in launches] == [(128, 1, 1), (64, 1, 1)]
    assert [ln["shared"] for ln in launches] == [0, 4000]
    assert all(ln["function"] == 0xABC and ln["stream"] == 4321 for ln in launches)
    assert kernel.max_dynamic_shared_size_bytes == 4000


def test_direct_launch_packs_python_ints_by_a_format_with_c_alignment(fake_cupy):
    """Python ints and floats with a ``struct`` format: an int before a pointer is padded to the
    pointer's 8-byte alignment, as the kernel's parameters are laid out."""
    from sparsegnn.kernels import _cupy

    launches, _, signature = fake_cupy
    signature[0] = (ctypes.c_int32, ctypes.c_uint64, ctypes.c_int32, ctypes.c_float, ctypes.c_uint64, ctypes.c_int32)
    args = (-5, 2 ** 47 + 3, 9, 0.75, 2 ** 33, 1)
    assert _cupy._direct(_Kernel(), 3, 32, args, torch.device("cuda", 0), 0, "@iQifQi")
    assert launches[0]["values"] == [-5, 2 ** 47 + 3, 9, 0.75, 2 ** 33, 1]


def test_direct_launch_falls_back_where_it_cannot_run(fake_cupy, monkeypatch):
    """Nothing launched (False: CuPy's call runs instead) for a Python int argument, another
    current device, or no current CUDA context on the thread."""
    from sparsegnn.kernels import _cupy

    launches, context, _ = fake_cupy
    kernel = _Kernel()
    assert not _cupy._direct(kernel, 1, 32, ARGS[:5] + (3,), torch.device("cuda", 0), 0, None)
    assert not _cupy._direct(kernel, 1, 32, ARGS, torch.device("cuda", 1), 0, None)
    context[0] = 0
    assert not _cupy._direct(kernel, 1, 32, ARGS, torch.device("cuda", 0), 0, None)
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


@pytest.mark.skipif(DEVICE != "cuda", reason="CuPy kernels need a GPU")
@pytest.mark.parametrize("direct", [True, False])
def test_formatted_launches_run_directly_and_through_cupy(monkeypatch, direct):
    """The CBSR kernels pass Python ints with a format: launched directly (one packed buffer) and
    by CuPy's call (the ints made into the format's scalars), the densified matrix equals torch's
    scatter and the root product the dense one, and the bias partials (no memset) sum exactly."""
    from sparsegnn.kernels import _cupy, cbsr_cuda

    if not _cupy.available():
        pytest.skip("CuPy missing")
    monkeypatch.setattr(_cupy, "DIRECT", direct)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(37, 64, generator=gen)
    values, index = x.topk(8, 1)
    index, order = index.sort(1)
    values = values.gather(1, order).cuda().contiguous()
    index = index.to(torch.uint8).cuda().contiguous()
    dense = torch.zeros(37, 64).scatter_(1, index.long().cpu(), values.cpu())
    assert torch.equal(cbsr_cuda.densify_cuda(values, index, 64).cpu(), dense)
    wt = torch.randn(64, 260, generator=gen)            # three column tiles of W^T
    bias = torch.randn(260, generator=gen)
    out = cbsr_cuda.cbsr_root_cuda(values, index, wt.cuda(), bias.cuda())
    torch.testing.assert_close(out.cpu().double(), dense.double() @ wt.double() + bias.double(), rtol=1e-5, atol=1e-5)
    grad = torch.randn(37, 260, generator=gen)
    junk = [torch.full((16 * 260,), float("nan"), device="cuda") for _ in range(8)]
    del junk                                            # freed blocks of NaN for the partials to reuse
    dvalues, dbias = cbsr_cuda.cbsr_root_grad_cuda(grad.cuda(), index, wt.cuda(), bias_grad=True)
    want = (grad.double() @ wt.double().t()).gather(1, index.long().cpu())
    torch.testing.assert_close(dvalues.cpu().double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dbias.cpu().double(), grad.double().sum(0), rtol=1e-5, atol=1e-5)


def test_formatted_arguments_become_the_formats_scalars_on_cupys_call(fake_cupy, monkeypatch):
    """With the direct path off, Python ints and floats given with a format reach CuPy's kernel
    call as the NumPy scalars of the format's codes (the types CuPy passes by value)."""
    import contextlib

    from sparsegnn.kernels import _cupy

    launches, _, _ = fake_cupy
    calls = []

    class Kernel(_Kernel):
        def __call__(self, grid, block, args, shared_mem=0):
            calls.append((grid, block, args, shared_mem))

    monkeypatch.setattr(_cupy, "DIRECT", False)
    monkeypatch.setattr(_cupy, "_stream", lambda device: contextlib.nullcontext())
    _cupy.launch(Kernel(), 5, 64, (2 ** 40, -3, 7, 0.5, 2.25), torch.device("cuda", 0), 100, "@QiIfd")
    (grid, block, args, shared), = calls
    assert (grid, block, shared) == ((5,), (64,), 100) and launches == []
    assert [type(a) for a in args] == [np.uint64, np.int32, np.uint32, np.float32, np.float64]
    assert [a.item() for a in args] == [2 ** 40, -3, 7, 0.5, 2.25]
