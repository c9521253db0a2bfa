"""``spmm_tc``: the SpMM on tensor cores (TC-GNN tiles), with autograd.

``out[i] = sum_{j -> i} w_ji x_j`` computed window by window as dense ``[W, K] @ [K, F]``
products over the graph's condensed tiles (``formats/tiles.py``, ``kernels/spmm_tiles.py``).
Backward: ``dX = A^T dY`` on the transpose's tiles, ``dw_e = <dY_i, X_j>`` with the row-wise
SDDMM.  The tiles of a graph's structure are built once and kept in ``graph.cache`` (like its
row plan); edge values become dense tile values with one ``index_add_`` per weight version,
or, on graphs whose dense tiles would pass ``RUNS_MIN_BYTES``, are read per edge by the runs
kernel (:func:`tile_encoding`).

``spmm(..., precision="tf32" | "bf16")`` goes through :func:`spmm_precise`: per graph structure,
feature width, dtype and precision the tuner (``tune.decide``, family ``TC_FAMILY``, persisted
like every decision) picks the fastest of the exact call itself, tile launch configs and the
row kernel on bf16-rounded (``"bf16"``) or fp16-packed (:func:`_packed_sum`) features, all
timed once, once the graph is invested in.  A precision is a permission, never a penalty: the
exact call is the first candidate (what a graph not invested in, ``SPARSEGNN_TUNE=off`` or a
zero-shot decision gets), every candidate is timed as an eager call makes it (its conversions
and launches, ``max(GPU, host)`` ms, the exact call's host ms a floor: ``tune.decide``'s
``eager``) and a reduced one must beat the exact call by ``REDUCED_MARGIN``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._checks import check, check_edge_values, check_node_features, check_same_device
from ..graph import Graph
from ..kernels import interpreting, triton_available
from ..tune.reuse import count_investment
from ._common import derived_values
from ._dispatch import edge_values
from ._triton import SPMM_FAMILY

__all__ = ["tile_encoding", "RUNS_MIN_BYTES", "spmm_tc", "spmm_precise", "TC_FAMILY", "PACKED_MIN_WORK", "precise_aggregate", "sddmm_precise", "SDDMM_TC_SPACE", "tiles_of_graph", "translate_graph", "tc_candidates", "TC_SPACE", "REDUCED_MARGIN", "precise_pick"]


def translate_graph(graph: Graph, window: int = 16, block_k: int = 16):
    """A new :class:`~sparsegnn.formats.tiles.TileGraph` of ``graph``'s structure (its
    ``block_vals`` are ones, built when first read; not cached: see :func:`tiles_of_graph`).
    Where Triton runs (CUDA, or the interpreter) the index work is
    ``kernels.translate.condense``: a sort per window in registers (a bit set per window over
    2048 edges), 2 kernels for the structure of a small graph (one fused pass), up to 10 on
    large ones, instead of ~60 (the reference's)."""
    from ..formats.tiles import translate

    condense = None
    if (graph.rowptr.is_cuda and triton_available()) or interpreting():
        from ..kernels.translate import condense
    return translate(graph.rowptr, graph.col, graph.num_src, window=window, block_k=block_k, row=graph.row,
                     condense=condense)


def tiles_of_graph(graph: Graph, window: int = 16, block_k: int = 16):
    """The graph's :class:`~sparsegnn.formats.tiles.TileGraph` (:func:`translate_graph`), cached
    per shape (the transpose's tiles live on ``graph.t()``)."""
    def build():
        count_investment("translations")
        return translate_graph(graph, window, block_k)
    return graph.cache.get("tiles", (window, block_k), build)


class _SpMMTiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: Graph, x: Tensor, weight: Optional[Tensor], precision: str, window: int,
                block_k: int) -> Tensor:
        from ..kernels.spmm_tiles import spmm_tiles

        tiles = tiles_of_graph(graph, window, block_k)
        ctx.graph, ctx.precision, ctx.shape = graph, precision, (window, block_k)
        ctx.save_for_backward(x, weight)
        values, encoding = _launch_values(graph, tiles, weight, torch.float32)
        return spmm_tiles(tiles, x, values, precision, encoding=encoding)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        from ..kernels.spmm_tiles import spmm_tiles

        x, weight = ctx.saved_tensors
        graph = ctx.graph
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            transposed = graph.t()
            tiles_t = tiles_of_graph(transposed, *ctx.shape)
            vals_t, encoding = _launch_values(transposed, tiles_t, _transposed_weight(graph, weight), torch.float32)
            grad_x = spmm_tiles(tiles_t, grad_out.contiguous(), vals_t, ctx.precision, encoding=encoding).to(x.dtype)
        if weight is not None and ctx.needs_input_grad[2]:
            backend = "triton" if grad_out.is_cuda else "reference"
            grad_w = edge_values(backend, graph, grad_out.float(), x.float(), "dot").to(weight.dtype)
        return None, grad_x, grad_w, None, None, None


