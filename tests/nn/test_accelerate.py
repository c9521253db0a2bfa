"""``accelerate(model)``: PyG convs swapped for ours, checked against the PyG model itself.

The oracle is always PyG: the original model (same weights) must give the same outputs and
gradients as the accelerated one, and PyG's own constructor signatures give the defaults.
Where one of our layers does not (yet) take what a PyG model needs (GIN's ``nn=``, GAT's
``edge_attr=``, GINE / GATv2), the test checks that the conv is kept with that reason instead.
"""
import copy
import inspect
import sys

import pytest
import torch
from torch import nn

import sparsegnn.nn as sgnn
from sparsegnn.nn.accelerate import _REQUIRED, SUPPORTED, AccelerateReport, _pyg_options, accelerate

pyg = pytest.importorskip("torch_geometric.nn")

N, F, H, C = 24, 6, 8, 3


@pytest.fixture(scope="module")
def data():
    """x, edge_index, edge_weight: 3 isolated nodes, 4 self loops (one per node: PyG keeps one
    of a node's repeated weighted loops where our GCN sums them), 5 duplicated edges."""
    g = torch.Generator().manual_seed(3)
    live = N - 3
    src, dst = torch.randint(0, live, (2, 70), generator=g)
    ei = torch.stack([src, dst])[:, src != dst]
    loops = torch.tensor([1, 4, 7, 10])
    ei = torch.cat([ei, torch.stack([loops, loops]), ei[:, :5]], dim=1)
    w = torch.rand(ei.shape[1], generator=g) + 0.5
    x = torch.randn(N, F, generator=g)
    return x, ei, w


def _ready(name, ctor=(), call=()):
    """Whether our layer ``name`` exists, takes constructor arguments ``ctor`` and forward
    keywords ``call`` (read from its signatures, not from accelerate)."""
    cls = getattr(sgnn, name, None)
    if cls is None:
        return False
    init, fwd = inspect.signature(cls).parameters, inspect.signature(cls.forward).parameters
    return all(a in init for a in ctor) and all(a in fwd for a in call)


def _assert_same_function(reference, fast, args, kwargs=None, train=False):
    """Same outputs (1e-5) and parameter gradients (1e-4), parameter by parameter name."""
    kwargs = kwargs or {}
    reference.train(train)
    fast.train(train)
    expected, out = reference(*args, **kwargs), fast(*args, **kwargs)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    proj = torch.randn(expected.shape, generator=torch.Generator().manual_seed(9))
    (expected * proj).sum().backward()
    (out * proj).sum().backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    grads = {n: p.grad for n, p in fast.named_parameters()}
    assert list(grads) == list(ref_grads)      # same names, same order (optimiser state_dicts)
    for name, ref in ref_grads.items():
        if ref is None:
            assert grads[name] is None, name
        else:
            torch.testing.assert_close(grads[name], ref, atol=1e-4, rtol=1e-4, msg=name)


def _assert_rest_untouched(original, fast, swapped):
    """Every module outside the swapped convs (GIN's reused ``nn`` included) has the same
    type, state and mode; swapped convs are our class of the same name."""
    for name, module in original.named_modules():
        if name in swapped:
            assert type(fast.get_submodule(name)) is getattr(sgnn, type(module).__name__), name
            continue
        inside = [s for s in swapped if name.startswith(s + ".")]
        if inside and not name.startswith(inside[0] + ".nn"):
            continue   # PyG's internal submodules of a swapped conv (lin, aggr_module, ...)
        other = fast.get_submodule(name)
        assert type(other) is type(module), name
        assert other.training == module.training, name
        mine, theirs = other.state_dict(), module.state_dict()
        assert mine.keys() == theirs.keys(), name
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), name


