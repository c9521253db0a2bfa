"""First-call autotuning (like ``triton.autotune``, but keyed on the graph as well).

The first call of a kernel for a (graph, feature width, dtype, ...) key times every candidate
config on the real inputs (a warm-up run, then about 2 ms of back-to-back runs between CUDA
events, so host launch cost counts as it will in use; the three fastest are timed again) and
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


def _time(run: Callable[[Dict[str, int]], object], config: Dict[str, int], budget_ms: float = 2.0) -> float:
    """Mean ms per call: one timed call sizes the repetitions to about ``budget_ms`` (2 to 50)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run(config)
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    reps = int(min(max(budget_ms / once, 2), 50))
    start.record()
    for _ in range(reps):
        run(config)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def pick_config(
    cache: MutableMapping[Hashable, Dict[str, int]],
    key: Hashable,
    candidates: List[Dict[str, int]],
    run: Callable[[Dict[str, int]], object],
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
        timings.append(_time(run, config))
    # Second round for the front-runners: small graphs are noisy (host-bound), keep the best.
    order = sorted(range(len(candidates)), key=timings.__getitem__)[:3]
    for i in order:
        timings[i] = min(timings[i], _time(run, candidates[i]))
    best = candidates[min(range(len(candidates)), key=timings.__getitem__)]
    cache[key] = best
    cache[(key, "timings")] = list(zip(candidates, timings))
    return best