def spmm_tc(graph: Graph, x: Tensor, edge_weight: Optional[Tensor] = None, precision: str = "tf32",
            window: int = 16, block_k: int = 16) -> Tensor:
    """Sum aggregation on tensor cores: ``out[i] = sum_{j -> i} w_ji x_j`` (see the module doc).

    Args:
        graph: a :class:`Graph` (bipartite allowed).
        x: ``[M, F]`` float32 / float16 / bfloat16 source features.
        edge_weight: ``[E]`` in the graph's CSR order, or None (the graph's ``edge_val``, else ones).
        precision: ``"tf32"`` (default here) or ``"ieee"`` (exact fp32 products).
        window, block_k: tile shape ``W x K`` (powers of two, 16 for ``tl.dot``).

    Returns:
        ``[N, F]`` of ``x``'s dtype (fp32 accumulation).

    Shapes:
        x: [M, F]; edge_weight: [E] -> [N, F].
    """
    fn = "spmm_tc"
    check(isinstance(graph, Graph), fn, f"graph must be a sparsegnn Graph, got {type(graph).__name__}")
    check_node_features(x, graph.num_src, fn, sources=graph.is_bipartite)
    check(precision in ("tf32", "ieee"), fn, f"precision must be 'tf32' or 'ieee', got {precision!r}")
    weight = graph.edge_val if edge_weight is None else edge_weight
    if weight is not None:
        check_edge_values(weight, graph.num_edges, fn, "edge_weight", max_dim=1)
    check_same_device(fn, graph=graph.rowptr, x=x)
    check(x.is_cuda or interpreting(), fn, f"runs Triton kernels: needs CUDA tensors (or TRITON_INTERPRET=1), got {x.device}")
    return _SpMMTiles.apply(graph, x, weight, precision, window, block_k)


# ---------------------------------------------------------------------------------------------
# precision="tf32" / "bf16": the tuner picks the exact call, tiles or reduced rows per graph, width and dtype

#: Search space of the ``"spmm_tc"`` decisions: ``path`` 0 = the exact call on the caller's
#: features (the CUDA-core row kernel or cuSPARSE, tuned as ``precision="ieee"`` is), 1 = tiles
#: (``swap``, ``bf`` features per program, ``warps``, ``chunk`` blocks per item), 3 = the row
#: kernel on fp32 features packed to fp16 with a scale per row (``kernels/pack.py``: tf32's 11
#: significant bits for entries above 2^-29 of their row's largest magnitude, half the gathered
#: bytes), 4 = the row kernel on features rounded to bf16 (``"bf16"`` on fp32 / fp16 features:
#: half the gathered bytes), its bf16 result converted to the features' dtype, 5 = the same
#: kernel writing its fp32 sums in the features' dtype directly.  Neither of 4 and 5 wins
#: everywhere (H200, bf16 rows, ms): yelp F = 256 (14M edges) 2.39 against 1.98, the Reddit
#: stand-in (115M) 7.1 against 8.2-8.8 (its best configs run ~1.3x slower with an fp32 result).
TC_SPACE = {"path": (0, 1, 3, 4, 5), "swap": (0, 1), "bf": (32, 64, 128, 256), "warps": (4, 8),
            "chunk": (4, 8, 16, 32)}
#: A reduced-precision candidate is picked only when faster than the exact call by more than
#: this fraction: its call path has host work the timing leaves out (the precision dispatch,
#: no memoised call), and a tie is no reason to lose bits.
REDUCED_MARGIN = 0.1


def _tile(swap: int, bf: int, warps: int, chunk: int) -> dict:
    return {"path": 1, "swap": swap, "bf": bf, "warps": warps, "chunk": chunk}