# ---------------------------------------------------------------- PyG's BasicGNN models
BASIC = {
    # name: (constructor, conv class, what our layer must take: ctor args, forward keywords; model call keywords)
    "GCN": (lambda: pyg.GCN(F, H, 3, C, norm="batch_norm"), "GCNConv", (), ("edge_weight",), ("edge_weight",)),
    "GCN-improved": (lambda: pyg.GCN(F, H, 2, C, improved=True, cached=True), "GCNConv", ("improved",),
                     ("edge_weight",), ("edge_weight",)),
    "GraphSAGE": (lambda: pyg.GraphSAGE(F, H, 2, C, jk="cat"), "SAGEConv", (), (), ()),
    "GIN": (lambda: pyg.GIN(F, H, 2, C, train_eps=True), "GINConv", ("nn",), (), ()),
    "GAT": (lambda: pyg.GAT(F, H, 2, C, heads=2), "GATConv", (), ("edge_attr",), ()),
    "GATv2-edge_dim": (lambda: pyg.GAT(F, H, 2, C, heads=2, v2=True, edge_dim=3), "GATv2Conv", ("edge_dim",),
                       ("edge_attr",), ("edge_attr",)),
}


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("model_name", list(BASIC))
def test_basic_gnn(data, model_name, train):
    x, ei, w = data
    build, conv_name, ctor, call, passed = BASIC[model_name]
    torch.manual_seed(0)
    model = build().train(train)
    fast, report = accelerate(model, return_report=True)
    names = [f"convs.{i}" for i in range(len(model.convs))]
    if _ready(conv_name, ctor, call):
        assert [(s.name, s.pyg_class, s.our_class) for s in report.swapped] == \
            [(n, getattr(pyg, conv_name), getattr(sgnn, conv_name)) for n in names]
        assert report.skipped == []
        _assert_rest_untouched(model, fast, set(names))
    else:   # kept, and the report says which argument our layer lacks (or that it does not exist)
        assert report.swapped == [] and [s.name for s in report.skipped] == names
        assert all(any(a in s.reason for a in ctor + call + ("not available",)) for s in report.skipped), report
        assert all(type(c) is getattr(pyg, conv_name) for c in fast.convs)
    edge_attr = torch.randn(ei.shape[1], 3, generator=torch.Generator().manual_seed(4))
    kwargs = {k: {"edge_weight": w, "edge_attr": edge_attr}[k] for k in passed}
    _assert_same_function(model, fast, (x, ei), kwargs, train=train)


# ---------------------------------------------------------------- hand-written models
class Scale(nn.Module):
    """A custom module with a parameter and a buffer."""

    def __init__(self, d):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, d))
        self.register_buffer("shift", torch.full((d,), 0.1))

    def forward(self, x):
        return x * self.scale + self.shift


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin_in = nn.Linear(F, H)
        self.gcn = pyg.GCNConv(H, H)
        self.bn = nn.BatchNorm1d(H)
        self.convs = nn.ModuleList([pyg.SAGEConv(H, H, aggr="max"), pyg.GATConv(H, 4, heads=2, negative_slope=0.1)])
        self.norm = nn.LayerNorm(H)
        self.gin = pyg.GINConv(nn.Sequential(nn.Linear(H, H), nn.ReLU(), nn.Linear(H, H)), eps=0.3, train_eps=True)
        self.agnn = pyg.AGNNConv()
        self.scale = Scale(H)
        self.head = nn.Linear(H, C)

    def forward(self, x, edge_index, edge_weight):
        h = self.lin_in(x).relu()
        h = self.bn(self.gcn(h, edge_index, edge_weight)).relu()
        h = self.convs[0](h, edge_index)
        h = self.norm(self.convs[1](h, edge_index)).relu()
        h = self.agnn(self.gin(h, edge_index), edge_index)
        return self.head(self.scale(h))


NET_CONVS = {"gcn": "GCNConv", "convs.0": "SAGEConv", "convs.1": "GATConv", "gin": "GINConv", "agnn": "AGNNConv"}


def _net_expected():
    return {n for n, c in NET_CONVS.items() if _ready(c, ("nn",) if c == "GINConv" else ())}


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_hand_written_model(data, train):
    x, ei, w = data
    torch.manual_seed(1)
    model = Net().train(train)
    fast, report = accelerate(model, return_report=True)
    expected = _net_expected()
    assert {s.name for s in report.swapped} == expected
    assert {s.name for s in report.skipped} == set(NET_CONVS) - expected
    _assert_rest_untouched(model, fast, expected)
    _assert_same_function(model, fast, (x, ei, w), train=train)


class NetV2(nn.Module):
    """GINE with edge features and GATv2 (shared weights): swapped once our layers exist."""

    def __init__(self):
        super().__init__()
        self.gine = pyg.GINEConv(nn.Sequential(nn.Linear(F, H), nn.ReLU(), nn.Linear(H, H)), edge_dim=3)
        self.gatv2 = pyg.GATv2Conv(H, 4, heads=2, share_weights=True)

    def forward(self, x, edge_index, edge_attr):
        return self.gatv2(self.gine(x, edge_index, edge_attr).relu(), edge_index)


