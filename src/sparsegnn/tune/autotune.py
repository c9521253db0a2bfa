"""Kernel config decisions: keyed by a structural signature, shared, persisted, predicted.

``decide(op, graph, ...)`` is the one entry point the ops use.  The decision for a key
``op | detail | F | dtype | signature(graph)`` is looked up in the device's
:class:`~sparsegnn.tune.store.DecisionStore` (process-wide, persisted on disk), so every Graph
object of the same structure, in this process or a later one, reuses it.  A graph of a class
decided on other graphs (another ``fingerprint``) is decided on itself, under
``key#fingerprint``, until ``GRAPHS_PER_CLASS`` graphs of the class have been; later ones take
the class's decision untimed (mini-batches of one loader, a stream of molecules).  On a miss
the policy (``SPARSEGNN_TUNE``) decides:

- ``auto`` (default): the learned cost model ranks the candidates; a kernel it predicts to
  take under ``TINY_MS`` takes the model's pick untimed (timing and compiling alternatives
  would cost more than they can save), otherwise its ``SHORTLIST`` best are timed;
  without a shipped model every candidate is timed;
- ``model``: the model's pick, nothing timed (zero-shot);
- ``shortlist``: the model's ``SHORTLIST`` best timed, whatever their predicted time;
- ``exhaustive``: every candidate timed;
- ``off`` (or ``SPARSEGNN_AUTOTUNE=0``): the heuristic, the first candidate.

A stored pick of the model that timed no alternative (``model``, or ``auto`` under
``TINY_MS``) records the weights that made it (``tune.model.model_file`` of the device, tagged
with a digest of its bytes: ``tune.model.weights_id``) and is decided again under other weights
(a new version of the package, a GPU that gained its own, its weights refitted); timed picks
hold whatever the weights.

While a CUDA graph is being captured nothing can be timed: a decision missing then is the
model's zero-shot pick (the heuristic without a model), used for that call only and neither
stored nor memoised.

Timing follows the benchmark protocol (``triton.testing.do_bench``): the median of single
calls, each after flushing L2, as CUDA-graph replays so that a schedule's launches run back
to back (eagerly when a call cannot be captured); the three fastest are timed again.  A
family that chooses between ways of making one call (the precision modes) times them warm
instead: each call after the one before it, behind a spin kernel (``decide``'s ``warm``).
Without a GPU nothing is timed (the model or the heuristic decides) unless a test installs a
timer (``set_timer``); the CPU backend's candidates (``device`` cpu) are timed on the CPU
with ``perf_counter``.
"""
from __future__ import annotations

import hashlib
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .._failed_capture import CleanupCUDAGraph
from .._streams import side_stream
from ..kernels import interpreting
from .features import graph_stats_cached, signature
from .model import MODEL_FILE, load_model, model_file, weights_id
from . import reuse
from .reuse import invested
from .store import store_for_device

#: Kernels predicted faster than this (ms) take the model's pick without timing.
TINY_MS = 0.02
#: Candidates the autotuner times when the model shortlists.
SHORTLIST = 3
#: Graphs of one structural class whose decisions are timed on themselves; later graphs of
#: the class take the class's decision untimed.  (One class holds graphs on which different
#: candidates win: a co-purchase stand-in took the tile SpMM that won on a batch of protein
#: graphs of the same class, 1.5x slower than its own best.)
GRAPHS_PER_CLASS = 8
MODES = ("auto", "model", "shortlist", "exhaustive", "off")

_COUNTS = {"decisions": 0, "timed": 0}
_TIMER: Optional[Callable[[Callable, Dict[str, int]], float]] = None
_DEVICE_NAMES: Dict[object, str] = {}
#: key -> (store, config): decisions already validated in this process, read without the
#: store's lock and copies (a call on a tuned graph costs a dict lookup).  Entries of a store
#: that was replaced (``store.reset_stores``) are ignored.
_HOT: Dict[str, tuple] = {}
_KEYS: Dict[tuple, str] = {}


def tune_mode() -> str:
    """The policy from ``SPARSEGNN_TUNE`` (``SPARSEGNN_AUTOTUNE=0`` means ``off``)."""
    if os.environ.get("SPARSEGNN_AUTOTUNE", "1") == "0":
        return "off"
    mode = os.environ.get("SPARSEGNN_TUNE", "auto").lower()
    if mode not in MODES:
        raise ValueError(f"SPARSEGNN_TUNE must be one of {MODES}, got {mode!r}")
    return mode


