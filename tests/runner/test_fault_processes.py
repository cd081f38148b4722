"""Faults between processes, with real processes: a sweep's parent killed with SIGKILL (its
workers stop and write nothing more, with the joblib launcher and with `moebench
reproduce`'s child sweep), and two identical sweeps racing over one experiment folder (every
run ends complete). Slow: `make fault-matrix` and `make test-slow` run them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.runner.results import PAUSE_ENV

pytestmark = [pytest.mark.fault, pytest.mark.slow]
TINY = ["workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=3",
        "calibration_requests=2", "progress=false", "trace_cache_dir=null"]


def _children(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc: Linux)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        found += kids
        frontier = kids
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _results(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("result.json")} if folder.is_dir() \
        else {}


def _kill_while_writing(cmd: list[str], cwd: Path, watch: Path, min_children: int,
                        env: dict | None = None) -> None:
    """Start `cmd` with every write paused 3 s, SIGKILL it while a worker is inside a write,
    then check its workers stop and nothing under `watch` changes afterwards."""
    proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, PAUSE_ENV: "3", **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not list(watch.rglob(".*.tmp-*")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert len(workers) >= min_children, workers
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = _results(watch)
    deadline = time.monotonic() + 5
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [w for w in workers if _alive(w)], "workers outlived their parent"
    time.sleep(4)  # longer than the paused write: a surviving worker would have swapped
    assert _results(watch) == killed_at


def test_killing_a_joblib_sweep_stops_its_workers(tmp_path):
    cmd = [sys.executable, "-m", "moebench.cli", "-m", "hydra/launcher=joblib",
           "hydra.launcher.n_jobs=2", "system=lru,on_demand", "seed=0,1", *TINY,
           "results_dir=r"]
    _kill_while_writing(cmd, tmp_path, tmp_path / "r", min_children=2)


def test_killing_reproduce_stops_its_child_sweep(tmp_path):
    cmd = [sys.executable, "-m", "moebench.cli", "reproduce", "table1", "--jobs", "1",
           "--results", "r", *(f"--override={o}" for o in TINY)]
    _kill_while_writing(cmd, tmp_path, tmp_path / "r", min_children=1,
                        env={"MOEBENCH_SHARED_DATA": str(tmp_path / "absent")})


def test_two_identical_sweeps_leave_every_run_complete(tmp_path):
    cmd = [sys.executable, "-m", "moebench.cli", "-m", "system=lru,on_demand", "seed=0,1",
           *TINY, "results_dir=r"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        p.communicate(timeout=300)
    records = [json.loads(p.read_text()) for p in (tmp_path / "r").rglob("result.json")]
    assert len(records) == 4
    assert [r["status"] for r in records] == ["valid"] * 4
