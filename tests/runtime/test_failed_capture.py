"""The clean-up after a failed CUDA-graph capture (``sparsegnn._failed_capture``) that runs without
a GPU: the signature torch calls, and which allocator calls run.  The captures themselves are
tested on the GPU in test_tune.py, test_replay.py and test_capture.py."""
import inspect

import pytest
import torch

from sparsegnn import _failed_capture
from sparsegnn._failed_capture import CleanupCUDAGraph, free_failed_capture


def test_capture_begin_takes_every_argument_of_torchs():
    """torch.cuda.graph passes its arguments by keyword (torch 2.13 added check_input_liveness):
    an override that does not take one turns every capture into a TypeError."""
    base = inspect.signature(torch.cuda.CUDAGraph.capture_begin).parameters
    ours = inspect.signature(CleanupCUDAGraph.capture_begin)
    names = [n for n in base if n != "self"]
    assert names and names[0] == "pool"
    ours.bind(None, **{n: None for n in names})                 # by keyword, as torch.cuda.graph does
    ours.bind(None, None, **{n: None for n in names[1:]})       # the pool by position


@pytest.fixture
def calls(monkeypatch):
    log = []
    monkeypatch.setattr(_failed_capture, "end_failed_capture", lambda device: log.append(("generator", device)))
    monkeypatch.setattr(torch._C, "_cuda_releasePool", lambda d, p: log.append(("free", d, p)), raising=False)
    return log


def test_a_pool_the_allocator_still_held_is_ended_and_freed(monkeypatch, calls):
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", lambda d, p: calls.append(("end", d, p)),
                        raising=False)
    free_failed_capture(1, (0, 7))
    assert calls == [("end", 1, (0, 7)), ("free", 1, (0, 7)), ("generator", 1)]


def test_a_pool_torch_already_ended_is_not_freed_twice(monkeypatch, calls):
    """A capture_end that failed after telling the allocator (in the graph's instantiation): the
    graph frees its pool when destroyed; freeing it here too would free a shared pool early."""
    def ended(device, pool):
        raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", ended, raising=False)
    free_failed_capture(0, (0, 7))
    assert calls == [("generator", 0)]