#: Op families whose candidates are CPU code (the ``"cpu"`` backend), timed on the CPU.
CPU_FAMILY_PREFIX = "cpu_"


def autotune_enabled(device=None, op: Optional[str] = None) -> bool:
    """Whether candidates can be timed here: a test timer; the CPU backend's families
    (``op`` starting with ``cpu_``) on a CPU ``device``; else a GPU outside the interpreter
    (Triton kernels on CPU tensors run in the interpreter, where times mean nothing)."""
    if _TIMER is not None:
        return True
    if tune_mode() == "off":
        return False
    if op is not None and op.startswith(CPU_FAMILY_PREFIX) and device is not None and torch.device(device).type == "cpu":
        return True
    return not interpreting() and torch.cuda.is_available()


def set_timer(timer: Optional[Callable[[Callable, Dict[str, int]], float]]) -> None:
    """Install ``timer(run, config) -> ms`` in place of GPU timing (tests); None restores it."""
    global _TIMER
    _TIMER = timer


def tuner_invocations() -> int:
    """How many decisions were made (store misses) in this process."""
    return _COUNTS["decisions"]


def candidates_timed() -> int:
    """How many candidate timings were run in this process."""
    return _COUNTS["timed"]


def device_name(device) -> str:
    """Name under which decisions are stored: the GPU's name, or ``cpu``."""
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    index = device.index if device.index is not None else torch.cuda.current_device()
    name = _DEVICE_NAMES.get(index)
    if name is None:
        name = _DEVICE_NAMES[index] = torch.cuda.get_device_name(index)
    return name


def decision_key(op: str, graph, detail: str, num_feats: int, dtype: torch.dtype) -> str:
    """The store key of a decision: op, variant, width, dtype and the graph's signature."""
    sig = graph.cache.get("signature")
    if sig is None:
        sig = signature(graph_stats_cached(graph))
        if graph.num_src != graph.num_nodes:   # bipartite: the gathered side has its own size
            sig += f".src{graph.num_src.bit_length() - 1}"
        graph.cache.put("signature", sig)
    parts = (op, detail, num_feats, dtype, sig)
    key = _KEYS.get(parts)
    if key is None:  # formatted once per distinct key (the per-call path is a tuple lookup)
        key = _KEYS[parts] = f"{op}|{detail}|F{num_feats}|{str(dtype).replace('torch.', '')}|{sig}"
    return key


def fingerprint(graph) -> str:
    """A short hash of the graph's exact structure statistics (sizes, degree moments and tail,
    locality): tells a class's graphs apart, equal for every Graph object of one structure."""
    fp = graph.cache.get("fingerprint")
    if fp is None:
        stats = graph_stats_cached(graph)
        values = stats.as_dict()
        del values["num_src"]               # in the text below (as before it was a statistic)
        text = "|".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values.values())
        fp = hashlib.blake2b(f"{text}|{graph.num_src}".encode(), digest_size=6).hexdigest()
        graph.cache.put("fingerprint", fp)
    return fp


def lookup(op: str, graph, detail: str, num_feats: int, dtype: torch.dtype, device) -> Optional[Dict]:
    """The stored record (config, ms, source, ...) for this case, or None."""
    key = decision_key(op, graph, detail, num_feats, dtype)
    own_key = key + "#" + fingerprint(graph)
    store = store_for_device(device_name(device))
    own = store.get_record(own_key)
    if own is None:
        shared = store.get_record(key)
        own = shared if shared is not None and _class_applies(shared, own_key) else None
    return own


def _class_applies(shared: Dict, own_key: str) -> bool:
    """Whether a graph without a decision of its own takes its class's: the class's was made
    on this very graph, or the class has been timed on ``GRAPHS_PER_CLASS`` graphs."""
    return shared.get("fp") == own_key or shared.get("graphs", 1) >= GRAPHS_PER_CLASS


