"""Uniform neighbour sampling (sparsegnn.sampling): structure, exact uniformity, PyG parity.

Oracles are independent of the sampler: the structure is checked edge by edge against the
input edge list with plain Python sets; uniformity with goodness-of-fit tests whose power is
shown on deliberately biased selections; layer outputs against PyG's SAGEConv and a dense
float64 computation on the full graph restricted to the sampled edges.
"""
import itertools
import math
import sys
from collections import Counter

import pytest
import torch
from scipy import stats

import sparsegnn
from sparsegnn import Graph
from sparsegnn.datasets import random_graph
from sparsegnn.sampling import MiniBatch, NeighborLoader, NeighborSampler, sample_neighbors
from sparsegnn.sampling import _core, _fused

from conftest import DEVICE

P_MIN = 1e-4          # a correct sampler fails a test with probability <= 1e-4 (fixed seeds: deterministic)


def gen(seed=0, device=DEVICE):
    return torch.Generator(device=device).manual_seed(seed)


def awkward_graph(device=DEVICE):
    """Isolated nodes, nodes without in-edges, self loops, duplicate edges and one hub (node 0)."""
    ei, _ = random_graph(60, 500, seed=3, num_isolated=4, num_empty_rows=5, num_self_loops=8, num_duplicates=30)
    hub_src = torch.randint(0, 56, (300,), generator=torch.Generator().manual_seed(4))
    hub = torch.stack([hub_src, torch.zeros_like(hub_src)])          # 300 in-edges of node 0, many repeated
    ei = torch.cat([ei, hub, torch.tensor([[0, 0], [0, 0]])], dim=1)  # and two more self loops on the hub
    return ei.to(device), 60


# ---------------------------------------------------------------------------- structure oracle
def check_structure(ei, num_nodes, batch, seeds, fanouts, replace=False, edge_order="csr", graph=None):
    """Every claim of the batch, checked against the raw edge list ``ei`` with Python sets and loops."""
    ei = ei.cpu()
    seeds = [int(s) for s in seeds]
    n_id = batch.n_id.cpu().tolist()
    src, dst = (t.tolist() for t in batch.edge_index.cpu())
    e_id = batch.e_id.cpu().tolist()
    in_edges = {v: [] for v in range(num_nodes)}                # raw edge positions into each node
    for e in range(ei.shape[1]):
        in_edges[int(ei[1, e])].append(e)
    # nodes: seeds first, then distinct; counts add up
    assert n_id[:len(seeds)] == seeds
    assert len(set(n_id)) == len(n_id)
    assert batch.batch_size == len(seeds)
    assert batch.num_nodes == len(n_id) == sum(batch.num_sampled_nodes)
    assert len(batch.num_sampled_nodes) == len(fanouts) + 1 and len(batch.num_sampled_edges) == len(fanouts)
    assert batch.num_sampled_nodes[0] == len(seeds)
    assert len(src) == len(e_id) == sum(batch.num_sampled_edges)
    # every edge exists, and e_id points at it
    for s, d, e in zip(src, dst, e_id):
        raw = e if edge_order == "input" else int(graph.edge_perm[e])
        assert (int(ei[0, raw]), int(ei[1, raw])) == (n_id[s], n_id[d])
    # hop by hop: targets are exactly the frontier, each keeps min(deg, k) edges, new nodes in first-seen order
    lo, hi, pos = 0, len(seeds), 0
    for hop, k in enumerate(fanouts):
        count = batch.num_sampled_edges[hop]
        hop_src, hop_dst, hop_e = src[pos:pos + count], dst[pos:pos + count], e_id[pos:pos + count]
        assert hop_dst == sorted(hop_dst) and all(lo <= t < hi for t in hop_dst)
        if edge_order == "csr":                                     # within a target: ascending CSR position
            for i in range(1, count):
                if hop_dst[i] == hop_dst[i - 1]:
                    assert hop_e[i] >= hop_e[i - 1] if replace else hop_e[i] > hop_e[i - 1]
        per_target = Counter(hop_dst)
        for t in range(lo, hi):
            deg = len(in_edges[n_id[t]])
            want = deg if k < 0 else (k if deg > 0 else 0) if replace else min(deg, k)
            assert per_target.get(t, 0) == want, (hop, t, deg, k)
        if not replace:
            assert len(set(hop_e)) == len(hop_e)                # distinct edge positions
        seen, new = set(n_id[:hi]), []
        for s in hop_src:
            if n_id[s] not in seen:
                seen.add(n_id[s])
                new.append(n_id[s])
        assert n_id[hi:hi + len(new)] == new and batch.num_sampled_nodes[hop + 1] == len(new)
        lo, hi, pos = hi, hi + len(new), pos + count
    assert hi == len(n_id)
    # the attached Graph is the sub-graph's CSR, in edge_index order
    sub = batch.graph
    assert isinstance(sub, Graph) and sub.num_nodes == len(n_id) and sub.num_edges == len(src)
    assert sub.col.cpu().tolist() == src and sub.row.cpu().tolist() == dst
    for got, want in zip(sub.transpose_parts(), sparsegnn.formats.csr.transpose_csr(sub.rowptr, sub.col, sub.num_src)):
        assert torch.equal(got, want)                               # make_batch's sync-free transpose