#: Store name of the decisions among :func:`tc_candidates`; its version rises when the list
#: gains a path (path 5, the fp32 result written directly), so that decisions stored before
#: (which never timed it) are made again.  It carries the row kernels' family too
#: (``SPMM_FAMILY``): paths 0 and 3 run the row kernel, so
#: a decision stored while it was slower is not kept once it changes (real
#: PROTEINS_full F=256 tf32 kept a tile config at 0.0545 ms timed against an older row kernel,
#: which now runs it in 0.0448 ms; a fresh decision picks the row kernel).  @6: timed warm
#: (``decide``'s ``warm``): cold timings made bf16 picks that lost to the exact call on graphs
#: whose features fit in L2 (soc-BlogCatalog F = 64: 0.90x).
TC_FAMILY = "spmm_tc@6+" + SPMM_FAMILY
#: Least ``E x F`` for which the packed path is timed: its pack pass and extra launch cost
#: more than it saves below (H100, captured suites: it won from 21.9M up, real wikipedia F=64,
#: tied at 10.9M, and lost below 8M; Cora's widths stay below).
PACKED_MIN_WORK = 1 << 23


def tc_candidates(num_feats: int, half: bool, packed: bool = True, rounded: bool = False) -> list:
    """Configs timed for one ``"spmm_tc"`` decision, the untimed default first: the exact call
    (which itself runs cuSPARSE where that wins: ``ops._triton.VENDOR_FAMILY``; as a tf32
    candidate of its own, cuSPARSE won small graphs by host time the timing missed and lost
    them eagerly, H200: Cora F = 64 0.040 against 0.054 ms a call).

    Then the tile configs, by the rule of the H100 sweep of ``scripts/time_tiles.py`` over the
    real suite and the paper stand-ins (``docs/design/tensor-cores.md``; ``half``: the tiles
    read half features, the caller's or bf16-rounded ones): features per program 32 up to
    ``F <= 32``, else 64 (fp32) or 128 (half); with half features and ``F >= 64`` the
    swapped orientation (features on the MMA's M side); the second-best tile config (and,
    above 64 features, short items of 4 blocks for small graphs).  Then ``rounded`` (``"bf16"``
    on features that are not bf16) the row kernel on bf16-rounded features, with a bf16 result
    converted (path 4) and with its result written in the features' dtype (path 5); for fp32 features
    (``not half``) and ``packed`` the row kernel on features packed to fp16 (path 3: fewer
    gathered bytes at tf32's precision, for graphs whose gathers dominate).
    """
    if num_feats <= 32:
        tiles = [_tile(0, 32, 4, 8), _tile(0, 64, 4, 4)]
    elif num_feats <= 64:
        tiles = [_tile(1, 64, 4, 16), _tile(0, 64, 4, 4)] if half else [_tile(0, 64, 4, 4), _tile(0, 64, 4, 16)]
    else:
        tiles = [_tile(1, 128, 4, 32), _tile(1, 64, 4, 16)] if half else [_tile(0, 64, 4, 16), _tile(0, 128, 8, 16)]
        # and short items of 4 blocks, which win on small graphs (more programs; Cora F = 256,
        # captured: 13.6 vs 14.5 us tf32, 14.6 vs 15.0 us bf16; docs/design/tensor-cores.md)
        tiles.append(_tile(0, 64, 4, 4))
    return ([{"path": 0}] + tiles + ([{"path": 4}, {"path": 5}] if rounded else [])
            + ([{"path": 3}] if packed and not half else []))


#: Dense tile values above this many bytes are not built: graphs with sorted rows take the runs
#: encoding there (``formats.tiles.TileGraph``).  Below it the dense tiles are faster (H100:
#: runs took 1.08-2.89x the dense kernel's time, 1.66x tf32 geomean over 8 cases,
#: ``docs/design/tensor-cores.md``) and cheap to build.
RUNS_MIN_BYTES = 1 << 30


def tile_encoding(tiles) -> str:
    """``"runs"`` where the rows are sorted and the dense fp32 tile values would take more than
    ``RUNS_MIN_BYTES`` (reddit 7.3 GB: zeroing and filling them took longer than a training
    epoch), else ``"dense"``."""
    big = tiles.num_blocks * tiles.window * tiles.block_k * 4 > RUNS_MIN_BYTES
    return "runs" if big and tiles.ordered else "dense"


def _launch_values(graph: Graph, tiles, weight: Optional[Tensor], dtype: torch.dtype):
    """``(values, encoding)`` for the tile SpMM (:func:`tile_encoding`): with runs ``weight`` is
    read per edge in CSR order and no tile values are built; else the dense tile values of
    ``weight`` (built once per weight version)."""
    if tile_encoding(tiles) == "runs":
        return (None if weight is None else weight.detach().to(dtype)), "runs"
    return _tile_vals(graph, tiles, weight, dtype), "dense"


