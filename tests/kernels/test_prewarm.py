"""Triton's per-process start-up work (``kernels._prewarm``): nothing at import, threads from
CUDA's first use; the key stored once and installed by later processes (only while the files it
reads are unchanged), else hashed on a background thread (the hashing imports nothing) and
stored; the modules Triton's first launch imports, imported on that thread first; off where no
GPU kernel will be compiled."""
import sys
import time

import pytest

pytest.importorskip("triton")

from sparsegnn.kernels import _prewarm  # noqa: E402


@pytest.fixture
def fresh_prewarm(monkeypatch, tmp_path):
    """``_prewarm`` as in a new process, its cache root in ``tmp_path``; Triton's own key restored
    afterwards."""
    from triton.runtime.cache import triton_key

    _prewarm.restore()                 # a key installed by this process's import (a GPU machine)
    monkeypatch.setenv("SPARSEGNN_CACHE", str(tmp_path))
    monkeypatch.setattr(_prewarm, "_THREAD", None)
    triton_key.cache_clear()
    yield tmp_path
    _prewarm.restore()
    _prewarm.wait()


def test_off_by_variable_and_under_the_interpreter(monkeypatch):
    import multiprocessing

    import torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("SPARSEGNN_PREWARM", "1")
    monkeypatch.setattr(torch.version, "cuda", "12.8")             # a CUDA build of torch
    assert _prewarm.wanted()
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())   # a worker process
    assert not _prewarm.wanted()
    monkeypatch.undo()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("SPARSEGNN_PREWARM", "0")
    assert not _prewarm.wanted()
    monkeypatch.setenv("SPARSEGNN_PREWARM", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not _prewarm.wanted()


def test_the_thread_computes_the_key_and_its_hashing_imports_nothing(fresh_prewarm, monkeypatch):
    from triton.runtime.cache import triton_key

    imported = []
    original = _prewarm._hash

    def hash_and_watch(*args):
        before = set(sys.modules)
        original(*args)
        imported.extend(sorted(set(sys.modules) - before))

    monkeypatch.setattr(_prewarm, "_THREAD", None)
    monkeypatch.setattr(_prewarm, "_hash", hash_and_watch)
    triton_key.cache_clear()
    thread = _prewarm.start(force=True)
    assert thread is not None and _prewarm.start(force=True) is thread   # once per process
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert triton_key.cache_info().currsize == 1           # the first launch finds it cached
    assert imported == []
    assert triton_key() == triton_key.__wrapped__()        # the cached key is Triton's own


def test_wait_joins_a_running_prewarm(fresh_prewarm, monkeypatch):
    """``wait`` returns once the background work is done (the first launch calls it rather than
    hashing a second time), and at once when nothing runs."""
    import threading

    go_on = threading.Event()
    monkeypatch.setattr(_prewarm, "_THREAD", None)
    monkeypatch.setattr(_prewarm, "_hash", lambda *args: go_on.wait(60))
    thread = _prewarm.start(force=True)
    assert thread.is_alive()
    threading.Timer(0.2, go_on.set).start()
    _prewarm.wait()
    assert not thread.is_alive()
    monkeypatch.setattr(_prewarm, "_THREAD", None)
    _prewarm.wait()                                         # nothing started: returns at once


@pytest.fixture
def cuda_build(fresh_prewarm, monkeypatch):
    """A process that looks like a CUDA build before ``arm``: returns the list that
    ``torch.cuda._lazy_call`` queues into; the key thread ends at once."""
    import torch

    queued = []
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("SPARSEGNN_PREWARM", raising=False)
    monkeypatch.setattr(torch.cuda, "_lazy_call", lambda fn, **kw: queued.append(fn))
    monkeypatch.setattr(_prewarm, "_ARMED", False)
    monkeypatch.setattr(_prewarm, "_LATE", False)
    monkeypatch.setattr(_prewarm, "_background", lambda store, own: None)
    return queued


def test_the_threads_start_where_cuda_starts(cuda_build, monkeypatch):
    """``arm`` (what the import does) queues ``_on_cuda_init`` for CUDA's lazy init and starts
    nothing; run there, it starts the key thread and the tools thread, which runs the tool
    versions, Triton's driver and the kernel sources, in that order; ``wait`` joins both; it
    never raises into torch."""
    import threading

    import torch

    queued, ran, go_on = cuda_build, [], threading.Event()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(_prewarm, "_TOOLS", None)
    record = lambda name: ran.append((name, threading.current_thread().name))  # noqa: E731
    monkeypatch.setattr(_prewarm, "_tool_versions", lambda: (go_on.wait(5), record("tools")))
    monkeypatch.setattr(_prewarm, "_driver", lambda: record("driver"))
    monkeypatch.setattr(_prewarm, "_kernel_sources", lambda: record("sources"))
    threads = threading.active_count()
    _prewarm.arm()
    _prewarm.arm()                                  # once per process
    assert queued == [_prewarm._on_cuda_init]
    assert _prewarm._THREAD is None and _prewarm._TOOLS is None and threading.active_count() == threads
    queued[0]()                                     # what torch.cuda._lazy_init does at its end
    assert _prewarm._THREAD is not None and _prewarm._THREAD.name == "sparsegnn-triton-prewarm"
    assert _prewarm._TOOLS is not None and _prewarm._TOOLS.name == "sparsegnn-triton-tools"
    threading.Timer(0.2, go_on.set).start()
    _prewarm.wait()                                 # returns only once the tools thread is done
    assert not _prewarm._TOOLS.is_alive() and not _prewarm._THREAD.is_alive()
    assert ran == [(name, "sparsegnn-triton-tools") for name in ("tools", "driver", "sources")]

    def refuse(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(_prewarm.threading, "Thread", refuse)
    monkeypatch.setattr(_prewarm, "_THREAD", None)
    _prewarm._on_cuda_init()                        # swallowed: torch would re-raise it to the user


def test_cuda_started_before_the_import_starts_the_prewarm_at_the_first_launch(cuda_build, monkeypatch):
    """Where the script initialised CUDA before importing sparsegnn, ``arm`` queues nothing and
    starts nothing; the first launch's ``wait`` starts the key thread and joins it."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    _prewarm.arm()
    assert cuda_build == [] and _prewarm._THREAD is None and _prewarm._LATE
    _prewarm.wait()
    assert _prewarm._THREAD is not None and not _prewarm._THREAD.is_alive() and not _prewarm._LATE


def test_import_starts_no_thread_and_leaves_triton_as_it_was(tmp_path):
    """A fresh interpreter that looks like a CUDA build: ``import sparsegnn`` queues the warm-up
    for CUDA's first use, and starts no thread, registers nothing to run, keeps Triton's key."""
    import os
    import subprocess

    code = (
        "import threading, torch\n"
        "torch.version.cuda = '12.8'\n"
        "import sparsegnn\n"
        "from sparsegnn.kernels import _prewarm\n"
        "import triton.runtime.cache as cache\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "assert _prewarm._ARMED and _prewarm._THREAD is None and _prewarm._ORIGINAL is None\n"
        "assert cache.triton_key.__wrapped__.__module__ == 'triton.runtime.cache'\n"
        "print('quiet')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SPARSEGNN_PREWARM")}
    env["SPARSEGNN_CACHE"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "quiet" in out.stdout, out.stderr


def test_the_kernel_sources_are_imported_and_keyed_once_the_package_is_imported(monkeypatch):
    """After the tool versions the thread imports ``_KERNEL_MODULES`` and computes their
    kernels' cache keys, but only once ``import sparsegnn`` has finished (never while the main
    thread may hold an import lock it needs)."""
    import types

    keyed = []

    class JITFunction:                              # Triton's class name is what it checks
        @property
        def cache_key(self):
            keyed.append(self)
            return "key"

    module = types.ModuleType("sparsegnn.kernels._fake_first_step")
    module.kernel, module.helper, module.other = JITFunction(), JITFunction(), object()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(_prewarm, "_KERNEL_MODULES", ("_no_such_module", "_fake_first_step"))
    package = sys.modules["sparsegnn"]
    monkeypatch.setattr(package.__spec__, "_initializing", True, raising=False)   # import still running
    start = time.monotonic()
    assert not _prewarm._package_imported(timeout=0.05) and time.monotonic() - start >= 0.05
    monkeypatch.setattr(_prewarm, "_package_imported", lambda timeout=5.0: False)
    _prewarm._kernel_sources()
    assert keyed == []                              # nothing imported or keyed before the package is
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(_prewarm, "_KERNEL_MODULES", ("_no_such_module", "_fake_first_step"))
    assert _prewarm._package_imported(timeout=0.05)
    _prewarm._kernel_sources()                      # the missing module is skipped, not raised
    assert sorted(map(id, keyed)) == sorted([id(module.kernel), id(module.helper)])


def test_the_thread_creates_tritons_default_driver_only_and_swallows_its_failure(monkeypatch):
    """``_after_cuda_work`` runs the tool versions, creates Triton's *default* driver (its C
    utilities, built by gcc where cached builds are missing; the active one is left for Triton
    to set, so a script's ``set_active`` is never overwritten) and then the kernel sources; a
    driver that cannot be created is left to the first launch."""
    import triton.runtime

    order = []

    class Config:                                   # Triton's DriverConfig: default, then active from it
        def __init__(self):
            self._default = self._active = None

        @property
        def default(self):
            order.append("driver")
            if self.fail:
                raise RuntimeError("0 active drivers")
            self._default = object()
            return self._default

        @property
        def active(self):
            raise AssertionError("the thread must not set the active driver")

    config = Config()
    config.fail = False
    monkeypatch.setattr(triton.runtime, "driver", config)     # what ``from triton.runtime import driver`` finds
    monkeypatch.setattr(_prewarm, "_tool_versions", lambda: order.append("tools"))
    monkeypatch.setattr(_prewarm, "_kernel_sources", lambda: order.append("sources"))
    _prewarm._after_cuda_work()
    assert order == ["tools", "driver", "sources"] and config._default is not None and config._active is None
    _prewarm._after_cuda_work()                     # built already: not built again
    assert order[3:] == ["tools", "sources"]
    config._default, config.fail = None, True
    _prewarm._after_cuda_work()                     # the driver raises: swallowed, the sources still run
    assert order[5:] == ["tools", "driver", "sources"]


def test_a_fork_waits_for_the_threads_but_not_for_itself(monkeypatch):
    """The at-fork hook joins running prewarm threads (so no import lock held by a thread is
    copied into the child), at most ``FORK_WAIT_S`` each, and skips the calling thread."""
    import threading

    go_on = threading.Event()
    done = []
    worker = threading.Thread(target=lambda: (go_on.wait(5), done.append(1)), daemon=True)
    worker.start()
    monkeypatch.setattr(_prewarm, "_THREAD", worker)
    monkeypatch.setattr(_prewarm, "_TOOLS", None)
    threading.Timer(0.2, go_on.set).start()
    t0 = time.monotonic()
    _prewarm._before_fork()
    assert done == [1] and time.monotonic() - t0 >= 0.15        # it waited for the thread
    stuck = threading.Thread(target=lambda: time.sleep(1.0), daemon=True)
    stuck.start()
    monkeypatch.setattr(_prewarm, "_THREAD", stuck)
    monkeypatch.setattr(_prewarm, "FORK_WAIT_S", 0.1)
    t0 = time.monotonic()
    _prewarm._before_fork()
    assert time.monotonic() - t0 < 0.6 and stuck.is_alive()     # bounded by FORK_WAIT_S
    errors = []

    def from_the_thread():
        try:
            _prewarm._before_fork()                 # a fork from the prewarm thread itself
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    own = threading.Thread(target=from_the_thread, daemon=True)
    monkeypatch.setattr(_prewarm, "_THREAD", own)
    monkeypatch.setattr(_prewarm, "FORK_WAIT_S", 2.0)
    own.start()
    own.join(3)
    assert not own.is_alive() and errors == []


def test_a_hashed_key_is_stored_and_a_second_process_installs_it_without_hashing(fresh_prewarm, monkeypatch):
    import triton.runtime.cache as cache

    own = cache.triton_key
    thread = _prewarm.start(force=True)
    assert thread is not None
    thread.join(timeout=120)
    stored = list((fresh_prewarm / "triton_key").iterdir())
    assert [p.name for p in stored] == [_prewarm.stamp()]
    assert stored[0].read_text() == own()                  # Triton's own key, as hashed

    # "second process": nothing cached in Triton's own function, which must not run again; a
    # Triton module that bound the function by name at its import (as the autotuner does)
    import types

    binder = types.ModuleType("triton._bound_key_for_test")
    binder.triton_key = own
    monkeypatch.setitem(sys.modules, binder.__name__, binder)
    monkeypatch.setattr(_prewarm, "_THREAD", None)
    own.cache_clear()
    thread = _prewarm.start(force=True)                   # installed; the thread only imports
    thread.join(timeout=120)
    assert _prewarm.state() == "stored"
    assert cache.triton_key is not own
    assert cache.triton_key() == stored[0].read_text()
    assert binder.triton_key is cache.triton_key           # rebound there too
    assert own.cache_info().misses == 0                   # Triton's hashing never ran
    _prewarm.restore()
    assert cache.triton_key is own and binder.triton_key is own and own() == stored[0].read_text()


def test_a_changed_triton_file_changes_the_stamp(fresh_prewarm, monkeypatch):
    """A file the key reads, rewritten (its size or time changes): a new stamp, so the stored key
    of the old files is not used."""
    import os

    files = _prewarm.key_files()
    assert any(os.path.basename(f).startswith("libtriton.") for f in files)
    assert any(f.endswith(os.path.join("runtime", "cache.py")) for f in files)
    before = _prewarm.stamp()
    real_stat = os.stat
    target = files[len(files) // 2]

    class Touched:
        def __init__(self, st):
            self.st_size, self.st_ino, self.st_mtime_ns = st.st_size, st.st_ino, st.st_mtime_ns + 1

    monkeypatch.setattr(os, "stat", lambda p, *a, **k: Touched(real_stat(p)) if p == target else real_stat(p, *a, **k))
    assert _prewarm.stamp() != before


@pytest.mark.parametrize("content", ["", "garbage", "3.0.0-abc", "not-a-version-" + "0" * 64])
def test_a_malformed_stored_key_is_ignored_and_rehashed(fresh_prewarm, content):
    import triton.runtime.cache as cache

    path = fresh_prewarm / "triton_key" / _prewarm.stamp()
    path.parent.mkdir(parents=True)
    path.write_text(content)
    own = cache.triton_key
    thread = _prewarm.start(force=True)
    assert thread is not None and cache.triton_key is own  # not installed: hashed in the background
    thread.join(timeout=120)
    assert path.read_text() == own()                       # and stored over the bad file


def test_no_key_is_stored_when_the_cache_root_is_unwritable(fresh_prewarm, monkeypatch):
    blocker = fresh_prewarm / "file"
    blocker.write_text("")
    monkeypatch.setenv("SPARSEGNN_CACHE", str(blocker))    # a file where a folder should be
    thread = _prewarm.start(force=True)
    thread.join(timeout=120)
    from triton.runtime.cache import triton_key

    assert triton_key.cache_info().currsize == 1           # the key is still computed for the launch
    assert blocker.is_file() and list(fresh_prewarm.iterdir()) == [blocker]   # nothing written, no temp left


def test_a_replaced_key_function_is_not_stored(fresh_prewarm, monkeypatch):
    """A ``triton_key`` someone else installed before the import (a compile worker's stub) is
    used, as Triton would, but its value is not stored for later processes."""
    import functools

    import triton.runtime.cache as cache

    monkeypatch.setattr(cache, "triton_key", functools.lru_cache()(lambda: "3.0-stub"))
    thread = _prewarm.start(force=True)
    thread.join(timeout=120)
    assert cache.triton_key.cache_info().currsize == 1
    assert not (fresh_prewarm / "triton_key").exists()


def test_the_thread_imports_what_the_first_launch_would_and_skips_what_is_missing(fresh_prewarm, monkeypatch,
                                                                                   tmp_path):
    """The launch-time modules are imported on the background thread (where present), before
    the key is hashed, and ``wait`` covers them."""
    import threading

    (tmp_path / "launch_time_module_for_test.py").write_text(
        "import threading\nTHREAD = threading.current_thread().name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_prewarm, "_LAUNCH_IMPORTS", ("no_such_module_for_test", "launch_time_module_for_test"))
    order = []
    monkeypatch.setattr(_prewarm, "_hash", lambda *args: order.append(
        "launch_time_module_for_test" in sys.modules))
    monkeypatch.setitem(sys.modules, "launch_time_module_for_test", None)   # restored (removed) afterwards
    del sys.modules["launch_time_module_for_test"]
    thread = _prewarm.start(force=True)
    _prewarm.wait()
    assert not thread.is_alive()
    module = sys.modules["launch_time_module_for_test"]
    assert module.THREAD == thread.name != threading.current_thread().name
    assert order == [True]                                  # imported first, then hashed
    assert "no_such_module_for_test" not in sys.modules
