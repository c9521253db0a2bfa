"""First-call autotuning (like ``triton.autotune``, but keyed on the graph as well).

The first call of a kernel for a (graph, feature width, dtype, ...) key times every candidate
config on the real inputs (a warm-up run, then ``reps`` timed runs between CUDA events) and
caches the fastest in the caller's dict (the Graph's cache), so later calls pay one lookup.
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


def pick_config(
    cache: MutableMapping[Hashable, Dict[str, int]],
    key: Hashable,
    candidates: List[Dict[str, int]],
    run: Callable[[Dict[str, int]], object],
    reps: int = 3,
) -> Dict[str, int]:
    """The cached best config for ``key``, timing ``candidates`` with ``run(config)`` on a miss."""
    best = cache.get(key)
    if best is not None:
        return best
    if len(candidates) == 1 or not autotune_enabled():
        cache[key] = candidates[0]
        return candidates[0]
    timings = []
    for config in candidates:
        run(config)  # compile + warm caches
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            run(config)
        end.record()
        end.synchronize()
        timings.append(start.elapsed_time(end) / reps)
    best = candidates[min(range(len(candidates)), key=timings.__getitem__)]
    cache[key] = best
    cache[(key, "timings")] = list(zip(candidates, timings))
    return best
