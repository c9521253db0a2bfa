"""When a graph has been used enough to repay planning and tuning: the amortisation rule.

A graph met for the first time (a DataLoader batch, one of many graphs of an inductive epoch,
a graph to run inference on) takes the *first-contact* path: kernels chosen by a rule from the
graph's sizes, no work plan, no tile translation, no signature or statistics, nothing timed,
nothing read back to the host.  Investing in a graph (a degree-aware plan, its statistics and
signature, a predicted or timed config, cuSPARSE timed beside ours, tensor-core tiles) costs
milliseconds to a second and pays only if the graph comes back often enough.

The rule is the ski-rental one: every call on a graph not invested in adds its *rent*, the
time investing would have saved on that call, estimated from the call's size; the graph is
invested in once the rent paid reaches the estimated cost of investing.  Whatever the number
of calls that follow, the time lost to this rule is then at most the investment's cost
(at most twice the best offline choice):

    rent per call  = HOST_SAVED_MS + SAVED_FRACTION * E * F * bytes / GATHER_BYTES_PER_MS
    investment     = INVEST_BASE_MS + E * INVEST_MS_PER_EDGE
    invest once    sum(rent) >= investment

So a graph of 100M edges at F = 256 is invested in after about 15 calls (four epochs of a
two-layer model), a 1M-edge graph at F = 64 after about 350 calls, a 50k-edge graph after
about 900, and a molecule batch (used for one step) never.  A call where host syncs are
forbidden (inside a CUDA-graph capture, such as a replayed model's recording, or the warm-up
before it, run under ``set_sync_debug_mode("error")``) pays rent but never invests, not even
under ``always`` or for a graph with a plan: investing reads sizes back to the host, so the
next eager call does it.  A recording is itself the proof of reuse (a replay repeats its
kernels for good), so a replayed model runs an eager forward and backward inside
:func:`investing` before it records (another while one invests, at most three): every graph
it uses is invested in there, and the replay keeps tuned kernels rather than first-contact
ones.  ``SPARSEGNN_INVEST`` overrides the rule: ``always`` (every graph planned and tuned on its
first call) or ``never`` (not even inside :func:`investing`).

The use counts live on the graph's structure (the ``"reuse"`` slot of ``Graph.cache``, shared by graphs made
with ``with_values``); the process-wide counters (``reuse_counts``) tell a user or a test how
many graphs were met, invested in and how many calls took each path.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from typing import Dict, Iterator

import torch

#: The share of a first-contact call's gather time that planning and tuning save (H200: the
#: piece kernel takes 3.0x the invested kernel's time, geomean over 36 graphs of 10k-2M edges;
#: docs/design/first-contact.md), taken at half.
SAVED_FRACTION = 0.5
#: Host time an invested call saves (a bound launcher and a memoised call path: 20-35 us
#: against 60-80 us a call on graphs that are launch-bound).
HOST_SAVED_MS = 0.02
#: Bytes of gathered features per millisecond a first-contact SpMM streams (H200: ~3 TB/s).
GATHER_BYTES_PER_MS = 3.0e9
#: Fixed part of investing: a work plan, the graph's statistics and signature, the decisions
#: looked up, predicted or timed (H200, Triton cache warm: 3-40 ms on graphs of 10k-2M edges).
INVEST_BASE_MS = 20.0
#: Per-edge part (the plan's and statistics' sorts and scans, ~20 passes over the edges).
INVEST_MS_PER_EDGE = 2.0e-6

_POLICIES = ("auto", "always", "never")
_COUNTS: Counter = Counter()
#: Depth of open ``investing()`` blocks.  Process-wide rather than per thread: a backward's
#: CUDA ops run on autograd's device thread, which sees neither thread-locals nor context
#: variables of the caller.
_INVESTING = 0
_INVESTING_LOCK = threading.Lock()


def policy() -> str:
    """``SPARSEGNN_INVEST``: ``auto`` (the amortisation rule), ``always`` or ``never``."""
    value = os.environ.get("SPARSEGNN_INVEST", "auto").strip().lower() or "auto"
    if value not in _POLICIES:
        raise ValueError(f"SPARSEGNN_INVEST must be one of {_POLICIES}, got {value!r}")
    return value


class _Use:
    """A structure's account: calls, rent paid (ms), and whether it was invested in."""

    __slots__ = ("calls", "rent_ms", "invested")

    def __init__(self) -> None:
        self.calls, self.rent_ms, self.invested = 0, 0.0, False


def syncs_forbidden() -> bool:
    """Whether a host sync would fail here: the current CUDA stream is capturing a CUDA graph,
    or the sync debug mode is ``"error"`` (as in a replay's warm-up before its recording; a
    captured step's eager warm-up steps allow syncs, and invest there).  Both need CUDA to be
    initialised already, so nothing is initialised here (a CPU-only process, or a forked
    worker, stays without CUDA); on the GPU path it costs two C calls."""
    return torch.cuda.is_initialized() and (torch.cuda.is_current_stream_capturing()
                                            or torch.cuda.get_sync_debug_mode() == 2)