def _tile_vals(graph: Graph, tiles, weight: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    if weight is None and dtype == torch.float32:
        return tiles.block_vals
    build = lambda: tiles.tiles_of(None if weight is None else weight.detach(), dtype)  # noqa: E731
    return derived_values(graph, ("tile_vals", tiles.window, tiles.block_k, dtype), weight, build)


def _run_sum(graph: Graph, x: Tensor, weight: Optional[Tensor], precision: str, config: dict) -> Tensor:
    """``A x`` (weights ``weight`` in ``graph``'s CSR order, None = ones) with one config, as
    a call makes it: ``x`` is the caller's features, rounded to bf16 here where the config
    reads them so (``"bf16"``), and the result is of ``x``'s dtype."""
    from ._dispatch import aggregate

    path = config["path"]
    if path == 0:                                  # the exact call
        return aggregate("triton", graph, x, weight, "sum")
    if path == 3 and x.dtype == torch.float32:     # (a stored pick for fp32 only)
        return _packed_sum(graph, x, weight)
    features = x.to(torch.bfloat16) if precision == "bf16" else x
    if path == 5 and features.dtype != x.dtype:
        # the sums accumulated in fp32 and written once in x's dtype (not rounded to bf16)
        from ._triton import sum_rows_into

        out = torch.empty((graph.num_nodes, x.shape[1]), dtype=x.dtype, device=x.device)
        return sum_rows_into(graph, features, weight, out)
    if path in (3, 4, 5):
        return aggregate("triton", graph, features, weight, "sum").to(x.dtype)
    slot = ("tile_launch", features.dtype, features.shape[1], precision, tuple(sorted(config.items())))
    launch = derived_values(graph, slot, weight, lambda: _tile_launch(graph, features, weight, precision, config))
    return launch(features).to(x.dtype)


def _packed_sum(graph: Graph, x: Tensor, weight: Optional[Tensor]) -> Tensor:
    """``A x`` for fp32 ``x`` at tf32's precision: ``x ~= h * inv`` packed to fp16 per row
    (``kernels/pack.py``), then ``out_i = sum_e w_e inv_{col[e]} h_{col[e]}`` by the row kernel
    (``inv`` gathered with each edge), accumulated and returned in fp32.  Bytes: ``x`` read
    and ``h`` written once (6 per element), then 2 per gathered feature instead of 4."""
    from ..kernels.pack import pack_fp16
    from ._triton import sum_rows_into

    packed, inv = pack_fp16(x)
    out = torch.empty((graph.num_nodes, x.shape[1]), dtype=torch.float32, device=x.device)
    return sum_rows_into(graph, packed, None if weight is None else weight.detach(), out, src_scale=inv)


def _tile_launch(graph: Graph, x: Tensor, weight: Optional[Tensor], precision: str, config: dict):
    """The prepared tile SpMM (``kernels.spmm_tiles.TileLaunch``) of one config: cached with
    the values it was built from, so a call costs one allocation and one launch."""
    from ..kernels.spmm_tiles import TileLaunch

    half = x.dtype in (torch.float16, torch.bfloat16)
    tiles = tiles_of_graph(graph)
    vals, encoding = _launch_values(graph, tiles, weight, x.dtype if half else torch.float32)
    return TileLaunch(tiles, vals, x.dtype, x.shape[1], "tf32" if precision == "tf32" else "ieee",
                      block_f=config["bf"], swap=bool(config["swap"]), num_warps=config["warps"],
                      chunk=config["chunk"], encoding=encoding)


def _precise_config(graph: Graph, x: Tensor, weight: Optional[Tensor], precision: str, exact=None) -> dict:
    """The ``"spmm_tc"`` decision for ``A x`` at ``precision`` (module doc): stored, or timed
    here over :func:`tc_candidates` with each candidate's eager cost.  ``exact``: the exact
    call as the caller makes it (its own weights and reduce, so its bound launch), timed for
    path 0; by default the exact sum with ``weight``."""
    from ..tune import decide

    half = x.dtype in (torch.float16, torch.bfloat16) or precision == "bf16"
    candidates = lambda: tc_candidates(  # noqa: E731
        x.shape[1], half, graph.num_edges * x.shape[1] >= PACKED_MIN_WORK,
        precision == "bf16" and x.dtype != torch.bfloat16)
    run = lambda cfg: exact() if exact is not None and cfg["path"] == 0 else _run_sum(  # noqa: E731
        graph, x, weight, precision, cfg)
    return decide(TC_FAMILY, graph, precision, x.shape[1], x.dtype, x.device, candidates, run,
                  space=TC_SPACE, ranked=False, eager=True, keep_first=REDUCED_MARGIN, warm=True)


def _precise_sum(graph: Graph, x: Tensor, weight: Optional[Tensor], precision: str) -> Tensor:
    return _run_sum(graph, x, weight, precision, _precise_config(graph, x, weight, precision))


def _effective_weight(graph: Graph, weight: Optional[Tensor], reduce: str) -> Optional[Tensor]:
    """``w'`` of ``A' = A`` (``"sum"``: ``weight`` itself) or ``D^-1 A`` (``"mean"``:
    ``_common.mean_weights``), None = ones: the same tensors the call itself passes on."""
    from ._common import mean_weights

    return mean_weights(graph, weight) if reduce == "mean" else weight


def precise_pick(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, precision: str) -> dict:
    """The config ``spmm(graph, x, reduce, weight, precision=precision)`` runs (decided here if
    not yet: see the module doc); ``spmm`` takes the exact path itself where it is path 0, and
    memoises the pick.  Path 0 is timed as ``spmm``'s exact call makes it (``weight``,
    ``reduce``); the others with the effective weights their call passes on."""
    from ._dispatch import aggregate

    exact = lambda: aggregate("triton", graph, x, weight, reduce)  # noqa: E731
    return _precise_config(graph, x, _effective_weight(graph, weight, reduce), precision, exact)


def _transposed_weight(graph: Graph, weight: Optional[Tensor]) -> Optional[Tensor]:
    """``weight`` (``graph``'s CSR order) in the order of ``graph.t()``'s edges; kept while the
    same tensor at the same version comes back (the graph's own values, a mean's ``1 / deg``),
    so the transpose's tile values are not rebuilt every backward."""
    if weight is None:
        return None
    if weight is graph.edge_val:
        return graph.t().edge_val           # permuted once and cached with the transpose
    perm = graph.transpose_parts()[2]
    return derived_values(graph, ("transposed_weight",), weight, lambda: weight.detach().index_select(0, perm))


def precise_aggregate(graph: Graph, x: Tensor, weight: Optional[Tensor], reduce: str, precision: str,
                      transposed: bool = False, config: Optional[dict] = None) -> Tensor:
    """No-grad ``A' x`` (``transposed``: ``A'^T x``) at ``precision``, ``A' = A`` (``"sum"``) or
    ``D^-1 A`` (``"mean"``), weights ``weight`` in ``graph``'s CSR order (None = ones): what the
    custom op ``sparsegnn::spmm_precise`` runs under ``torch.compile``.  ``config``: the pick of
    ``A' x`` (not transposed), made already.

    Shapes:
        x: [M, F] ([N, F] transposed); weight: [E] or None -> [N, F] ([M, F] transposed).
    """
    if reduce == "mean":
        weight = _effective_weight(graph, weight, reduce)
    if transposed:
        graph, weight = graph.t(), _transposed_weight(graph, weight)
    elif config is not None:
        return _run_sum(graph, x, weight, precision, config)
    return _precise_sum(graph, x, weight, precision)


class _SpMMPrecise(torch.autograd.Function):
    """``Y = A X`` at reduced precision; ``dX = A^T dY`` the same way on the cached transpose,
    ``dw_e = <dY_i, X_j>`` with the exact row-wise SDDMM."""

    @staticmethod
    def forward(ctx, graph: Graph, x: Tensor, weight: Optional[Tensor], precision: str,
                config: Optional[dict]) -> Tensor:
        ctx.graph, ctx.precision = graph, precision
        ctx.save_for_backward(x, weight)
        return precise_aggregate(graph, x, weight, "sum", precision, config=config)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        x, weight = ctx.saved_tensors
        graph, precision = ctx.graph, ctx.precision
        grad_x = grad_w = None
        grad_out = grad_out.contiguous()
        if ctx.needs_input_grad[1]:
            grad_x = precise_aggregate(graph, grad_out, weight, "sum", precision, transposed=True).to(x.dtype)
        if weight is not None and ctx.needs_input_grad[2]:
            grad_w = edge_values("triton", graph, grad_out.float(), x.float(), "dot").to(weight.dtype)
        return None, grad_x, grad_w, None, None


def spmm_precise(graph: Graph, x: Tensor, weight: Optional[Tensor], precision: str,
                 config: Optional[dict] = None) -> Tensor:
    """``out = A x`` with ``A``'s values ``weight`` (CSR order; None = ones) at ``precision``
    ``"tf32"`` (fp32 features, tf32 products where tensor cores run, or fp16-packed features on
    the row kernel) or ``"bf16"`` (features rounded to bf16, fp32 accumulation), on the fastest
    of the exact call, tiles and packed or rounded rows (module doc).
    Result in ``x``'s dtype; differentiable in ``x`` and ``weight``.

    ``config``: the forward's pick (``precise_pick``), made already.

    Shapes:
        x: [M, F] (CUDA); weight: [E] or None -> [N, F].
    """
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)):
        return _SpMMPrecise.apply(graph, x, weight, precision, config)
    return precise_aggregate(graph, x, weight, "sum", precision, config=config)  # no autograd node: less host work