def test_gine_gatv2(data):
    x, ei, _ = data
    edge_attr = torch.randn(ei.shape[1], 3, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(2)
    model = NetV2()
    fast, report = accelerate(model, return_report=True)
    expected = {n for n, c, a in (("gine", "GINEConv", ("nn", "edge_dim")), ("gatv2", "GATv2Conv", ("share_weights",)))
                if _ready(c, a)}
    assert {s.name for s in report.swapped} == expected
    for s in report.skipped:
        if getattr(sgnn, s.cls.__name__, None) is None:
            assert s.reason == f"not available: sparsegnn.nn has no {s.cls.__name__}"
    if "gatv2" in expected:   # tied lin_l / lin_r stay one module's parameters
        assert fast.gatv2.lin_l.weight is fast.gatv2.lin_r.weight
    _assert_rest_untouched(model, fast, expected)
    _assert_same_function(model, fast, (x, ei, edge_attr), train=True)


def test_pyg_sequential(data, monkeypatch):
    x, ei, w = data
    torch.manual_seed(3)
    model = pyg.Sequential("x, edge_index, edge_weight", [
        (pyg.GCNConv(F, H), "x, edge_index, edge_weight -> x"),
        nn.ReLU(),
        (pyg.SAGEConv(H, C), "x, edge_index -> x"),
    ])
    fast, report = accelerate(model, return_report=True)
    assert [s.name for s in report.swapped] == ["module_0", "module_2"]
    assert type(fast[0]) is sgnn.GCNConv and type(fast[2]) is sgnn.SAGEConv
    _assert_same_function(model, fast, (x, ei, w))

    class Renamed(sgnn.GCNConv):   # third positional argument means something else
        def forward(self, x, graph, scale=None):
            return super().forward(x, graph)

    monkeypatch.setattr(sgnn, "GCNConv", Renamed)
    _, report = accelerate(model, return_report=True)
    assert [s.name for s in report.skipped] == ["module_0"]
    assert "argument 3" in report.skipped[0].reason and "edge_weight" in report.skipped[0].reason


def test_basic_gnn_call_form_checked(monkeypatch):
    class NoWeight(sgnn.GCNConv):
        def forward(self, x, graph):
            return super().forward(x, graph)

    monkeypatch.setattr(sgnn, "GCNConv", NoWeight)
    fast, report = accelerate(pyg.GCN(F, H, 2, C), return_report=True)
    assert report.swapped == [] and len(report.skipped) == 2
    assert all("edge_weight=" in s.reason for s in report.skipped)
    assert all(type(c) is pyg.GCNConv for c in fast.convs)


# ---------------------------------------------------------------- parameters, modes, copies
def _sgd_step(model, opt, data):
    x, ei, w = data
    opt.zero_grad()
    model(x, ei, w).square().mean().backward()
    opt.step()


def test_inplace_shares_parameters_with_existing_optimizer(data):
    torch.manual_seed(4)
    model = Net()
    model.gcn.bias.requires_grad_(False)          # frozen stays frozen
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    _sgd_step(model, opt, data)                   # momentum buffers exist before the swap
    _sgd_step(reference, ref_opt, data)
    before = {id(p) for p in model.parameters()}
    gin_nn = model.gin.nn
    out = accelerate(model, inplace=True)
    assert out is model and type(model.gcn) is sgnn.GCNConv
    assert {id(p) for p in model.parameters()} == before
    assert model.gin.nn is gin_nn
    assert not model.gcn.bias.requires_grad
    for _ in range(2):
        _sgd_step(model, opt, data)
        _sgd_step(reference, ref_opt, data)
    ref_state = reference.state_dict()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, ref_state[k], atol=1e-5, rtol=1e-5, msg=k)


def test_not_inplace_leaves_model_untouched():
    torch.manual_seed(5)
    model = Net()
    modules = dict(model.named_modules())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fast = accelerate(model)
    assert fast is not model and type(fast.gcn) is sgnn.GCNConv
    assert dict(model.named_modules()) == modules     # same objects under the same names
    assert type(model.gcn) is pyg.GCNConv
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    fast_ids = {id(p) for p in fast.parameters()}
    assert not fast_ids & {id(p) for p in model.parameters()}


