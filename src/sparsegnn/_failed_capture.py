"""Leave CUDA's random number generator (and the thread's stream) usable after a CUDA-graph
capture that failed (imports only ``_streams``: the tuner, ``capture_step`` and the replaying
layers use it).

Why: ``CUDAGraph.capture_begin`` registers the device's default generator and marks its state
as capturing; only a successful ``capture_end`` marks it back.  When the capture fails (a host
sync or a forbidden allocation inside it), ``capture_end`` raises first, and in torch 2.11 the
state stays "capturing": every later random op on that device (``dropout``, ``randn``) then
raises ``Offset increment outside graph capture encountered unexpectedly``.  Our tuner times
candidates as captured replays and falls back to eager timings when one cannot be captured;
``capture_step`` and the replaying layers report a failed capture and run eagerly.  Each of
those left the user's next dropout failing (found by the GPU run of the test suite, stop 49:
a test after the tuner's failed-capture tests failed in ``torch.randn``).

The cure uses only public API: an empty capture on the same device, whose successful
``capture_end`` runs the generator's capture epilogue.  The generator keeps its state object,
seed and offset, so graphs captured before keep replaying from the same stream of numbers.

The same failed ``capture_end`` also leaves the capture's memory pool held: torch tells the
allocator the capture is over, and releases the pool, only for a capture that ended.  The pool
kept whatever the capture had allocated (a whole forward's activations, for a replay recording)
until the process ended, and the allocator kept the capture in its list of those under way.
:class:`CleanupCUDAGraph` does both when its ``capture_end`` fails.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator, Optional

import torch

from ._streams import side_stream


def end_failed_capture(device: Optional[int] = None) -> None:
    """Mark the default CUDA generator of ``device`` (default: the current device) as no longer
    capturing, after a capture on that device failed.  One empty capture; harmless where the
    generator was not left capturing.  Call it outside any capture."""
    index = torch.cuda.current_device() if device is None else int(device)
    graph = torch.cuda.CUDAGraph()
    stream = side_stream(index)
    stream.wait_stream(torch.cuda.current_stream(index))
    with warnings.catch_warnings(), torch.cuda.device(index), torch.cuda.stream(stream):
        warnings.simplefilter("ignore")        # "the CUDA graph is empty": it is meant to be
        graph.capture_begin(capture_error_mode="thread_local")
        graph.capture_end()
    torch.cuda.current_stream(index).wait_stream(stream)
    del graph


def release_failed_capture(device: int, pool) -> None:
    """After a capture on ``device`` into ``pool`` whose ``capture_end`` raised: the allocator
    told that the capture is over, the capture's hold on the pool dropped (its memory returns to
    the allocator's cache), and :func:`end_failed_capture`."""
    for release in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
        try:
            getattr(torch._C, release)(device, pool)
        except Exception:  # noqa: BLE001 - a torch that ended the pool itself
            pass
    end_failed_capture(device)


class CleanupCUDAGraph(torch.cuda.CUDAGraph):
    """``torch.cuda.CUDAGraph`` whose ``capture_end``, when it fails, first runs
    :func:`release_failed_capture` (pool and generator) and then raises as before."""

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        # the pool's id kept here: torch's pool() refuses to answer before a successful capture
        self._pool_id = torch.cuda.graph_pool_handle() if pool is None else pool
        super().capture_begin(pool=self._pool_id, capture_error_mode=capture_error_mode)

    def capture_end(self) -> None:
        try:
            super().capture_end()
        except BaseException:
            try:
                release_failed_capture(torch.cuda.current_device(), self._pool_id)
            except Exception:  # noqa: BLE001 - the capture's error is the one to report
                pass
            raise


@contextmanager
def failed_capture_guard(device: Optional[int] = None) -> Iterator[None]:
    """Entered just before ``torch.cuda.graph(...)``: when the capture raises, the calling thread's
    current stream is set back to the one it had here, and :func:`end_failed_capture` runs,
    before the error goes on (an error of that cleanup never hides the capture's own).

    The stream: ``torch.cuda.graph.__exit__`` calls ``capture_end`` before it leaves its stream
    context, so a failed ``capture_end`` left the thread on torch's capture stream for good
    (torch 2.11): every later op of the thread ran there, and a replaying layer, which records
    only on the default stream, never recorded again (seen on the GPU, stop 49)."""
    stream = torch.cuda.current_stream(device)
    try:
        yield
    except BaseException:
        try:
            if torch.cuda.current_stream(device) != stream:
                torch.cuda.set_stream(stream)
            end_failed_capture(device)
        except Exception:  # noqa: BLE001 - the capture's error is the one to report
            pass
        raise
