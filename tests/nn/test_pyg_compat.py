"""sparsegnn.nn as a drop-in for torch_geometric.nn: every layer against PyG 2.8's on the CPU.

For each layer and each option / input form, the PyG layer and ours get the same weights
(a strict ``load_state_dict`` from PyG's into ours, or the reverse), the same inputs (cloned
leaves), and must give the same output (fp32, 1e-5 relative), the same attention weights, and
the same gradients (1e-4) with respect to the node features, edge weights / features and every
parameter.  The graphs have isolated nodes, self loops and duplicate edges.  PyG is the oracle:
nothing here is compared with numbers sparsegnn produced itself.
"""
from typing import Dict

import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric import EdgeIndex

from sparsegnn import Graph
from sparsegnn import nn as sgnn

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

OUT_RTOL, OUT_ATOL = 1e-5, 1e-6
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5
EDGE_DIM = 3


def _square():
    """12 nodes: nodes 10, 11 isolated, 9 without incoming edges; loops on 1, 4, 7; duplicates."""
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 10, (40,), generator=gen), torch.randint(0, 9, (40,), generator=gen)
    keep = src != dst
    ei = torch.stack([src[keep], dst[keep]])
    loops = torch.tensor([[1, 4, 7], [1, 4, 7]])
    ei = torch.cat([ei, loops, ei[:, :5]], dim=1)               # + 3 loops, + 5 duplicate edges
    ei = ei[:, torch.randperm(ei.shape[1], generator=gen)]
    return dict(m=12, n=12, ei=ei, w=torch.rand(ei.shape[1], generator=gen) + 0.5,
                ea=torch.randn(ei.shape[1], EDGE_DIM, generator=gen), x=torch.randn(12, 5, generator=gen),
                xb=torch.randn(3, 12, 5, generator=gen))


def _bipartite():
    """10 sources (8, 9 send nothing), 7 targets (5, 6 receive nothing); edges i -> i (PyG's loops
    remove those); duplicates."""
    gen = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, 8, (30,), generator=gen), torch.randint(0, 5, (30,), generator=gen)
    ei = torch.cat([torch.stack([src, dst]), torch.tensor([[2, 3], [2, 3]])], dim=1)
    ei = torch.cat([ei, ei[:, :4]], dim=1)
    return dict(m=10, n=7, ei=ei, w=torch.rand(ei.shape[1], generator=gen) + 0.5,
                ea=torch.randn(ei.shape[1], EDGE_DIM, generator=gen), x_src=torch.randn(10, 6, generator=gen),
                x_dst=torch.randn(7, 5, generator=gen))


SQ, BI = _square(), _bipartite()


# ---------------------------------------------------------------- building both layers
def _mlp(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(width, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))


def _make(lib, name: str, kwargs: dict, width: int):
    cls = getattr(lib, name)
    if name in ("GINConv", "GINEConv"):       # ``in_channels`` only sets the test's feature widths
        return cls(_mlp(width), **{k: v for k, v in kwargs.items() if k != "in_channels"})
    return cls(**kwargs)


def _graph_arg(form: str, data: dict, weighted: bool, attr_width: int):
    """``(pyg_arg, ours_arg, weight, attr, to_ours)``: the graph in ``form`` for each library,
    the caller-order edge weight and features (``None`` where the form carries none), and how
    ours gets per-edge tensors from the caller's (a Graph takes them in CSR order)."""
    ei, m, n = data["ei"], data["m"], data["n"]
    attr = torch.randn(ei.shape[1], attr_width, generator=torch.Generator().manual_seed(7))
    weight = data["w"] if weighted else None
    same = lambda t: t  # noqa: E731
    if form == "edge_index":
        return ei, ei, weight, attr, same
    if form == "EdgeIndex":
        return EdgeIndex(ei, sparse_size=(m, n)), EdgeIndex(ei, sparse_size=(m, n)), weight, attr, same
    if form in ("coo", "csr"):
        values = data["w"] if weighted else torch.ones(ei.shape[1])
        adj = torch.sparse_coo_tensor(ei.flip(0), values, (n, m)).coalesce()   # duplicates merge
        if form == "csr":
            adj = adj.to_sparse_csr()
        attr = torch.randn(adj._nnz(), attr_width, generator=torch.Generator().manual_seed(8))
        return adj, adj, None, attr, same
    if form == "graph":
        graph = Graph.from_edge_index(ei, None, n, num_src=None if m == n else m)
        if weighted:                         # our Graph carries the weights, in CSR order
            return ei, ("graph", graph), weight, attr, graph.to_graph_order
        return ei, graph, None, attr, graph.to_graph_order
    raise AssertionError(form)


