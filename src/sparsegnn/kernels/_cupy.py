"""CUDA kernels compiled at run time through CuPy (``RawModule``, NVRTC): no build step at
install.  Used only where Triton cannot express the kernel (shared-memory scatters and
atomics); every caller keeps a Triton or reference path for where :func:`available` is False."""
from __future__ import annotations

import functools
import warnings

import torch


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


def launch(kernel, grid: int, threads: int, args: tuple, device: torch.device, shared_mem: int = 0) -> None:
    """Run a CuPy ``kernel`` on the current torch stream of ``device`` (``grid`` blocks of
    ``threads``), raising the kernel's dynamic shared-memory limit where ``shared_mem`` needs it
    (its default is 48 KB less the kernel's static shared memory, so the check is not against
    48 KB)."""
    import cupy

    with cupy.cuda.Device(device.index), _stream(device):
        if shared_mem and kernel.max_dynamic_shared_size_bytes < shared_mem:
            kernel.max_dynamic_shared_size_bytes = shared_mem
        kernel((grid,), (threads,), args, shared_mem=shared_mem)


@functools.lru_cache(maxsize=None)
def shared_bytes_optin(device: torch.device) -> int:
    """The most dynamic shared memory one block may ask for on ``device``."""
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))