_CUDA_STATE: list = []


def cuda_syncs_forbidden() -> bool:
    """``syncs_forbidden()`` for a call on CUDA tensors (CUDA initialised): torch's two C calls
    without the Python wrappers of ``torch.cuda`` (~1 us of host a call on the H200's), for the
    per-call path of an invested graph."""
    if not _CUDA_STATE:
        _CUDA_STATE.extend((torch._C._cuda_isCurrentStreamCapturing, torch._C._cuda_get_sync_debug_mode))
    return _CUDA_STATE[0]() or _CUDA_STATE[1]() == 2


@contextlib.contextmanager
def investing() -> Iterator[None]:
    """Within the block, every graph a call uses is invested in on that call, whatever rent it
    has paid (unless the policy is ``never``, the graph is transient, or host syncs are
    forbidden).  For callers that know a graph will be reused, such as a replay about to record
    its kernels for good.  The block holds for every thread of the process while it is open
    (so that autograd's device threads see it): graphs another thread uses meanwhile are
    invested in too."""
    global _INVESTING
    with _INVESTING_LOCK:
        _INVESTING += 1
    try:
        yield
    finally:
        with _INVESTING_LOCK:
            _INVESTING -= 1


def investing_now() -> bool:
    """Whether an :func:`investing` block is open (in any thread of the process)."""
    return _INVESTING > 0


def _account(graph) -> _Use:
    account = graph.cache.get("reuse")
    if account is None:
        account = _Use()
        graph.cache.put("reuse", account)          # kept unless the graph is volatile
        _COUNTS["graphs"] += 1
    return account


def investment_ms(num_edges: int) -> float:
    """Estimated cost of investing in a graph of ``num_edges`` edges (module doc)."""
    return INVEST_BASE_MS + num_edges * INVEST_MS_PER_EDGE


def rent_ms(num_edges: int, num_feats: int, elem_size: int) -> float:
    """Estimated time one call on the first-contact path loses against an invested graph."""
    return HOST_SAVED_MS + SAVED_FRACTION * num_edges * max(num_feats, 1) * elem_size / GATHER_BYTES_PER_MS


def use(graph, num_feats: int, elem_size: int) -> bool:
    """Record one call on ``graph`` of ``num_feats`` features of ``elem_size`` bytes, and
    whether it runs invested (planned and tuned) or on the first-contact path.

    A transient graph (``Graph.transient``) is never invested in; a graph someone planned
    already (its ``plan`` cached) counts as invested.
    """
    if graph.transient:
        _COUNTS["first_contact_calls"] += 1
        return False
    account = graph.cache.get("reuse") or _account(graph)
    account.calls += 1
    if account.invested:                           # the per-call path of a graph in use
        _COUNTS["invested_calls"] += 1
        return True
    if not account.invested:
        mode = policy()
        if mode == "auto":
            account.rent_ms += rent_ms(graph.num_edges, num_feats, elem_size)
        due = mode == "always" or "plan" in graph.cache or (mode == "auto" and (
            _INVESTING > 0 or account.rent_ms >= investment_ms(graph.num_edges)))
        # never where host syncs are forbidden (a replayed model's recording and the warm-up
        # before it): the plan, the statistics and the tuner's timings read back to the host;
        # a later eager call invests
        account.invested = due and not syncs_forbidden()
        if account.invested:
            _COUNTS["invested"] += 1
    _COUNTS["invested_calls" if account.invested else "first_contact_calls"] += 1
    return account.invested


def calls(graph) -> int:
    """Calls recorded on ``graph``'s structure so far (``use``; 0 for a transient graph)."""
    if graph.transient:
        return 0
    account = graph.cache.get("reuse")
    return 0 if account is None else account.calls


def invested(graph) -> bool:
    """Whether ``graph`` has been invested in (``use`` said so once); transient graphs never."""
    if graph.transient:
        return False
    if policy() == "always":
        return True
    account = graph.cache.get("reuse")
    return account is not None and account.invested


def count_investment(kind: str) -> None:
    """Count one piece of investment work done on a graph (``"plans"``: a work plan built,
    ``"translations"``: a tile translation), for ``reuse_counts``."""
    _COUNTS[kind] += 1


def reuse_counts() -> Dict[str, int]:
    """Process-wide counts: ``graphs`` met, ``invested`` graphs, ``first_contact_calls`` and
    ``invested_calls``, and the investment work done: ``plans`` and ``translations`` built."""
    return {k: _COUNTS[k] for k in ("graphs", "invested", "first_contact_calls", "invested_calls", "plans",
                                    "translations")}


def reset_reuse_counts() -> None:
    """Zero the process-wide counts (the graphs' own accounts are kept)."""
    _COUNTS.clear()
