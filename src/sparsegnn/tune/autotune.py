"""First-call autotuning (like ``triton.autotune``, but keyed on the graph as well).

The first call of a kernel for a (graph, feature width, dtype, ...) key times every candidate
config on the real inputs and caches the fastest in the caller's dict (the Graph's cache), so
later calls pay one lookup.  Timing follows the benchmark protocol (``triton.testing.do_bench``):
the median of single calls, each after flushing L2, with host launch cost hidden behind the
flush; the three fastest are timed again.  (Back-to-back warm runs, the earlier protocol,
rank configs by host overhead and L2-warm speed on small graphs; see notes/spmm.md.)
Disabled under the Triton interpreter and with ``SPARSEGNN_AUTOTUNE=0`` (then the first
candidate, the heuristic, is used).
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Hashable, List, MutableMapping

import torch

from ..kernels import interpreting


def autotune_enabled() -> bool:
    return os.environ.get("SPARSEGNN_AUTOTUNE", "1") != "0" and not interpreting() and torch.cuda.is_available()


def _flush_buffer(device) -> torch.Tensor:
    """Zeroing this buffer evicts the timed inputs from L2: at least twice the L2 and 256 MB
    (as ``do_bench``), so that the GPU is busy with it for longer than the host needs to issue
    the timed call (on an H100 about 90 us against 20-40 us of Python per call)."""
    l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
    return torch.empty(max(2 * l2_bytes, 256 << 20), dtype=torch.int8, device=device)


def _time(run: Callable[[Dict[str, int]], object], config: Dict[str, int], flush: torch.Tensor,
          budget_ms: float = 10.0) -> float:
    """Median ms of single calls, each after an L2 flush (the protocol of ``triton.testing.do_bench``).

    The flush runs on the GPU while the host prepares the call, so host launch cost is hidden
    unless it exceeds the flush (as in a training step, where the host runs ahead); gaps
    between the launches of a multi-launch schedule still count.  3 to 25 repetitions, about
    ``budget_ms`` of kernel time in all.
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    flush.zero_()
    start.record()
    run(config)
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    reps = int(min(max(budget_ms / once, 3), 25))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        run(config)
        ends[i].record()
    ends[-1].synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2]


def pick_config(
    cache: MutableMapping[Hashable, Dict[str, int]],
    key: Hashable,
    candidates: List[Dict[str, int]],
    run: Callable[[Dict[str, int]], object],
    device=None,
) -> Dict[str, int]:
    """The cached best config for ``key``, timing ``candidates`` with ``run(config)`` on a miss
    (on ``device``, default the current CUDA device)."""
    best = cache.get(key)
    if best is not None:
        return best
    if len(candidates) == 1 or not autotune_enabled():
        cache[key] = candidates[0]
        return candidates[0]
    flush = _flush_buffer(device if device is not None else torch.cuda.current_device())
    timings = []
    for config in candidates:
        run(config)  # compile
        timings.append(_time(run, config, flush))
    # Second round for the front-runners (short kernels are noisy), keep the better median.
    order = sorted(range(len(candidates)), key=timings.__getitem__)[:3]
    for i in order:
        timings[i] = min(timings[i], _time(run, candidates[i], flush))
    del flush
    best = candidates[min(range(len(candidates)), key=timings.__getitem__)]
    cache[key] = best
    cache[(key, "timings")] = list(zip(candidates, timings))
    return best