def test_modes_device_dtype_kept(data):
    x, ei, w = data
    torch.manual_seed(6)
    model = Net().double().train()
    model.gcn.eval()
    model.bn.eval()
    fast = accelerate(model)
    assert not fast.gcn.training and not fast.bn.training
    assert fast.convs[0].training and fast.agnn.training and fast.training
    assert all(p.dtype == torch.float64 and p.device == x.device for p in fast.parameters())
    _assert_same_function(model, fast, (x.double(), ei, w.double()), train=False)
    assert all(not m.training for m in accelerate(Net().eval()).modules())


def test_conv_reachable_twice_swapped_once(data):
    x, ei, _ = data

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = pyg.GCNConv(F, F)
            self.b = self.a

        def forward(self, x, edge_index):
            return self.b(self.a(x, edge_index), edge_index)

    model = Twice()
    fast, report = accelerate(model, return_report=True)
    assert fast.a is fast.b and type(fast.a) is sgnn.GCNConv
    assert [s.name for s in report.swapped] == ["a"]
    _assert_same_function(model, fast, (x, ei))


def test_containers(data):
    x, ei, _ = data
    model = nn.ModuleDict({"block": nn.Sequential(pyg.GCNConv(F, F)), "more": nn.ModuleDict({"c": pyg.AGNNConv()})})
    fast, report = accelerate(model, return_report=True)
    assert [s.name for s in report.swapped] == ["block.0", "more.c"]
    assert type(fast["block"][0]) is sgnn.GCNConv and type(fast["more"]["c"]) is sgnn.AGNNConv
    assert list(fast["block"]._modules) == ["0"] and list(fast["more"]._modules) == ["c"]
    torch.testing.assert_close(fast["more"]["c"](fast["block"][0](x, ei), ei),
                               model["more"]["c"](model["block"][0](x, ei), ei), atol=1e-5, rtol=1e-5)


def test_model_that_is_a_conv(data):
    x, ei, w = data
    conv = pyg.GCNConv(F, C, improved=False)
    fast, report = accelerate(conv, return_report=True)
    assert type(fast) is sgnn.GCNConv and [s.name for s in report.swapped] == [""]
    _assert_same_function(conv, fast, (x, ei, w))


def test_no_pyg_convs():
    model = nn.Sequential(nn.Linear(F, H), nn.ReLU(), nn.Linear(H, C))
    same, report = accelerate(model, inplace=True, return_report=True)
    assert same is model and report == AccelerateReport()
    assert "no PyG" in str(report)
    copied = accelerate(model)
    assert [type(m) for m in copied.modules()] == [type(m) for m in model.modules()]


# ---------------------------------------------------------------- kept convs and reasons
class MyGCN(pyg.GCNConv):
    pass


class Holder(nn.Module):
    def __init__(self, **convs):
        super().__init__()
        for k, v in convs.items():
            setattr(self, k, v)


def _reasons(model):
    _, report = accelerate(model, return_report=True)
    return {s.name: s.reason for s in report.skipped}, {s.name for s in report.swapped}


def test_kept_subclass_hooks_and_other_convs():
    hooked, sub_hooked, prop_hooked = pyg.GCNConv(F, H), pyg.GCNConv(F, H), pyg.SAGEConv(F, H)
    hooked.register_forward_hook(lambda *a: None)
    sub_hooked.lin.register_forward_pre_hook(lambda *a: None)
    prop_hooked.register_propagate_forward_hook(lambda *a: None)
    explained = pyg.GCNConv(F, H)
    explained.explain = True
    model = Holder(sub=MyGCN(F, H), hooked=hooked, sub_hooked=sub_hooked, prop_hooked=prop_hooked,
                   explained=explained, graphconv=pyg.GraphConv(F, H), plain=pyg.GCNConv(F, H))
    reasons, swapped = _reasons(model)
    assert swapped == {"plain"}
    assert reasons == {
        "sub": "subclass of GCNConv, may override behaviour",
        "hooked": "has hooks",
        "sub_hooked": "has hooks (on lin)",
        "prop_hooked": "has hooks",
        "explained": "in PyG explain mode",
        "graphconv": "no sparsegnn layer for GraphConv",
    }
    fast = accelerate(model)
    assert type(fast.sub) is MyGCN and type(fast.hooked) is pyg.GCNConv


def test_hook_on_reused_gin_nn_does_not_block(data):
    if not _ready("GINConv", ("nn",)):
        pytest.skip("our GINConv does not take nn= yet")
    x, ei, _ = data
    calls = []
    mlp = nn.Linear(F, H)
    mlp.register_forward_hook(lambda *a: calls.append(1))
    model = Holder(gin=pyg.GINConv(mlp))
    fast = accelerate(model, inplace=True)
    assert type(fast.gin) is sgnn.GINConv and fast.gin.nn is mlp
    fast.gin(x, ei)
    assert calls == [1]