@pytest.fixture(params=["torch", "triton"])
def impl(request, monkeypatch):
    """Run a test on the torch sampler and on the Triton hop kernels."""
    monkeypatch.setattr(_fused, "FUSED", "never" if request.param == "torch" else "always")
    return request.param


@pytest.mark.parametrize("fanouts", [[3, 2], [5], [2, 2, 2], [-1, 4], [0, 3], [1000, 1], [64, 2]])
@pytest.mark.parametrize("replace", [False, True])
def test_structure(impl, fanouts, replace):
    ei, n = awkward_graph()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    x = torch.randn(n, 5, device=DEVICE)
    y = torch.arange(n, device=DEVICE) * 3
    mask = torch.rand(n, device=DEVICE) > 0.5
    seeds = torch.tensor([0, 17, 55, 58, 3, 40], device=DEVICE)    # the hub, isolated (58) and empty-row nodes
    batch = sample_neighbors(graph, seeds, fanouts, replace=replace, generator=gen(1), x=x, y=y,
                             node_attrs={"mask": mask})
    check_structure(ei, n, batch, seeds.tolist(), fanouts, replace, graph=graph)
    assert torch.equal(batch.x, x[batch.n_id]) and torch.equal(batch.y, y[batch.n_id])
    assert torch.equal(batch.mask, mask[batch.n_id])
    assert torch.equal(batch.input_id.cpu(), torch.arange(len(seeds)))


# The without-replacement methods: default mix; random keys only (padded row-wise sort, then one
# flat sort over all rows); rejection for every row of
# d > k with m = k draws, so that rows of collisions (about half of them at d = 20, k = 5) fall back
# to random keys; rejection with many draws (few fallbacks).
METHODS = {
    "default": {},
    "keys-only": {"REJECTION_MAX_FANOUT": 0},
    "keys-flat": {"REJECTION_MAX_FANOUT": 0, "KEYS_PAD_RATIO": 0},     # one sort over all rows' keys
    "rejection-with-fallbacks": {"REJECTION_MIN_RATIO": 1, "REJECTION_DRAW_FACTOR": 1},
    "rejection-many-draws": {"REJECTION_MIN_RATIO": 1, "REJECTION_DRAW_FACTOR": 4},
    "triton": {},           # the Triton hop kernels (Floyd's algorithm; interpreted on the CPU)
}


def use_method(monkeypatch, method):
    """The torch sampler with ``_core``'s constants set, or the Triton one (``method == "triton"``)."""
    monkeypatch.setattr(_fused, "FUSED", "always" if method == "triton" else "never")
    for name, value in METHODS[method].items():
        monkeypatch.setattr(_core, name, value)


@pytest.mark.parametrize("method", list(METHODS))
def test_structure_every_method(monkeypatch, method):
    use_method(monkeypatch, method)
    ei, n = awkward_graph()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    for fanouts in ([3, 2], [70, 3], [1, 1, 1]):                     # 70 > REJECTION_MAX_FANOUT
        seeds = list(range(0, n, 4))
        batch = sample_neighbors(graph, seeds, fanouts, generator=gen(13))
        check_structure(ei, n, batch, seeds, fanouts, graph=graph)