def decide(op: str, graph, detail: str, num_feats: int, dtype: torch.dtype, device,
           candidates, run: Callable[[Dict[str, int]], object],
           space: Optional[Dict] = None, ranked: bool = True, eager: bool = False,
           keep_first: float = 0.0, warm: bool = False) -> Dict[str, int]:
    """The config for ``run`` on ``graph``: stored, predicted or timed (see the module doc).

    Args:
        op, detail: kernel family (``"spmm"``) and variant (reduce, weights, ...).
        graph: the Graph (its structure gives the signature and the model's features).
        num_feats, dtype, device: the dense operand's width, dtype and device.
        candidates: configs to choose from, the heuristic first, or a function returning them
            (called only on a store miss: building the list costs more than a lookup).
        run: ``run(config)`` launches the kernel once with ``config``.
        space: the family's search space; a stored config outside it (older version) is ignored.
        ranked: whether the cost model ranks this family's configs (SpMM); without it every
            candidate is timed (short lists only).
        eager: a candidate costs ``max(GPU ms, host ms, the first candidate's host ms)``
            (``measure(host=True)``): what a call issued eagerly takes, host-bound or GPU-bound,
            so that a config with more host work (conversions, extra launches, lookups) loses
            where the host is the bottleneck.  The first candidate's host time is a floor for
            every candidate: the alternatives are that call's work done another way, behind at
            least its dispatch, so where the first is host-bound none can be faster.
        keep_first: the first candidate (the default) is kept unless another is faster by
            more than this fraction of its time (0: the fastest wins).
        warm: each call timed with the L2 as the same candidate's call before left it
            (``measure``'s ``warm``), not after a flush: back-to-back calls, for choices
            between ways of making one call (features that fit in L2 are gathered from it).

    A graph not invested in (``tune.reuse``: a transient graph, or one met too few times to
    repay tuning) gets the heuristic (the first candidate) at once: no signature, no lookup,
    nothing timed or stored.  The CPU backend's families (``cpu_*``) decide on every graph.
    """
    if not (op.startswith(CPU_FAMILY_PREFIX) or invested(graph)) or getattr(graph, "transient", False):
        return (candidates() if callable(candidates) else candidates)[0]
    key = decision_key(op, graph, detail, num_feats, dtype)
    own_key = key + "#" + fingerprint(graph)
    name = device_name(device)
    store = store_for_device(name)
    hot = _HOT.get(own_key)
    if hot is not None and hot[0] is store:  # validated before: no copy, no lock (the per-call path)
        return hot[1]
    usable = lambda rec: rec is not None and (space is None or all(  # noqa: E731
        k in space and v in space[k] for k, v in rec["config"].items()))
    # a heuristic stand-in (tuning was off or impossible when it was stored), or a pick of other
    # cost-model weights than this device's (records without ``weights``, or naming the default
    # file without a digest, are the default's), is replaced once this process can predict or
    # time; until a capture is over it will do
    weights = weights_id(model_file(name)) if ranked else None
    made_by = lambda rec: (weights_id(MODEL_FILE) if rec.get("weights", MODEL_FILE) == MODEL_FILE  # noqa: E731
                           else rec["weights"])
    provisional = lambda rec: tune_mode() != "off" and (rec.get("source") == "heuristic" or (  # noqa: E731
        rec.get("source") == "model" and made_by(rec) != weights))
    own, shared = store.get_record(own_key), store.get_record(key)
    had_own = usable(own)
    if not had_own:
        own = shared if usable(shared) and _class_applies(shared, own_key) else None
    if usable(own):
        if not provisional(own):
            _HOT[own_key] = (store, own["config"])
            return own["config"]
        if _capturing():
            return own["config"]
    if _capturing():
        if usable(shared):         # a class-mate's decision will do until the capture is over
            return shared["config"]
        return _zero_shot(graph, num_feats, dtype, device, candidates, ranked)
    _COUNTS["decisions"] += 1
    if callable(candidates):
        candidates = candidates()
    mode = tune_mode()
    config, ms, source = candidates[0], None, "heuristic"
    model = load_model(name) if ranked and mode in ("auto", "model", "shortlist") else None
    order = list(range(len(candidates)))
    if model is not None and len(candidates) > 1:
        order = model.rank(graph_stats_cached(graph), num_feats, dtype.itemsize, candidates)
        config, source = candidates[order[0]], "model"
    times: Dict[int, float] = {}  # candidate index -> its cost (ms)
    pairs: Dict[int, Tuple[float, float]] = {}  # candidate index -> measured (GPU ms, host ms)
    protocol: Dict[str, bool] = {}  # one timing protocol for every candidate (_time_pairs)
    if mode != "off" and len(candidates) > 1 and autotune_enabled(device, op):
        if mode == "exhaustive" or model is None:
            to_time = order
        elif mode == "shortlist":
            to_time = order[:SHORTLIST]
        elif mode == "auto":  # the model's pick first; alternatives only if it is not tiny
            pairs.update(zip([order[0]], _time_pairs(run, [config], device, protocol, eager, warm)))
            to_time = order[:SHORTLIST] if max(pairs[order[0]]) >= TINY_MS else []
        else:  # "model": nothing timed
            to_time = []
        if keep_first > 0 and to_time and 0 not in to_time:   # the default is what others must beat
            to_time = [0] + list(to_time)
        missing = [i for i in to_time if i not in pairs]
        replayed_before = protocol.get("replayed", False)
        pairs.update(zip(missing, _time_pairs(run, [candidates[i] for i in missing], device, protocol, eager, warm)))
        if replayed_before and not protocol["replayed"]:   # one could not be captured: all eager
            stale = [i for i in pairs if i not in missing]
            pairs.update(zip(stale, _time_pairs(run, [candidates[i] for i in stale], device, protocol, eager,
                                                warm)))
        times = _costs(pairs, eager)
        best = min(times, key=times.__getitem__) if times else None
        if best is not None and keep_first > 0 and 0 in times and times[best] > (1 - keep_first) * times[0]:
            best = 0
        if best is not None:
            config, ms = candidates[best], times[best]
            if len(to_time) == len(candidates):
                source = "exhaustive"
            elif len(to_time) > 1:
                source = "shortlist"
    # what a report shows beside the pick: the default's (first candidate's) time and the best;
    # a model's pick (untimed, or timed alone) holds for the weights that made it
    extra = {"first_ms": times.get(0), "best_ms": min(times.values())} if len(times) > 1 else {}
    if source == "model":
        extra["weights"] = weights
    if usable(shared) and not provisional(shared) and shared.get("fp") != own_key:   # a new member of a timed class
        store.put(own_key, config, ms=ms, source=source, **extra)
        if source != "heuristic":
            meta = {k: v for k, v in shared.items() if k not in ("config", "ms", "source", "time")}
            store.put(key, shared["config"], ms=shared.get("ms"), source=shared.get("source", "tuned"),
                      **dict(meta, graphs=shared.get("graphs", 1) + 1))
    else:
        same = shared is not None and shared.get("fp") == own_key   # the class's own graph decided again
        store.put(key, config, ms=ms, source=source, fp=own_key, graphs=shared.get("graphs", 1) if same else 1,
                  **extra)
        if had_own:   # a provisional record of its own, not left to be decided again in every process
            store.put(own_key, config, ms=ms, source=source, **extra)
    if source != "heuristic" or mode == "off":
        _HOT[own_key] = (store, config)
    return config


