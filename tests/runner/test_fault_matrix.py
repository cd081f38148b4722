"""The store's one rule, as a matrix: a failure never replaces a finished run.

Every failure path (a bad key, an exception, a timeout, a full disk, a read-only store, an
unusable trace cache, a crafted trace, a lost lock, a failing or slow logger) runs in a sweep
job (`run_job(multirun=True)`, `resume=false` so the job does run) over a run folder that
holds a complete run of the same config, and over an empty one:

- over the complete run: its files are byte-identical afterwards, and the failure is
  reported (the job's outcome is `failed`, stderr says why and that the run was kept);
- over an empty folder: the failure record is written where one can be (status failed, the
  error's kind), and nothing where the store cannot be written.

Paths that must not fail at all (an unusable cache, a failing logger) run to a valid record
with a warning. Disk-full and read-only stores are injected write failures (no root or loop
device). Expected values are literals.
"""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import rewrite_trace, set_array, snapshot

import harness.runner.results as results_module
import harness.runner.sweep as sweep_module
import harness.runner.trace_cache as trace_cache
from core.trace import TraceError, write_trace
from harness.runner.assembly import load_routing
from harness.runner.config import compose_config
from harness.runner.run_types import RunMemo
from harness.runner.store import RunLock
from harness.runner.sweep import run_job
from harness.sim.engine import Engine

pytestmark = pytest.mark.fault
TINY = ["workload.prompt_len=8", "workload.output_len=3", "calibration_requests=2",
        "progress=false", "resume=false", "trace_cache_dir=null"]


def _cfg(root: Path, *extra: str) -> dict:
    return compose_config(["system=on_demand", "workload.num_requests=2", *TINY, *extra],
                          run_name="r", results_dir=str(root))


def _complete(root: Path) -> tuple[Path, dict]:
    """A complete run of the plain config in <root>/default/r, and its bytes."""
    out = run_job(_cfg(root), multirun=True, system_name="on_demand")
    assert out["status"] == "done", out
    run_dir = root / "default" / "r"
    return run_dir, snapshot(run_dir)


def _record(run_dir: Path) -> dict | None:
    path = run_dir / "result.json"
    return json.loads(path.read_text()) if path.is_file() else None


# ---- failure paths: (id, config overrides, setup(monkeypatch, root) -> None, error kind) ---
def _raise_in_engine(monkeypatch, root):
    def boom(self):
        raise RuntimeError("the engine broke")
    monkeypatch.setattr(Engine, "run", boom)


def _disk_full_tables(monkeypatch, root):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(results_module, "write_tables", full)


def _slow_logger_is_no_timeout(monkeypatch, root):
    monkeypatch.setattr(sweep_module, "log_run", lambda *a: time.sleep(1.5))


FAILURES = [
    ("timeout_s=-1", ["timeout_s=-1"], None, "input"),
    ("timeout_s=abc", ["timeout_s=abc"], None, "input"),
    ("timeout_s=[1,2]", ["timeout_s=[1,2]"], None, "input"),
    ("blas_threads=abc", ["blas_threads=abc"], None, "input"),
    ("bad-knob", ["system.prefetch=maybe"], None, "input"),
    ("exception", [], _raise_in_engine, "exception"),
    ("timeout", ["timeout_s=0.001", "workload.num_requests=2"], None, "timeout"),
    ("disk-full", [], _disk_full_tables, "exception"),
]


@pytest.mark.parametrize("case_id,extra,setup,kind", FAILURES, ids=[f[0] for f in FAILURES])
def test_a_failure_keeps_the_complete_run(tmp_path, monkeypatch, capsys, case_id, extra, setup,
                                          kind):
    run_dir, before = _complete(tmp_path)
    if setup:
        setup(monkeypatch, tmp_path)
    capsys.readouterr()
    out = run_job(_cfg(tmp_path, *extra), multirun=True, system_name="on_demand")
    err = capsys.readouterr().err
    assert out["status"] == "failed", out
    assert "kept the complete run" in err and str(run_dir) in err, err
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("case_id,extra,setup,kind", FAILURES, ids=[f[0] for f in FAILURES])
def test_a_failure_over_no_run_writes_its_record(tmp_path, monkeypatch, case_id, extra, setup,
                                                 kind):
    if setup:
        setup(monkeypatch, tmp_path)
    out = run_job(_cfg(tmp_path, *extra), multirun=True, system_name="on_demand")
    assert out["status"] == "failed", out
    rec = _record(tmp_path / "default" / "r")
    assert rec["status"] == "failed" and rec["error"]["kind"] == kind, rec
    assert sorted(p.name for p in (tmp_path / "default" / "r").iterdir()) == ["result.json"]