@pytest.mark.parametrize("method", list(METHODS))
def test_hub_gets_exactly_fanout_distinct_edges(monkeypatch, method):
    use_method(monkeypatch, method)
    hub_degree = 20000
    src = torch.randint(1, 5000, (hub_degree,), generator=torch.Generator().manual_seed(0))
    ei = torch.stack([src, torch.zeros_like(src)]).to(DEVICE)     # one hub, heavy duplicates
    graph = Graph.from_edge_index(ei, num_nodes=5000)
    for k in (1, 10, 100):
        batch = sample_neighbors(graph, [0], [k], generator=gen(k))
        e = batch.e_id.cpu()
        assert e.numel() == k and e.unique().numel() == k and bool((e < hub_degree).all())
        assert torch.equal(graph.col[batch.e_id], batch.n_id[batch.edge_index[0]])


def test_input_edge_order_and_edge_values():
    ei, n = awkward_graph()
    w = torch.rand(ei.shape[1], device=DEVICE)
    graph = Graph.from_edge_index(ei, w, num_nodes=n)
    batch = sample_neighbors(graph, [0, 5, 9], [4, 3], generator=gen(2), edge_order="input")
    check_structure(ei, n, batch, [0, 5, 9], [4, 3], edge_order="input")
    assert torch.equal(batch.edge_weight, w[batch.e_id])
    assert torch.equal(batch.graph.edge_val, w[batch.e_id])


def test_same_generator_seed_same_batch_and_scratch_left_clean(impl):
    ei, n = awkward_graph()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    a = sample_neighbors(graph, [0, 1, 2], [5, 5], generator=gen(7))
    with pytest.raises(ValueError, match="distinct"):
        sample_neighbors(graph, [4, 9, 4], [5, 5], generator=gen(7))
    b = sample_neighbors(graph, [0, 1, 2], [5, 5], generator=gen(7))
    for key in ("n_id", "e_id", "edge_index"):
        assert torch.equal(a[key], b[key])
    check_structure(ei, n, b, [0, 1, 2], [5, 5], graph=graph)
    sampler = NeighborSampler(graph, [5, 5])
    out = sampler.sample(torch.tensor([0, 1, 2], device=DEVICE), gen(7))
    assert torch.equal(out.n_id, a.n_id) and torch.equal(out.e_id, a.e_id)
    assert bool((sampler._slot == _core.SENTINEL).all())


# ---------------------------------------------------------------------------- uniformity
def repeated_hub_graph(draws, degree):
    """``draws`` target nodes with identical in-rows from sources draws .. draws + degree - 1.

    Sampling every target once at one hop gives ``draws`` independent samples of a node of
    degree ``degree``; the offset of a sampled edge in its row is ``e_id - rowptr[target]``.
    """
    tgt = torch.arange(draws).repeat_interleave(degree)
    src = draws + torch.arange(degree).repeat(draws)
    return Graph.from_edge_index(torch.stack([src, tgt]).to(DEVICE), num_nodes=draws + degree)


def draw_subsets(draws, degree, k, seed, replace=False):
    """``[draws, k]`` sampled offsets (sorted per draw) of ``draws`` independent samples."""
    graph = repeated_hub_graph(draws, degree)
    batch = sample_neighbors(graph, torch.arange(draws), [k], replace=replace, generator=gen(seed))
    tgt = batch.n_id[batch.edge_index[1]]
    offsets = (batch.e_id - graph.rowptr[tgt]).cpu()
    assert offsets.numel() == draws * k
    return offsets.view(draws, k).sort(dim=1).values


def marginal_pvalue(subsets, degree):
    """Goodness of fit of the inclusion counts to ``P(i included) = k / d`` for k-subsets without replacement.

    Counts ``X_i`` over ``R`` draws have mean ``R p`` (``p = k / d``), variance ``R p (1 - p)`` and
    covariance ``-R p (1 - p) / (d - 1)`` (from ``P(i, j) = k (k - 1) / (d (d - 1))``): the
    covariance of the Pearson residuals is ``(1 - p) d / (d - 1)`` times the projection off the
    all-ones vector, so ``sum (X_i - R p)^2 / (R p) * (d - 1) / (d - k)`` is chi-square with
    ``d - 1`` degrees of freedom (asymptotically in ``R``).
    """
    draws, k = subsets.shape
    counts = torch.bincount(subsets.flatten(), minlength=degree).double()
    expected = draws * k / degree
    stat = float(((counts - expected) ** 2).sum() / expected) * (degree - 1) / (degree - k)
    return stats.chi2.sf(stat, degree - 1)


