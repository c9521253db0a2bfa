"""Triton's once-per-process start-up work, moved off the first kernel launch: its key (stored
on disk, or hashed in the background), the modules its first launch imports, its tool versions,
its driver and the SpMM kernels' sources.

The first launch of any Triton kernel in a process, even one whose binary sits in Triton's disk
cache, computes ``triton.runtime.cache.triton_key()``: a SHA-256 over Triton's compiler library
(``libtriton.so``, ~400-500 MB) and sources, ~0.25 s of reads and hashing.

``import sparsegnn`` starts none of this: it only queues ``_on_cuda_init`` for the end of CUDA's
lazy init (``arm``).  The script's first CUDA use (moving its data to the GPU) then starts two
daemon threads that run while the script builds its model:

- **The stored key.**  The key depends only on the bytes of those files, so it is stored under
  the cache root (``<cache root>/triton_key/<stamp>``), where the stamp is a SHA-256 over
  Triton's version and the path, size, modification time and inode of every file the key reads
  (Python's rule for ``.pyc`` files).  A process that finds its stamp's file installs the stored
  key as ``triton_key`` in Triton's modules (Triton's own compile-worker pool does the same with
  the key its parent computed).  Stamping costs ~2 ms of ``stat`` calls.
- **The background hash.**  Without a stored key, the first thread computes the key (``hashlib``
  and file reads give up the GIL), then stores it.  The first launch that takes Triton's own
  path (``kernels/_launch.py``) calls ``wait()`` first, so a key still being hashed is waited
  for rather than hashed twice.
- **The launch-time imports.**  Triton's first launch imports modules its own import did not
  (Triton 3.6: the gluon tensor-descriptor classes, ~75 ms) and runs ``file`` once for its
  platform key (~0.1 s); the first thread does both first.
- **The tool versions.**  The CUDA backend's hash in every kernel's cache key runs
  ``ptxas --version`` (twice, ~5-7 ms, cached per architecture); the second thread fills it.
- **Triton's driver.**  The second thread then creates Triton's default driver, whose C
  utilities module Triton builds with ``gcc`` where its cache has none (~0.3 s).
- **The first step's kernel sources.**  The second thread then imports the SpMM kernel module
  (each ``@triton.jit`` tokenises its source) and computes its kernels' cache keys (an AST walk
  each): ~30 ms of Python, overlapping the step's first cuBLAS call.  It waits until
  ``import sparsegnn`` has finished, so the two threads may wait on each other's import of one
  module but never in a cycle.

The hashing imports nothing: the packages ``triton_key`` walks are imported on the calling
thread first.  sparsegnn's own first launch waits for both threads.  A fork while a thread holds
a module's import lock would copy a lock the child can never unlock (a DataLoader worker importing
that module would hang), so ``start`` registers a hook that, before a fork, waits up to
``FORK_WAIT_S`` for the threads.  It all runs only where kernels will be compiled for a GPU (a
CUDA or ROCm build of torch, Triton installed, not the interpreter, not a worker process);
``SPARSEGNN_PREWARM=0`` turns it off.  A failure in it is ignored: the first launch then computes
the key itself; a stored key that is not one of this Triton's is ignored.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import threading
from pathlib import Path
from typing import Callable, List, Optional

from .._paths import cache_root
from . import interpreting, triton_available

_THREAD: Optional[threading.Thread] = None
#: The thread that fills Triton's ``ptxas --version`` once CUDA has started (``_after_cuda_init``).
_TOOLS: Optional[threading.Thread] = None
#: Modules Triton imports on a process's first launch, not at its own import (absent ones are skipped).
_LAUNCH_IMPORTS = ("triton.experimental.gluon.nvidia.hopper",)
#: sparsegnn's kernel modules that a first GCN training step launches (``_kernel_sources``).
_KERNEL_MODULES = ("spmm_csr",)
#: Triton's subpackages whose modules ``triton_key`` reads (besides ``runtime/cache.py`` and
#: ``_C/libtriton``).
_KEYED_PACKAGES = ("compiler", "backends", "language")
#: Triton's own ``triton_key`` while the stored one is installed (``restore`` puts it back).
_ORIGINAL: Optional[Callable[[], str]] = None


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
    for sub in _KEYED_PACKAGES:
        for _ in pkgutil.walk_packages([os.path.join(root, sub)], prefix=f"triton.{sub}."):
            pass


def key_files() -> List[str]:
    """The files whose bytes ``triton_key`` hashes, and more: ``runtime/cache.py``, every
    module file (``.py``, ``.pyc``, ``.so``, ``.pyd``) under Triton's ``compiler``, ``backends``
    and ``language`` folders outside ``__pycache__``, and ``_C/libtriton.*`` (a superset of the
    module origins Triton's own walk finds)."""
    import triton

    root = os.path.dirname(os.path.abspath(triton.__file__))
    files = [os.path.join(root, "runtime", "cache.py")]
    for sub in _KEYED_PACKAGES:
        for folder, subfolders, names in os.walk(os.path.join(root, sub)):
            subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
            files += [os.path.join(folder, n) for n in sorted(names) if n.endswith((".py", ".pyc", ".so", ".pyd"))]
    lib = os.path.join(root, "_C")
    files += [os.path.join(lib, n) for n in sorted(os.listdir(lib)) if n.startswith("libtriton.")]
    return files


def stamp() -> str:
    """SHA-256 over Triton's version and (path, size, mtime, inode) of each of ``key_files()``:
    it changes whenever a file the key reads may have changed."""
    import triton

    digest = hashlib.sha256(f"{triton.__version__}\n".encode())
    for path in key_files():
        st = os.stat(path)
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return digest.hexdigest()


def _plausible(key: str) -> bool:
    """Whether ``key`` has the form of this Triton's keys: its version, then SHA-256 hex digests
    joined by '-'."""
    import triton

    version = triton.__version__
    return key.startswith(version) and re.fullmatch(r"[0-9a-f]{64}(-[0-9a-f]{64})+", key[len(version):]) is not None


def _rebind(old: Callable[[], str], new: Callable[[], str]) -> None:
    """Replace ``old`` by ``new`` as ``triton_key`` in every loaded Triton module that bound it
    (``triton.runtime.cache`` and those that imported it by name, such as the autotuner)."""
    modules = [m for name, m in list(sys.modules.items())
               if (name == "triton" or name.startswith("triton.")) and getattr(m, "triton_key", None) is old]
    for module in modules:
        module.triton_key = new


def _install(key: str) -> None:
    """Make ``triton_key`` return ``key`` in every loaded Triton module that bound it; on a
    failure part-way, Triton's own function is put back before the error propagates."""
    global _ORIGINAL
    import triton.runtime.cache as cache

    @functools.lru_cache()
    def triton_key() -> str:  # Triton's key of these very files, read from sparsegnn's store
        return key

    original = cache.triton_key
    _ORIGINAL = original
    try:
        _rebind(original, triton_key)
    except BaseException:
        restore()
        raise


def restore() -> None:
    """Put Triton's own ``triton_key`` back where ``_install`` replaced it (tests)."""
    global _ORIGINAL
    if _ORIGINAL is None:
        return
    import triton.runtime.cache as cache

    original, _ORIGINAL = _ORIGINAL, None
    _rebind(cache.triton_key, original)


def _load(path: Path) -> Optional[str]:
    try:
        key = path.read_text().strip()
    except OSError:
        return None
    return key if _plausible(key) else None


def _save(path: Path, key: str) -> None:
    """Write ``key`` to ``path`` atomically (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(key)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _tritons_own(fn) -> bool:
    """Whether ``fn`` is Triton's own ``triton_key`` (its ``lru_cache`` over the function defined
    in ``triton.runtime.cache``), not a replacement someone installed (a worker's stub)."""
    return getattr(getattr(fn, "__wrapped__", None), "__module__", None) == "triton.runtime.cache"


def _hash(store: Optional[Path], own: Callable[[], str]) -> None:
    """Compute Triton's key (filling its ``lru_cache``) and store it if ``own`` is Triton's own
    function and still the one installed (a replacement's value is never stored)."""
    try:
        import triton.runtime.cache as cache

        key = cache.triton_key()
        if store is not None and cache.triton_key is own and _tritons_own(own):
            _save(store, key)
    except Exception:  # noqa: BLE001 - the first launch computes it itself (see the module doc)
        pass


def _import_launch_modules() -> None:
    """Import ``_LAUNCH_IMPORTS`` and fill Triton's cached platform key (a ``file`` subprocess)."""
    import importlib

    for name in _LAUNCH_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - another Triton: its first launch imports what it needs
            pass
    try:
        from triton.runtime.build import platform_key

        if hasattr(platform_key, "cache_info"):     # cached (Triton 3.6 on): computed once here
            platform_key()
    except Exception:  # noqa: BLE001 - as above
        pass


def _background(store: Optional[Path], own: Optional[Callable[[], str]]) -> None:
    """The thread's work: the launch-time imports, then (``own``: no stored key) the key."""
    _import_launch_modules()
    if own is not None:
        _hash(store, own)


def _tool_versions() -> None:
    """Fill Triton's cached ``ptxas --version`` for the current device's architecture: the
    CUDA backend's hash, part of every kernel's cache key, runs it (two subprocesses, ~5-7 ms
    of a process's first compile or cache load)."""
    try:
        import torch
        from triton.backends.nvidia.compiler import get_ptxas_version

        major, minor = torch.cuda.get_device_capability()
        get_ptxas_version(major * 10 + minor)
    except Exception:  # noqa: BLE001 - another Triton or no ptxas: the first launch runs it itself
        pass


def _driver() -> None:
    """Create Triton's default driver: its CUDA utilities module (``load_binary`` and friends) is
    C that Triton compiles with the host compiler on a process's first use where its cache holds
    no build (~0.3 s of ``gcc`` in a first step with empty caches; a library load otherwise).
    With torch loaded, Triton 3.6 and 3.9 make no CUDA call here beyond torch's cached device
    count.  Only ``driver.default`` is built: the *active* driver is left for Triton to set from
    it on first use, so a ``driver.set_active(...)`` by the script (Inductor does that) is never
    overwritten by this thread.  Where the script builds the driver at the same time, Triton
    (which takes no lock) builds it twice: wasted work, the same result."""
    try:
        from triton.runtime import driver

        if type(driver).__dict__.get("default") is not None and getattr(driver, "_default", None) is None:
            driver.default  # noqa: B018 - creates and keeps the default driver
    except Exception:  # noqa: BLE001 - the first launch creates it itself
        pass


def _after_cuda_work() -> None:
    """The second thread's work: the tool versions, Triton's driver, the first step's kernel sources."""
    _tool_versions()
    _driver()
    _kernel_sources()


def _package_imported(timeout: float = 5.0) -> bool:
    """Wait (polling, at most ``timeout`` s) until ``import sparsegnn`` has finished, so a module
    imported on a thread never waits on a lock the importing thread holds; False if it did not."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        package = sys.modules.get(__package__.rpartition(".")[0])
        spec = getattr(package, "__spec__", None)
        if package is not None and not getattr(spec, "_initializing", False):
            return True
        time.sleep(0.005)
    return False


def _kernel_sources() -> None:
    """Import the kernel modules a first training step launches (``_KERNEL_MODULES``) and compute
    their kernels' Triton cache keys: Python work of ~30 ms (each ``@triton.jit`` tokenises its
    source at import; each key walks its AST) that a first GCN step otherwise pays on its own
    thread, and that here overlaps the step's first cuBLAS and CUDA module loads (C++ that
    gives up the GIL).  Only Python runs here: no CUDA call, so a CUDA graph capture that the
    script begins meanwhile cannot be disturbed by this thread."""
    if not _package_imported():
        return
    import importlib

    for name in _KERNEL_MODULES:
        try:
            module = importlib.import_module(f".{name}", __package__)
            for value in list(vars(module).values()):
                if type(value).__name__ == "JITFunction" and hasattr(type(value), "cache_key"):
                    value.cache_key                                 # noqa: B018 - fills value.hash
        except Exception:  # noqa: BLE001 - the first launch imports and hashes it itself
            pass


def _after_cuda_init() -> None:
    """Called by ``_on_cuda_init`` where CUDA's lazy init ends (on the thread that initialised
    it): starts ``_after_cuda_work`` on a daemon thread.  Never
    raises: an exception here would surface as torch's ``DeferredCudaCallError``."""
    global _TOOLS
    try:
        _TOOLS = threading.Thread(target=_after_cuda_work, name="sparsegnn-triton-tools", daemon=True)
        _TOOLS.start()
    except Exception:  # noqa: BLE001 - see the docstring
        pass


