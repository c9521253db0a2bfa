"""``accelerate(model)``: swap the PyG convolutions inside an existing model for ours.

Every module of ``model`` whose class is *exactly* one of PyG's ``GCNConv``, ``SAGEConv``,
``GINConv``, ``GINEConv``, ``GATConv``, ``GATv2Conv`` or ``AGNNConv`` is replaced, in its
parent (``setattr(parent, name, new)``, which also works for ``ModuleList`` / ``Sequential``
/ ``ModuleDict`` children), by the layer of the same name in :mod:`sparsegnn.nn`, built
with the PyG module's constructor arguments (read from its attributes, passed by PyG's
keyword names). Nothing else in the model is touched, and PyG itself is never patched.

**Parameters are shared, not copied.** The new layer holds the very same ``Parameter`` and
buffer objects as the PyG layer it replaces (first checked by a ``load_state_dict(...,
strict=True)`` into the new layer, which must reproduce every value exactly). So with
``inplace=True`` an optimiser built before ``accelerate`` keeps working, momentum included,
``requires_grad`` flags are kept, and weights tied across layers stay tied. With
``inplace=False`` (the default) the model is deep-copied first, so the returned model has
its own parameters: build the optimiser on it. Our layers register their tensors in PyG's
order, so ``model.parameters()`` keeps its order too (an optimiser's ``state_dict`` maps
parameters by position).

A conv is left in place, with the reason in the report, when: it is a user subclass of a
PyG conv (it may override behaviour); our layer of that name does not exist; our constructor
does not take one of its non-default options, or rejects them (``ValueError`` /
``TypeError``); its ``state_dict`` does not load strictly and exactly into ours; it has
forward/backward hooks (PyG's propagate/message hooks included) on it or on a submodule that
would be dropped; it is lazy (``in_channels=-1`` not yet initialised) and ours is not; it is
in PyG's explain mode; or the model calls it in a way our ``forward`` does not accept.
The calls are known for PyG's ``BasicGNN`` models (``GCN`` passes ``edge_weight=``, ``GAT``
``edge_attr=``, ``GraphSAGE`` / ``GIN`` nothing) and for ``torch_geometric.nn.Sequential``
(positional arguments from each child's header); a hand-written ``forward`` is not inspected.

Not carried over: a ``cached=True`` layer's cached graph (ours caches again on its next
call) and references to the PyG layer held outside the module tree (plain lists, closures).
"""
from __future__ import annotations

import copy
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import torch
from torch import nn

__all__ = ["accelerate", "AccelerateReport", "SwappedLayer", "SkippedLayer"]

SUPPORTED = ("GCNConv", "SAGEConv", "GINConv", "GINEConv", "GATConv", "GATv2Conv", "AGNNConv")
_REQUIRED = object()   # marks a constructor argument without a default
_SIMPLE_AGGRS = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min", "mul": "mul"}


class SwappedLayer(NamedTuple):
    """One replaced module: its qualified name in the model, PyG's class and ours."""

    name: str
    pyg_class: type
    our_class: type


class SkippedLayer(NamedTuple):
    """One PyG message-passing module left in place, and why."""

    name: str
    cls: type
    reason: str