def _leaf(t):
    return None if t is None else t.clone().requires_grad_(True)


def _close(got, want, rtol, atol, what):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def _dense_attention(edge_index_or_graph, alpha, n, m):
    """Attention weights as a dense [N, M, H] sum (forms with different edge orders compare equal)."""
    if isinstance(edge_index_or_graph, Graph):
        row, col = edge_index_or_graph.row, edge_index_or_graph.col
    elif isinstance(edge_index_or_graph, torch.Tensor) and edge_index_or_graph.layout != torch.strided:
        coo = edge_index_or_graph.to_sparse_coo().coalesce()
        row, col = coo.indices()
    else:
        ei = edge_index_or_graph.as_tensor() if isinstance(edge_index_or_graph, EdgeIndex) else edge_index_or_graph
        col, row = ei[0], ei[1]
    alpha = alpha.reshape(alpha.shape[0], -1)
    return torch.zeros(n, m, alpha.shape[1]).index_put_((row, col), alpha.detach(), accumulate=True)


def run_case(name: str, kwargs: dict, form: str = "edge_index", pair: str = "", size: bool = False,
             batched: bool = False, weighted: bool = False, attr: bool = False, attention: bool = False,
             train: bool = False, reverse: bool = False, lazy: bool = False, calls: int = 1) -> None:
    """Build PyG's ``name(**kwargs)`` and ours, share the weights, compare outputs and gradients.

    ``pair``: "" (one feature tensor), "pair" (``(x_src, x_dst)``) or "none" (``(x_src, None)``).
    """
    data = BI if pair else SQ
    if pair:
        widths = kwargs["in_channels"] if isinstance(kwargs.get("in_channels"), tuple) else (5, 5)
        widths = tuple(5 if w == -1 else w for w in widths)
        x_src, x_dst = data["x_src"][:, :widths[0]], data["x_dst"][:, :widths[1]]
    else:
        x_src = SQ["xb"] if batched else SQ["x"]
        if batched and kwargs.get("node_dim") == 0:             # nodes first: [N, B, F]
            x_src = x_src.transpose(0, 1).contiguous()
        x_dst, widths = None, (5, 5)
    width = widths[0]
    attr_width = EDGE_DIM if kwargs.get("edge_dim") else width
    pyg_graph, ours_graph, weight, edge_attr, to_ours = _graph_arg(form, data, weighted, attr_width)
    torch.manual_seed(0)
    theirs = _make(pyg, name, kwargs, width)
    ours = _make(sgnn, name, kwargs, width)
    leaves: Dict[str, Dict[str, torch.Tensor]] = {}
    for side in ("pyg", "ours"):
        leaves[side] = {"x_src": _leaf(x_src), "x_dst": _leaf(x_dst) if pair == "pair" else None,
                        "weight": _leaf(weight), "attr": _leaf(edge_attr) if attr else None}

    def call(layer, side):
        leaf = leaves[side]
        x = (leaf["x_src"], leaf["x_dst"]) if pair else leaf["x_src"]
        graph, kw = (pyg_graph if side == "pyg" else ours_graph), {}
        if isinstance(graph, tuple):                            # our weighted Graph: values from the leaf
            g = graph[1]
            graph = g.with_values(to_ours(leaf["weight"]))
        elif leaf["weight"] is not None:
            kw["edge_weight"] = leaf["weight"]
        if leaf["attr"] is not None:
            kw["edge_attr"] = leaf["attr"] if side == "pyg" else to_ours(leaf["attr"])
        if size:
            kw["size"] = (data["m"], data["n"])
        if attention:
            kw["return_attention_weights"] = True
        if train:
            torch.manual_seed(123)              # same dropout mask (the unfused path draws PyG's)
        return layer(x, graph, **kw)

    if lazy:                                    # materialise the lazy source, then load strictly
        src, dst = (ours, theirs) if reverse else (theirs, ours)
        call(src, "ours" if reverse else "pyg")
        dst.load_state_dict(src.state_dict(), strict=True)
    elif reverse:
        theirs.load_state_dict(ours.state_dict(), strict=True)
    else:
        ours.load_state_dict(theirs.state_dict(), strict=True)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    for layer in (ours, theirs):
        layer.train(train)
    for _ in range(calls):
        outs = {side: call(layer, side) for side, layer in (("pyg", theirs), ("ours", ours))}
    got, want = outs["ours"], outs["pyg"]
    if attention:
        got, (got_graph, got_alpha) = got
        want, (want_graph, want_alpha) = want
        n, m = data["n"], data["m"]
        _close(_dense_attention(got_graph, got_alpha, n, m), _dense_attention(want_graph, want_alpha, n, m),
               OUT_RTOL, OUT_ATOL, "attention (dense)")
        if form in ("edge_index", "EdgeIndex"):           # same edges, same order
            as_plain = lambda t: t.as_tensor() if isinstance(t, EdgeIndex) else t  # noqa: E731
            assert type(got_graph) is type(want_graph)
            assert torch.equal(as_plain(got_graph), as_plain(want_graph))
            _close(got_alpha, want_alpha, OUT_RTOL, OUT_ATOL, "attention")
        if form in ("coo", "csr"):
            assert got_graph.layout == want_graph.layout
            _close(got_graph.to_dense(), want_graph.to_dense(), OUT_RTOL, OUT_ATOL, "attention adj_t")
    _close(got, want, OUT_RTOL, OUT_ATOL, "output")
    probe = torch.randn(want.shape, generator=torch.Generator().manual_seed(3))
    for out in (want, got):
        (out * probe).sum().backward()
    for key in ("x_src", "x_dst", "weight", "attr"):
        if leaves["pyg"][key] is not None:
            _close(leaves["ours"][key].grad, leaves["pyg"][key].grad, GRAD_RTOL, GRAD_ATOL, f"grad {key}")
    theirs_params = dict(theirs.named_parameters())
    for pname, param in ours.named_parameters():
        assert param.grad is not None or theirs_params[pname].grad is None, pname
        if param.grad is not None:
            _close(param.grad, theirs_params[pname].grad, GRAD_RTOL, GRAD_ATOL, f"grad {pname}")