# ---------------------------------------------------------------------------------------------
# sddmm(..., precision="tf32" | "bf16"): the tuner picks the row-wise kernel or the tile kernel

#: Search space of the ``"sddmm_tc"`` decisions: ``path`` 0 = the exact row-wise SDDMM,
#: 1 = the tile SDDMM (one ``[W, F] @ [F, K]`` tf32 product per block), ``bf`` features per step.
SDDMM_TC_SPACE = {"path": (0, 1), "bf": (32, 64)}


def sddmm_candidates(num_feats: int) -> list:
    """The exact row kernel first: since its edge-parallel schedule it is faster than
    the tile kernel on all 54 H100 cases of ``scripts/time_tiles.py --no-spmm`` (before it the
    tiles won 27: small graphs, batched molecules, community stand-ins); tiles stay timed."""
    first = 32 if num_feats <= 32 else 64
    return [{"path": 0, "bf": 32}, {"path": 1, "bf": first}, {"path": 1, "bf": 96 - first}]


def _sddmm_run(graph: Graph, a: Tensor, b: Tensor, config: dict) -> Tensor:
    from ..kernels.spmm_tiles import sddmm_tiles

    if config["path"] == 0:
        return edge_values("triton", graph, a, b, "dot").float()
    return sddmm_tiles(tiles_of_graph(graph), a, b, precision="tf32", block_f=config["bf"])