@dataclass
class AccelerateReport:
    """What :func:`accelerate` swapped and what it left in place (and why).

    ``swapped`` and ``skipped`` list one entry per module object (a module reachable under
    several names is listed under the first); the model itself is named ``""``.
    """

    swapped: List[SwappedLayer] = field(default_factory=list)
    skipped: List[SkippedLayer] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.swapped and not self.skipped:
            return "sparsegnn accelerate: no PyG message-passing layers found"
        rows = [(_display(s.name), s.pyg_class.__name__, f"-> sparsegnn.nn.{s.our_class.__name__}")
                for s in self.swapped]
        rows += [(_display(s.name), s.cls.__name__, f"kept: {s.reason}") for s in self.skipped]
        rows.insert(0, ("module", "class", "result"))
        widths = [max(len(r[i]) for r in rows) for i in range(2)]
        lines = [f"sparsegnn accelerate: {len(self.swapped)} swapped, {len(self.skipped)} kept"]
        lines += [f"  {a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows]
        return "\n".join(lines)


def _display(name: str) -> str:
    return name if name else "(model)"


# ---------------------------------------------------------------- constructor arguments
def _same(a: Any, b: Any) -> bool:
    """``a == b`` for plain option values; tensors and odd types compare unequal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    try:
        return bool(a == b)
    except Exception:
        return False


def _aggregation(module: nn.Module) -> Tuple[Any, str]:
    """The aggregation as a constructor value, and its canonical name for default checks."""
    from torch_geometric.nn import aggr as pyg_aggr

    value = module.aggr
    if isinstance(value, str) and value in _SIMPLE_AGGRS:
        return value, _SIMPLE_AGGRS[value]
    names = {pyg_aggr.SumAggregation: "sum", pyg_aggr.MeanAggregation: "mean", pyg_aggr.MaxAggregation: "max",
             pyg_aggr.MinAggregation: "min", pyg_aggr.MulAggregation: "mul"}
    agg = getattr(module, "aggr_module", None)
    if type(agg) in names and not any(True for _ in agg.parameters()):
        return names[type(agg)], names[type(agg)]
    return value, repr(value)


def _pyg_options(module: nn.Module) -> List[Tuple[str, Any, Any]]:
    """``(name, value, PyG's default)`` for every constructor argument of a PyG 2.8 conv.

    Values are read from the module's attributes; the default is ``_REQUIRED`` for arguments
    without one. Message-passing options (``aggr``, ``flow``, ``node_dim``,
    ``decomposed_layers``) come last.
    """
    name = type(module).__name__
    m = module
    aggr_value, aggr_name = _aggregation(m)
    opts: List[Tuple[str, Any, Any]]
    if name == "GCNConv":
        opts = [("in_channels", m.in_channels, _REQUIRED), ("out_channels", m.out_channels, _REQUIRED),
                ("improved", m.improved, False), ("cached", m.cached, False),
                ("add_self_loops", m.add_self_loops, m.normalize),   # PyG: None means "= normalize"
                ("normalize", m.normalize, True), ("bias", m.bias is not None, True)]
    elif name == "SAGEConv":
        opts = [("in_channels", m.in_channels, _REQUIRED), ("out_channels", m.out_channels, _REQUIRED),
                ("normalize", m.normalize, False), ("root_weight", m.root_weight, True),
                ("project", m.project, False), ("bias", m.lin_l.bias is not None, True)]
    elif name in ("GINConv", "GINEConv"):
        opts = [("nn", m.nn, _REQUIRED), ("eps", m.initial_eps, 0.0),
                ("train_eps", isinstance(m.eps, nn.Parameter), False)]
        if name == "GINEConv":
            opts.append(("edge_dim", None if m.lin is None else m.lin.in_channels, None))
    elif name in ("GATConv", "GATv2Conv"):
        opts = [("in_channels", m.in_channels, _REQUIRED), ("out_channels", m.out_channels, _REQUIRED),
                ("heads", m.heads, 1), ("concat", m.concat, True), ("negative_slope", m.negative_slope, 0.2),
                ("dropout", m.dropout, 0.0), ("add_self_loops", m.add_self_loops, True),
                ("edge_dim", m.edge_dim, None)]
        if m.edge_dim is not None:   # fill_value only fills the edge features of added self loops
            opts.append(("fill_value", m.fill_value, "mean"))
        opts += [("bias", m.bias is not None, True), ("residual", m.residual, False)]
        if name == "GATv2Conv":
            opts.append(("share_weights", m.share_weights, False))
    elif name == "AGNNConv":
        opts = [("requires_grad", m.requires_grad, True), ("add_self_loops", m.add_self_loops, True)]
    else:  # pragma: no cover - guarded by SUPPORTED
        raise ValueError(f"accelerate(): no options known for {name}")
    default_aggr = "mean" if name == "SAGEConv" else "sum"
    opts.append(("aggr", aggr_value, aggr_value if aggr_name == default_aggr else default_aggr))
    opts.append(("flow", m.flow, "source_to_target"))
    if name not in ("GATConv", "GATv2Conv"):   # GAT convs fix node_dim=0 themselves
        opts.append(("node_dim", m.node_dim, -2))
    # only trades memory for time: passed where ours takes it, dropped (never a reason) otherwise
    opts.append(("decomposed_layers", m.decomposed_layers, m.decomposed_layers))
    return opts


def _constructor_kwargs(our_cls: type, options: List[Tuple[str, Any, Any]]) -> Union[Dict[str, Any], str]:
    """Keyword arguments for ``our_cls``, or why it cannot take ``options``.

    An option our constructor does not name is dropped when it has PyG's default value
    (our layer then does what PyG does by default) and is a reason to keep PyG's layer otherwise.
    """
    params = inspect.signature(our_cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {n for n, p in params.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    kwargs: Dict[str, Any] = {}
    for name, value, default in options:
        if takes_any or name in named:
            kwargs[name] = value
        elif default is _REQUIRED or not _same(value, default):
            shown = type(value).__name__ if isinstance(value, nn.Module) else repr(value)
            return f"our {our_cls.__name__} does not take {name}={shown}"
    return kwargs


# ---------------------------------------------------------------- checks on the PyG module
def _is_lazy(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and torch.nn.parameter.is_lazy(t)


def _hook_owner(module: nn.Module, reused: set) -> Optional[str]:
    """Qualified name (``""`` for ``module``) of the first submodule with hooks that the swap
    would drop, or None. Reused submodules (GIN's ``nn``) keep theirs; PyG ``Linear``'s own
    lazy-initialisation pre-hook does not count."""
    for name, sub in module.named_modules():
        if id(sub) in reused:
            continue
        lazy_hook = getattr(getattr(sub, "_hook", None), "id", None)
        for attr, value in vars(sub).items():
            if not (attr.endswith("_hooks") and ("forward" in attr or "backward" in attr)):
                continue
            if isinstance(value, dict) and any(k != lazy_hook for k in value):
                return name
    return None


def _forward_problem(our_cls: type, pyg_cls: type, call: Tuple[str, Any]) -> Optional[str]:
    """Why ``our_cls.forward`` cannot take the call the model makes, or None.

    ``call`` is ``("keywords", (caller, names))``: ``conv(x, edge_index, **{name: ...})``, or
    ``("positional", (caller, k))``: ``conv(a_1, ..., a_k)`` where argument ``i >= 2`` means
    what PyG's ``forward`` names it.
    """
    sig = inspect.signature(our_cls.forward)
    kind, (caller, arg) = call
    if kind == "keywords":
        try:
            sig.bind(None, None, None, **{k: None for k in arg})
        except TypeError:
            shown = ", ".join(f"{k}=..." for k in arg)
            return f"{caller} calls it as conv(x, edge_index, {shown}), which our {our_cls.__name__}.forward rejects"
        return None
    try:
        sig.bind(None, *([None] * arg))
    except TypeError:
        return f"{caller} passes it {arg} positional arguments, which our {our_cls.__name__}.forward rejects"
    ours = [p.name for p in sig.parameters.values()][1:]
    theirs = [p.name for p in inspect.signature(pyg_cls.forward).parameters.values()][1:]
    for i in range(2, arg):
        if i >= len(ours) or i >= len(theirs) or ours[i] != theirs[i]:
            return (f"{caller} passes argument {i + 1} positionally, which is "
                    f"{theirs[i] if i < len(theirs) else '?'} for PyG but "
                    f"{ours[i] if i < len(ours) else '?'} for our {our_cls.__name__}")
    return None


# ---------------------------------------------------------------- building our layer
def _check_loaded(old: nn.Module, new: nn.Module, loaded: bool = True) -> Optional[str]:
    """Why ``new`` cannot take over ``old``'s tensors, or None.

    Keys must agree, each tensor must be a parameter (or buffer) in both, and, where ``new``
    has ``loaded`` ``old``'s state_dict, the loaded values must equal ``old``'s exactly, so
    that sharing the objects changes nothing (a lazy layer is not loaded: shapes only)."""
    theirs = old.state_dict(keep_vars=True)
    mine = new.state_dict(keep_vars=True)
    if set(theirs) != set(mine):
        return "state_dict keys differ"
    for key, tensor in theirs.items():
        path, _, local = key.rpartition(".")
        owner = new.get_submodule(path) if path else new
        if local in owner._parameters:
            if not isinstance(tensor, nn.Parameter):
                return f"{key} is a buffer in PyG's layer but a parameter in ours"
        elif local in owner._buffers:
            if isinstance(tensor, nn.Parameter):
                return f"{key} is a parameter in PyG's layer but a buffer in ours"
        else:
            return f"cannot share {key} (extra state)"
        own = mine[key]
        if _is_lazy(tensor) or _is_lazy(own):
            continue
        if own.shape != tensor.shape:
            return f"{key} has shape {tuple(tensor.shape)} in PyG's layer but {tuple(own.shape)} in ours"
        if loaded and not (own.dtype == tensor.dtype and (torch.equal(own, tensor) or (
                tensor.is_floating_point() and bool(((own == tensor) | (own.isnan() & tensor.isnan())).all())))):
            return f"our layer changes {key} while loading it, so it cannot share PyG's tensor"
    return None


def _share_state(old: nn.Module, new: nn.Module) -> None:
    """Make ``new`` hold ``old``'s parameter and buffer objects, key by key."""
    for key, tensor in old.state_dict(keep_vars=True).items():
        path, _, local = key.rpartition(".")
        owner = new.get_submodule(path) if path else new
        if getattr(owner, local) is not tensor:     # reused modules (GIN's nn) hold theirs already
            setattr(owner, local, tensor)


def _build(our_cls: type, kwargs: Dict[str, Any]) -> nn.Module:
    """``our_cls(**kwargs)`` with module arguments (GIN's ``nn``) deep-copied: a constructor
    may re-initialise them, and the user's trained module must not change."""
    return our_cls(**{k: copy.deepcopy(v) if isinstance(v, nn.Module) else v for k, v in kwargs.items()})


def _builds_lazy(our_cls: type, kwargs: Dict[str, Any]) -> bool:
    """Whether our layer, given the same (lazy) options, is lazy too."""
    try:
        probe = _build(our_cls, kwargs)
    except Exception:   # e.g. a negative dimension: no lazy initialisation
        return False
    return any(_is_lazy(t) for t in probe.state_dict(keep_vars=True).values())


def _convert(old: nn.Module, our_cls: type, call: Optional[Tuple[str, Any]]) -> Union[nn.Module, str]:
    """Our layer equivalent to the PyG conv ``old``, sharing its tensors; or why not."""
    name = our_cls.__name__
    if getattr(old, "_explain", None):
        return "in PyG explain mode"
    if call is not None:
        problem = _forward_problem(our_cls, type(old), call)
        if problem:
            return problem
    options = _pyg_options(old)
    kwargs = _constructor_kwargs(our_cls, options)
    if isinstance(kwargs, str):
        return kwargs
    state = old.state_dict(keep_vars=True)
    lazy = any(_is_lazy(t) for t in state.values())
    reused = {k: v for k, v in kwargs.items() if isinstance(v, nn.Module)}   # GIN's nn: kept as is
    owner = _hook_owner(old, {id(m) for v in reused.values() for m in v.modules()})
    if owner is not None:
        return "has hooks" + (f" (on {owner})" if owner else "")
    if lazy and not _builds_lazy(our_cls, kwargs):
        return "lazy: run one forward first"
    tensors = [t for t in state.values() if isinstance(t, torch.Tensor) and not _is_lazy(t)]
    device = tensors[0].device if tensors else torch.device("cpu")
    floats = [t.dtype for t in tensors if t.is_floating_point()]
    try:
        with torch.device(device):
            new = _build(our_cls, kwargs)
    except (ValueError, TypeError, NotImplementedError) as exc:
        return f"our {name} rejects its options: {exc}"
    if floats:
        new.to(dtype=floats[0])
    if not lazy:
        try:
            new.load_state_dict(old.state_dict(), strict=True)
        except (RuntimeError, ValueError, KeyError) as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            return f"its state_dict does not load into our {name}: {'; '.join(lines[1:] or lines)}"
    problem = _check_loaded(old, new, loaded=not lazy)
    if problem:
        return problem
    for key, module in reused.items():
        if not isinstance(getattr(new, key, None), nn.Module):
            return f"our {name} does not keep its {key} module as .{key}"
        setattr(new, key, module)
    _share_state(old, new)
    modes = {n: m.training for n, m in old.named_modules()}
    for n, m in new.named_modules():
        m.training = modes.get(n, old.training)
    return new


# ---------------------------------------------------------------- the walk
def _call_forms(module: nn.Module, pyg: Any) -> Dict[int, Tuple[str, Any]]:
    """How ``module`` (a PyG model container) calls its convs: ``{id(conv): call}``."""
    forms: Dict[int, Tuple[str, Any]] = {}
    if isinstance(module, pyg.models.basic_gnn.BasicGNN) and isinstance(getattr(module, "convs", None), nn.ModuleList):
        keywords = tuple(k for k, flag in (("edge_weight", module.supports_edge_weight),
                                           ("edge_attr", module.supports_edge_attr)) if flag)
        for conv in module.convs:
            forms[id(conv)] = ("keywords", (type(module).__name__, keywords))
    if isinstance(module, pyg.Sequential):
        for child in getattr(module, "_children", []):
            conv = getattr(module, child.name, None)
            if isinstance(conv, nn.Module):
                forms[id(conv)] = ("positional", ("torch_geometric.nn.Sequential", len(child.param_names)))
    return forms


def accelerate(model: nn.Module, *, inplace: bool = False, verbose: bool = False,
               return_report: bool = False, replay: Optional[bool] = None
               ) -> Union[nn.Module, Tuple[nn.Module, AccelerateReport]]:
    r"""Replace every supported PyG convolution in ``model`` by the :mod:`sparsegnn.nn` layer
    of the same name, weights carried over (shared), everything else untouched.

    Each swapped layer computes what the PyG layer did: for input features :math:`X` and a
    graph :math:`A`, ``new(X, A, ...) == old(X, A, ...)`` up to floating-point rounding, with
    the same parameters (the very same objects), device, dtype and train/eval mode. See the
    module docstring for what is swapped, what is kept and why.

    Args:
        model: any ``nn.Module``: PyG's ``GCN`` / ``GraphSAGE`` / ``GIN`` / ``GAT``, a
            ``torch_geometric.nn.Sequential``, a hand-written model, or a PyG conv itself.
        inplace: convert ``model`` itself; otherwise a deep copy is converted and ``model`` is
            left untouched. A model that is itself a PyG conv is returned as a new object
            either way.
        verbose: print the report.
        return_report: return ``(model, report)`` instead of the model alone.
        replay: when a layer was swapped, the model's ``forward`` replays its forward and
            backward from CUDA graphs in training steps that call it with the same CUDA
            tensors (:func:`sparsegnn.nn.replay.enable_replay`, as our own models do): None
            (default) within a memory budget, True always, False never.

    Returns:
        The converted model, or ``(model, AccelerateReport)`` with ``return_report=True``.

    Raises:
        ValueError: ``model`` is not an ``nn.Module`` (or is scripted / compiled),
            torch_geometric is not installed, or ``model`` cannot be deep-copied.

    Shapes:
        unchanged: the returned model takes and returns what ``model`` does.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"accelerate(): model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule):
        raise ValueError("accelerate(): model is a TorchScript module; call accelerate() on the eager model")
    if hasattr(model, "_orig_mod"):
        raise ValueError("accelerate(): model is compiled; call accelerate() before torch.compile")
    try:
        pyg = importlib.import_module("torch_geometric.nn")
    except ImportError as exc:
        raise ValueError("accelerate(): needs torch_geometric (pip install torch_geometric): "
                         f"it converts PyG layers ({exc})") from exc
    if not inplace:
        try:
            model = copy.deepcopy(model)
        except Exception as exc:
            raise ValueError(f"accelerate(): could not deep-copy the model ({type(exc).__name__}: {exc}); "
                             "pass inplace=True to convert it in place") from exc
    ours = importlib.import_module(__package__)     # sparsegnn.nn, looked up at call time
    targets = {getattr(pyg.conv, n): n for n in SUPPORTED}
    report = AccelerateReport()
    # id(module) -> (module, our layer or None). Holding the module keeps its id from being
    # reused by a layer built later, once a swapped conv has left the tree.
    results: Dict[int, Tuple[nn.Module, Optional[nn.Module]]] = {}
    forms: Dict[int, Tuple[str, Any]] = {}

    def decide(name: str, module: nn.Module) -> Optional[nn.Module]:
        if id(module) in results:
            return results[id(module)][1]
        new: Optional[nn.Module] = None
        cls = type(module)
        if cls in targets:
            our_cls = getattr(ours, targets[cls], None)
            if not (isinstance(our_cls, type) and issubclass(our_cls, nn.Module)):
                outcome: Union[nn.Module, str] = f"not available: sparsegnn.nn has no {targets[cls]}"
            else:
                outcome = _convert(module, our_cls, forms.get(id(module)))
            if isinstance(outcome, str):
                report.skipped.append(SkippedLayer(name, cls, outcome))
            else:
                new = outcome
                report.swapped.append(SwappedLayer(name, cls, our_cls))
        elif isinstance(module, pyg.MessagePassing):
            base = next((t for t in cls.__mro__[1:] if t in targets), None)
            reason = (f"subclass of {base.__name__}, may override behaviour" if base is not None
                      else f"no sparsegnn layer for {cls.__name__}")
            report.skipped.append(SkippedLayer(name, cls, reason))
        results[id(module)] = (module, new)
        return new

    visited: Dict[int, nn.Module] = {}

    def walk(module: nn.Module, prefix: str) -> None:
        if id(module) in visited:
            return
        visited[id(module)] = module
        forms.update(_call_forms(module, pyg))
        for child_name, child in list(module._modules.items()):
            if child is None:
                continue
            qualified = f"{prefix}.{child_name}" if prefix else child_name
            new = decide(qualified, child)
            if new is not None:
                setattr(module, child_name, new)
                child = new
            walk(child, qualified)

    root = decide("", model)
    if root is not None:
        model = root
    walk(model, "")
    if report.swapped and replay is not False:
        from .replay import enable_replay

        enable_replay(model, replay)
    if verbose:
        print(report)
    return (model, report) if return_report else model