# ---------------------------------------------------------------- cases
def _cases():
    cases = []

    def add(case_id, name, kwargs, **opts):
        cases.append(pytest.param(name, kwargs, opts, id=f"{name}-{case_id}"))

    # GCNConv
    add("default-weighted", "GCNConv", dict(in_channels=5, out_channels=4), weighted=True)
    add("reverse", "GCNConv", dict(in_channels=5, out_channels=7), weighted=True, reverse=True)
    add("improved-weighted", "GCNConv", dict(in_channels=5, out_channels=4, improved=True), weighted=True)
    add("improved-unweighted", "GCNConv", dict(in_channels=5, out_channels=4, improved=True))
    add("no-self-loops", "GCNConv", dict(in_channels=5, out_channels=4, add_self_loops=False), weighted=True)
    add("no-normalize", "GCNConv", dict(in_channels=5, out_channels=4, normalize=False), weighted=True)
    add("no-bias-wide", "GCNConv", dict(in_channels=5, out_channels=7, bias=False))
    add("cached", "GCNConv", dict(in_channels=5, out_channels=4, cached=True), calls=2)
    for aggr in ("mean", "max", "min"):
        add(f"aggr-{aggr}", "GCNConv", dict(in_channels=5, out_channels=4, aggr=aggr), weighted=True)
    for form in ("EdgeIndex", "coo", "csr", "graph"):
        add(f"{form}", "GCNConv", dict(in_channels=5, out_channels=4, improved=True), form=form, weighted=True)
    add("coo-no-normalize", "GCNConv", dict(in_channels=5, out_channels=4, normalize=False), form="coo",
        weighted=True)
    add("batched", "GCNConv", dict(in_channels=5, out_channels=4), batched=True, weighted=True)
    add("batched-wide", "GCNConv", dict(in_channels=5, out_channels=7), batched=True)
    add("batched-node-dim-0", "GCNConv", dict(in_channels=5, out_channels=4, normalize=False, node_dim=0),
        batched=True)
    add("lazy", "GCNConv", dict(in_channels=-1, out_channels=4), lazy=True, weighted=True)
    add("lazy-reverse", "GCNConv", dict(in_channels=-1, out_channels=4), lazy=True, reverse=True)
    # SAGEConv
    add("default", "SAGEConv", dict(in_channels=5, out_channels=4))
    add("reverse-wide", "SAGEConv", dict(in_channels=5, out_channels=7), reverse=True)
    for aggr in ("sum", "add", "max", "min"):
        add(f"aggr-{aggr}", "SAGEConv", dict(in_channels=5, out_channels=4, aggr=aggr))
    add("normalize-no-root", "SAGEConv", dict(in_channels=5, out_channels=4, normalize=True, root_weight=False))
    add("project-no-bias", "SAGEConv", dict(in_channels=5, out_channels=4, project=True, bias=False))
    add("bipartite", "SAGEConv", dict(in_channels=(6, 5), out_channels=4), pair="pair")
    add("bipartite-size", "SAGEConv", dict(in_channels=(6, 5), out_channels=4, aggr="max", project=True),
        pair="pair", size=True)
    add("bipartite-no-dst", "SAGEConv", dict(in_channels=(6, 5), out_channels=4), pair="none", size=True)
    for form in ("EdgeIndex", "coo", "csr", "graph"):
        add(f"{form}", "SAGEConv", dict(in_channels=5, out_channels=4), form=form, weighted=form in ("coo", "csr"))
        add(f"{form}-bipartite", "SAGEConv", dict(in_channels=(6, 5), out_channels=4, aggr="sum"), form=form,
            pair="pair", weighted=form in ("coo", "csr"))
    add("batched", "SAGEConv", dict(in_channels=5, out_channels=4, project=True), batched=True)
    add("batched-node-dim-0", "SAGEConv", dict(in_channels=5, out_channels=4, node_dim=0), batched=True)
    add("lazy", "SAGEConv", dict(in_channels=-1, out_channels=4), lazy=True)
    add("lazy-bipartite", "SAGEConv", dict(in_channels=(-1, -1), out_channels=4), pair="pair", lazy=True,
        reverse=True)
    # GINConv
    add("default", "GINConv", dict(eps=0.3))
    add("train-eps-reverse", "GINConv", dict(eps=0.3, train_eps=True), reverse=True)
    for aggr in ("mean", "max"):
        add(f"aggr-{aggr}", "GINConv", dict(train_eps=True, aggr=aggr))
    add("bipartite", "GINConv", dict(in_channels=(5, 5), train_eps=True), pair="pair")
    add("bipartite-no-dst", "GINConv", dict(in_channels=(5, 5)), pair="none", size=True)
    for form in ("EdgeIndex", "coo", "csr", "graph"):
        add(f"{form}", "GINConv", dict(train_eps=True), form=form, weighted=form in ("coo", "csr"))
    add("coo-bipartite", "GINConv", dict(in_channels=(5, 5)), form="coo", pair="pair", weighted=True)
    add("batched", "GINConv", dict(train_eps=True), batched=True)
    # GINEConv
    add("edge-dim", "GINEConv", dict(train_eps=True, edge_dim=EDGE_DIM), attr=True)
    add("same-width-reverse", "GINEConv", dict(eps=0.2), attr=True, reverse=True)
    add("aggr-max", "GINEConv", dict(edge_dim=EDGE_DIM, aggr="max"), attr=True)
    add("bipartite", "GINEConv", dict(in_channels=(5, 5), edge_dim=EDGE_DIM), pair="pair", attr=True)
    for form in ("EdgeIndex", "coo", "csr", "graph"):
        add(f"{form}", "GINEConv", dict(edge_dim=EDGE_DIM, train_eps=True), form=form, attr=True)
    add("batched", "GINEConv", dict(edge_dim=EDGE_DIM), batched=True, attr=True)
    # GATConv
    gat = dict(in_channels=5, out_channels=4, heads=2)
    add("default", "GATConv", gat)
    add("reverse", "GATConv", gat, reverse=True)
    add("mean-heads-slope-no-bias", "GATConv", dict(gat, concat=False, negative_slope=0.1, bias=False))
    add("no-self-loops-residual", "GATConv", dict(gat, add_self_loops=False, residual=True))
    add("attention", "GATConv", gat, attention=True)
    add("attention-no-loops", "GATConv", dict(gat, add_self_loops=False), attention=True)
    add("dropout-train-attention", "GATConv", dict(gat, dropout=0.4), attention=True, train=True)
    add("dropout-eval-fused", "GATConv", dict(gat, dropout=0.4))
    for fill in ("mean", "add", "min", "max", "mul", 0.5):
        add(f"edge-dim-fill-{fill}", "GATConv", dict(gat, edge_dim=EDGE_DIM, fill_value=fill), attr=True)
    add("edge-dim-fill-tensor", "GATConv", dict(gat, edge_dim=EDGE_DIM, fill_value=torch.tensor([0.5, -1.0, 2.0])),
        attr=True, attention=True)
    add("edge-dim-no-loops", "GATConv", dict(gat, edge_dim=EDGE_DIM, add_self_loops=False, concat=False),
        attr=True)
    add("bipartite-shared-lin", "GATConv", dict(gat, residual=True), pair="pair")
    add("bipartite", "GATConv", dict(gat, in_channels=(6, 5)), pair="pair", size=True)
    add("bipartite-attention", "GATConv", dict(gat, in_channels=(6, 5), edge_dim=EDGE_DIM), pair="pair",
        attr=True, attention=True)
    add("bipartite-no-dst", "GATConv", dict(gat, in_channels=(6, 5)), pair="none", size=True)
    add("bipartite-no-dst-attention", "GATConv", dict(gat, in_channels=(6, 5)), pair="none", size=True,
        attention=True)
    for form in ("EdgeIndex", "coo", "csr", "graph"):
        add(f"{form}", "GATConv", gat, form=form)
        add(f"{form}-attention", "GATConv", gat, form=form, attention=True)
    add("graph-edge-dim", "GATConv", dict(gat, edge_dim=EDGE_DIM), form="graph", attr=True)
    add("coo-edge-dim-no-loops", "GATConv", dict(gat, edge_dim=EDGE_DIM, add_self_loops=False), form="coo",
        attr=True, attention=True)
    add("graph-bipartite-attention", "GATConv", dict(gat, in_channels=(6, 5)), form="graph", pair="pair",
        attention=True)
    add("lazy", "GATConv", dict(gat, in_channels=-1, residual=True), lazy=True)
    add("lazy-bipartite", "GATConv", dict(gat, in_channels=(-1, -1)), pair="pair", lazy=True, reverse=True)
    # GATv2Conv
    add("default", "GATv2Conv", gat)
    add("reverse-share-weights", "GATv2Conv", dict(gat, share_weights=True), reverse=True)
    add("mean-heads-no-bias-residual", "GATv2Conv", dict(gat, concat=False, bias=False, residual=True))
    add("no-self-loops-attention", "GATv2Conv", dict(gat, add_self_loops=False), attention=True)
    add("dropout-train", "GATv2Conv", dict(gat, dropout=0.4, negative_slope=0.1), train=True)
    add("edge-dim-attention", "GATv2Conv", dict(gat, edge_dim=EDGE_DIM, fill_value=1.5), attr=True, attention=True)
    add("edge-dim-max", "GATv2Conv", dict(gat, edge_dim=EDGE_DIM, fill_value="max"), attr=True)
    add("bipartite", "GATv2Conv", dict(gat, in_channels=(6, 5)), pair="pair", attention=True)
    add("bipartite-share-weights", "GATv2Conv", dict(gat, share_weights=True), pair="pair")
    for form in ("EdgeIndex", "coo", "csr", "graph"):
        add(f"{form}-attention", "GATv2Conv", gat, form=form, attention=True)
    add("lazy", "GATv2Conv", dict(gat, in_channels=-1), lazy=True)
    # AGNNConv
    add("default", "AGNNConv", {})
    add("fixed-beta-reverse", "AGNNConv", dict(requires_grad=False), reverse=True)
    add("no-self-loops", "AGNNConv", dict(add_self_loops=False))
    for form in ("EdgeIndex", "coo", "csr", "graph"):
        add(f"{form}", "AGNNConv", {}, form=form)
    return cases


