"""Sweeps: failure isolation, timeouts, resume after SIGKILL, save_rows=false, progress.

The CLI runs as real processes (the default basic launcher); the kill test SIGKILLs a sweep
while at least one run is complete and at least one is not, and reruns it. Expected values
are literals or read back from what a plain uninterrupted sweep wrote.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT

from harness.runner import sweep
from harness.runner.config import compose_config
from harness.runner.guard import JobTimeout, blas_threads, watchdog
from harness.runner.results import PAUSE_ENV
from harness.runner.sweep import complete_record, run_job, summarize
from harness.runner.sweep_size import sweep_size

TINY = ["workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=2",
        "calibration_requests=2", "progress=false"]
SWEEP = ["-m", "system=on_demand,lru", "seed=0,1", *TINY, "results_dir=results"]
MACHINE = ("timing", "environment")


def cli(args, cwd: Path, env: dict | None = None, **kw):
    return subprocess.run([sys.executable, "-m", "moebench.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, **(env or {})}, **kw)


def runs(exp: Path) -> dict[str, Path]:
    """Visible run folders of an experiment folder (hidden temporaries and locks skipped)."""
    return {p.name: p for p in sorted(exp.iterdir()) if p.is_dir() and not p.name.startswith(".")}


def complete(exp: Path) -> list[str]:
    return [n for n, p in runs(exp).items() if (p / "result.json").is_file()] if exp.is_dir() \
        else []


def record(run_dir: Path) -> dict:
    out = json.loads((run_dir / "result.json").read_text())
    return {k: v for k, v in out.items() if k not in MACHINE}


# ---- resume after SIGKILL ------------------------------------------------------------------

@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("reference")
    done = cli(SWEEP, cwd)
    assert done.returncode == 0, done.stderr
    assert "sweep: 4 done, 0 failed, 0 skipped" in done.stdout
    return cwd / "results" / "default"


def test_a_killed_sweep_resumes_to_the_uninterrupted_result(tmp_path, uninterrupted):
    exp = tmp_path / "results" / "default"
    # Each job sleeps 1 s inside its write, so the kill lands between two complete runs.
    proc = subprocess.Popen([sys.executable, "-m", "moebench.cli", *SWEEP], cwd=tmp_path,
                            env={**os.environ, PAUSE_ENV: "1.0"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not complete(exp) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = complete(exp)
    assert 1 <= len(finished) < 4, finished  # at least one complete, at least one not
    print(f"\nkilled with {len(finished)} of 4 runs complete: {finished}")

    t0 = time.monotonic()
    again = cli(SWEEP[:], tmp_path)
    print(again.stdout, f"resumed in {time.monotonic() - t0:.1f} s")
    assert again.returncode == 0, again.stderr
    assert f"sweep: skipped {len(finished)} complete runs" in again.stdout
    assert f"sweep: {4 - len(finished)} done, 0 failed, {len(finished)} skipped" in again.stdout
    assert sorted(runs(exp)) == sorted(runs(uninterrupted))  # every run exactly once
    for name, path in runs(exp).items():
        assert record(path) == record(uninterrupted / name), name
    leftovers = [p.name for p in exp.iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers  # temporaries, locks, sweep state: all gone

    forced = cli([*SWEEP, "resume=false"], tmp_path)
    assert "sweep: 4 done, 0 failed, 0 skipped" in forced.stdout, forced.stdout


# ---- failure isolation ---------------------------------------------------------------------

def test_a_rejected_value_fails_its_job_and_the_others_run(tmp_path):
    done = cli(["-m", "system=on_demand", "expert_cache_gb=40,4", *TINY, "results_dir=r"],
               tmp_path)
    assert done.returncode == 1, done.stderr
    assert "sweep: 1 done, 1 failed, 0 skipped" in done.stdout
    folders = runs(tmp_path / "r" / "default")
    bad = next(p for n, p in folders.items() if "expert_cache_gb=40," in n)
    good = next(p for n, p in folders.items() if "expert_cache_gb=4," in n)
    failed = json.loads((bad / "result.json").read_text())
    assert failed["status"] == "failed" and failed["error"]["kind"] == "input"
    assert failed["error"]["type"] == "SpecError"
    assert failed["error"]["message"].startswith("expert_cache_gb: 40 GiB exceeds")
    assert "Traceback" in failed["error"]["traceback"]
    assert failed["config"]["expert_cache_gb"] == 40 and failed["metrics"] is None
    assert sorted(p.name for p in bad.iterdir()) == ["result.json"]
    assert json.loads((good / "result.json").read_text())["status"] == "valid"
    from analysis.runs import collect  # a report notes the failure and misses its row

    table = collect(tmp_path / "r" / "default", allow_partial=True)
    assert [r.folder for r in table.results] == [good.name]
    assert table.missing == ["on_demand (expert_cache_gb=40)"]
    assert table.notes == [f"failed (failure record): {bad.name}: {failed['reason']}"]
    # the same value in a single run: a clear error, exit 2, nothing written
    single = tmp_path / "single"
    one = cli(["system=on_demand", "expert_cache_gb=40", *TINY, f"results_dir={single}"],
              tmp_path)
    assert one.returncode == 2 and "Traceback" not in one.stderr
    assert "expert_cache_gb: 40 GiB exceeds" in one.stderr
    assert not list(single.rglob("result.json")) and not (single / "default").exists()


def _cfg(tmp_path: Path, *extra: str, name: str = "run") -> dict:
    return compose_config(["system=lru", *TINY, *extra], run_name=name,
                          results_dir=str(tmp_path))


@pytest.mark.parametrize("multirun", [True, False])
def test_an_exception_or_memory_error_leaves_a_failure_record(tmp_path, monkeypatch, multirun):
    import harness.runner.run as run_module

    def boom(run):
        raise MemoryError("cannot allocate 9 TiB")

    monkeypatch.setattr(run_module, "execute", boom)
    cfg = _cfg(tmp_path)
    out = run_job(cfg, multirun=multirun, system_name="lru")
    assert out["status"] == "failed" and out["reason"] == "MemoryError: cannot allocate 9 TiB"
    rec = json.loads((tmp_path / "default" / "run" / "result.json").read_text())
    assert rec["status"] == "failed" and rec["error"]["kind"] == "exception"
    assert rec["error"]["type"] == "MemoryError" and rec["system"] == {"name": "lru"}
    assert rec["config"] == cfg
    assert complete_record(cfg) == (False, "status failed")  # a failed run reruns


def test_timeout_records_a_failed_run(tmp_path):
    cfg = _cfg(tmp_path, "timeout_s=0.001", "workload.num_requests=8", "workload.prompt_len=64",
               "workload.output_len=16")
    out = run_job(cfg, multirun=True, system_name="lru")
    assert out["status"] == "failed", out
    rec = json.loads((tmp_path / "default" / "run" / "result.json").read_text())
    assert rec["error"]["kind"] == "timeout" and rec["error"]["type"] == "JobTimeout"
    assert rec["error"]["message"] == "timeout_s: the run took longer than 0.001 s"


def test_the_watchdog_cuts_a_loop_in_any_thread_and_spares_a_quick_body():
    def spin(box):
        try:
            with watchdog(0.05):
                while True:
                    pass
        except JobTimeout:
            box.append("timeout")

    box: list = []
    spin(box)  # main thread: SIGALRM
    worker = threading.Thread(target=spin, args=(box,))
    worker.start()
    worker.join(10)
    assert box == ["timeout", "timeout"] and not worker.is_alive()
    with watchdog(5):
        value = sum(range(10))
    time.sleep(0.01)
    assert value == 45  # no exception later either


def test_blas_is_pinned_inside_a_job():
    from threadpoolctl import threadpool_info

    with blas_threads(1):
        inside = [i["num_threads"] for i in threadpool_info()]
    assert inside and set(inside) == {1}


# ---- resume decisions ----------------------------------------------------------------------

def test_complete_record_needs_the_same_code_and_its_tables(tmp_path):
    from harness.runner.assembly import assemble
    from harness.runner.run import execute

    cfg = _cfg(tmp_path)
    run_dir = execute(assemble(cfg)).run_dir
    assert complete_record(cfg) == (True, "complete")
    assert complete_record({**cfg, "resume": False, "timeout_s": 9})[0]  # not semantic
    assert complete_record({**cfg, "seed": 1}) == (False, "another config")
    (run_dir / "accesses.parquet").unlink()
    assert complete_record(cfg) == (False, "no accesses.parquet")
    assert complete_record({**cfg, "save_rows": False}) == (True, "complete")
    text = (run_dir / "result.json").read_text()
    rec = json.loads(text)
    rec["git"]["sha"] = "0" * 40
    (run_dir / "result.json").write_text(json.dumps(rec))
    assert complete_record({**cfg, "save_rows": False}) == (False, "another code version")


def test_save_rows_false_keeps_every_summary(tmp_path):
    from harness.runner.run import run_config

    full = run_config(_cfg(tmp_path, name="full"))
    lean = run_config(_cfg(tmp_path, "save_rows=false", name="lean"))
    files = sorted(p.name for p in (tmp_path / "default" / "lean").iterdir())
    assert files == ["result.json", "tokens.parquet", "transfers.parquet"]
    assert lean["metrics"] == full["metrics"] and lean["config_sha256"] == full["config_sha256"]


# ---- progress and summary ------------------------------------------------------------------

class _Tty(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_line_only_on_a_terminal(tmp_path, monkeypatch):
    (tmp_path / "job-000000.json").write_text("{}")
    (tmp_path / "job-000001.json").write_text("{}")
    monkeypatch.setenv(sweep.STATE_ENV, str(tmp_path))
    monkeypatch.setenv(sweep.TOTAL_ENV, "6")
    monkeypatch.setenv(sweep.START_ENV, repr(time.time() - 60))  # 2 of 6 took 60 s
    log, tty = _Tty(False), _Tty(True)
    sweep.progress_line(2, log)
    sweep.progress_line(2, tty)
    assert log.getvalue() == ""
    assert tty.getvalue() == "sweep: job 3/6, 1m00s elapsed, ETA 2m00s\n"


def test_a_captured_sweep_log_has_no_progress_lines(tmp_path):
    done = cli(["-m", "system=on_demand", "seed=0,1", *TINY, "results_dir=r"], tmp_path)
    assert "sweep: job" not in done.stdout + done.stderr and done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == 3, lines  # one line per finished run, then the summary
    assert lines[0].startswith("[SIMULATED, synthetic routing] on_demand")
    assert lines[-1].startswith("sweep: 2 done, 0 failed, 0 skipped in ")


def test_summary_counts_and_lost_jobs(tmp_path):
    for i, status in enumerate(["done", "failed", "skipped", "done"]):
        (tmp_path / f"job-{i:06d}.json").write_text(json.dumps(
            {"status": status, "run_dir": f"r{i}", "reason": "x" if status == "failed" else None}))
    counts, lines = summarize(tmp_path, 5, 61)
    assert counts == {"done": 2, "failed": 2, "skipped": 1}
    assert lines[0] == "sweep: skipped 1 complete runs (resume=false reruns them)"
    assert lines[1] == "sweep: failed: r1: x"
    assert lines[-1] == "sweep: 2 done, 2 failed, 1 skipped in 1m01s (1 jobs never reported)"


def test_sweep_size_counts_like_the_basic_sweeper():
    n_systems = len(list((ROOT / "conf" / "system").glob("*.yaml")))
    assert sweep_size(["system=lru,on_demand", "seed=0,1,2", "max_batch=1"]) == 6
    assert sweep_size(["seed=range(0,4)", "hardware.h2d_gbps=16,32"]) == 8
    assert sweep_size(["system=glob(*,exclude=[composed])"]) == n_systems - 1
    assert sweep_size(["seed=[unclosed"]) is None  # the line then shows job i/?
