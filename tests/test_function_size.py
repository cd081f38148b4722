"""Every function and method outside tests/ is at most MAX_FUNCTION_LINES long, read from the
source with ast (nothing is imported); every source file, tests included, is at most
MAX_FILE_LINES long.

A function's length runs from its `def` line to its last line (decorators not counted; a
nested function counts in its own right and inside its owner). Past the limit, split it into
named steps that read top to bottom. Cyclomatic complexity is ruff's C901 (pyproject.toml).
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400
SKIP_TOP = {"tests", "build"}  # plus every hidden folder (.venv, .git, caches)
# Hand-written sources; the .c files next to the .pyx ones are Cython's output
SOURCE_SUFFIXES = {".py", ".pyx", ".pxd", ".h"}


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


def test_every_file_is_short():
    files = [p for p in sorted(ROOT.rglob("*")) if p.suffix in SOURCE_SUFFIXES
             and p.relative_to(ROOT).parts[0] != "build"
             and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]
    assert any(p.suffix == ".pyx" for p in files) and any(p.parts[-2] == "tests" for p in files)
    offenders = [f"{p.relative_to(ROOT).as_posix()}:{n}" for p in files
                 if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not offenders, (f"files over {MAX_FILE_LINES} lines (file:lines; split them by "
                           "what they do): " + ", ".join(offenders))
