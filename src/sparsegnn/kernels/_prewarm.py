"""Triton's once-per-process start-up work, done in the background while a script gets ready.

The first launch of any Triton kernel in a process, even one whose binary sits in Triton's
disk cache, computes ``triton.runtime.cache.triton_key()``: a SHA-256 over Triton's own
compiler library (``libtriton.so``, ~400-500 MB) and sources, kept in an ``lru_cache``:
~0.25 s of reads and hashing on the H100 host, in a first GCN training step of 1.17 s with
every cache warm (``benchmarks/h100/first_step_profile_2026-11-24_before.txt``).  ``hashlib``
and file reads release the GIL, so a daemon thread started when ``sparsegnn`` is imported does
the hashing while the script loads its data and builds its model.  The first launch that
takes Triton's own path (``kernels/_launch.py``) calls ``wait()`` first, so a key still being
hashed is waited for rather than hashed a second time on the calling thread.

The thread imports nothing: the packages ``triton_key`` walks are imported (and walked) on
the calling thread first, so the two threads never import concurrently.  It starts only
where kernels will be compiled for a GPU (a CUDA or ROCm build of torch, Triton installed,
not the interpreter, not a worker process such as a DataLoader's); ``SPARSEGNN_PREWARM=0``
turns it off.  A failure in it is ignored: the first launch then computes the key itself,
as it would without this module.
"""
from __future__ import annotations

import os
import threading
from typing import Optional

from . import interpreting, triton_available

_THREAD: Optional[threading.Thread] = None


def wanted() -> bool:
    """Whether this process will compile Triton kernels for a GPU and the user did not opt out."""
    if os.environ.get("SPARSEGNN_PREWARM", "1").strip() in ("0", "false", "no", "off"):
        return False
    if not triton_available() or interpreting():
        return False
    import multiprocessing

    if multiprocessing.parent_process() is not None:   # a DataLoader or pool worker: no kernels
        return False
    import torch

    return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None


def _walk_triton_packages() -> None:
    """Import, on this thread, the packages that ``triton_key`` walks (already imported in
    practice: Triton's own import pulls them in; this makes sure)."""
    import pkgutil

    import triton

    root = os.path.dirname(triton.__file__)
    for sub in ("compiler", "backends", "language"):
        for _ in pkgutil.walk_packages([os.path.join(root, sub)], prefix=f"triton.{sub}."):
            pass


def _hash() -> None:
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception:  # noqa: BLE001 - the first launch computes it itself (see the module doc)
        pass


def start(force: bool = False) -> Optional[threading.Thread]:
    """Start the background hashing once per process (``force``: even where ``wanted()`` is
    False, for tests).  Returns the thread, or None when it does not run."""
    global _THREAD
    if _THREAD is not None:
        return _THREAD
    if not (force or wanted()):
        return None
    try:
        from triton.runtime.cache import triton_key  # noqa: F401 - imported here, not on the thread

        _walk_triton_packages()
    except Exception:  # noqa: BLE001 - a Triton without this layout: nothing to prewarm
        return None
    _THREAD = threading.Thread(target=_hash, name="sparsegnn-triton-prewarm", daemon=True)
    _THREAD.start()
    return _THREAD


def wait(timeout: float = 30.0) -> None:
    """Block until a started prewarm has finished (at most ``timeout`` seconds); returns at once
    when none runs.  ``kernels/_launch.launch`` calls it before a kernel first takes Triton's own
    path (compile or load); the interpreter and launches under profiler hooks do not."""
    thread = _THREAD
    if thread is not None and thread.is_alive():
        thread.join(timeout)
