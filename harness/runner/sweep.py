"""One job of a sweep (or a single run): resume, failure isolation, progress, the summary.

A job's outcome is `done`, `failed` or `skipped`:

- skipped: a sweep (`-m`) with `resume: true` finds the run's folder holding a complete record
  of the same run (`complete_record`), and leaves it as it is;
- failed: anything raised inside the job: in a sweep a rejected value too (e.g.
  expert_cache_gb=40 on a 24 GB GPU), an exception, a MemoryError, `timeout_s` passing. The
  job writes a failure record (harness/runner/results.py, `failure_record`) into its run
  folder, atomically and under the folder's lock, unless the folder holds a finished run: a
  failure never replaces one (harness/runner/store.py, `commit`); the failure is then
  reported on stderr and in the summary only. The sweep goes on. A single run keeps the
  plain rule for bad input: the caller gets the SpecError / TraceError (a clear message,
  exit 2, nothing written); other failures write the record there too, under the same rule;
  a process that loses a folder's lock to a live writer writes nothing there;
- done: the run wrote its result (status valid, or oom when the config does not fit).

A value that leaves the job no safe folder name (an unknown top-level key, a NaN, an unsafe
run_name) cannot be recorded in a folder: the job is counted failed, with its message on
stderr. Every job of a sweep drops its outcome into a hidden state folder of the sweep
(`.sweep-<host>-<pid>`, written atomically, so jobs of other launcher processes report
too); `SweepCallback` counts them when the sweep ends and prints one summary line.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from hydra.experimental.callback import Callback

from core.atomic import write_json
from core.specs import SpecError, model_spec_from_dict
from core.trace import TraceError
from harness.runner.guard import JobTimeout, blas_threads, watchdog
from harness.runner.logger import log_run
from harness.runner.parent import ENV as PARENT_ENV
from harness.runner.parent import watch_parent
from harness.runner.provenance import code_identity, code_known, code_version, environment, run_id
from harness.runner.results import (
    ALWAYS_TABLES,
    COMPLETE_STATUSES,
    config_hash,
    failure_record,
)
from harness.runner.run_types import RunMemo
from harness.runner.runconfig import check_run_config
from harness.runner.store import LockHeld, RunLock, commit, run_dir_of

STATE_ENV, TOTAL_ENV, START_ENV = ("MOEBENCH_SWEEP_STATE", "MOEBENCH_SWEEP_TOTAL",
                                   "MOEBENCH_SWEEP_START")
# A file the sweep writes its counts to when it ends (`moebench reproduce` reads it: a sweep
# that never got there stopped before its first job)
COUNTS_ENV = "MOEBENCH_SWEEP_COUNTS"
# The directory a job-file sweep was started in (hydra_plugins/moebench_job_sweeper): a job
# run elsewhere (a Ray worker) works there, where its config's relative paths point
CWD_ENV = "MOEBENCH_SWEEP_CWD"


# ---- resume ---------------------------------------------------------------------------------
def _file_trace_sha(cfg: dict, split: str, memo: RunMemo | None) -> str | None:
    from harness.runner.assembly import load_routing  # memoised: a rerun reads it once

    model = model_spec_from_dict(cfg["model"], "model")
    n = cfg["calibration_requests"] if split == "calibration" else None
    return load_routing(cfg, model, split, n, memo=memo).content_sha256()


def complete_record(cfg: dict, memo: RunMemo | None = None) -> tuple[bool, str]:
    """(True, why) when the run folder holds a complete record of this very run: the same
    config hash and code version (provenance.code_identity: the git sha and the digest of
    uncommitted changes, or an installed copy's version and source digest), a complete
    status, its tables, and the same trace. A synthetic trace is a function of the config
    and the code, so the two keys fix its sha without rebuilding it (a Table 1 trace takes
    seconds to generate); a trace file (`routing`, `calibration_routing`) can change under
    the same path, so it is read and its content sha compared."""
    run_dir = run_dir_of(cfg)
    try:
        old = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return False, "no readable result.json"
    if not isinstance(old, dict) or old.get("status") not in COMPLETE_STATUSES:
        return False, f"status {old.get('status') if isinstance(old, dict) else None}"
    if old.get("config_sha256") != config_hash(cfg):
        return False, "another config"
    code, was = code_version(), old.get("git") or {}
    if not code_known(code):
        return False, "code version unknown (neither a git checkout nor an installed copy)"
    if code_identity(was) != code_identity(code):
        return False, "another code version"
    missing = _missing_table(cfg, run_dir) if old["status"] == "valid" else None
    if missing:
        return False, f"no {missing}.parquet"
    return _same_trace_files(cfg, old, memo)


def _missing_table(cfg: dict, run_dir: Path) -> str | None:
    wanted = (*ALWAYS_TABLES, "accesses") if cfg.get("save_rows", True) else ALWAYS_TABLES
    return next((t for t in wanted if not (run_dir / f"{t}.parquet").is_file()), None)


def _same_trace_files(cfg: dict, old: dict, memo: RunMemo | None) -> tuple[bool, str]:
    """(True, "complete") when every trace file the run read holds the trace it recorded."""
    for key, split, block in (("routing", "measure", "trace"),
                              ("calibration_routing", "calibration", "calibration_trace")):
        recorded = (old.get(block) or {}).get("sha256")
        if cfg.get(key) and recorded is not None:
            try:
                if _file_trace_sha(cfg, split, memo) != recorded:
                    return False, f"{key}: the file's trace changed"
            except (SpecError, TraceError, OSError):
                return False, f"{key}: unreadable (the run reports why)"
    return True, "complete"


# ---- failures -------------------------------------------------------------------------------
def _kind(exc: BaseException) -> str:
    if isinstance(exc, JobTimeout):
        return "timeout"
    return "input" if isinstance(exc, (SpecError, TraceError)) else "exception"


def write_failure(cfg: dict, exc: BaseException, system_name: str | None,
                  wall_s: float) -> tuple[Path, dict | None]:
    """(run folder, the failure record written there), or (run folder, None) when the folder
    holds a complete run, which a failure never replaces (store.commit)."""
    if isinstance(exc, JobTimeout) and not str(exc):  # raised asynchronously, no message
        exc = JobTimeout(f"timeout_s: the run took longer than {cfg.get('timeout_s')} s")
    run_dir = run_dir_of(cfg)
    code = code_version()
    record = failure_record(cfg, exc, _kind(exc), run_id=run_id(config_hash(cfg), code),
                            git=code, environment=environment(), system_name=system_name,
                            wall_s=wall_s)
    with RunLock(run_dir):
        written = commit(run_dir, record)
    return run_dir, record if written else None


# ---- one job --------------------------------------------------------------------------------
def run_job(cfg: dict, *, multirun: bool, system_name: str | None, job_num: int = 0,
            memo: RunMemo | None = None) -> dict:
    """Run one named config; returns {"status": done|failed|skipped, "run_dir", "result"
    (result.json's content), "reason"}. Raises SpecError / TraceError only for a single run's
    bad input. `memo`: traces and floors the caller's jobs share (harness/runner/assembly.py).

    Every key is checked before anything with a side effect (the BLAS cap, the timer, the
    lock, the trace cache); the logger runs after the job's `timeout_s`, bounded by its own
    `logger.timeout_s`."""
    with _sweep_cwd():
        return _run_job(cfg, multirun=multirun, system_name=system_name, job_num=job_num,
                        memo=memo)


@contextmanager
def _sweep_cwd():
    """Work in the directory the sweep was started in (CWD_ENV) for the job's length; the
    process's own directory is back afterwards (a Ray worker runs other jobs too)."""
    target, before = os.environ.get(CWD_ENV), os.getcwd()
    if not target or Path(target) == Path(before):
        yield
        return
    os.chdir(target)  # a missing directory raises: the worker cannot see the sweep's files
    try:
        yield
    finally:
        os.chdir(before)


def _run_job(cfg: dict, *, multirun: bool, system_name: str | None, job_num: int,
             memo: RunMemo | None) -> dict:
    from harness.runner.assembly import assemble
    from harness.runner.run import execute

    t0 = time.perf_counter()
    watch_parent()
    if multirun:
        progress_line(job_num)
    try:
        check_run_config(cfg)
    except (SpecError, TraceError) as exc:
        if not multirun:
            raise
        return report(job_num, _failed(cfg, exc, system_name, t0))
    if multirun and cfg.get("resume", True) and complete_record(cfg, memo)[0]:
        return report(job_num, {"status": "skipped", "run_dir": str(run_dir_of(cfg)),
                                "result": None, "reason": "complete"})
    try:
        with blas_threads(cfg.get("blas_threads")), watchdog(cfg.get("timeout_s")):
            result = execute(assemble(cfg, memo))
    except (SpecError, TraceError) as exc:
        if not multirun:
            raise
        return report(job_num, _failed(cfg, exc, system_name, t0))
    except (Exception, JobTimeout) as exc:  # noqa: BLE001 (a crash is this job's result)
        return report(job_num, _failed(cfg, exc, system_name, t0))
    record = result.record()
    log_run(cfg, record, result.run_dir)  # reads the written record; never raises
    return report(job_num, {"status": "done", "run_dir": str(result.run_dir), "result": record,
                            "reason": None})


def _failed(cfg: dict, exc: BaseException, system_name, t0: float) -> dict:
    """The failed outcome; its record where the store's rule allows one, else the reason on
    stderr with what was kept."""
    import traceback

    if _kind(exc) == "exception":  # a crash: its traceback belongs in the log too
        traceback.print_exception(exc, file=sys.stderr)
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    out = {"status": "failed", "run_dir": None, "result": None, "reason": reason}
    if isinstance(exc, LockHeld):  # the holder writes this folder; nothing to add
        print(f"moebench: error: {exc}", file=sys.stderr, flush=True)
        return out
    try:
        run_dir, record = write_failure(cfg, exc, system_name, time.perf_counter() - t0)
    except (SpecError, OSError) as err:  # no safe folder, another writer holds it, disk full
        out["reason"] += f" (no failure record: {err})"
        print(f"moebench: error: {out['reason']}", file=sys.stderr, flush=True)
        return out
    out["run_dir"] = str(run_dir)
    if record is None:
        out["reason"] += " (the complete run in this folder was kept; no failure record)"
        print(f"moebench: error: {reason}; kept the complete run in {run_dir} (a failure "
              "never replaces a finished run)", file=sys.stderr, flush=True)
    else:
        log_run(cfg, record, run_dir)  # failed runs reach the logger too (never raises)
    return out


def unnamed_failure(job_num: int, exc: BaseException) -> dict:
    """A job whose config cannot name a folder (see the module docstring)."""
    return report(job_num, {"status": "failed", "run_dir": None, "result": None,
                            "reason": f"{exc} (no folder to record it in)"})


# ---- sweep state, progress and summary -----------------------------------------------------
def report(job_num: int, outcome: dict) -> dict:
    """Drop the outcome into the sweep's state folder (when this job is part of a sweep)."""
    state = os.environ.get(STATE_ENV)
    if state and Path(state).is_dir():
        write_json(Path(state) / f"job-{job_num:06d}.json",
                   {k: outcome[k] for k in ("status", "run_dir", "reason")})
    return outcome


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def progress_line(job_num: int, stream=None) -> None:
    """`sweep: job i/N, 1m02s elapsed, ETA 2m10s` on stderr, only when it is a terminal."""
    stream = stream or sys.stderr
    state, start = os.environ.get(STATE_ENV), os.environ.get(START_ENV)
    if not (state and start and stream.isatty()):
        return
    total = os.environ.get(TOTAL_ENV) or "?"
    elapsed = time.time() - float(start)
    finished = len(list(Path(state).glob("job-*.json"))) if Path(state).is_dir() else 0
    eta = "?"
    if finished and total != "?":
        eta = _clock(elapsed / finished * max(int(total) - finished, 0))
    print(f"sweep: job {job_num + 1}/{total}, {_clock(elapsed)} elapsed, ETA {eta}",
          file=stream, flush=True)


def summarize(state: Path, total: int | None, elapsed_s: float) -> tuple[dict, list[str]]:
    """Counts of the sweep's outcomes and the lines that report them."""
    outcomes = []
    for path in sorted(Path(state).glob("job-*.json")):
        try:
            outcomes.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    counts = {s: sum(o.get("status") == s for o in outcomes) for s in ("done", "failed",
                                                                       "skipped")}
    lines = []
    if counts["skipped"]:
        lines.append(f"sweep: skipped {counts['skipped']} complete runs (resume=false reruns "
                     "them)")
    for o in (o for o in outcomes if o.get("status") == "failed"):
        lines.append(f"sweep: failed: {o.get('run_dir') or '(no folder)'}: {o.get('reason')}")
    lost = (total - len(outcomes)) if total is not None and total > len(outcomes) else 0
    counts["failed"] += lost  # a job that never reported (its worker died) did not finish
    lines.append(f"sweep: {counts['done']} done, {counts['failed']} failed, "
                 f"{counts['skipped']} skipped in {_clock(elapsed_s)}"
                 + (f" ({lost} jobs never reported)" if lost else ""))
    return counts, lines


def folder_counts(state: Path) -> dict[str, dict]:
    """{experiment folder name: counts} of the outcomes that name a run folder (a suite's
    one sweep spans many experiment folders; `moebench reproduce` reports each)."""
    out: dict[str, dict] = {}
    for path in sorted(Path(state).glob("job-*.json")):
        try:
            outcome = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if outcome.get("run_dir") and outcome.get("status") in ("done", "failed", "skipped"):
            counts = out.setdefault(Path(outcome["run_dir"]).parent.name,
                                    {"done": 0, "failed": 0, "skipped": 0})
            counts[outcome["status"]] += 1
    return out


def _clean_dead_states(sweep_dir: Path) -> None:
    """Remove the state folders of this host's sweeps whose process is gone (killed)."""
    prefix = f".sweep-{socket.gethostname()}-"
    for folder in sweep_dir.glob(".sweep-*") if sweep_dir.is_dir() else ():
        pid = folder.name[len(prefix):] if folder.name.startswith(prefix) else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _remove_state(folder)


def _remove_state(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def state_folder(sweep_dir: Path, pid: int) -> Path:
    """The state folder of the sweep run by process `pid` on this host."""
    return Path(sweep_dir).resolve() / f".sweep-{socket.gethostname()}-{pid}"


def discard_state(sweep_dir: Path, pid: int) -> None:
    """Remove the state folder of a sweep that stopped before it ended (its callback never
    ran): `moebench reproduce` after a sweep that started no run."""
    _remove_state(state_folder(sweep_dir, pid))


@contextmanager
def counted_sweep():
    """Yield a dict that holds the counts of the sweep run inside once it ends (empty after a
    single run): SweepCallback writes them to the file COUNTS_ENV names, this one's unless the
    caller (`moebench reproduce`) named its own."""
    given = os.environ.get(COUNTS_ENV)
    counts: dict = {}
    with tempfile.TemporaryDirectory(prefix="moebench-counts-") as tmp:
        path = Path(given) if given else Path(tmp) / "counts.json"
        os.environ[COUNTS_ENV] = str(path)
        try:
            yield counts
        finally:
            if not given:
                os.environ.pop(COUNTS_ENV, None)
        if path.is_file():
            counts.update(json.loads(path.read_text()))


class SweepCallback(Callback):
    """Hydra callback (conf/config.yaml, hydra.callbacks): opens the sweep's state folder
    before the first job, prints the summary after the last."""

    def on_multirun_start(self, config, **kwargs) -> None:
        from harness.runner.sweep_size import sweep_total

        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        _clean_dead_states(sweep_dir)
        state = state_folder(sweep_dir, os.getpid())
        state.mkdir(parents=True, exist_ok=True)
        for old in state.glob("job-*.json"):  # a pid reused on this host: start clean
            old.unlink()
        total = sweep_total(config)
        os.environ[STATE_ENV], os.environ[START_ENV] = str(state), repr(time.time())
        os.environ[PARENT_ENV] = str(os.getpid())  # workers stop when this process dies
        os.environ[TOTAL_ENV] = "" if total is None else str(total)

    def on_multirun_end(self, config, **kwargs) -> None:
        state = os.environ.pop(STATE_ENV, None)
        os.environ.pop(PARENT_ENV, None)
        start = float(os.environ.pop(START_ENV, time.time()))
        total = os.environ.pop(TOTAL_ENV, "")
        if not state:
            return
        counts, lines = summarize(Path(state), int(total) if total else None,
                                  time.time() - start)
        for line in lines:
            print(line, flush=True)
        if os.environ.get(COUNTS_ENV):
            write_json(os.environ[COUNTS_ENV], {**counts, "folders": folder_counts(Path(state))})
        _remove_state(Path(state))
