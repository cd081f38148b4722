"""Every function and method outside tests/ is at most MAX_FUNCTION_LINES long, read from the
source with ast (nothing is imported).

A function's length runs from its `def` line to its last line (decorators not counted; a
nested function counts in its own right and inside its owner). Past the limit, split it into
named steps that read top to bottom. Cyclomatic complexity is ruff's C901 (pyproject.toml).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 60
SKIP_TOP = {"tests", "build"}  # plus every hidden folder (.venv, .git, caches)


def _sources() -> list[Path]:
    """The project's .py files: everything below the root but tests/, build/ and hidden
    folders."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if parts[0] in SKIP_TOP or any(p.startswith(".") for p in parts):
            continue
        out.append(path)
    return out


def _long_functions(path: Path) -> list[str]:
    """'file:function:lines' of each function or method in `path` over the limit."""
    rel = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(), filename=rel)
    return [f"{rel}:{node.name}:{node.end_lineno - node.lineno + 1}"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_sources_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert {"core/trace.py", "harness/sim/engine.py", "moebench/cli.py"} <= names
    assert not any(n.startswith(("tests/", ".venv/")) for n in names)


def test_every_function_is_short():
    offenders = [hit for path in _sources() for hit in _long_functions(path)]
    assert not offenders, (f"functions over {MAX_FUNCTION_LINES} lines (file:function:lines; "
                           "split them into named steps): " + ", ".join(offenders))
