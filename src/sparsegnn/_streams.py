"""One side CUDA stream per device and thread for the library's captures and warm-ups (no
sparsegnn imports: every layer may use it).

Why one: PyTorch keeps a cuBLAS workspace (32 MB on an H100) for every (handle, stream) pair a
matrix product ran on, until the process ends.  A new ``torch.cuda.Stream()`` per replay
recording or captured step (streams come from a pool of 32 per priority) would grow CUDA memory
by 32 MB per recording, up to 1 GB, all of it held by cuBLAS workspaces.  Users of one side
stream order their work with ``wait_stream`` both ways, so sharing it only serialises them.
"""
from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import torch

_SIDE: Dict[Tuple[int, int], "torch.cuda.Stream"] = {}
_LOCK = threading.Lock()


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