def pair_min_pvalue(subsets, degree):
    """Bonferroni-corrected two-sided binomial tests of ``P(i and j included) = k (k - 1) / (d (d - 1))``.

    Per draw, a pair is included or not, independently across draws: each pair's count is
    exactly Binomial(R, P2).
    """
    draws, k = subsets.shape
    member = torch.zeros(draws, degree, dtype=torch.float64)
    member.scatter_(1, subsets, 1.0)
    pair_counts = member.T @ member                                 # [d, d] co-inclusion counts
    p2 = k * (k - 1) / (degree * (degree - 1))
    pairs = list(itertools.combinations(range(degree), 2))
    pvalues = [stats.binomtest(int(pair_counts[i, j]), draws, p2).pvalue for i, j in pairs]
    return min(1.0, min(pvalues) * len(pairs))


def first_k(draws, degree, k):
    return torch.arange(k).expand(draws, k)


def weighted_without_replacement(draws, degree, k, seed=0, weight=2.0):
    """Biased: the first half of the row ``weight`` times as likely (torch.multinomial, no replacement)."""
    weights = torch.ones(degree)
    weights[: degree // 2] = weight
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(weights.expand(draws, degree), k, replacement=False, generator=g).sort(dim=1).values


def cyclic_window(draws, degree, k, seed=0):
    """Biased jointly but not marginally: ``k`` consecutive offsets (cyclic) from a uniform start."""
    start = torch.randint(0, degree, (draws, 1), generator=torch.Generator().manual_seed(seed))
    return ((start + torch.arange(k)) % degree).sort(dim=1).values


def num_draws(draws, impl):
    """``draws``, or a quarter of it (at least 1000) for the Triton kernels: interpreted on the CPU,
    they cost a program a draw.  The p-value tests widen with fewer draws by themselves (exact
    chi-square and binomial laws); each test shows, at the draws it takes, that they still reject
    biased selections."""
    return max(1000, draws // 4) if impl == "triton" else draws


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("degree,k", [(20, 5), (12, 4), (9, 8)])
def test_inclusion_is_uniform(monkeypatch, method, degree, k):
    use_method(monkeypatch, method)
    draws = num_draws(4000, method)
    subsets = draw_subsets(draws, degree, k, seed=degree * 100 + k)
    assert bool((subsets[:, 1:] != subsets[:, :-1]).all())        # distinct within a draw
    assert marginal_pvalue(subsets, degree) > P_MIN
    assert pair_min_pvalue(subsets, degree) > P_MIN
    # the same tests reject biased selections
    assert marginal_pvalue(first_k(draws, degree, k), degree) < P_MIN
    assert marginal_pvalue(weighted_without_replacement(draws, degree, k), degree) < P_MIN
    # and a milder one: the first half 1.3 times as likely (p ~ 1e-9 .. 1e-14 at 1000 draws)
    assert marginal_pvalue(weighted_without_replacement(draws, degree, k, weight=1.3), degree) < P_MIN


def test_rejection_fallbacks_are_exercised():
    """With m = k draws at d = 20, k = 5, a row is accepted iff its draws are distinct:
    probability 20 * 19 * 18 * 17 * 16 / 20^5 = 0.58, so the mixing test above mixes both methods."""
    deg = torch.full((4000,), 20, device=DEVICE)
    chosen, ok = _core._first_distinct(deg, 5, 5, gen(0))
    assert abs(ok.double().mean().item() - 0.5814) < 0.03
    good = chosen[ok].cpu()
    assert bool((good[:, 1:] > good[:, :-1]).all()) and bool(((good >= 0) & (good < 20)).all())


def test_pair_test_catches_what_the_marginal_test_cannot():
    draws, degree, k = 4000, 12, 4
    window = cyclic_window(draws, degree, k)
    assert marginal_pvalue(window, degree) > P_MIN                 # marginally uniform ...
    assert pair_min_pvalue(window, degree) < P_MIN                 # ... but not jointly


@pytest.mark.parametrize("method", list(METHODS))
def test_every_subset_equally_likely(monkeypatch, method):
    """d = 6, k = 3: each of the 20 subsets has probability 1/20; the counts are exactly multinomial."""
    use_method(monkeypatch, method)
    draws, degree, k = num_draws(6000, method), 6, 3
    subsets = draw_subsets(draws, degree, k, seed=11)
    index = {c: i for i, c in enumerate(itertools.combinations(range(degree), k))}
    counts = torch.bincount(torch.tensor([index[tuple(row)] for row in subsets.tolist()]), minlength=len(index))
    assert stats.chisquare(counts.numpy()).pvalue > P_MIN
    biased = weighted_without_replacement(draws, degree, k)
    biased_counts = torch.bincount(torch.tensor([index[tuple(r)] for r in biased.tolist()]), minlength=len(index))
    assert stats.chisquare(biased_counts.numpy()).pvalue < P_MIN


@pytest.mark.slow
def test_large_hub_marginals(impl):
    """A hub of degree 2000, fanout 10 (the rejection method: its cost does not grow with the degree)."""
    draws, degree, k = num_draws(2000, impl), 2000, 10          # at 1000 draws, 5 expected a cell
    subsets = draw_subsets(draws, degree, k, seed=5)
    assert marginal_pvalue(subsets, degree) > P_MIN
    assert marginal_pvalue(first_k(draws, degree, k), degree) < P_MIN


def test_with_replacement_is_uniform(impl):
    draws, degree, k = num_draws(3000, impl), 7, 5      # k < d and k > d both draw k times
    for d in (degree, 3):
        picks = draw_subsets(draws, d, k, seed=d, replace=True)
        counts = torch.bincount(picks.flatten(), minlength=d)
        assert stats.chisquare(counts.numpy()).pvalue > P_MIN
        # repeats within a draw happen (they would not without replacement)
        assert bool((picks[:, 1:] == picks[:, :-1]).any())
        # the test rejects the first half of the row 1.3 times as likely, at as many picks
        weights = torch.ones(d)
        weights[: d // 2] = 1.3
        biased = torch.multinomial(weights, picks.numel(), replacement=True, generator=torch.Generator().manual_seed(d))
        assert stats.chisquare(torch.bincount(biased, minlength=d).numpy()).pvalue < P_MIN


# ---------------------------------------------------------------------------- models on a batch
def dense_sage_seeds(graph, e_id, x, layers, seeds):
    """Two mean-SAGE layers in float64 on the FULL graph keeping only the edges ``e_id`` (CSR positions)."""
    n = graph.num_nodes
    adj = torch.zeros(n, n, dtype=torch.float64)
    adj.index_put_((graph.row[e_id].cpu(), graph.col[e_id].cpu()), torch.ones(e_id.numel(), dtype=torch.float64),
                   accumulate=True)
    mean = adj / adj.sum(1, keepdim=True).clamp(min=1)
    h = x.cpu().double()
    for i, (w_l, b_l, w_r) in enumerate(layers):
        h = mean @ h @ w_l.T.double().cpu() + b_l.double().cpu() + h @ w_r.T.double().cpu()
        if i == 0:
            h = h.relu()
    return h[seeds]


def test_pyg_and_sparsegnn_sage_agree_on_a_batch():
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    ei, n = awkward_graph()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    x = torch.randn(n, 8, device=DEVICE)
    seeds = [0, 7, 12, 33, 58]
    batch = sample_neighbors(graph, seeds, [4, 3], generator=gen(3), x=x)
    ours = [sparsegnn.nn.SAGEConv(8, 16), sparsegnn.nn.SAGEConv(16, 4)]
    theirs = [pyg_nn.SAGEConv(8, 16), pyg_nn.SAGEConv(16, 4)]
    layers = []
    for a, b in zip(ours, theirs):
        b.lin_l.weight.data.copy_(a.lin_l.weight.data)
        b.lin_l.bias.data.copy_(a.lin_l.bias.data)
        b.lin_r.weight.data.copy_(a.lin_r.weight.data)
        a.to(DEVICE), b.to(DEVICE)
        layers.append((a.lin_l.weight.detach(), a.lin_l.bias.detach(), a.lin_r.weight.detach()))

    def run(convs, graph_arg):
        h = convs[0](batch.x, graph_arg).relu()
        return convs[1](h, graph_arg)[:batch.batch_size]

    out_ours = run(ours, batch.graph)
    out_ours_ei = run(ours, batch.edge_index)
    out_pyg = run(theirs, batch.edge_index)
    assert (out_ours - out_pyg).abs().max().item() < 1e-5
    assert (out_ours_ei - out_pyg).abs().max().item() < 1e-5
    oracle = dense_sage_seeds(graph, batch.e_id, x, layers, seeds)
    assert (out_ours.double().cpu() - oracle).abs().max().item() < 1e-5


@pytest.mark.parametrize("hops,layers", [(2, 2), (3, 3), (3, 2)])
def test_trimmed_layers_equal_untrimmed_on_the_seeds(hops, layers):
    """layer_graphs: seeds' outputs and every parameter gradient as the untrimmed model's (float64),
    and each layer's graph holds exactly the rows a later layer reads."""
    torch.manual_seed(0)
    ei, n = awkward_graph()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    x = torch.randn(n, 40, device=DEVICE, dtype=torch.float64)
    seeds = [0, 7, 12, 33, 58]
    batch = sample_neighbors(graph, seeds, [4, 3, 2][:hops], generator=gen(3), x=x)
    widths = [40, 24, 8, 3][:layers + 1]     # 40 -> 24: the first layer aggregates first when trimmed
    convs = [sparsegnn.nn.SAGEConv(a, b).to(DEVICE).double() for a, b in zip(widths, widths[1:])]
    graphs = sparsegnn.sampling.layer_graphs(batch, layers)
    assert len(graphs) == layers and graphs[-1].num_nodes == len(seeds)
    nodes, edges = batch.num_sampled_nodes, batch.num_sampled_edges
    for i, g in enumerate(graphs):
        kept = layers - i
        assert g.num_nodes == sum(nodes[:kept]) and g.num_src == sum(nodes[:kept + 1])
        assert g.num_edges == sum(edges[:kept]) and bool((g.col < g.num_src).all())
        assert torch.equal(g.row, batch.graph.row[:g.num_edges])
        want = sparsegnn.formats.csr.transpose_csr(g.rowptr, g.col, g.num_src)   # the sorting oracle
        for got, ref in zip(g.transpose_parts(), want):
            assert torch.equal(got, ref)
    assert sparsegnn.sampling.layer_graphs(batch, layers) is graphs          # cached

    def run(trim):
        h = batch.x
        for i, conv in enumerate(convs):
            h = conv((h[:graphs[i].num_src], h[:graphs[i].num_nodes]), graphs[i]) if trim else conv(h, batch.graph)
            h = h.relu() if i < layers - 1 else h
        out = h[:batch.batch_size]
        grads = torch.autograd.grad(out.square().sum(), [p for c in convs for p in c.parameters()])
        return out, grads

    full, full_grads = run(False)
    trimmed, trimmed_grads = run(True)
    assert (full - trimmed).abs().max().item() < 1e-10
    for a, b in zip(full_grads, trimmed_grads):
        assert (a - b).abs().max().item() < 1e-10
    with pytest.raises(ValueError, match="num_layers"):
        sparsegnn.sampling.layer_graphs(batch, hops + 1)


def test_sage_projects_first_only_where_cheaper():
    from sparsegnn.nn.sage import _project_first

    square = Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)
    assert _project_first(square, 64, 16) and not _project_first(square, 16, 64)
    # a trimmed first layer: 100k sources, 2k targets, 150k edges, 602 -> 256: aggregate first
    wide = Graph(torch.zeros(2001, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, 2000, num_src=100000)
    wide._num_edges = 150000
    assert not _project_first(wide, 602, 256)


# ---------------------------------------------------------------------------- without PyG
def test_without_torch_geometric(monkeypatch):
    ei, n = awkward_graph()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    x = torch.randn(n, 3, device=DEVICE)
    with_pyg = sample_neighbors(graph, [0, 2, 4], [3, 3], generator=gen(5), x=x)
    monkeypatch.setitem(sys.modules, "torch_geometric", None)
    batch = sample_neighbors(graph, [0, 2, 4], [3, 3], generator=gen(5), x=x)
    assert isinstance(batch, MiniBatch)
    check_structure(ei, n, batch, [0, 2, 4], [3, 3], graph=graph)
    for key in ("edge_index", "n_id", "e_id", "x", "input_id"):
        assert torch.equal(batch[key], with_pyg[key])
    for key in ("batch_size", "num_sampled_nodes", "num_sampled_edges", "num_nodes"):
        assert getattr(batch, key) == getattr(with_pyg, key)
    assert batch.num_edges == batch.edge_index.shape[1] and "graph" in batch
    moved = batch.to("cpu")
    assert isinstance(moved.graph, Graph) and moved.n_id.device.type == "cpu"
    loader = NeighborLoader(graph, [2], batch_size=16, x=x, shuffle=False)
    assert all(isinstance(b, MiniBatch) for b in loader)


# ---------------------------------------------------------------------------- the loader
def test_loader_visits_every_input_node_once():
    ei, n = awkward_graph()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    mask = torch.zeros(n, dtype=torch.bool, device=DEVICE)
    mask[::3] = True
    y = torch.arange(n, device=DEVICE)
    loader = NeighborLoader(graph, [3, 2], batch_size=7, input_nodes=mask, y=y, generator=gen(0))
    assert len(loader) == math.ceil(int(mask.sum()) / 7)
    seen = []
    for batch in loader:
        seeds = batch.n_id[:batch.batch_size]
        check_structure(ei, n, batch, seeds.tolist(), [3, 2], graph=graph)
        assert torch.equal(batch.input_id, seeds)                 # a mask: input_id are the node ids (PyG)
        assert torch.equal(batch.y[:batch.batch_size], seeds)
        seen += seeds.tolist()
    assert sorted(seen) == torch.nonzero(mask).squeeze(1).tolist()
    dropping = NeighborLoader(graph, [3, 2], batch_size=7, input_nodes=mask, drop_last=True)
    assert len(dropping) == int(mask.sum()) // 7 == len(list(dropping))
    assert all(b.batch_size == 7 for b in dropping)


def test_loader_index_input_and_determinism():
    ei, n = awkward_graph()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    index = torch.tensor([5, 1, 44, 20, 8], device=DEVICE)
    ordered = list(NeighborLoader(graph, [2], batch_size=2, input_nodes=index, shuffle=False))
    assert [b.n_id[:b.batch_size].tolist() for b in ordered] == [[5, 1], [44, 20], [8]]
    assert [b.input_id.tolist() for b in ordered] == [[0, 1], [2, 3], [4]]   # positions in input_nodes
    a = [b.n_id for b in NeighborLoader(graph, [4, 4], batch_size=3, generator=gen(9))]
    b = [b.n_id for b in NeighborLoader(graph, [4, 4], batch_size=3, generator=gen(9))]
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and len(a) == math.ceil(n / 3)


def test_loader_prefetch_gives_the_same_batches():
    ei, n = awkward_graph()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    x = torch.randn(n, 3, device=DEVICE)
    plain = list(NeighborLoader(graph, [3, 2], batch_size=8, x=x, generator=gen(21)))
    ahead = NeighborLoader(graph, [3, 2], batch_size=8, x=x, generator=gen(21), prefetch=2)
    fetched = list(ahead)
    assert len(fetched) == len(plain) == len(ahead)
    for a, b in zip(plain, fetched):
        for key in ("n_id", "e_id", "edge_index", "x", "input_id"):
            assert torch.equal(a[key], b[key])
        check_structure(ei, n, b, b.n_id[:b.batch_size].tolist(), [3, 2], graph=graph)
    # leaving early stops the producer; a failure in it reaches the loop
    for i, _ in enumerate(ahead):
        if i == 1:
            break
    import gc
    import threading
    gc.collect()
    assert not any(t.name == "sparsegnn-prefetch" and t.is_alive() for t in threading.enumerate())

    def failing(index, calls=[0]):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("boom")
        return NeighborLoader._batch(ahead, index)
    ahead._batch = failing
    with pytest.raises(RuntimeError, match="boom"):
        list(ahead)


def test_loader_from_pyg_data():
    data_mod = pytest.importorskip("torch_geometric.data")
    ei, n = awkward_graph()
    e = ei.shape[1]
    data = data_mod.Data(edge_index=ei, x=torch.randn(n, 4, device=DEVICE), y=torch.arange(n, device=DEVICE),
                         edge_attr=torch.randn(e, 2, device=DEVICE), edge_weight=torch.rand(e, device=DEVICE),
                         train_mask=torch.arange(n, device=DEVICE) % 2 == 0, name="awkward", num_nodes=n)
    loader = NeighborLoader(data, [3, 3], batch_size=10, input_nodes=data.train_mask, generator=gen(4))
    assert loader.graph.num_nodes == n and loader.graph.num_edges == e
    for batch in loader:
        seeds = batch.n_id[:batch.batch_size].tolist()
        check_structure(ei, n, batch, seeds, [3, 3], edge_order="input")     # e_id indexes data.edge_index
        assert torch.equal(batch.x, data.x[batch.n_id]) and torch.equal(batch.y, data.y[batch.n_id])
        assert torch.equal(batch.edge_attr, data.edge_attr[batch.e_id])
        assert torch.equal(batch.edge_weight, data.edge_weight[batch.e_id])
        assert torch.equal(batch.graph.edge_val, data.edge_weight[batch.e_id])
        assert torch.equal(batch.train_mask, data.train_mask[batch.n_id]) and batch.name == "awkward"


# ---------------------------------------------------------------------------- errors
def test_errors():
    ei, n = awkward_graph()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    bad_fanouts = [[], [-2], [1.5], "ab", [True], 3]
    for fanouts in bad_fanouts:
        with pytest.raises(ValueError, match=r"sample_neighbors\(\): fanouts"):
            sample_neighbors(graph, [0], fanouts)
        with pytest.raises(ValueError, match=r"NeighborLoader\(\): fanouts"):
            NeighborLoader(graph, fanouts)
    for seeds, what in [([], "empty"), ([0, n], "must lie in"), ([-1], "must lie in"), ([1, 2, 1], "distinct"),
                        (torch.zeros(2, 2, dtype=torch.long), "1-D"), (torch.tensor([0.5]), "integer")]:
        with pytest.raises(ValueError, match=what):
            sample_neighbors(graph, seeds, [2])
    with pytest.raises(ValueError, match="'x' has 3 rows"):
        sample_neighbors(graph, [0], [2], x=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="'w' has 3 rows"):
        NeighborLoader(graph, [2], node_attrs={"w": torch.zeros(3)})
    with pytest.raises(ValueError, match="square"):
        sample_neighbors(Graph.from_edge_index(torch.tensor([[0], [1]]), num_nodes=2, num_src=5), [0], [1])
    with pytest.raises(ValueError, match="edge_perm"):
        sample_neighbors(Graph.from_csr(graph.rowptr, graph.col), [0], [1], edge_order="input")
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        sample_neighbors(graph, [0], [1], generator=42)
    if DEVICE == "cuda":
        with pytest.raises(ValueError, match="generator is on cpu"):
            sample_neighbors(graph, [0], [1], generator=torch.Generator())
    with pytest.raises(ValueError, match="batch_size"):
        NeighborLoader(graph, [2], batch_size=0)
    with pytest.raises(ValueError, match="prefetch"):
        NeighborLoader(graph, [2], prefetch=-1)
    with pytest.raises(ValueError, match="mask has 3 entries"):
        NeighborLoader(graph, [2], input_nodes=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="selects no node"):
        NeighborLoader(graph, [2], input_nodes=torch.zeros(n, dtype=torch.bool))
    with pytest.raises(ValueError, match="more than once"):
        NeighborLoader(graph, [2], input_nodes=torch.tensor([1, 2, 1]))
    with pytest.raises(ValueError, match="must lie in"):
        NeighborLoader(graph, [2], input_nodes=torch.tensor([1, n]))
    with pytest.raises(ValueError, match="Graph or a torch_geometric Data"):
        NeighborLoader(ei, [2])