#: Seconds a fork waits for the prewarm threads (``_before_fork``); they run ~0.1-0.4 s.
FORK_WAIT_S = 2.0
_FORK_HOOK = False


def _before_fork() -> None:
    """``os.register_at_fork(before=...)``: let running prewarm threads finish (at most
    ``FORK_WAIT_S`` each) so the child inherits no import lock held by a thread it lacks.  A
    fork from one of the threads themselves (none does; subprocesses exec at once) is not made
    to wait for itself."""
    current = threading.current_thread()
    for thread in (_THREAD, _TOOLS):
        if thread is not None and thread is not current and thread.is_alive():
            thread.join(FORK_WAIT_S)


def start(force: bool = False) -> Optional[threading.Thread]:
    """Install the stored key, else hash it, and import the launch-time modules on a background
    thread, once per process (``force``: even where ``wanted()`` is False, for tests).  Returns
    the thread, or None when nothing is to be done."""
    global _THREAD
    if _THREAD is not None or _ORIGINAL is not None:
        return _THREAD
    if not (force or wanted()):
        return None
    try:
        import triton.runtime.cache as cache   # imported here, not on the thread

        _walk_triton_packages()
    except Exception:  # noqa: BLE001 - a Triton without this layout: nothing to prewarm
        return None
    own: Optional[Callable[[], str]] = cache.triton_key
    try:
        store: Optional[Path] = cache_root() / "triton_key" / stamp()
        key = _load(store)
        if key is not None:
            _install(key)
            own = None                              # nothing to hash
    except Exception:  # noqa: BLE001 - no stamp or no cache root: hash, store nothing
        store = None
    global _FORK_HOOK
    if not _FORK_HOOK and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork)
        _FORK_HOOK = True
    _THREAD = threading.Thread(target=_background, args=(store, own), name="sparsegnn-triton-prewarm", daemon=True)
    _THREAD.start()
    return _THREAD


