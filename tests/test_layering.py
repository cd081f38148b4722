"""Package layering, read from the source with ast (nothing is imported).

The import graph counts every `import` / `from ... import` anywhere in a module (inside
functions too, relative imports resolved) and `importlib.import_module("...")` calls with a
string literal. Layers, bottom to top (docs/architecture.md): core < systems, workloads <
harness.sim < harness.runner < harness.live < harness.bench < analysis, moebench.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "systems", "workloads", "harness", "analysis", "moebench")
HARNESS_SUBS = ("harness.sim", "harness.live", "harness.bench", "harness.runner")
MAX_LINES = 400
# Rank of each layer: a module may import its own layer or a lower rank only.
RANK = {"core": 0, "systems": 1, "workloads": 1, "harness.sim": 2, "harness.runner": 3,
        "harness.live": 4, "harness.bench": 5, "analysis": 6, "moebench": 6}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    is_pkg = MODULES[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> dict[str, list[tuple[str, str]]]:
    """Imported project module -> [(name bound here, imported name or "")]; a `from m import
    x` of a submodule x counts as importing m.x."""
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.name].append((a.asname or a.name.split(".")[0], ""))
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(module, node)
            for a in node.names:
                sub = f"{src}.{a.name}"
                if sub in MODULES:
                    out[sub].append((a.asname or a.name, ""))
                else:
                    out[src].append((a.asname or a.name, a.name))
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module"
                   or getattr(node.func, "id", None) == "import_module")):
            out[node.args[0].value].append(("", ""))
    return {m: v for m, v in out.items() if m.split(".")[0] in PACKAGES}


IMPORTS = {m: _imports(m) for m in MODULES}


def _unit(module: str, level: str) -> str:
    """The layer a module belongs to: its top-level package, or harness's sub-package."""
    top = module.split(".")[0]
    if level == "harness" and top == "harness":
        return ".".join(module.split(".")[:2])
    return top


def _edges(level: str) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for src, targets in IMPORTS.items():
        for dst in targets:
            a, b = _unit(src, level), _unit(dst, level)
            if a != b:
                edges[a].add(b)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def _why(a: str, b: str, level: str) -> list[str]:
    return sorted(f"{s} -> {d}" for s, ts in IMPORTS.items() for d in ts
                  if _unit(s, level) == a and _unit(d, level) == b)[:5]


def test_graph_helpers_find_a_cycle_and_resolve_relative_imports():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    node = ast.parse("from ..sim import engine").body[0]
    assert _resolve("harness.live.driver", node) == "harness.sim"
    assert "harness.sim.engine" in IMPORTS["harness.live.driver"]  # a module-level import
    assert "harness.runner.assembly" in IMPORTS["harness.bench.sim_child"]  # in a function


@pytest.mark.parametrize("level", ["top", "harness"])
def test_no_import_cycle(level):
    edges = _edges(level)
    if level == "harness":
        edges = {a: {b for b in bs if b in HARNESS_SUBS} for a, bs in edges.items()
                 if a in HARNESS_SUBS}
    bad = _cycles(edges)
    detail = {f"{a} -> {b}": _why(a, b, level) for comp in bad for a in comp
              for b in edges.get(a, ()) if b in comp}
    assert not bad, f"import cycles {bad}: {detail}"


def test_no_upward_import():
    bad = []
    for src, targets in IMPORTS.items():
        a = _unit(src, "harness")
        for dst in targets:
            b = _unit(dst, "harness")
            if a != b and RANK.get(b, 99) >= RANK.get(a, 99):
                bad.append(f"{src} -> {dst}")
    assert not bad, "imports of the same or a higher layer:\n" + "\n".join(sorted(bad))


def test_core_and_the_plugins_import_only_below():
    allowed = {"core": {"core"}, "systems": {"core", "systems"},
               "workloads": {"core", "workloads"}}
    bad = [f"{src} -> {dst}" for src, targets in IMPORTS.items() for dst in targets
           if src.split(".")[0] in allowed and dst.split(".")[0] not in allowed[src.split(".")[0]]]
    assert not bad, "\n".join(sorted(bad))


def test_no_module_over_the_line_limit():
    # the compiled engine core's Cython sources (harness/sim/*.pyx, *.pxd) count too
    cython = [p for pkg in PACKAGES for ext in ("*.pyx", "*.pxd") for p in (ROOT / pkg).rglob(ext)]
    long = {str(p.relative_to(ROOT)): n for p in [*MODULES.values(), *cython]
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_reaches(module: str) -> list[str]:
    """`from m import _x` of another project module, and `name._x` where `name` is bound here
    to another project module or to a name imported from one (a class, a function)."""
    out, foreign = [], {}
    for dst, bound in IMPORTS[module].items():
        if MODULES.get(dst) == MODULES[module]:
            continue
        for local, imported in bound:
            if imported and _private(imported):
                out.append(f"from {dst} import {imported}")
            if local and "." not in local:
                foreign[local] = f"{dst}.{imported}" if imported else dst
    for node in ast.walk(TREES[module]):
        if (isinstance(node, ast.Attribute) and _private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in foreign):
            out.append(f"{node.value.id}.{node.attr} ({foreign[node.value.id]}), "
                       f"line {node.lineno}")
    return out


def test_private_reach_detector():
    src = ("from core import trace\nfrom core.trace import Trace, _x\n"
           "def f():\n    return trace._y, Trace._z, Trace.__name__\n")
    TREES["core.__probe__"] = ast.parse(src)
    MODULES["core.__probe__"] = ROOT / "core" / "__probe__.py"
    try:
        IMPORTS["core.__probe__"] = _imports("core.__probe__")
        found = _private_reaches("core.__probe__")
    finally:
        for d in (TREES, MODULES, IMPORTS):
            d.pop("core.__probe__", None)
    assert found == ["from core.trace import _x", "trace._y (core.trace), line 4",
                     "Trace._z (core.trace.Trace), line 4"]


def test_nothing_reaches_into_another_modules_private_names():
    bad = {m: found for m in MODULES if (found := _private_reaches(m))}
    assert not bad, bad