def test_a_read_only_store_writes_nothing_and_says_why(tmp_path, monkeypatch, capsys):
    run_dir, before = _complete(tmp_path)

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(results_module, "atomic_dir", read_only)
    out = run_job(_cfg(tmp_path), multirun=True, system_name="on_demand")
    assert out["status"] == "failed" and "Read-only file system" in out["reason"]
    assert snapshot(run_dir) == before
    fresh = run_job(_cfg(tmp_path / "other"), multirun=True, system_name="on_demand")
    assert fresh["status"] == "failed" and "no failure record" in fresh["reason"]
    assert not (tmp_path / "other" / "default" / "r").exists()
    assert "no failure record" in capsys.readouterr().err


# ---- crafted traces: an input error, never a record over a finished run ---------------------
def _deep_header(path: Path) -> None:
    """The header member replaced by a JSON array nested 200,000 levels deep."""
    deep = np.frombuffer(b"[" * 200_000 + b"]" * 200_000, np.uint8)
    rewrite_trace(path, path, set_array("header_json", deep))


@pytest.mark.parametrize("craft", ["deep-header", "zero-requests"])
def test_a_crafted_trace_keeps_the_run_of_its_path(tmp_path, craft, capsys):
    from core.specs import model_spec_from_dict
    from core.trace import trace_from_routing

    good = _cfg(tmp_path)
    trace = load_routing(good, model_spec_from_dict(good["model"]), "measure")
    path = tmp_path / "routing.npz"
    write_trace(trace, path)
    cfg = compose_config(["system=on_demand", *TINY, f"routing={path}"], run_name="r",
                         results_dir=str(tmp_path))
    assert run_job(cfg, multirun=True, system_name="on_demand")["status"] == "done"
    run_dir = tmp_path / "default" / "r"
    before = snapshot(run_dir)
    if craft == "deep-header":
        _deep_header(path)
    else:
        write_trace(trace_from_routing(trace.meta, []), path)
    capsys.readouterr()
    out = run_job(cfg, multirun=True, system_name="on_demand")
    assert out["status"] == "failed" and "TraceError" in out["reason"], out
    assert "Traceback" not in capsys.readouterr().err
    assert snapshot(run_dir) == before
    with pytest.raises(TraceError, match="routing.npz"):  # a single run: the plain error
        run_job(cfg, multirun=False, system_name="on_demand")
    assert snapshot(run_dir) == before


# ---- a live writer holds the folder: the loser writes nothing -------------------------------
@pytest.mark.parametrize("with_run", [True, False])
def test_losing_the_lock_writes_no_record(tmp_path, capsys, with_run):
    run_dir = tmp_path / "default" / "r"
    before = _complete(tmp_path)[1] if with_run else {}
    with RunLock(run_dir):
        out = run_job(_cfg(tmp_path), multirun=True, system_name="on_demand")
    assert out["status"] == "failed" and "is writing this run folder" in out["reason"]
    assert "is writing this run folder" in capsys.readouterr().err
    assert (snapshot(run_dir) if run_dir.exists() else {}) == before


# ---- paths that must not fail the run -------------------------------------------------------
@pytest.mark.parametrize("where", ["a-file", "proc", "read-only"])
def test_an_unusable_trace_cache_costs_the_cache_not_the_run(tmp_path, monkeypatch, capsys,
                                                             where):
    run_dir, before = _complete(tmp_path)
    cache = {"a-file": tmp_path / "plain.txt", "proc": Path("/proc/nope"),
             "read-only": tmp_path / "cache"}[where]
    if where == "a-file":
        cache.write_text("not a folder")
    if where == "read-only":
        def refuse(self):
            raise OSError(errno.EROFS, "Read-only file system")
        monkeypatch.setattr(trace_cache._KeyLock, "__enter__", refuse)
    out = run_job(_cfg(tmp_path, f"trace_cache_dir={cache}"), multirun=True,
                  system_name="on_demand")
    assert out["status"] == "done", out
    assert "trace cache" in capsys.readouterr().err
    after = _record(run_dir)
    assert after["status"] == "valid"
    assert after["metrics"] == json.loads(before["result.json"])["metrics"]


def test_a_failing_logger_warns_and_keeps_the_run(tmp_path, capsys):
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "runs.csv").mkdir()  # the csv logger cannot write its file
    out = run_job(_cfg(tmp_path, "logger=csv"), multirun=True, system_name="on_demand")
    assert out["status"] == "done"
    assert "logger=csv failed" in capsys.readouterr().err
    assert _record(tmp_path / "default" / "r")["status"] == "valid"


def test_the_logger_runs_outside_timeout_s(tmp_path, monkeypatch):
    """A run well inside timeout_s whose logger then takes longer than timeout_s."""
    memo = RunMemo()  # the trace and compute floor made before: the run itself is quick
    run_job(_cfg(tmp_path / "warm"), multirun=True, system_name="on_demand", memo=memo)
    _slow_logger_is_no_timeout(monkeypatch, tmp_path)
    out = run_job(_cfg(tmp_path, "timeout_s=1"), multirun=True, system_name="on_demand",
                  memo=memo)
    assert out["status"] == "done", out
    assert _record(tmp_path / "default" / "r")["status"] == "valid"