def _capturing() -> bool:
    """Whether nothing may be timed or synced here: the current CUDA stream is capturing a CUDA
    graph, or host syncs raise (a replay's warm-up before its recording; ``reuse.syncs_forbidden``)."""
    return reuse.syncs_forbidden()


def _zero_shot(graph, num_feats: int, dtype: torch.dtype, device, candidates, ranked: bool) -> Dict[str, int]:
    """The cost model's pick (the first candidate without a model), neither timed, stored nor
    memoised: ``decide`` decides properly on the first call after the capture."""
    if callable(candidates):
        candidates = candidates()
    model = load_model(device_name(device)) if ranked and tune_mode() != "off" else None
    if model is None or len(candidates) == 1:
        return candidates[0]
    return candidates[model.rank(graph_stats_cached(graph), num_feats, dtype.itemsize, candidates)[0]]


def _time_pairs(run: Callable, configs: List[Dict[str, int]], device=None,
                protocol: Optional[Dict[str, bool]] = None, host: bool = False,
                warm: bool = False) -> List[Tuple[float, float]]:
    """(GPU ms, host ms) of each config (``measure``; host 0 unless ``host``; ``warm`` as
    there; a test's timer or, for the CPU backend's candidates, ``perf_counter``, give the
    first, host 0)."""
    if not configs:
        return []
    _COUNTS["timed"] += len(configs)
    if _TIMER is not None:
        return [(float(_TIMER(run, cfg)), 0.0) for cfg in configs]
    if device is not None and torch.device(device).type == "cpu":   # the CPU backend's candidates
        return [(_time_cpu(run, config), 0.0) for config in configs]
    return measure(run, configs, device, protocol, host=host, warm=warm)