@pytest.mark.parametrize("name, kwargs, opts", _cases())
def test_matches_pyg(name, kwargs, opts):
    run_case(name, kwargs, **opts)


def test_gcn_duplicate_weighted_self_loops_match_pyg():
    """Two weighted self loops on one node: PyG (on the CPU) keeps the last one's weight, and so
    do we.  (Only the forward: PyG's index_put also sends a gradient to the overwritten loop.)"""
    ei = torch.cat([SQ["ei"], torch.tensor([[4, 4], [4, 4]])], dim=1)
    w = torch.cat([SQ["w"], torch.tensor([2.5, 0.25])])
    theirs = pyg.GCNConv(5, 4, improved=True)
    ours = sgnn.GCNConv(5, 4, improved=True)
    ours.load_state_dict(theirs.state_dict())
    _close(ours(SQ["x"], ei, w), theirs(SQ["x"], ei, w), OUT_RTOL, OUT_ATOL, "output")


class SparseTensor:
    """A stand-in for ``torch_sparse.SparseTensor`` (not installed here): the few methods the
    layers use, with row-major (target, source) sorted, coalesced storage."""

    def __init__(self, row, col, value=None, sparse_sizes=None):
        order = torch.argsort(row * sparse_sizes[1] + col, stable=True)
        self._row, self._col = row[order], col[order]
        self._value = None if value is None else value[order]
        self._sizes = tuple(sparse_sizes)

    def coo(self):
        return self._row, self._col, self._value

    def sparse_sizes(self):
        return self._sizes


