"""Padded batches for captured steps: the padding's structure, volatile graphs that keep nothing
stale when refilled, BatchNorm over the real nodes, and padded training steps that train exactly
as unpadded eager ones (run eagerly here: CUDA graphs need a GPU, scripts/gpu_check.sh runs them there)."""
import copy

import pytest
import torch

import sparsegnn as sg
from sparsegnn import Graph
from sparsegnn.datasets.loader import GraphDataset, GraphLoader, collate
from sparsegnn.datasets.padding import MIN_PAD_NODES, PAD_GRAPH_NODES, BatchPadding, StaticBatch, pad_batch
from sparsegnn.datasets.tu import GraphSample
from sparsegnn.formats.csr import transpose_csr
from sparsegnn.graph_training import CapturedGraphSteps, graph_cross_entropy, masked_bce

from conftest import DEVICE, dense_adjacency


def samples(num=14, seed=0, weighted=False, dense=False, dtype=torch.float64):
    """Random directed graphs with self loops, duplicates, an edgeless and a one-node graph."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in range(num):
        n = [1, 4][g % 2] if g < 2 else int(torch.randint(3, 12, (1,), generator=gen))
        e = 0 if g == 1 else int(torch.randint(0, (8 if dense else 3) * n, (1,), generator=gen))
        ei = torch.randint(0, n, (2, e), generator=gen)
        if e >= 2:
            ei[:, 1] = ei[:, 0]
        w = torch.rand(e, generator=gen, dtype=dtype) + 0.5 if weighted else None
        out.append(GraphSample(Graph.from_edge_index(ei, w, num_nodes=n), torch.randn(n, 5, generator=gen, dtype=dtype),
                               g % 3))
    return out


def dataset(**kw):
    data = GraphDataset.from_samples(samples(**kw))
    y_mask = torch.rand(data.num_graphs, 3, generator=torch.Generator().manual_seed(1)) < 0.7
    y = (torch.rand(data.num_graphs, 3, generator=torch.Generator().manual_seed(2)) < 0.5).to(data.x.dtype)
    return data, GraphDataset(data.graph, data.x, y, y_mask, name="multi")


# ---------------------------------------------------------------------------- structure
@pytest.mark.parametrize("weighted", [False, True])
def test_padded_batch_is_the_batch_plus_a_separate_padding_block(weighted):
    data, multi = dataset(weighted=weighted)
    padding = BatchPadding(6, node_multiple=32, edge_multiple=32)
    batch = collate(multi, torch.tensor([4, 1, 0, 9, 7]))               # 5 graphs: one slot stays empty
    padded = pad_batch(batch, padding)
    g, pg = batch.graph, padded.graph
    n, e, big_n, big_e = g.num_nodes, g.num_edges, pg.num_nodes, pg.num_edges
    assert big_n % 32 == 0 and big_e % 32 == 0 and big_n - n >= MIN_PAD_NODES and big_e >= e
    assert pg.volatile and pg.transient and padded.x.shape == (big_n, 5)
    dense = pg.to_dense(torch.float64)
    assert torch.equal(dense[:n, :n], g.to_dense(torch.float64))        # the real block, unchanged
    assert not dense[:n, n:].any() and not dense[n:, :n].any()          # nothing joins padding and real nodes
    row, col = pg.row, pg.col
    assert torch.equal(row[e:], col[e:]) and bool((col[e:] >= n).all())  # padding edges: loops on padding nodes
    assert int(pg.in_degree()[n:].max()) <= -(-(big_e - e) // (big_n - n))  # spread evenly
    if weighted:
        assert not pg.edge_val[e:].any()
    # slots: the 5 graphs, one empty slot, then padding graphs of <= 16 nodes covering the padding
    ptr = pg.ptr
    assert ptr.numel() == padding.slots + 1 and torch.equal(ptr[:6], g.ptr) and int(ptr[6]) == n
    sizes = ptr.diff()[6:]
    assert int(sizes.sum()) == big_n - n and int(sizes.max()) <= PAD_GRAPH_NODES
    assert torch.equal(padded.batch, torch.repeat_interleave(torch.arange(padding.slots), ptr.diff()))
    assert padded.node_weight.tolist() == [1.0] * n + [0.0] * (big_n - n)
    assert padded.graph_weight.tolist() == [1.0] * 5 + [0.0] * (padding.slots - 5)
    assert not padded.y_mask[5:].any() and torch.equal(padded.y[:5], batch.y) and padded.index[5:].eq(-1).all()
    assert not padded.x[n:].any() and torch.equal(padded.x[:n], batch.x)
    # the derived forms the owner supplies are the graph's own
    for got, want in zip(pg.transpose_parts(), transpose_csr(pg.rowptr, pg.col, big_n)):
        assert torch.equal(got, want)
    assert torch.equal(pg.in_degree(), pg.rowptr.diff())
    t = pg.t()
    assert torch.equal(t.to_dense(torch.float64), dense.t())
    stats = pg.batch_stats()
    assert stats[2] and stats[0] >= int(g.ptr.diff().max()) and stats[0] >= PAD_GRAPH_NODES


def test_shape_errors():
    _, multi = dataset()
    padding = BatchPadding(3, 32, 32)
    with pytest.raises(ValueError, match=r"BatchPadding.shape_of\(\): the batch holds 4 graphs"):
        padding.shape_of(collate(multi, torch.arange(4)))
    with pytest.raises(ValueError, match=r"BatchPadding\(\): node_multiple"):
        BatchPadding(3, 8, 32)
    small = collate(multi, torch.tensor([0, 1]))
    static = StaticBatch(padding.shape_of(small), small, padding.pad_graphs)
    with pytest.raises(ValueError, match=r"PaddedGraph.fill\(\): a graph of \d+ nodes"):
        static.fill(collate(multi, torch.tensor([2, 3, 4])))
    padded = pad_batch(small, padding)
    with pytest.raises(ValueError, match="padded already"):
        padding.shape_of(padded)


def test_size_classes_follow_the_batched_kernels():
    from sparsegnn.datasets.padding import BATCHED_LIMIT, LARGE_CLASS, _size_class
    from sparsegnn.ops._triton import BATCHED_MAX_NODES

    assert BATCHED_LIMIT == BATCHED_MAX_NODES
    assert [_size_class(n) for n in (1, 16, 17, 100, 128, 129, 5000)] == [16, 16, 32, 128, 128, LARGE_CLASS, LARGE_CLASS]
    assert LARGE_CLASS > BATCHED_MAX_NODES                  # the dispatcher sends that class to the row kernels


def test_for_dataset_picks_power_of_two_multiples():
    _, multi = dataset()
    p = BatchPadding.for_dataset(multi, 50)
    mean_nodes = multi.graph.num_nodes * 50 / multi.num_graphs
    assert p.node_multiple & (p.node_multiple - 1) == 0 and mean_nodes / 16 <= p.node_multiple <= max(32, mean_nodes / 4)
    assert p.slots == 50 + p.pad_graphs


# ---------------------------------------------------------------------------- volatile graphs
def test_volatile_graph_keeps_only_what_its_owner_supplied():
    g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), None, 2, volatile=True)
    assert g.transient
    first = g.row
    g.col.copy_(torch.tensor([0, 1]))
    g.rowptr.copy_(torch.tensor([0, 0, 2]))
    assert g.row.tolist() == [1, 1] and first.tolist() == [0, 1]         # built again, from the new contents
    g.cache.put("signature", "s")                                         # what an op stores is dropped
    assert "signature" not in g.cache
    supplied = torch.tensor([7, 7])
    g.set_derived("row", supplied)
    assert g.row is supplied
    with pytest.raises(ValueError, match=r"Graph.set_derived\(\): key"):
        g.set_derived("plan", 1)


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_refilled_static_batch_aggregates_the_new_batch(backend, dense, weighted):
    """Forward and backward of spmm on a StaticBatch refilled with a second batch equal those of
    that batch alone: nothing derived from the first one (transposes, permuted values, dense
    tiles of the batched kernels) survives the refill."""
    if backend == "cpu":
        pytest.importorskip("numba")
    device = DEVICE if backend == "triton" else "cpu"        # Triton: CUDA, or the interpreter on the CPU
    data = GraphDataset.from_samples(samples(weighted=weighted, dense=dense, dtype=torch.float32)).to(device)
    padding = BatchPadding(5, 32, 64)
    first, second = collate(data, torch.tensor([2, 3, 4, 5, 6])), collate(data, torch.tensor([9, 0, 12, 1]))
    shape = tuple(max(a, b) for a, b in zip(padding.shape_of(first), padding.shape_of(second)))
    static = StaticBatch(shape, first, padding.pad_graphs)
    for batch in (first, second):
        padded = static.fill(batch)
        x = torch.randn(padded.graph.num_nodes, 6, device=device, requires_grad=True)
        out = sg.spmm(padded.graph, x, backend=backend)            # the graph's own values (or none)
        n = batch.graph.num_nodes
        grad = torch.autograd.grad(out[:n].sum(), x)[0]
        out, grad, x = out.cpu(), grad.cpu(), x.detach().cpu()
        a = dense_adjacency(torch.stack([batch.graph.col, batch.graph.row]).cpu(), n, batch.graph.edge_val)
        torch.testing.assert_close(out[:n].double(), a @ x[:n].detach().double(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad[:n].double(), a.t() @ torch.ones(n, 6, dtype=torch.float64),
                                   rtol=1e-5, atol=1e-5)
        assert not grad[n:].any()


# ---------------------------------------------------------------------------- BatchNorm
@pytest.mark.parametrize("momentum", [0.1, None])
def test_padded_batch_norm_equals_batch_norm_of_the_real_rows(momentum):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(23, 4, generator=gen, dtype=torch.float64) * 3 + 1
    n = 17
    weight = torch.tensor([1.0] * n + [0.0] * (23 - n), dtype=torch.float64)
    ours = sg.nn.PaddedBatchNorm1d(4, momentum=momentum).double()
    ref = torch.nn.BatchNorm1d(4, momentum=momentum).double()
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-1, 1)
    ref.load_state_dict(ours.state_dict())
    for step in range(3):
        xo, xr = x.clone().requires_grad_(), x[:n].clone().requires_grad_()
        with sg.nn.padded_nodes(weight):
            out = ours(xo)
        expected = ref(xr)
        torch.testing.assert_close(out[:n], expected)
        assert torch.isfinite(out).all()
        g = torch.randn(n, 4, generator=gen, dtype=torch.float64)
        (out[:n] * g).sum().backward()
        (expected * g).sum().backward()
        torch.testing.assert_close(xo.grad[:n], xr.grad)
        torch.testing.assert_close(ours.weight.grad, ref.weight.grad)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(ours, name), getattr(ref, name))
        x = x * 0.9 + step
    ours.eval()
    ref.eval()
    with sg.nn.padded_nodes(weight):
        torch.testing.assert_close(ours(x)[:n], ref(x[:n]))
    torch.testing.assert_close(ours(x), ref(x))                        # outside the context: BatchNorm1d


# ---------------------------------------------------------------------------- padded training steps
def _models(name, data, num_out):
    torch.manual_seed(0)
    if name == "chemgcn":
        model = sg.nn.ChemGCN(data.num_features, num_out, hidden=8, head=8, dropout=0.0, normalize=False)
    else:
        model = sg.nn.GINClassifier(data.num_features, num_out, hidden=8, num_layers=3, dropout=0.0)
    model = model.double()
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("name", ["chemgcn", "gin"])
def test_padded_steps_train_exactly_like_eager_steps(name):
    data, multi = dataset(dtype=torch.float64)
    if name == "chemgcn":
        data = multi.gcn_normalized()
        loss_fn = lambda logits, batch: masked_bce(logits, batch.y, batch.y_mask)  # noqa: E731
        num_out = 3
    else:
        loss_fn, num_out = graph_cross_entropy, 3
    eager, padded = _models(name, data, num_out)
    opt_e = torch.optim.Adam(eager.parameters(), lr=0.05)
    opt_p = torch.optim.Adam(padded.parameters(), lr=0.05)
    steps = CapturedGraphSteps(padded, opt_p, loss_fn, BatchPadding.for_dataset(data, 4), capture=False)
    eager.train()
    padded.train()
    loader = GraphLoader(data, 4, shuffle=True, generator=torch.Generator().manual_seed(0))   # 14 graphs: 4,4,4,2
    for _ in range(2):
        for batch in loader:
            opt_e.zero_grad()
            loss_e = loss_fn(eager(batch.x, batch.graph), batch)
            loss_e.backward()
            opt_e.step()
            loss_p = steps(batch)
            torch.testing.assert_close(loss_p, loss_e.detach(), rtol=1e-9, atol=1e-12)
    assert sum(steps.shapes.values()) == 8 and len(steps.shapes) >= 1
    for (key, a), b in zip(eager.state_dict().items(), padded.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)   # a bias before BatchNorm: ~1e-17 gradients, Adam noise


def test_capture_needs_cuda():
    from sparsegnn.graph_training import _use_capture

    assert _use_capture(None, "cpu") is False
    assert _use_capture(None, "cuda", "reference") is False and _use_capture(None, "cuda") is True
    with pytest.raises(ValueError, match=r"train\(\): capture=True needs a CUDA device"):
        _use_capture(True, "cpu")


# ---------------------------------------------------------------------------- sampled mini-batches
@pytest.mark.parametrize("model_name", ["sage", "gcn"])
def test_padded_minibatch_steps_train_exactly_like_eager_steps(model_name):
    from sparsegnn.sampling import MiniBatchPadding, NeighborLoader, minibatch_loss
    from sparsegnn.training import _uncache, build_model

    data = sg.datasets.load("cora")
    torch.manual_seed(0)
    eager = _uncache(build_model(model_name, data.x.shape[1], data.num_classes, 16, 0.0, "auto")).double()
    padded = copy.deepcopy(eager)
    opt_e, opt_p = (torch.optim.Adam(m.parameters(), lr=0.01) for m in (eager, padded))
    padding = MiniBatchPadding(node_multiple=64, edge_multiple=256)
    steps = CapturedGraphSteps(padded, opt_p, minibatch_loss, padding, capture=False)
    loader = NeighborLoader(data.graph, [5, 3], batch_size=50, input_nodes=data.train_mask, x=data.x.double(), y=data.y,
                            generator=torch.Generator().manual_seed(0))
    for batch in loader:                                  # 140 seeds: 50, 50, 40
        loss_e = minibatch_loss(eager(batch.x, batch.graph), batch)
        opt_e.zero_grad()
        loss_e.backward()
        opt_e.step()
        torch.testing.assert_close(steps(batch), loss_e.detach(), rtol=1e-9, atol=1e-12)
    assert sum(steps.shapes.values()) == 3 and all(shape[2] in (50, 40) for shape in steps.shapes)
    for (key, a), b in zip(eager.state_dict().items(), padded.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=key)


class _LayerwiseSage(torch.nn.Module):
    """Two SAGE layers on one graph, or (trimmed) on one graph per layer."""

    def __init__(self, f_in, hidden, classes):
        super().__init__()
        self.convs = torch.nn.ModuleList([sg.nn.SAGEConv(f_in, hidden), sg.nn.SAGEConv(hidden, classes)])

    def forward(self, x, graph):
        for i, conv in enumerate(self.convs):
            g = graph[i] if isinstance(graph, list) else graph
            x = conv((x[:g.num_src], x[:g.num_nodes]), g) if isinstance(graph, list) else conv(x, g)
            x = x.relu() if i == 0 else x
        return x


@pytest.mark.parametrize("weighted", [False, True])
def test_trimmed_padded_minibatch_steps_train_exactly_like_untrimmed_eager_steps(weighted):
    """TrimmedMiniBatchPadding: each layer's padded bipartite graph; the seeds' loss, and so the
    trained weights, equal the untrimmed eager model's (float64)."""
    from sparsegnn.sampling import NeighborLoader, TrimmedMiniBatchPadding, layer_graphs, minibatch_loss

    data = sg.datasets.load("cora")
    graph = data.graph.with_values(torch.rand(data.graph.num_edges, dtype=torch.float64)) if weighted else data.graph
    torch.manual_seed(0)
    eager = _LayerwiseSage(data.x.shape[1], 16, data.num_classes).double()
    padded = copy.deepcopy(eager)
    opt_e, opt_p = (torch.optim.Adam(m.parameters(), lr=0.01) for m in (eager, padded))
    padding = TrimmedMiniBatchPadding()
    steps = CapturedGraphSteps(padded, opt_p, minibatch_loss, padding, capture=False)
    loader = NeighborLoader(graph, [5, 3], batch_size=50, input_nodes=data.train_mask, x=data.x.double(), y=data.y,
                            generator=torch.Generator().manual_seed(0))
    for batch in loader:                                  # 140 seeds: 50, 50, 40
        loss_e = minibatch_loss(eager(batch.x, batch.graph), batch)
        opt_e.zero_grad()
        loss_e.backward()
        opt_e.step()
        trimmed = minibatch_loss(padded(batch.x, layer_graphs(batch)), batch)     # unpadded trimmed: same loss
        torch.testing.assert_close(trimmed, loss_e.detach(), rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(steps(batch), loss_e.detach(), rtol=1e-9, atol=1e-12)
    assert sum(steps.shapes.values()) == 3
    for shape in steps.shapes:                             # (T_pad per layer, E_pad per layer, N_pad, seeds)
        targets, edges, nodes, seeds = shape
        assert len(targets) == len(edges) == 2 and targets[1] < nodes and seeds in (50, 40)
    for (key, a), b in zip(eager.state_dict().items(), padded.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=key)


@pytest.mark.parametrize("model_name", ["sage", "gin"])
def test_train_minibatch_trimmed_equals_untrimmed(model_name):
    """train_minibatch(trim=True): per-layer graphs, the same losses (the aggregation order of the
    first layer differs: aggregate-first vs project-first, so float32 rounding only)."""
    from sparsegnn.training import train_minibatch

    data = sg.datasets.load("cora")
    runs = [train_minibatch(data, model_name, fanouts=(5, 3), batch_size=64, epochs=2, hidden=16, dropout=0.0,
                            num_layers=2, progress=False, trim=trim) for trim in (False, True)]
    torch.testing.assert_close(torch.tensor(runs[1].losses), torch.tensor(runs[0].losses), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="trim=True needs"):
        train_minibatch(data, "sage", fanouts=(5,), epochs=1, num_layers=2, progress=False, trim=True)


def test_padded_batch_norm_zeroes_padding_rows_and_survives_no_real_nodes():
    bn = sg.nn.PaddedBatchNorm1d(3)
    x = torch.randn(6, 3) * 1e6                                       # padding rows of any size
    w = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    with sg.nn.padded_nodes(w):
        out = bn(x)
    assert torch.isfinite(out).all() and not out[w == 0].any()
    stats = (bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked))
    with sg.nn.padded_nodes(torch.zeros(6)):                          # a batch of empty graphs only
        out = bn(x)
    assert torch.isfinite(out).all() and not out.any()
    assert torch.equal(bn.running_mean, stats[0]) and torch.equal(bn.running_var, stats[1])
    assert int(bn.num_batches_tracked) == stats[2]