def _costs(pairs: Dict[int, Tuple[float, float]], eager: bool) -> Dict[int, float]:
    """Each timed candidate's cost: its GPU ms, or ``eager`` the largest of its GPU and host ms
    and the first candidate's host ms (``decide``'s ``eager``)."""
    if not eager:
        return {i: gpu for i, (gpu, _) in pairs.items()}
    floor = pairs[0][1] if 0 in pairs else 0.0
    return {i: max(gpu, host, floor) for i, (gpu, host) in pairs.items()}


def _time_candidates(run: Callable, configs: List[Dict[str, int]], device=None,
                     protocol: Optional[Dict[str, bool]] = None) -> List[float]:
    """GPU ms of each config (:func:`_time_pairs`)."""
    return [gpu for gpu, _ in _time_pairs(run, configs, device, protocol)]


def measure(run: Callable, configs: List[Dict[str, int]], device=None,
            protocol: Optional[Dict[str, bool]] = None, host: bool = False,
            warm: bool = False) -> List[Tuple[float, float]]:
    """(GPU ms, host ms) of each config on a CUDA device.

    GPU ms: the median of single calls after an L2 flush (``warm``: after the call before it,
    the GPU kept busy by a kernel that touches no memory), as CUDA-graph replays (``_time``),
    or eagerly for all of them when one call cannot be captured; the three fastest are timed
    again and the lower median kept.  Host ms (``host``; else 0): ``_host``, what issuing one
    call takes (for sweeps: the tuner decides on GPU time).  ``protocol``: shared by the calls
    of one decision; ``protocol["replayed"]`` says how the last call timed, and a call after
    an eager one times eagerly too."""
    protocol = {} if protocol is None else protocol
    with torch.cuda.device(device if device is not None else torch.cuda.current_device()):
        flush = _flush_buffer(torch.cuda.current_device())
        for config in configs:
            run(config)  # compile (and build what the call caches) before anything is captured
        hosts = [_host(run, config, flush) if host else 0.0 for config in configs]
        replayed, times = protocol.get("replayed", True), []
        for config in configs:
            ms = _time(run, config, flush, True, warm=warm) if replayed else None
            if ms is None:
                if replayed:  # this call cannot be captured: every config timed eagerly
                    replayed, times = False, [_time(run, c, flush, warm=warm) for c in configs[:len(times)]]
                ms = _time(run, config, flush, warm=warm)
            times.append(ms)
        if len(configs) > 1:
            for i in sorted(range(len(configs)), key=times.__getitem__)[:3]:
                again = _time(run, configs[i], flush, replayed, warm=warm)   # None: this capture failed (memory)
                times[i] = min(times[i], again if again is not None else times[i])
        del flush
    protocol["replayed"] = replayed
    return list(zip(times, hosts))


def _host(run: Callable[[Dict[str, int]], object], config: Dict[str, int], flush: torch.Tensor,
          calls: int = 3) -> float:
    """Least ms the host takes to issue ``run(config)`` (Python, argument checks, launches) in
    ``calls`` calls (an interrupted host only adds time), each issued behind an L2 flush so
    that the GPU is busy and no launch waits for it."""
    times = []
    for _ in range(calls):
        flush.zero_()
        start = time.perf_counter()
        run(config)
        times.append(1e3 * (time.perf_counter() - start))
    torch.cuda.current_stream().synchronize()
    return min(times)