def _coalesced(ei, w, n, m):
    adj = torch.sparse_coo_tensor(ei.flip(0), w, (n, m)).coalesce()
    (row, col), value = adj.indices(), adj.values()
    return row, col, value


def test_sparse_tensor_inputs_follow_pyg_semantics():
    """PyG's SparseTensor semantics, checked against PyG on the equivalent edge_index: GCN
    replaces self loops by loops of weight ``fill``; SAGE drops the values; GAT returns the
    SparseTensor with the attention as values."""
    row, col, value = _coalesced(SQ["ei"], SQ["w"], 12, 12)
    adj = SparseTensor(row=row, col=col, value=value, sparse_sizes=(12, 12))
    plain = row != col
    ei, w = torch.stack([col[plain], row[plain]]), value[plain]       # no loops: PyG adds weight-fill loops
    theirs, ours = pyg.GCNConv(5, 4, improved=True), sgnn.GCNConv(5, 4, improved=True)
    ours.load_state_dict(theirs.state_dict())
    _close(ours(SQ["x"], adj), theirs(SQ["x"], ei, w), OUT_RTOL, OUT_ATOL, "GCNConv")
    theirs, ours = pyg.SAGEConv(5, 4, aggr="sum"), sgnn.SAGEConv(5, 4, aggr="sum")
    ours.load_state_dict(theirs.state_dict())
    _close(ours(SQ["x"], adj), theirs(SQ["x"], torch.stack([col, row])), OUT_RTOL, OUT_ATOL, "SAGEConv")
    theirs, ours = pyg.GATConv(5, 4, heads=2), sgnn.GATConv(5, 4, heads=2)
    ours.load_state_dict(theirs.state_dict())
    out, att = ours(SQ["x"], adj, return_attention_weights=True)
    want, (want_ei, want_alpha) = theirs(SQ["x"], torch.stack([col, row]), return_attention_weights=True)
    _close(out, want, OUT_RTOL, OUT_ATOL, "GATConv")
    assert isinstance(att, SparseTensor)
    got_row, got_col, got_alpha = att.coo()
    _close(_dense_attention(torch.stack([got_col, got_row]), got_alpha, 12, 12),
           _dense_attention(want_ei, want_alpha, 12, 12), OUT_RTOL, OUT_ATOL, "GATConv attention")


