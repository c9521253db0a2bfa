"""The background hashing of Triton's compiler (``kernels._prewarm``): it fills Triton's
per-process key on its own thread, importing nothing there, and stays off where no GPU kernel
will be compiled."""
import sys

import pytest

pytest.importorskip("triton")

from sparsegnn.kernels import _prewarm  # noqa: E402


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


def test_thread_computes_the_key_and_imports_nothing(monkeypatch):
    from triton.runtime.cache import triton_key

    imported = []
    original = _prewarm._hash

    def hash_and_watch():
        before = set(sys.modules)
        original()
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


def test_wait_joins_a_running_prewarm(monkeypatch):
    """``wait`` returns once the background work is done (the first launch calls it rather than
    hashing a second time), and at once when nothing runs."""
    import threading

    release = threading.Event()
    monkeypatch.setattr(_prewarm, "_THREAD", None)
    monkeypatch.setattr(_prewarm, "_hash", lambda: release.wait(60))
    thread = _prewarm.start(force=True)
    assert thread.is_alive()
    threading.Timer(0.2, release.set).start()
    _prewarm.wait()
    assert not thread.is_alive()
    monkeypatch.setattr(_prewarm, "_THREAD", None)
    _prewarm.wait()                                         # nothing started: returns at once
