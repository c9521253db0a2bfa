"""The sampling kernels: uniform k-subsets per frontier node and first-seen relabelling, in torch ops.

Nothing here loops over nodes in Python: every step is a fixed number of tensor ops over a whole
hop's frontier, on the graph's device.  The only Python loop runs over the hops.

**Uniform k-subsets without replacement.**  A frontier node ``v`` of degree ``d > k`` needs a
uniformly random set of ``k`` distinct offsets in ``[0, d)`` (offsets into its CSR row, so
duplicate edges are distinct candidates).  Two exact methods, each a fixed handful of tensor
ops for the whole frontier, whatever ``k`` (a Python loop over the ``k`` draws, as Floyd's
algorithm needs, would cost ``k`` kernel launches per hop: measured, it dominated on the GPU):

* First ``k`` distinct of i.i.d. draws ("rejection"), for ``d >= REJECTION_MIN_RATIO * k`` and
  ``k <= REJECTION_MAX_FANOUT``: draw ``m = REJECTION_DRAW_FACTOR * k`` offsets uniformly with
  replacement and keep the first ``k`` distinct values in draw order.  Given the distinct values
  seen so far, the next new value is uniform over the others, so the first ``k`` distinct form
  a uniform ``k``-subset.  A row whose ``m`` draws hold fewer than ``k`` distinct values goes to
  the method below instead; that event is invariant under relabelling the offsets, so the
  accepted rows stay uniform, and so does the mixture.  Cost ``O(k log k)`` per node whatever
  ``d``: a hub of degree 10^6 costs what a node of degree ``4k`` costs.  The draws are made for
  every frontier node before the hop's sync (so the fallback rows are counted in the same sync),
  ``O(F k log k)`` per hop.  With ``d >= 4k`` and ``m = 2k`` fallbacks are rare: measured at
  ``d = 4k`` over 10^5 rows, 0.24 % for ``k = 2``, 0.04 % for ``k = 5``, 0.001 % for ``k = 10``,
  none for ``k >= 15``.
* Random keys, for the other rows (``k < d < 4k``, larger ``k``, and rejection's fallbacks):
  every candidate edge gets an independent 62-bit random key and the ``k`` smallest keys of each
  node are kept (a row-wise sort of a padded ``[rows, max degree]`` key matrix, or one sort by
  key then a stable one by node).  The ranking of i.i.d. keys is a uniform
  random permutation, so its first ``k`` are a uniform ``k``-subset (ties have probability
  below ``d^2 / 2^63``).  Cost ``O(D log D)`` for ``D`` the summed degree of those rows:
  ``O(k)`` per row except for ``k > REJECTION_MAX_FANOUT`` (then ``O(sum of hub degrees)``,
  the stated worst case) and for fallbacks.

Uniform integers in ``[0, n)`` are ``r mod n`` of 62-bit uniform ``r``: the modulo bias is
below ``n / 2^62``.

**Relabelling.**  Sampled sources are mapped to local ids through ``slot``, a scratch int64
array of one entry per graph node, kept by the caller and reset after each batch (so a batch
costs ``O(sampled)``, not ``O(N)``).  ``slot[v]`` is ``v``'s local id, or ``SENTINEL`` when
``v`` is not sampled yet.  New nodes of a hop are found by one ``scatter_reduce(amin)`` of
``BASE + position`` over the hop's candidate sources: an entry that held ``SENTINEL`` ends up
holding ``BASE +`` its first position, and the candidates whose own ``BASE + position`` reads
back are the first occurrences, in order.

**Host syncs**: two per hop (one ``.tolist()`` of the hop's sizes, one ``nonzero`` for its new
nodes; counted with ``torch.cuda.set_sync_debug_mode``), none for a hop with an empty frontier.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _fused
from ._output import SampleOutput, _arange  # noqa: F401  (SampleOutput: re-exported)

REJECTION_MAX_FANOUT = 64      # above this fanout, only the random-keys method (rejection holds [F, m] draws)
REJECTION_MIN_RATIO = 4        # rejection for rows of degree >= this times the fanout
REJECTION_DRAW_FACTOR = 2      # rejection draws m = this times the fanout per row
KEYS_PAD_RATIO = 2             # random keys in a padded [rows, max degree] matrix while it is this small
SENTINEL = 2 ** 62             # slot value of a node not sampled yet
BASE = 2 ** 61                 # slot value BASE + p marks a first occurrence at candidate position p
_RAND_HIGH = 2 ** 62           # random integers are drawn in [0, 2^62)


def _randint(shape, generator: Optional[torch.Generator], device: torch.device) -> Tensor:
    return torch.randint(0, _RAND_HIGH, shape, generator=generator, device=device, dtype=torch.int64)


def _expand(counts: Tensor, total: int) -> Tuple[Tensor, Tensor]:
    """``(segment, slot)`` of every element of segments of sizes ``counts`` laid end to end.

    ``segment = repeat_interleave(arange(S), counts)`` and ``slot`` = position within the
    segment, by one ``searchsorted`` (cheaper to launch than ``repeat_interleave``).

    Shapes:
        counts: [S] int64 -> segment, slot: [total] int64.
    """
    ends = torch.cumsum(counts, 0)
    position = _arange(total, counts.device)
    segment = torch.searchsorted(ends, position, right=True)
    return segment, position - (ends - counts)[segment]


def _first_distinct(deg: Tensor, k: int, m: int, generator: Optional[torch.Generator]):
    """The first ``k`` distinct of ``m`` uniform draws in ``[0, deg[f])``, for every row ``f``.

    Returns:
        ``(chosen, ok)``: ``chosen[f]`` sorted ascending, meaningful where ``ok[f]`` (the row's
        draws held ``k`` distinct values).

    Shapes:
        deg: [F] int64 -> chosen: [F, k] int64, ok: [F] bool.
    """
    rows, device = deg.numel(), deg.device
    draws = torch.remainder(_randint((rows, m), generator, device), deg.clamp(min=1).unsqueeze(1))
    # sort by (value, draw position): distinct keys, so an unstable (single-kernel) sort will do
    keys, order = torch.sort(draws * m + _arange(m, device), dim=1)
    values = torch.div(keys, m, rounding_mode="floor")
    first_sorted = torch.ones_like(values, dtype=torch.bool)
    first_sorted[:, 1:] = values[:, 1:] != values[:, :-1]       # earliest draw of its value
    first_drawn = torch.zeros_like(first_sorted).scatter_(1, order, first_sorted)
    rank = torch.cumsum(first_drawn, dim=1)                     # 1-based rank among distinct, draw order
    keep_sorted = torch.gather(first_drawn & (rank <= k), 1, order)
    ok = first_sorted.sum(dim=1) >= k
    column = torch.where(keep_sorted, torch.cumsum(keep_sorted, dim=1) - 1, k)   # column k: discarded
    chosen = torch.zeros(rows, k + 1, dtype=torch.int64, device=device).scatter_(1, column, values)
    return chosen[:, :k], ok


def _random_keys(deg: Tensor, k: int, total: int, max_deg: int, generator: Optional[torch.Generator]) -> Tensor:
    """A uniform ``k``-subset of ``[0, deg[h])`` for every row ``h`` (needs ``deg > k``), sorted, by
    keeping the ``k`` smallest random keys of each row.

    ``total`` and ``max_deg`` are ``deg.sum()`` and ``deg.max()`` (known to the caller, which
    saves a sync).  While ``H * max_deg <= KEYS_PAD_RATIO * (total + 2048)``, a padded
    ``[H, max_deg]`` key matrix is sorted row-wise (padding keys exceed every real one);
    otherwise the keys of all rows are sorted in one array, then stably by row.

    Shapes:
        deg: [H] int64 -> [H, k] int64.
    """
    device = deg.device
    rows = deg.numel()
    if rows * max_deg <= KEYS_PAD_RATIO * (total + 2048):
        keys = _randint((rows, max_deg), generator, device)
        keys = torch.where(_arange(max_deg, device) < deg.unsqueeze(1), keys, _RAND_HIGH)
        offsets = torch.sort(keys, dim=1).indices[:, :k]
        return torch.sort(offsets, dim=1).values
    seg, _ = _expand(deg, total)
    seg_start = torch.cumsum(deg, 0) - deg
    order = torch.argsort(_randint((total,), generator, device))          # a uniform permutation
    order = order[torch.argsort(seg[order], stable=True)]                 # grouped by row, key order kept
    first = seg_start.unsqueeze(1) + _arange(k, device)                   # [H, k] first k slots of each row
    offsets = order[first] - seg_start.unsqueeze(1)
    return torch.sort(offsets, dim=1).values


def _hop_offsets(deg: Tensor, cnt: Tensor, k: int, replace: bool, total: int, keys_rows: Optional[Tensor],
                 keys_stats: Sequence[int], rejected: Optional[Tensor], generator: Optional[torch.Generator]):
    """Target (frontier position) and row offset of every edge sampled in one hop.

    Args:
        deg: [F] degrees of the frontier nodes; cnt: [F] edges each keeps; total: ``cnt.sum()``.
        keys_rows: [F] bool, rows sampled by random keys; keys_stats: their number, summed
            degree and largest degree.
        rejected: [F, k] offsets chosen by ``_first_distinct`` for the other rows of ``deg > k``.

    Returns:
        ``(tgt, offset)``: [total] each; ``tgt`` is non-decreasing.
    """
    device = deg.device
    tgt, r = _expand(cnt, total)                                          # target, slot within its edges
    if k <= 0 or total == 0:
        return tgt, r
    if replace:
        draws = torch.remainder(_randint((deg.numel(), k), generator, device), deg.clamp(min=1).unsqueeze(1))
        draws = torch.sort(draws, dim=1).values
        return tgt, draws[tgt, r]
    r_k = r.clamp(max=k - 1)
    offset = r if rejected is None else torch.where((deg > k)[tgt], rejected[tgt, r_k], r)
    num_keys, keys_total, keys_max = keys_stats
    if num_keys > 0:
        rows = torch.nonzero_static(keys_rows, size=num_keys).squeeze(1)
        chosen = _random_keys(deg[rows], k, keys_total, keys_max, generator)
        rank = torch.cumsum(keys_rows, 0) - 1                             # row of each node in `chosen`
        offset = torch.where(keys_rows[tgt], chosen[rank[tgt].clamp(min=0), r_k], offset)
    return tgt, offset


def sample_hops(
    rowptr: Tensor,
    col: Tensor,
    seeds: Tensor,
    fanouts: Sequence[int],
    replace: bool,
    generator: Optional[torch.Generator],
    slot: Tensor,
    check_unique: bool = True,
) -> SampleOutput:
    """Multi-hop uniform neighbour sampling over a destination-major CSR (see the module doc).

    ``seeds`` must be valid node ids on ``rowptr``'s device; ``slot`` is the all-``SENTINEL``
    scratch array ``[N]``, left all-``SENTINEL`` on return.  On an exception it is refilled
    (``O(N)``) so it stays usable.

    Host syncs: 2 per hop (one ``.tolist()`` of the hop's sizes, one ``nonzero`` for its new
    nodes), none for a hop with an empty frontier.

    Raises:
        ValueError: ``check_unique`` and ``seeds`` holds a node twice.

    Shapes:
        rowptr: [N + 1]; col: [E]; seeds: [B] int64; slot: [N] int64 -> SampleOutput.
    """
    device = rowptr.device
    batch = seeds.numel()
    if _fused.applies(device, fanouts, batch, rowptr.numel() - 1):
        return _fused.sample_hops_fused(rowptr, col, seeds, fanouts, replace, generator, slot, check_unique)
    arange_b = _arange(batch, device)
    n_id_parts: List[Tensor] = [seeds]
    clean = False
    try:
        slot[seeds] = arange_b
        dup = (slot[seeds] != arange_b).any() if check_unique else None
        frontier, lo, hi = seeds, 0, batch
        src_parts: List[Tensor] = []
        dst_parts: List[Tensor] = []
        eid_parts: List[Tensor] = []
        cnt_parts: List[Tensor] = []
        num_nodes_list, num_edges_list = [batch], []
        for hop, k in enumerate(fanouts):
            if frontier.numel() == 0:
                num_nodes_list.append(0)
                num_edges_list.append(0)
                continue
            start = rowptr[frontier]
            deg = rowptr[frontier + 1] - start
            if k < 0:
                cnt = deg
            elif replace:
                cnt = torch.where(deg > 0, k, 0)
            else:
                cnt = deg.clamp(max=k)
            stats = [cnt.sum()]
            keys_rows = rejected = None
            if k > 0 and not replace:
                keys_rows = deg > k
                if k <= REJECTION_MAX_FANOUT:                          # drawn before the sync: no extra one
                    rejected, ok = _first_distinct(deg, k, REJECTION_DRAW_FACTOR * k, generator)
                    keys_rows = keys_rows & ~(ok & (deg >= REJECTION_MIN_RATIO * k))
                keys_deg = torch.where(keys_rows, deg, 0)
                stats += [keys_rows.sum(), keys_deg.sum(), keys_deg.max()]
            if dup is not None:
                stats.append(dup.to(torch.int64))
            values = torch.stack(stats).tolist()                       # sync 1 of the hop
            if dup is not None:
                if values[-1]:
                    raise ValueError("seeds must be distinct nodes")
                dup = None
            total = values[0]
            keys_stats = values[1:4] if keys_rows is not None else (0, 0, 0)
            tgt, offset = _hop_offsets(deg, cnt, k, replace, total, keys_rows, keys_stats, rejected, generator)
            eid = start[tgt] + offset
            src = col[eid]
            position = _arange(total, device)
            slot.scatter_reduce_(0, src, position + BASE, reduce="amin")
            first = torch.nonzero(slot[src] == position + BASE).squeeze(1)   # sync 2 of the hop
            new_nodes = src[first]
            n_new = new_nodes.numel()
            slot[new_nodes] = torch.arange(hi, hi + n_new, device=device)
            n_id_parts.append(new_nodes)
            src_parts.append(slot[src])
            dst_parts.append(tgt + lo)
            eid_parts.append(eid)
            cnt_parts.append(cnt)
            num_nodes_list.append(n_new)
            num_edges_list.append(total)
            frontier, lo, hi = new_nodes, hi, hi + n_new
        if dup is not None and bool(dup):                              # every hop had an empty frontier
            raise ValueError("seeds must be distinct nodes")
        n_id = torch.cat(n_id_parts)
        slot.index_fill_(0, n_id, SENTINEL)            # (slot[n_id] = SENTINEL would copy the scalar: a sync)
        clean = True
    finally:
        if not clean:
            slot.fill_(SENTINEL)
    empty = seeds.new_zeros(0)
    counts = torch.cat(cnt_parts + [seeds.new_zeros(hi - lo)])      # cnt_parts cover local nodes [0, lo)
    rowptr_sub = torch.zeros(n_id.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=rowptr_sub[1:])
    return SampleOutput(
        n_id=n_id,
        e_id=torch.cat(eid_parts) if eid_parts else empty,
        src=torch.cat(src_parts) if src_parts else empty,
        dst=torch.cat(dst_parts) if dst_parts else empty,
        rowptr=rowptr_sub,
        num_sampled_nodes=num_nodes_list,
        num_sampled_edges=num_edges_list,
    )
