"""One side CUDA stream per device and thread for the library's captures and warm-ups, and the
mark of a warm-up for a capture (no sparsegnn imports: every layer may use it).

Why one: PyTorch keeps a cuBLAS workspace (32 MB on an H100) for every (handle, stream) pair a
matrix product ran on, until the process ends.  A new ``torch.cuda.Stream()`` per replay
recording or captured step (streams come from a pool of 32 per priority) would grow CUDA memory
by 32 MB per recording, up to 1 GB, all of it held by cuBLAS workspaces.  Users of one side
stream order their work with ``wait_stream`` both ways, so sharing it only serialises them.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Dict, Iterator, Optional, Tuple

import torch

_SIDE: Dict[Tuple[int, int], "torch.cuda.Stream"] = {}
_LOCK = threading.Lock()
_WARMUP = [0]   # depth of nested ``capture_warmup`` blocks, process-wide


def side_stream(device: Optional[int] = None) -> "torch.cuda.Stream":
    """The calling thread's side stream on ``device`` (default: the current CUDA device), created
    on first use."""
    index = torch.cuda.current_device() if device is None else int(device)
    key = (index, threading.get_ident())
    stream = _SIDE.get(key)
    if stream is None:
        with _LOCK:
            stream = _SIDE.get(key)
            if stream is None:
                stream = _SIDE[key] = torch.cuda.Stream(device=index)
    return stream


@contextlib.contextmanager
def capture_warmup() -> Iterator[None]:
    """Mark the process's work as the warm-up of a CUDA-graph capture (a replay's recording, a
    captured step): choices that suit a call made once (such as pushing a backward instead of
    building a transpose) would be recorded and replayed for good, so they are made as for a
    graph in steady use.  Process-wide, not per thread: the autograd engine runs a CUDA
    backward on its own worker thread."""
    with _LOCK:
        _WARMUP[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _WARMUP[0] -= 1


def in_capture_warmup() -> bool:
    """Whether some thread of the process is inside ``capture_warmup``."""
    return _WARMUP[0] > 0