# ---------------------------------------------------------------- what cannot be honoured raises
def _errors():
    x, ei, bi = SQ["x"], SQ["ei"], BI
    coo = torch.sparse_coo_tensor(ei.flip(0), SQ["w"], (12, 12)).coalesce()
    rect = torch.sparse_coo_tensor(bi["ei"].flip(0), bi["w"], (bi["n"], bi["m"])).coalesce()
    mlp = torch.nn.Linear(5, 5)
    return [
        ("SAGEConv(): aggr=MeanAggregation() is not supported",
         lambda: sgnn.SAGEConv(5, 4, aggr=pyg.aggr.MeanAggregation())),
        ("SAGEConv(): aggr=['mean', 'max'] is not supported", lambda: sgnn.SAGEConv(5, 4, aggr=["mean", "max"])),
        ("SAGEConv(): aggr='lstm' is not supported", lambda: sgnn.SAGEConv(5, 4, aggr="lstm")),
        ("SAGEConv(): in_channels=-1 is not supported", lambda: sgnn.SAGEConv(-1, 4, project=True)),
        ("GCNConv(): decomposed_layers=2 is not supported", lambda: sgnn.GCNConv(5, 4, decomposed_layers=2)),
        ("GCNConv(): aggr_kwargs={'p': 2} is not supported", lambda: sgnn.GCNConv(5, 4, aggr_kwargs={"p": 2})),
        ("GINConv(): flow='target_to_source' is not supported",
         lambda: sgnn.GINConv(mlp, flow="target_to_source")),
        ("GCNConv(): add_self_loops=True is not supported", lambda: sgnn.GCNConv(5, 4, True, normalize=False,
                                                                                 add_self_loops=True)),
        ("GATConv(): aggr='mean' is not supported", lambda: sgnn.GATConv(5, 4, aggr="mean")),
        ("GATConv(): fill_value='median' is not supported", lambda: sgnn.GATConv(5, 4, fill_value="median")),
        ("GATv2Conv(): aggr='max' is not supported", lambda: sgnn.GATv2Conv(5, 4, aggr="max")),
        ("AGNNConv(): node_dim=1 is not supported", lambda: sgnn.AGNNConv(node_dim=1)),
        ("GCNConv(): node_dim=-1 is not supported", lambda: sgnn.GCNConv(5, 4, node_dim=-1)),
        ("AGNNConv(): aggr='mean' is not supported", lambda: sgnn.AGNNConv(aggr="mean")),
        ("GINEConv(): edge_dim is given but the input width of nn cannot be read",
         lambda: sgnn.GINEConv(torch.nn.ReLU(), edge_dim=3)),
        # inputs PyG's layers refuse too
        ("GCNConv(): x is a tuple", lambda: sgnn.GCNConv(5, 4)((x, x), ei)),
        ("GCNConv(): the graph has 7 target nodes but the target features have 10",
         lambda: sgnn.GCNConv(6, 4, normalize=False)(bi["x_src"], rect)),
        ("AGNNConv(): x is a tuple", lambda: sgnn.AGNNConv()((x, x), ei)),
        ("GATConv(): x must be 2-D", lambda: sgnn.GATConv(5, 4)(SQ["xb"], ei)),
        ("AGNNConv(): x must be 2-D", lambda: sgnn.AGNNConv()(SQ["xb"], ei)),
        ("GATv2Conv(): the target features x[1] are needed", lambda: sgnn.GATv2Conv(5, 4)((x, None), ei)),
        ("GATv2Conv(): edge_attr is given but the layer has no edge_dim",
         lambda: sgnn.GATv2Conv(5, 4)(x, ei, SQ["ea"])),
        ("GINEConv(): edge_attr must be a 2-D tensor", lambda: sgnn.GINEConv(torch.nn.Linear(5, 4))(x, ei)),
        ("GINEConv(): node and edge features have different widths",
         lambda: sgnn.GINEConv(torch.nn.Linear(5, 4))(x, ei, SQ["ea"])),
        ("GATConv(): add_self_loops=True is not supported",
         lambda: sgnn.GATConv(5, 4, edge_dim=3)(x, coo, torch.randn(coo._nnz(), 3))),
        ("SAGEConv(): size[0]=3 but the source features have 10 nodes",
         lambda: sgnn.SAGEConv((6, 5), 4)((bi["x_src"], bi["x_dst"]), bi["ei"], size=(3, 7))),
        ("SAGEConv(): the graph must be a sparsegnn.Graph", lambda: sgnn.SAGEConv(5, 4)(x, ei.tolist())),
        ("SAGEConv(): adj_t must have layout sparse_coo or sparse_csr",
         lambda: sgnn.SAGEConv(5, 4)(x, coo.to_sparse_csc())),
        ("GINConv(): adj_t must be a 2-D sparse tensor",
         lambda: sgnn.GINConv(mlp)(x, torch.sparse_coo_tensor(ei.flip(0), SQ["ea"], (12, 12, 3)))),
    ]


@pytest.mark.parametrize("message, make", _errors(), ids=lambda v: v if isinstance(v, str) else "")
def test_unsupported_raises_value_error(message, make):
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value).startswith(message), str(info.value)


def test_node_dim_out_of_range_is_a_clear_error():
    conv = sgnn.GCNConv(4, 3, node_dim=4)
    with pytest.raises(ValueError, match=r"GCNConv\(\): node_dim=4 is out of range for features of shape \(5, 4\)"):
        conv(torch.randn(5, 4), torch.tensor([[0, 1], [1, 2]]))