def test_molecule_loss_without_a_mask_ignores_padding_slots():
    from sparsegnn.graph_training import _molecule_loss

    data, _ = dataset()
    y = (torch.rand(data.num_graphs, 2, generator=torch.Generator().manual_seed(3)) < 0.5).double()
    unmasked = GraphDataset(data.graph, data.x, y, None, name="nomask")
    batch = collate(unmasked, torch.tensor([0, 3, 5]))
    padded = pad_batch(batch, BatchPadding(5, 32, 32))
    logits = torch.randn(padded.y.shape[0], 2, dtype=torch.float64)
    torch.testing.assert_close(_molecule_loss(logits, padded), _molecule_loss(logits[:3], batch))


def test_padding_rows_stay_bounded_through_deep_gin():
    """Padding nodes carry up to q / p self loops (~175 each here); under a sum aggregation they
    would grow ~175x per layer (overflow, then NaN losses) without the BatchNorm's zeroing."""
    data, _ = dataset(dtype=torch.float32)
    torch.manual_seed(0)
    model = sg.nn.GINClassifier(data.num_features, 3, hidden=8, num_layers=12, dropout=0.0)
    batch = collate(data, torch.tensor([0, 1, 2, 3]))
    padded = pad_batch(batch, BatchPadding(4, 16, 4096))
    n, x = batch.graph.num_nodes, padded.x
    with sg.nn.padded_nodes(padded.node_weight):
        for conv, norm in zip(model.convs, model.norms):
            x = torch.relu(norm(conv(x, padded.graph)))
            assert float(x[n:].abs().max()) <= 100.0
        out = model(padded.x, padded.graph)
    torch.testing.assert_close(graph_cross_entropy(out, padded), graph_cross_entropy(model(batch.x, batch.graph), batch),
                               rtol=1e-4, atol=1e-5)
