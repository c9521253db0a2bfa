"""The package's layout rules: no import cycles, backend names branched on only inside ``ops/``,
no benchmark drivers inside the package, and no development-round vocabulary in tracked files."""
import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "sparsegnn"


def _modules():
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _import_graph():
    """``module -> modules it imports`` over the package, deferred (function-level) imports included;
    ``from . import x`` counts as importing the submodule ``x``, not its package."""
    modules = _modules()
    edges = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
                targets = subs or [base]
            edges[name].update(t for t in targets if t in modules and t != name)
    return edges


def _cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_package_has_no_import_cycles():
    edges = _import_graph()
    assert len(edges) > 100 and "sparsegnn.ops._triton" in edges["sparsegnn.ops._dispatch"]
    assert _cycles(edges) == []


#: The op backends; comparing a name against them outside ``ops/`` is dispatch in the wrong place.
_BACKEND_NAMES = {"triton", "cpu", "reference", "cusparse"}


def _backend_comparisons(tree):
    """``x == "triton"`` / ``backend != "reference"`` / ``backend in ("cpu", ...)`` where one
    side names a backend variable (its name contains ``backend`` or ``chosen``)."""
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left] + list(node.comparators)
        names = [s.id if isinstance(s, ast.Name) else s.attr if isinstance(s, ast.Attribute) else "" for s in sides]
        strings = set()
        for s in sides:
            if isinstance(s, ast.Constant) and isinstance(s.value, str):
                strings.add(s.value)
            elif isinstance(s, (ast.Tuple, ast.List, ast.Set)):
                strings.update(e.value for e in s.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
        if strings & _BACKEND_NAMES and any("backend" in n or "chosen" in n for n in names):
            hits.append(node.lineno)
    return hits


def test_only_ops_branches_on_backend_names():
    assert _backend_comparisons(ast.parse("if backend == 'triton': pass")) == [1]
    offenders = []
    for name, path in _modules().items():
        if name.startswith("sparsegnn.ops"):
            continue
        offenders += [f"{path.relative_to(ROOT)}:{line}" for line in _backend_comparisons(ast.parse(path.read_text()))]
    assert offenders == []


def test_the_package_holds_no_benchmark_suites_or_sweeps():
    names = set(_modules())
    assert not any(n.startswith("sparsegnn.bench.") or n.endswith(("_sweep", ".sweep")) for n in names), sorted(names)


#: Words of development history, not of the product (assembled so this file does not match itself).
_ROUND_WORDS = re.compile("|".join([r"stop[ _-]?[0-9]", r"issue[ _-]?[0-9]", "le" + "ase"]), re.IGNORECASE)
#: PyTorch's own private API whose name contains one of them.
_ALLOWED = ("_cuda_" + "rel" + "easePool",)


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_no_tracked_path_or_text_speaks_of_development_rounds():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert len(files) > 100
    hits = [f for f in files if _ROUND_WORDS.search(f)]
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in (".png", ".npz", ".pt", ".sqlite", ".gz"):
            continue
        text = path.read_text(errors="ignore")
        for allowed in _ALLOWED:
            text = text.replace(allowed, "")
        hits += [f"{name}: {m.group(0)}" for m in _ROUND_WORDS.finditer(text)]
    assert hits == []
