"""Multi-hop sampling with the Triton hop kernels (``kernels.sample``): one host sync a batch.

Same semantics and output as ``_core.sample_hops`` (seeds first, each hop's new nodes in
first-seen order, edges grouped by target by ascending CSR position), other random draws.
Taken on CUDA for fanouts in ``[1, MAX_FANOUT]`` (``FUSED``); ``-1`` (all in-edges), ``0`` and
larger fanouts use the torch sampler.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import Tensor

from ._output import SampleOutput, _arange

#: ``"auto"``: the Triton sampler on CUDA where it applies; ``"always"``: also on the CPU
#: (through the Triton interpreter: tests); ``"never"``: the torch sampler only.
FUSED = "auto"


def applies(device: torch.device, fanouts: Sequence[int], batch: int, num_nodes: int) -> bool:
    """Whether ``sample_hops`` takes the Triton sampler for this call (see ``FUSED``)."""
    from ..kernels.sample import MAX_FANOUT

    if FUSED == "never" or (FUSED == "auto" and device.type != "cuda"):
        return False
    if not all(1 <= k <= MAX_FANOUT for k in fanouts):
        return False
    rows = batch
    for k in fanouts:                         # padded positions of every hop fit int32
        if rows * k >= 2 ** 31:
            return False
        rows = min(rows * k, num_nodes)
    return True


def sample_hops_fused(rowptr: Tensor, col: Tensor, seeds: Tensor, fanouts: Sequence[int], replace: bool,
                      generator: Optional[torch.Generator], slot: Tensor, check_unique: bool = True):
    """``_core.sample_hops`` on the Triton hop kernels (see ``kernels.sample``).

    Host syncs: one (the sizes, at the end).  ``slot`` is left all-``SENTINEL``, also on errors.

    Shapes:
        rowptr: [N + 1]; col: [E]; seeds: [B] int64; slot: [N] int64 -> SampleOutput.
    """
    from ..kernels import sample as K

    device = rowptr.device
    n = rowptr.numel() - 1
    batch, hops = seeds.numel(), len(fanouts)
    # host-known upper bounds: frontier rows of every hop, padded edge positions, nodes
    f_ub: List[int] = [batch]
    for k in fanouts[:-1]:
        f_ub.append(min(f_ub[-1] * k, n))
    pos_ub = [f * k for f, k in zip(f_ub, fanouts)]
    nodes_ub = min(n, batch + sum(pos_ub))
    edges_ub = sum(pos_ub)
    i64 = torch.int64
    clean = False
    try:
        arange_b = _arange(batch, device)
        slot[seeds] = arange_b
        dup = (slot[seeds] != arange_b).any() if check_unique else None
        nid = torch.empty(nodes_ub, dtype=i64, device=device)
        nid[:batch].copy_(seeds)
        meta = torch.zeros(2 * hops + 3, dtype=i64, device=device)   # frontier bounds [H + 2], edge offsets [H + 1]
        meta[1:2].fill_(batch)
        nmeta, emeta = meta[:hops + 2], meta[hops + 2:]
        hop_seeds = torch.randint(0, 2 ** 62, (hops,), generator=generator, device=device, dtype=i64)
        out_src = torch.empty(edges_ub, dtype=i64, device=device)
        out_dst = torch.empty(edges_ub, dtype=i64, device=device)
        out_eid = torch.empty(edges_ub, dtype=i64, device=device)
        rowptr_sub = torch.zeros(nodes_ub + 1, dtype=i64, device=device)
        for hop, k in enumerate(fanouts):
            rows, positions = f_ub[hop], pos_ub[hop]
            kp = max(2, 1 << (k - 1).bit_length())
            eid = torch.empty(positions, dtype=i64, device=device)
            src = torch.empty(positions, dtype=i64, device=device)
            cnt = torch.empty(rows, dtype=i64, device=device)
            first = torch.empty(positions, dtype=torch.int32, device=device)
            K.hop_sample(rowptr, col, nid, nmeta, hop_seeds, eid, src, cnt, slot, hop, rows, k, kp, replace)
            K.hop_first(src, slot, first, positions)
            K.hop_assign(src, first, torch.cumsum(first, 0), slot, nid, nmeta, hop, positions)
            K.hop_compact(eid, src, cnt, torch.cumsum(cnt, 0), slot, nmeta, emeta, out_src, out_dst, out_eid,
                          rowptr_sub, hop, rows, k, kp)
        sizes = meta if dup is None else torch.cat([meta, dup.view(1).to(i64)])
        values = sizes.tolist()                                           # the one sync
        if dup is not None and values[-1]:
            raise ValueError("seeds must be distinct nodes")
        bounds, offsets = values[:hops + 2], values[hops + 2:2 * hops + 3]
        num_nodes, num_edges = bounds[-1], offsets[-1]
        n_id = nid[:num_nodes]
        slot.index_fill_(0, n_id, K.SENTINEL)
        clean = True
    finally:
        if not clean:
            slot.fill_(K.SENTINEL)
    rowptr_sub = rowptr_sub[:num_nodes + 1]
    if num_nodes > bounds[hops]:                   # the last hop's new nodes keep no edges
        rowptr_sub[bounds[hops] + 1:].fill_(num_edges)
    return SampleOutput(
        n_id=n_id,
        e_id=out_eid[:num_edges],
        src=out_src[:num_edges],
        dst=out_dst[:num_edges],
        rowptr=rowptr_sub,
        num_sampled_nodes=[batch] + [bounds[h + 2] - bounds[h + 1] for h in range(hops)],
        num_sampled_edges=[offsets[h + 1] - offsets[h] for h in range(hops)],
    )