def _sddmm_tc(graph: Graph, a: Tensor, b: Tensor, precision: str) -> Tensor:
    """No-grad ``<a_i, b_j>`` per edge (CSR order, fp32) on the tuned path."""
    from ..tune import decide

    run = lambda cfg: _sddmm_run(graph, a, b, cfg)  # noqa: E731
    config = decide("sddmm_tc", graph, precision, a.shape[1], a.dtype, a.device,
                    lambda: sddmm_candidates(a.shape[1]), run, space=SDDMM_TC_SPACE, ranked=False)
    return run(config)


class _SDDMMPrecise(torch.autograd.Function):
    """``s_e = <a_i, b_j>``; ``da = A_s b``, ``db = A_s^T a`` (``A_s``: the graph with values
    ``ds``) by the reduced-precision SpMM."""

    @staticmethod
    def forward(ctx, graph: Graph, a: Tensor, b: Tensor, precision: str) -> Tensor:
        ctx.graph, ctx.precision = graph, precision
        ctx.save_for_backward(a, b)
        return _sddmm_tc(graph, a, b, precision).to(a.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        graph, precision = ctx.graph, ctx.precision
        grad = grad.float().contiguous()
        grad_a = grad_b = None
        if ctx.needs_input_grad[1]:
            grad_a = precise_aggregate(graph, b, grad, "sum", precision).to(a.dtype)
        if ctx.needs_input_grad[2]:
            grad_b = precise_aggregate(graph, a, grad, "sum", precision, transposed=True).to(b.dtype)
        return None, grad_a, grad_b, None


def sddmm_precise(graph: Graph, a: Tensor, b: Tensor, precision: str) -> Tensor:
    """``out[e] = <a_i, b_j>`` for every edge ``e: j -> i`` with tf32 products where the
    tuner (family ``"sddmm_tc"``, :func:`sddmm_candidates`) finds the tile kernel faster than
    the exact row-wise one.  ``"bf16"`` runs as ``"tf32"`` (no bf16 tile SDDMM).  Result in
    ``a``'s dtype; differentiable in ``a`` and ``b`` (backward by ``spmm`` at ``precision``).

    Shapes:
        a: [N, F]; b: [M, F] (CUDA) -> [E] in CSR order.
    """
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _SDDMMPrecise.apply(graph, a, b, precision)
    return _sddmm_tc(graph, a, b, precision).to(a.dtype)