def test_kept_when_our_constructor_rejects_or_lacks_options(data, monkeypatch):
    x, ei, w = data
    ours = sgnn.GCNConv

    class Rejecting(ours):
        def __init__(self, *args, **kwargs):
            raise ValueError("GCNConv(): option not supported")

    class Narrow(ours):   # takes fewer options than PyG, and no lazy in_channels
        def __init__(self, in_channels, out_channels, bias=True):
            if in_channels <= 0:
                raise ValueError("Narrow(): in_channels must be positive")
            super().__init__(in_channels, out_channels, bias=bias)

    monkeypatch.setattr(sgnn, "GCNConv", Rejecting)
    reasons, swapped = _reasons(Holder(c=pyg.GCNConv(F, H)))
    assert swapped == set() and reasons == {"c": "our Rejecting rejects its options: GCNConv(): option not supported"}

    monkeypatch.setattr(sgnn, "GCNConv", Narrow)
    model = Holder(improved=pyg.GCNConv(F, H, improved=True), cached=pyg.GCNConv(F, H, cached=True),
                   default=pyg.GCNConv(F, H), lazy=pyg.GCNConv(-1, H), nobias=pyg.GCNConv(F, H, bias=False))
    fast, report = accelerate(model, return_report=True)
    assert {s.name: s.reason for s in report.skipped} == {
        "improved": "our Narrow does not take improved=True",
        "cached": "our Narrow does not take cached=True",
        "lazy": "lazy: run one forward first",
    }
    assert {s.name for s in report.swapped} == {"default", "nobias"}   # PyG defaults: nothing to pass
    assert fast.nobias.bias is None
    _assert_same_function(model.default, fast.default, (x, ei, w))


def test_kept_when_state_dict_does_not_match(monkeypatch):
    ours = sgnn.GCNConv

    class Extra(ours):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.extra = nn.Parameter(torch.zeros(1))

    class Rescaling(ours):   # loads, but not to the same values: cannot share PyG's tensors
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_load_state_dict_post_hook(self._shift)

        @staticmethod
        def _shift(module, incompatible_keys):
            module.bias.data.add_(1.0)

    for cls in (Extra, Rescaling):   # they take what our GCNConv takes
        cls.__init__.__signature__ = inspect.signature(ours.__init__)
    monkeypatch.setattr(sgnn, "GCNConv", Extra)
    reasons, _ = _reasons(Holder(c=pyg.GCNConv(F, H)))
    assert reasons["c"].startswith("its state_dict does not load into our Extra") and '"extra"' in reasons["c"]
    monkeypatch.setattr(sgnn, "GCNConv", Rescaling)
    reasons, _ = _reasons(Holder(c=pyg.GCNConv(F, H)))
    assert reasons == {"c": "our layer changes bias while loading it, so it cannot share PyG's tensor"}


def test_not_available(monkeypatch):
    monkeypatch.delattr(sgnn, "AGNNConv")
    reasons, swapped = _reasons(Holder(a=pyg.AGNNConv(), g=pyg.GCNConv(F, H)))
    assert swapped == {"g"} and reasons == {"a": "not available: sparsegnn.nn has no AGNNConv"}


