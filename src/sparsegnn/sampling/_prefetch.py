"""Sampling batches ahead in a background thread (on a side CUDA stream on the GPU).

The sampler syncs with the host twice per hop.  In a training loop those syncs wait for the
previous step's queued GPU work, so the step's host-side launch time and its GPU time stop
overlapping.  A producer thread that samples on its own stream syncs with that stream only:
batches are ready when the loop asks for them, and the loop's stream waits (on the device,
through an event) for the producer's work on each batch it receives.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor

from ..graph import Graph

_END = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _tensors(batch) -> Iterator[Tensor]:
    """Every tensor a batch holds: those of its ``graph`` included, and of what the sampler
    prebuilt in the graph's cache (its transpose, ``row``, ``1/deg``, degrees)."""
    for _, value in batch.items():
        if isinstance(value, Tensor):
            yield value
        elif isinstance(value, Graph):
            for t in (value.rowptr, value.col, value.edge_val, value.edge_perm, value.ptr):
                if t is not None:
                    yield t
            for cached in value.cache.entries():
                for t in (cached if isinstance(cached, tuple) else (cached,)):
                    if isinstance(t, Tensor):
                        yield t


def prefetched(batches: Callable[[], Iterator[Any]], device: torch.device, depth: int) -> Iterator[Any]:
    """Iterate over ``batches()`` run in a background thread, ``depth`` batches ahead.

    On CUDA the producer runs on a side stream that first waits for the consumer's stream;
    each batch comes with an event the consumer's stream waits on, and its tensors are marked
    as used by the consumer's stream (``record_stream``) for the caching allocator.  Exceptions
    of the producer are re-raised in the consumer.  Leaving the loop early stops the producer.
    """
    cuda = device.type == "cuda"
    consumer: Optional[torch.cuda.Stream] = torch.cuda.current_stream(device) if cuda else None
    side: Optional[torch.cuda.Stream] = torch.cuda.Stream(device) if cuda else None
    out: "queue.Queue[Any]" = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            context = torch.cuda.stream(side) if cuda else contextlib.nullcontext()
            with context:
                if cuda:
                    side.wait_stream(consumer)              # inputs made on the consumer's stream
                for batch in batches():
                    event = None
                    if cuda:
                        event = torch.cuda.Event()
                        event.record(side)
                    if not put((batch, event)):
                        return
            put(_END)
        except BaseException as exc:                          # handed to the consumer
            put(_Failure(exc))

    thread = threading.Thread(target=produce, name="sparsegnn-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = out.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            batch, event = item
            if cuda:
                consumer.wait_event(event)
                for t in _tensors(batch):
                    t.record_stream(consumer)
            yield batch
    finally:
        stop.set()
        thread.join()
        if cuda:
            consumer.wait_stream(side)                       # work of an abandoned batch, before reuse