#: Whether ``arm`` queued ``_on_cuda_init`` (it runs once, where CUDA's lazy init ends).
_ARMED = False
#: Whether CUDA had started before ``arm`` ran: then the first launch calls ``start`` (``wait``).
_LATE = False
_LATE_LOCK = threading.Lock()


def arm() -> None:
    """What ``import sparsegnn`` does: nothing but queue ``_on_cuda_init`` for the end of CUDA's
    lazy init (``torch.cuda._lazy_call``), where this process will compile kernels for a GPU
    (``wanted``).  No thread starts and no Triton module changes at import.  Where CUDA has
    already started (the script touched the GPU before importing sparsegnn), the first kernel
    launch starts the prewarm instead (``wait``); it then overlaps nothing, but the stored key
    still spares the hashing."""
    global _ARMED, _LATE
    if _ARMED or not wanted():
        return
    _ARMED = True
    try:
        import torch

        if torch.cuda.is_initialized():
            _LATE = True
        else:
            torch.cuda._lazy_call(_on_cuda_init)
    except Exception:  # noqa: BLE001 - a torch without the hook: the first launch starts it
        _LATE = True


def _on_cuda_init() -> None:
    """Queued by ``arm``: runs where CUDA's lazy init ends (on the thread that initialised it).
    Starts the key thread (``start``) and the tools thread (``_after_cuda_init``) while the
    script moves its data and builds its model.  Never raises: an exception here would surface
    as torch's ``DeferredCudaCallError``.  ``start``'s own work here (importing the packages the
    key walks, ~2 ms of stamping, installing a stored key) runs inside torch's lazy init, on the
    thread making the script's first CUDA call."""
    try:
        started = start() is not None
    except Exception:  # noqa: BLE001 - see the docstring
        started = False
    if started:                                 # declined (a worker, no Triton layout): nothing more
        _after_cuda_init()


def state() -> str:
    """What ``start`` did in this process with Triton's key: ``"stored"`` (a stored key
    installed), ``"hashing"`` (hashed on the background thread, which may have finished) or
    ``"none"``."""
    return "stored" if _ORIGINAL is not None else "hashing" if _THREAD is not None else "none"


def wait(timeout: float = 30.0) -> None:
    """Block until a started prewarm has finished (at most ``timeout`` seconds); returns at once
    when none runs.  ``kernels/_launch.launch`` calls it before a kernel first takes Triton's own
    path (compile or load); the interpreter and launches under profiler hooks do not.  Where
    ``arm`` found CUDA already started, this first starts the prewarm (``start``)."""
    global _LATE
    if _LATE:
        with _LATE_LOCK:                        # two threads' first launches start it once
            if _LATE:
                _LATE = False
                try:
                    start()
                except Exception:  # noqa: BLE001 - the launch computes the key itself
                    pass
    for thread in (_THREAD, _TOOLS):
        if thread is not None and thread.is_alive():
            thread.join(timeout)