def test_lazy_conv(data):
    """A lazy PyG conv is swapped when our layer is lazy too, sharing the uninitialised
    weight (whichever layer runs first materialises it for both); else kept."""
    x, ei, w = data
    try:
        ours_lazy = any(torch.nn.parameter.is_lazy(t) for t in sgnn.GCNConv(-1, H).state_dict(keep_vars=True).values())
    except (ValueError, RuntimeError):
        ours_lazy = False
    pyg_conv = pyg.GCNConv(-1, H)
    model = Holder(c=pyg_conv)
    _, report = accelerate(model, inplace=True, return_report=True)
    if not ours_lazy:
        assert [(s.name, s.reason) for s in report.skipped] == [("c", "lazy: run one forward first")]
        return
    assert type(model.c) is sgnn.GCNConv and model.c.lin.weight is pyg_conv.lin.weight
    out = model.c(x, ei, w)                        # materialises the shared weight
    assert model.c.lin.weight is pyg_conv.lin.weight
    torch.testing.assert_close(out, pyg_conv(x, ei, w), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- PyG untouched, options, API
def test_pyg_itself_is_not_patched(data):
    x, ei, w = data
    classes = {n: getattr(pyg, n) for n in SUPPORTED}
    methods = {n: (c.__init__, c.forward) for n, c in classes.items()}
    torch.manual_seed(7)
    out_before = pyg.GCN(F, H, 2, C)(x, ei, w)
    accelerate(Net(), inplace=True)
    accelerate(pyg.GCN(F, H, 2, C), inplace=True)
    assert {n: getattr(pyg, n) for n in SUPPORTED} == classes
    assert {n: (c.__init__, c.forward) for n, c in classes.items()} == methods
    torch.manual_seed(7)
    again = pyg.GCN(F, H, 2, C)
    assert all(type(c) is pyg.GCNConv for c in again.convs)
    assert torch.equal(again(x, ei, w), out_before)


PYG_DEFAULT_ARGS = {
    "GCNConv": (4, 5), "SAGEConv": (4, 5), "GINConv": (nn.Linear(4, 5),), "GINEConv": (nn.Linear(4, 5),),
    "GATConv": (4, 5), "GATv2Conv": (4, 5), "AGNNConv": (),
}
PYG_OTHER_OPTIONS = {
    "GCNConv": dict(improved=True, cached=True, add_self_loops=False, normalize=True, bias=False, aggr="mean",
                    flow="target_to_source", node_dim=0),
    "SAGEConv": dict(aggr="max", normalize=True, root_weight=False, project=True, bias=False),
    "GINConv": dict(eps=0.5, train_eps=True, aggr="mean"),
    "GINEConv": dict(eps=0.5, train_eps=True, edge_dim=3),
    "GATConv": dict(heads=3, concat=False, negative_slope=0.1, dropout=0.3, add_self_loops=False, edge_dim=2,
                    fill_value=0.5, bias=False, residual=True),
    "GATv2Conv": dict(heads=3, concat=False, negative_slope=0.1, dropout=0.3, add_self_loops=False, edge_dim=2,
                      fill_value="add", bias=False, share_weights=True, residual=True),
    "AGNNConv": dict(requires_grad=False, add_self_loops=False),
}


@pytest.mark.parametrize("name", SUPPORTED)
def test_options_read_from_pyg_modules(name):
    cls = getattr(pyg, name)
    params = {n: p for n, p in inspect.signature(cls.__init__).parameters.items()
              if n != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD}
    default = {n: (v, d) for n, v, d in _pyg_options(cls(*PYG_DEFAULT_ARGS[name]))}
    other = PYG_OTHER_OPTIONS[name]
    read = {n: (v, d) for n, v, d in _pyg_options(cls(*PYG_DEFAULT_ARGS[name], **other))}
    assert set(params) <= set(read)                        # every PyG argument is read
    assert set(params) - set(default) <= {"fill_value"}    # (only used with edge_dim)
    for n, p in params.items():                            # our defaults are PyG's
        if p.default is inspect.Parameter.empty:
            assert read[n][1] is _REQUIRED, n
        elif p.default is not None or n == "edge_dim":     # GCN: add_self_loops=None means = normalize
            assert read[n][1] == p.default, n
    assert all(v == d for v, d in default.values() if d is not _REQUIRED)   # a default module: defaults
    assert default["aggr"][1] in (("mean",) if name == "SAGEConv" else ("add", "sum"))
    assert {n: read[n][0] for n in other} == other
    assert all(read[n][0] != read[n][1] for n in other if n not in ("normalize",)), read


def test_errors_and_report_output(monkeypatch, capsys):
    with pytest.raises(ValueError, match=r"accelerate\(\): model must be a torch.nn.Module"):
        accelerate([pyg.GCNConv(F, H)])
    model = Holder(c=pyg.GCNConv(F, H), s=MyGCN(F, H))
    returned = accelerate(model, verbose=True)
    assert isinstance(returned, nn.Module)
    printed = capsys.readouterr().out
    assert "1 swapped, 1 kept" in printed and "-> sparsegnn.nn.GCNConv" in printed
    assert "kept: subclass of GCNConv, may override behaviour" in printed
    monkeypatch.setitem(sys.modules, "torch_geometric.nn", None)
    with pytest.raises(ValueError, match=r"accelerate\(\): needs torch_geometric"):
        accelerate(nn.Linear(2, 2))
