"""CUDA kernels compiled at run time through CuPy (``RawModule``, NVRTC): no build step at
install.  Used only where Triton cannot express the kernel (shared-memory scatters and
atomics); every caller keeps a Triton or reference path for where :func:`available` is False."""
from __future__ import annotations

import functools
import warnings

import torch

from . import current_stream_key, device_properties


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether CuPy kernels can run here (CuPy installed and a CUDA GPU)."""
    if not torch.cuda.is_available():
        return False
    try:
        import cupy  # noqa: F401
    except Exception:   # noqa: BLE001 - any import problem means: not here
        return False
    return True


#: CuPy views of torch's streams, by (device, stream handle): made once (10 us each on the H100 host).
_STREAMS: dict = {}


def _stream(device: torch.device):
    import cupy

    handle = torch.cuda.current_stream(device).cuda_stream
    stream = _STREAMS.get((device.index, handle))
    if stream is None:
        with warnings.catch_warnings():     # CuPy 14 prefers Stream.from_external; the same stream
            warnings.simplefilter("ignore", DeprecationWarning)
            stream = _STREAMS[(device.index, handle)] = cupy.cuda.ExternalStream(handle, device.index)
    return stream


#: ``cuLaunchKernel`` directly (:func:`launch`'s fast path); off: CuPy's ``RawKernel`` call each time.
DIRECT = True
#: Per (kernel, device): the ``CUfunction`` and the dynamic shared memory it is allowed.
_FUNCTIONS: dict = {}
_CTYPES: dict = {}


def _ctypes_of(value):
    """The ctypes value of a NumPy / CuPy scalar argument (KeyError for other types)."""
    if not _CTYPES:
        import ctypes

        import numpy

        _CTYPES.update({numpy.uint64: ctypes.c_uint64, numpy.int64: ctypes.c_int64, numpy.int32: ctypes.c_int32,
                        numpy.uint32: ctypes.c_uint32, numpy.float32: ctypes.c_float,
                        numpy.float64: ctypes.c_double})
    return _CTYPES[type(value)](value)


def _direct(kernel, grid: int, threads: int, args: tuple, device: torch.device, shared_mem: int) -> bool:
    """``cuLaunchKernel`` with the arguments packed by ctypes, skipping CuPy's call (its device
    and stream context managers, the attribute query, the argument conversion): 20-45 us
    less host time in a translation on an H100 host.  False (nothing launched) where it cannot run:
    ``device`` not torch's current device, no current CUDA context on this thread, an argument
    of another type (Python ints and floats included), a CuPy without these entry points."""
    import ctypes

    import cupy

    driver = cupy.cuda.driver
    if not hasattr(driver, "launchKernel"):
        return False
    if device.index != torch.cuda.current_device():     # cuLaunchKernel runs in the current context
        return False
    key = (id(kernel), device.index)
    entry = _FUNCTIONS.get(key)
    if entry is None:
        try:
            function = kernel.kernel if hasattr(kernel, "kernel") else kernel
            entry = _FUNCTIONS[key] = [int(function.ptr), kernel.max_dynamic_shared_size_bytes, kernel]
        except AttributeError:
            return False
    if shared_mem > entry[1]:
        with cupy.cuda.Device(device.index):
            kernel.max_dynamic_shared_size_bytes = shared_mem
        entry[1] = shared_mem
    if not driver.ctxGetCurrent():
        return False
    try:
        values = [_ctypes_of(a) for a in args]
    except KeyError:
        return False
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    driver.launchKernel(entry[0], max(1, grid), 1, 1, threads, 1, 1, shared_mem, current_stream_key(device),
                        ctypes.addressof(params), 0)
    return True


def launch(kernel, grid: int, threads: int, args: tuple, device: torch.device, shared_mem: int = 0) -> None:
    """Run a CuPy ``kernel`` on the current torch stream of ``device`` (``grid`` blocks of
    ``threads``; ``args`` NumPy / CuPy scalars), raising the kernel's dynamic shared-memory
    limit where ``shared_mem`` needs it (its default is 48 KB less the kernel's static shared
    memory, so the check is not against 48 KB).  By ``cuLaunchKernel`` directly where it can
    (:func:`_direct`), else by CuPy's call."""
    import cupy

    if DIRECT and _direct(kernel, grid, threads, args, device, shared_mem):
        return
    with cupy.cuda.Device(device.index), _stream(device):
        if shared_mem and kernel.max_dynamic_shared_size_bytes < shared_mem:
            kernel.max_dynamic_shared_size_bytes = shared_mem
        kernel((grid,), (threads,), args, shared_mem=shared_mem)


def shared_bytes_optin(device: torch.device) -> int:
    """The most dynamic shared memory one block may ask for on ``device``."""
    return int(getattr(device_properties(device), "shared_memory_per_block_optin", 48 * 1024))
