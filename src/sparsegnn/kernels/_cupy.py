"""CUDA kernels compiled at run time through CuPy (``RawModule``, NVRTC): no build step at
install.  Used only where Triton cannot express the kernel (shared-memory scatters and
atomics); every caller keeps a Triton or reference path for where :func:`available` is False."""
from __future__ import annotations

import functools
import struct
import warnings
from typing import Optional

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
#: ``struct`` codes of the NumPy / CuPy scalar types a launch takes, and the formats made of them.
_CODES: dict = {}
_FORMATS: dict = {}
#: ``cuLaunchKernel``'s ``extra`` markers: the arguments as one buffer, its size, the end.
_BUFFER_POINTER, _BUFFER_SIZE, _END = 1, 2, 0


def _codes() -> dict:
    if not _CODES:
        import numpy

        _CODES.update({numpy.uint64: "Q", numpy.int64: "q", numpy.int32: "i", numpy.uint32: "I", numpy.float32: "f",
                       numpy.float64: "d"})
    return _CODES


def _format_of(args: tuple) -> Optional[str]:
    """The ``struct`` format of NumPy / CuPy scalar ``args`` (None for other types)."""
    types = tuple(map(type, args))
    fmt = _FORMATS.get(types)
    if fmt is None:
        codes = _codes()
        if not all(t in codes for t in types):
            return None
        fmt = _FORMATS[types] = "@" + "".join(codes[t] for t in types)
    return fmt


def _direct(kernel, grid: int, threads: int, args: tuple, device: torch.device, shared_mem: int,
            fmt: Optional[str]) -> bool:
    """``cuLaunchKernel`` with the arguments packed into one buffer (``struct`` at C alignment,
    passed through ``extra``), skipping CuPy's call (its device and stream context managers,
    the attribute query, the argument conversion): 20-45 us less host time in a translation on
    an H100 host, and one ``struct.pack`` instead of a ctypes value per argument (6 us less a
    densify on an H200 host: 7.8 against 13.6 us with its arguments made).  False (nothing
    launched) where it cannot run: ``device`` not torch's current device, no current CUDA
    context on this thread, an argument of another type, a CuPy without these entry points."""
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
    fmt = fmt or _format_of(args)
    if fmt is None:
        return False
    packed = struct.pack(fmt, *args)
    buffer = ctypes.create_string_buffer(packed, len(packed))
    size = ctypes.c_size_t(len(packed))
    extra = (ctypes.c_void_p * 5)(_BUFFER_POINTER, ctypes.addressof(buffer), _BUFFER_SIZE, ctypes.addressof(size),
                                  _END)
    driver.launchKernel(entry[0], max(1, grid), 1, 1, threads, 1, 1, shared_mem, current_stream_key(device), 0,
                        ctypes.addressof(extra))
    return True


def launch(kernel, grid: int, threads: int, args: tuple, device: torch.device, shared_mem: int = 0,
           fmt: Optional[str] = None) -> None:
    """Run a CuPy ``kernel`` on the current torch stream of ``device`` (``grid`` blocks of
    ``threads``), raising the kernel's dynamic shared-memory limit where ``shared_mem`` needs it
    (its default is 48 KB less the kernel's static shared memory, so the check is not against
    48 KB).  ``args``: NumPy / CuPy scalars, or with ``fmt`` (a ``struct`` format of the codes
    ``Q q I i f d``, such as ``"@QQiii"`` for two pointers and three ints) Python ints and floats
    (no scalar objects made a launch).  By ``cuLaunchKernel`` directly where it can
    (:func:`_direct`), else by CuPy's call."""
    import cupy

    if DIRECT and _direct(kernel, grid, threads, args, device, shared_mem, fmt):
        return
    if fmt is not None:
        types = {code: t for t, code in _codes().items()}
        args = tuple(types[code](a) for code, a in zip(fmt.lstrip("@=<>!"), args))
    with cupy.cuda.Device(device.index), _stream(device):
        if shared_mem and kernel.max_dynamic_shared_size_bytes < shared_mem:
            kernel.max_dynamic_shared_size_bytes = shared_mem
        kernel((grid,), (threads,), args, shared_mem=shared_mem)


def shared_bytes_optin(device: torch.device) -> int:
    """The most dynamic shared memory one block may ask for on ``device``."""
    return int(getattr(device_properties(device), "shared_memory_per_block_optin", 48 * 1024))
