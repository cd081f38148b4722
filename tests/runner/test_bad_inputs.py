"""Bad inputs through the real CLI: each case of tests/bad_input_cases.py writes its files,
runs `moebench` in a subprocess and expects a non-zero exit, no traceback, a message naming
the file and line or the field / key, and a results folder byte-identical to before (it
holds an earlier good run).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bad_input_cases import CASES
from helpers import snapshot

pytestmark = pytest.mark.fault


def _moebench(argv, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MOEBENCH_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "moebench.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A results folder holding one good run, as after a real session."""
    root = tmp_path_factory.mktemp("results")
    done = _moebench(("system=on_demand", "workload.num_requests=2", "workload.prompt_len=8",
                      "workload.output_len=3", f"results_dir={root}", "progress=false"), root)
    assert done.returncode == 0, done.stderr
    assert any(p.name == "result.json" for p in root.rglob("*"))
    return root


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_and_writes_nothing(case, results, tmp_path):
    for name, content in case.files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    before = snapshot(results)
    argv = [a.replace("{dir}", str(tmp_path)).replace("{results}", str(results))
            for a in case.argv]
    done = _moebench(argv, tmp_path)
    assert done.returncode != 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert snapshot(results) == before  # nothing written, nothing removed
    assert re.search(case.error, done.stderr), done.stderr


def test_cases_are_many_and_distinct():
    assert len({c.id for c in CASES}) == len(CASES) >= 50
