"""The public API keeps its names and signatures.

``public_api.json`` lists every name in the ``__all__`` of the public modules, with its
signature, and the signatures of the public methods of the public classes. A change that
renames, removes or re-signs one of them fails here; to change the API on purpose, regenerate
the file with ``python tests/test_public_api.py > tests/public_api.json`` and say why in the
commit. New names may be added without touching the file.
"""
import importlib
import inspect
import json
from pathlib import Path

PUBLIC_MODULES = ["sparsegnn", "sparsegnn.nn", "sparsegnn.ops", "sparsegnn.tune", "sparsegnn.sampling",
                  "sparsegnn.datasets", "sparsegnn.distributed", "sparsegnn.formats"]
LISTED = Path(__file__).with_name("public_api.json")


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(?)"


def public_api() -> dict:
    """Every public name with its kind and signature (classes also list their public methods)."""
    api = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in sorted(module.__all__):
            obj = getattr(module, name)
            key = f"{module_name}.{name}"
            if inspect.ismodule(obj):
                api[key] = "module"
            elif inspect.isclass(obj):
                init = next(c for c in obj.__mro__ if "__init__" in vars(c))
                own = init.__module__.startswith("sparsegnn")
                # a constructor inherited from torch follows torch's version, not ours
                api[key] = "class" + (_signature(obj) if own else f"(constructor of {init.__module__.partition('.')[0]})")
                for attr, member in sorted(vars(obj).items()):
                    if attr.startswith("_"):
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if inspect.isfunction(member):
                        api[f"{key}.{attr}"] = _signature(member)
                    elif isinstance(member, property):
                        api[f"{key}.{attr}"] = "property"
            elif callable(obj):
                api[key] = _signature(obj)
            else:
                api[key] = type(obj).__name__
    return api


def test_every_listed_public_name_keeps_its_signature():
    listed = json.loads(LISTED.read_text())
    now = public_api()
    missing = sorted(set(listed) - set(now))
    changed = sorted(k for k in listed if k in now and now[k] != listed[k])
    lines = [f"missing: {k} (was {listed[k]})" for k in missing]
    lines += [f"changed: {k}\n  was {listed[k]}\n  now {now[k]}" for k in changed]
    assert not lines, "public API changed:\n" + "\n".join(lines)


def test_the_listing_covers_the_main_entry_points():
    listed = json.loads(LISTED.read_text())
    for name in ("sparsegnn.Graph", "sparsegnn.Graph.from_edge_index", "sparsegnn.spmm", "sparsegnn.sddmm",
                 "sparsegnn.accelerate", "sparsegnn.nn.GCNConv", "sparsegnn.nn.GATConv"):
        assert name in listed, name


if __name__ == "__main__":
    print(json.dumps(public_api(), indent=1, sort_keys=True))