def _captured(run: Callable[[Dict[str, int]], object], config: Dict[str, int]):
    """``run(config)`` captured into a CUDA graph, or None where the call cannot be captured
    (it synchronises, or allocates in a way capture forbids).

    Captured on the library's side stream (``_streams.side_stream``) with
    ``capture_begin``/``capture_end`` directly: ``torch.cuda.graph`` would also run the garbage
    collector and empty the allocator's cache, each time.  The memory pool is this capture's
    own; a failed ``capture_end`` frees it and the random number generator's capture
    (``_failed_capture.CleanupCUDAGraph``)."""
    device = torch.cuda.current_device()
    stream = side_stream(device)
    graph = CleanupCUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    ok = False
    try:
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=torch.cuda.graph_pool_handle(), capture_error_mode="thread_local")
            try:
                run(config)
            finally:
                graph.capture_end()
            ok = True
    except Exception:  # noqa: BLE001 - not capturable: the caller times eager calls instead
        pass
    torch.cuda.current_stream().wait_stream(stream)
    if ok:
        return graph
    del graph
    torch.cuda.synchronize()
    return None


def _flush_buffer(device) -> torch.Tensor:
    """Zeroing this buffer evicts the timed inputs from L2: at least twice the L2 and 256 MB
    (as ``do_bench``), so that the GPU is busy with it for longer than the host needs to issue
    the timed call (on an H100 about 90 us against 20-40 us of Python per call)."""
    l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
    return torch.empty(max(2 * l2_bytes, 256 << 20), dtype=torch.int8, device=device)


#: GPU clock cycles a warm timing's spin kernel runs before each timed call (~100 us at the
#: H100's / H200's ~2 GHz): longer than the host takes to issue the call, as the flush is.
WARM_SPIN_CYCLES = 200_000


def _time(run: Callable[[Dict[str, int]], object], config: Dict[str, int], flush: torch.Tensor,
          replayed: bool = False, budget_ms: float = 10.0, warm: bool = False) -> Optional[float]:
    """Median ms of single calls, each after an L2 flush (the protocol of ``triton.testing.do_bench``);
    ``warm``: each after the one before, behind a kernel that only spins (``WARM_SPIN_CYCLES``),
    so that the host's issue of the call is hidden as the flush hides it and the L2 holds what
    the previous call left there.

    ``replayed``: the call is captured into a CUDA graph once and its replays are timed (None
    if it cannot be captured), so the launches of a multi-launch schedule run back to back as
    in a GPU-bound loop or a captured step.  Timed eagerly, the flush hides the host's cost of
    the first launch only: a schedule of several launches was charged the host's gaps between
    them (flickr F=64 bf16: 0.089 ms eager, 0.055 ms replayed), and lost to one-launch
    schedules that are slower on the GPU.  3 to 25 repetitions, about ``budget_ms`` of kernel
    time in all.
    """
    if replayed:
        graph = _captured(run, config)
        if graph is None:
            return None
        call = lambda _config: graph.replay()  # noqa: E731
    else:
        call = run
    busy = (lambda: torch.cuda._sleep(WARM_SPIN_CYCLES)) if warm else flush.zero_  # noqa: E731
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    busy()
    start.record()
    call(config)
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    reps = int(min(max(budget_ms / once, 3), 25))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        busy()
        starts[i].record()
        call(config)
        ends[i].record()
    ends[-1].synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2]


def _time_cpu(run: Callable[[Dict[str, int]], object], config: Dict[str, int], budget_ms: float = 20.0) -> float:
    """Median ms of single calls on the CPU (after one untimed call that compiles): 3 to 15
    repetitions, about ``budget_ms`` in all, then the same again, the lower median kept."""
    run(config)
    start = time.perf_counter()
    run(config)
    once = max(1e3 * (time.perf_counter() - start), 1e-3)
    reps = int(min(max(budget_ms / once, 3), 15))
    best = float("inf")
    for _ in range(2):
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            run(config)
            times.append(1e3 * (time.perf_counter() - start))
        best = min(best, sorted(times)[len(times) // 2])
    return best


def time_config(run: Callable[[Dict[str, int]], object], config: Dict[str, int]) -> float:
    """The GPU ms of one config as the tuner times it (compiles first); for sweeps and reports."""
    return _time_candidates(run, [config])[0]


__all__ = ["decide", "lookup", "decision_key", "tune_mode", "autotune_enabled", "set_timer", "tuner_invocations",
           "candidates_timed", "device_name", "time_config", "measure", "TINY_MS", "SHORTLIST", "MODES"]
