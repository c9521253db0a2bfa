"""Leave CUDA's random number generator (and the thread's stream) usable after a CUDA-graph
capture that failed (imports only ``_streams``: the tuner, ``capture_step`` and the replaying
layers use it).

Why: ``CUDAGraph.capture_begin`` registers the device's default generator and marks its state
as capturing; only a successful ``capture_end`` marks it back.  When the capture fails (a host
sync or a forbidden allocation inside it), ``capture_end`` raises first, and in torch 2.11 the
state stays "capturing": every later random op on that device (``dropout``, ``randn``) then
raises ``Offset increment outside graph capture encountered unexpectedly``.  Our tuner times
candidates as captured replays and falls back to eager timings when one cannot be captured;
``capture_step`` and the replaying layers report a failed capture and run eagerly.  Without
this cure, each of those would leave the user's next ``dropout`` or ``torch.randn`` failing.

The cure uses only public API: an empty capture on the same device, whose successful
``capture_end`` runs the generator's capture epilogue.  The generator keeps its state object,
seed and offset, so graphs captured before keep replaying from the same stream of numbers.

The same failed ``capture_end`` also leaves the capture's memory pool held: torch tells the
allocator the capture is over, and frees the pool, only for a capture that ended.  The pool
would keep whatever the capture had allocated (a whole forward's activations, for a replay
recording) until the process ends, and the allocator would keep the capture in its list of those
under way.
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


def free_failed_capture(device: int, pool) -> None:
    """After a capture on ``device`` into ``pool`` whose ``capture_end`` raised: the allocator
    told that the capture is over and, only then, the capture's hold on the pool dropped (its
    memory returns to the allocator's cache); then :func:`end_failed_capture`.

    torch 2.11 raises on the failed stream capture before it tells the allocator, so the pool is
    freed here.  Where the allocator had already been told (a ``capture_end`` that failed later,
    in the graph's instantiation, or a torch that ends the pool on every path), freeing it is left
    to torch: a second free could drop a pool that another graph sharing it still replays into."""
    try:
        torch._C._cuda_endAllocateToPool(device, pool)
    except Exception:  # noqa: BLE001 - "not currently recording": torch ended it and frees the pool
        pass
    else:
        try:
            torch._C._cuda_releasePool(device, pool)
        except Exception:  # noqa: BLE001
            pass
    end_failed_capture(device)


class CleanupCUDAGraph(torch.cuda.CUDAGraph):
    """``torch.cuda.CUDAGraph`` whose ``capture_end``, when it fails, first runs
    :func:`free_failed_capture` (pool and generator) and then raises as before.

    Not covered: a failure inside ``capture_begin`` itself, and the pinned host memory pool that
    newer torch versions also open for a capture (no Python call ends it)."""

    def capture_begin(self, pool=None, *args, **kwargs) -> None:
        # every argument torch passes goes through (torch 2.13 added check_input_liveness); the
        # pool's id is kept here because torch's pool() refuses to answer before a successful capture
        if pool is None:
            pool = torch.cuda.graph_pool_handle()
        self._pool_id = getattr(pool, "id", pool)     # a torch.cuda.MemPool, or a pool handle
        super().capture_begin(pool, *args, **kwargs)

    def capture_end(self) -> None:
        try:
            super().capture_end()
        except BaseException:
            try:
                free_failed_capture(torch.cuda.current_device(), self._pool_id)
            except Exception:  # noqa: BLE001 - the capture's error is the one to report
                pass
            raise


@contextmanager
def failed_capture_guard() -> Iterator[None]:
    """Entered just before ``torch.cuda.graph(...)``: when the capture raises, the calling thread's
    current device and every device's current stream are set back to what they were here, and
    :func:`end_failed_capture` runs, before the error goes on (an error of that cleanup never
    hides the capture's own).

    The stream: ``torch.cuda.graph.__exit__`` calls ``capture_end`` before it leaves its stream
    context, so a failed ``capture_end`` leaves the thread on torch's capture stream for good
    (torch 2.11): every later op of the thread would run there, and a replaying layer, which
    records only on the default stream, would never record again.  Torch's capture
    stream belongs to the device that was current when it was first made, so the context can have
    switched the current device too."""
    current = torch.cuda.current_device()
    streams = [torch.cuda.current_stream(d) for d in range(torch.cuda.device_count())]
    try:
        yield
    except BaseException:
        try:
            for stream in streams:
                if torch.cuda.current_stream(stream.device) != stream:
                    torch.cuda.set_stream(stream)        # this also makes stream.device current
            torch.cuda.set_device(current)
            end_failed_capture(current)
        except Exception:  # noqa: BLE001 - the capture's error is the one to report
            pass
        raise
