"""Structure work of small graphs on the host.

Building a graph's derived forms (CSR from ``edge_index``, transpose, work plan, statistics)
on a GPU runs a handful of sorting, scanning and counting kernels.  In a fresh process each
of them pays a one-off module load (CUDA's lazy loading: 5-70 ms for the sorts), about a third
of a small graph's first training step (Cora: ~0.35 s).  For a graph of a few tens of thousands
of edges the host does the same work in a few milliseconds, so such work runs on host copies and
its results are copied to the graph's device.  Most routed functions synchronise with the host
anyway (they read sizes back); the edge permutations (``csr.permute_edges``) and heavy-row lists
do not on the device, so their first ``HOST_CALLS`` calls in a process add one synchronisation
each (a learnable graph-owned edge weight re-permuted after each optimiser step: its first 8
backward passes).

Only while the device's kernels are cold: once loaded, the device does the same work faster
(steady state: a GCN layer's graph from a new ``edge_index`` of 13k edges takes about twice as
long on the host as on the device; a GAT layer's first step on a new 17k-edge graph, H200:
15.6 ms through the host, 6.0 ms on the device).  So each kind of work takes the host path for
its first ``HOST_CALLS`` calls in a process, and never again once it has run on the device (a
larger graph, a capture): a full-graph script builds its graphs once and never loads those
kernels; a loop that builds a graph every step (sampled or molecule batches) loads them a few
steps in; a stream of graphs of all sizes loads them at its first large graph and keeps them.

The rule: on a CUDA device, at most ``HOST_MAX_EDGES`` edges and nodes, no CUDA graph being
captured (copies to the host are not allowed there), no synchronisation debug mode set
(``torch.cuda.set_sync_debug_mode``: a replay's recording warm-up forbids syncs), and fewer
than ``HOST_CALLS`` earlier calls of the same kind.  ``SPARSEGNN_HOST_BUILD_MAX_EDGES`` relocates the bound; 0 keeps everything on
the device.
"""
from __future__ import annotations

import os
from collections import Counter

import torch
from torch import Tensor


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"sparsegnn: {name} must be an integer, got {raw!r}") from None


#: Graphs on a GPU with at most this many edges (and nodes) have their structure work done on
#: the host.  A GCN layer's graph of 13k edges (Cora) takes 3.6 ms on the host, 32k edges 8.8 ms.
HOST_MAX_EDGES = _env_int("SPARSEGNN_HOST_BUILD_MAX_EDGES", 1 << 15)

#: Calls of each kind of work that take the host path in a process (module doc).
HOST_CALLS = 8

_CALLS: Counter = Counter()


def small_on_gpu(tensor: Tensor, num_edges: int, work: str, num_nodes: int = 0) -> bool:
    """Whether this call of ``work`` (a name per kind of structure work) on ``tensor`` (an index
    tensor of a graph of ``num_edges`` edges and ``num_nodes`` nodes, the larger side of a
    bipartite one) runs on the host, by the rule of the module doc.  A True answer counts as
    one of the kind's host calls; a False one for a graph with edges on a GPU ends the kind's
    host calls (its device kernels are loaded now)."""
    if not (tensor.is_cuda and 0 < num_edges <= HOST_MAX_EDGES and num_nodes <= HOST_MAX_EDGES
            and _CALLS[work] < HOST_CALLS and not torch.cuda.is_current_stream_capturing()
            and not (torch.cuda.is_available() and torch.cuda.get_sync_debug_mode() != 0)):
        if tensor.is_cuda and num_edges > 0:
            _CALLS[work] = max(_CALLS[work], HOST_CALLS)
        return False
    _CALLS[work] += 1
    return True


def reset_counts() -> None:
    """Forget the host calls made so far (tests; a process whose device kernels were unloaded)."""
    _CALLS.clear()
