"""An installed copy (no git checkout of its own) still names its code, and runs resume on it.

Outside a checkout the code version is the package version plus a digest of the source
(.py under the packages, conf yaml); the run's run_id, resume (sweep.complete_record) and the
trace cache key (trace_cache.code_key) all compare that one identity. In a checkout the
identity is the git one, unchanged: the expected run_id below is computed by hand from the
formula result.json files already carry. Shared data: an installed copy reads only
MOEBENCH_SHARED_DATA.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

import core.shared_data as shared_data
from harness.runner import provenance, sweep, trace_cache
from harness.runner.config import compose_config
from harness.runner.provenance import code_identity, code_version, run_id

TINY = ["workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=2",
        "calibration_requests=2", "progress=false"]


def _tree(root: Path) -> Path:
    """A folder laid out like site-packages with this project installed."""
    (root / "core").mkdir(parents=True)
    (root / "core" / "paths.py").write_text("X = 1\n")
    (root / "systems" / "evictors").mkdir(parents=True)
    (root / "systems" / "evictors" / "lru.py").write_text("Y = 2\n")
    (root / "conf" / "system").mkdir(parents=True)
    (root / "conf" / "system" / "lru.yaml").write_text("a: 1\n")
    return root


def test_outside_git_the_version_and_a_source_digest_name_the_code(tmp_path):
    root = _tree(tmp_path / "site")
    one = code_version(root)
    assert (one["sha"], one["dirty"], one["dirty_sha256"]) == (None, None, None)
    assert len(one["source_sha256"]) == 64 and "version" in one
    provenance.source_sha256.cache_clear()
    (root / "results").mkdir()  # outputs, caches and byte code are not source
    (root / "results" / "x.py").write_text("nothing\n")
    (root / "core" / "__pycache__").mkdir()
    (root / "core" / "__pycache__" / "paths.cpython-311.pyc").write_bytes(b"\0")
    assert code_version(root)["source_sha256"] == one["source_sha256"]
    for rel, text in (("systems/evictors/lru.py", "Y = 3\n"), ("conf/system/lru.yaml", "a: 2\n")):
        provenance.source_sha256.cache_clear()
        before = code_version(root)
        (root / rel).write_text(text)
        provenance.source_sha256.cache_clear()
        after = code_version(root)
        assert after["source_sha256"] != before["source_sha256"], rel
        assert run_id("ab" * 32, after) != run_id("ab" * 32, before)


def test_an_installed_copy_inside_some_checkout_is_not_that_checkout(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo, check=True)
    site = _tree(repo / ".venv" / "lib" / "site-packages")
    code = code_version(site)
    assert code["sha"] is None and code["source_sha256"]


def test_the_checkout_run_id_is_the_git_formula():
    code = {"sha": "f" * 40, "dirty": False, "dirty_files": [], "dirty_sha256": None}
    expected = hashlib.sha256(f"{'ab' * 32}|{'f' * 40}|None".encode()).hexdigest()[:16]
    assert run_id("ab" * 32, code) == expected


def _installed(digest: str) -> dict:
    return {"sha": None, "dirty": None, "dirty_files": None, "dirty_sha256": None,
            "version": "0.1.0", "source_sha256": digest}


def test_resume_and_the_trace_cache_use_the_installed_identity(tmp_path, monkeypatch):
    import harness.runner.run as run_module

    current = {"code": _installed("1" * 64)}
    for module in (run_module, sweep, trace_cache):
        monkeypatch.setattr(module, "code_version", lambda: current["code"])
    trace_cache.code_key.cache_clear()
    cfg = compose_config(["system=on_demand", *TINY, f"trace_cache_dir={tmp_path / 'cache'}"],
                         run_name="r", results_dir=str(tmp_path / "results"))
    result = run_module.run_config(cfg)
    assert result["git"]["source_sha256"] == "1" * 64
    assert result["run_id"] == run_id(result["config_sha256"], _installed("1" * 64))
    assert sweep.complete_record(cfg) == (True, "complete")
    assert trace_cache.code_key() == code_identity(_installed("1" * 64))
    current["code"] = _installed("2" * 64)  # the installed source changed
    trace_cache.code_key.cache_clear()
    assert sweep.complete_record(cfg) == (False, "another code version")
    assert trace_cache.code_key() != code_identity(_installed("1" * 64))
    current["code"] = {**_installed(None), "version": None}  # nothing names the code
    assert sweep.complete_record(cfg)[1].startswith("code version unknown")
    trace_cache.code_key.cache_clear()


def test_an_installed_copy_reads_shared_data_only_from_the_variable(tmp_path, monkeypatch):
    monkeypatch.setattr(shared_data, "in_checkout", lambda: False)
    monkeypatch.delenv(shared_data.ENV_VAR, raising=False)
    assert shared_data.shared_data_dir() is None
    assert shared_data.shared_file("mmlu") is None
    with pytest.raises(FileNotFoundError, match=shared_data.ENV_VAR):
        shared_data.require_shared_file("mmlu", "x.jsonl")
    (tmp_path / "mmlu").mkdir()
    monkeypatch.setenv(shared_data.ENV_VAR, str(tmp_path))
    assert shared_data.shared_file("mmlu") == tmp_path / "mmlu"
