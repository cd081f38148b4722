"""Result files: result.json (schema v1) and per-access / per-token / per-transfer parquet
(schema 2.0: stored columns only; `read_tables` returns the full tables, harness/runner/
parquet_io.py).

A run directory is written whole into a hidden temporary sibling and swapped into place in
one step (core/atomic.py), so a failed or killed run leaves no partial result behind and
never removes the previous complete one. The caller holds the run folder's lock
(harness/runner/store.py). result.json is written with sorted keys and a fixed indent; everything
except its `timing` and `environment` blocks is byte-identical for the same config, seed and
code on any machine.

`save_rows: false` in the run's config leaves out accesses.parquet (one row per expert access,
most of a run's bytes); the summary metrics are computed before any file is written, so they
are exact either way, and tokens.parquet and transfers.parquet are always written.

A run that fails (a rejected value inside a sweep, an exception, a MemoryError, a timeout)
leaves a failure record instead (`failure_record`): result.json with `status: failed`, the
config, and an `error` block {kind, type, message, traceback}; no parquet files.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from core.atomic import atomic_dir
from harness.runner.parquet_io import write_tables

RESULT_SCHEMA_VERSION = "1.0"
# Config keys that change where or how a run is shown, not what it computes.
# logger reports a finished run (harness/runner/logger.py); resume, timeout_s and
# blas_threads decide whether and how a run executes, save_rows which
# files it keeps, trace_cache_dir where generated traces are kept (harness/runner/
# trace_cache.py); none changes a metric (harness/runner/guard.py).
NON_SEMANTIC_KEYS = ("progress", "results_dir", "run_name", "experiment_name", "logger",
                     "resume", "timeout_s", "save_rows", "blas_threads", "trace_cache_dir",
                     "time_policy", "engine_core", "policy_kernels")
# Statuses of a finished run, which a rerun would only repeat (`failed` reruns); a valid run
# always has these tables, and accesses.parquet unless save_rows is false.
COMPLETE_STATUSES = ("valid", "oom")
ALWAYS_TABLES = ("tokens", "transfers")
# error.kind of a failure record: a value the run's checks refused, the wall-clock limit, or
# anything else raised inside the job (MemoryError included)
FAILURE_KINDS = ("input", "timeout", "exception")
# Test-only: seconds to sleep between the parquet files and result.json, so a test can kill a
# writer provably inside the write (tests/runner/test_store.py). Unset in normal use.
PAUSE_ENV = "MOEBENCH_TEST_PAUSE_IN_WRITE_S"


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def config_hash(config: dict) -> str:
    semantic = {k: v for k, v in config.items() if k not in NON_SEMANTIC_KEYS}
    return hashlib.sha256(canonical_json(semantic).encode()).hexdigest()


def write_run(run_dir: Path, result: dict, stored: dict | None,
              request_ids: list[str] | None = None, before_swap=None) -> Path:
    """Write result.json (+ the parquet files of the stored tables, `Recorder.
    stored_tables()`) into a temporary sibling, then swap it in. `before_swap()`, when
    given, runs last before the swap; whatever it raises leaves the old folder in place."""
    run_dir = Path(run_dir)
    save_rows = (result.get("config") or {}).get("save_rows", True)
    with atomic_dir(run_dir) as tmp:
        if stored is not None:
            write_tables(tmp, stored, result["run_id"], request_ids, save_rows)
        if os.environ.get(PAUSE_ENV):
            time.sleep(float(os.environ[PAUSE_ENV]))
        text = json.dumps(result, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False)
        (tmp / "result.json").write_text(text + "\n")
        if before_swap is not None:
            before_swap()
    return run_dir


def error_info(exc: BaseException, kind: str) -> dict:
    """The `error` block of a failed run: what was raised, where, and which kind it is."""
    assert kind in FAILURE_KINDS, kind
    return {"kind": kind, "type": type(exc).__name__, "message": str(exc),
            "traceback": "".join(traceback.format_exception(exc))}


def failure_record(cfg: dict, exc: BaseException, kind: str, *, run_id: str, git: dict,
                   environment: dict, system_name: str | None, wall_s: float) -> dict:
    """result.json of a run that failed before it had a result: the config (so the run can
    be repeated), the code version, and the error; no metrics and no tables."""
    return {
        "schema_version": RESULT_SCHEMA_VERSION, "run_id": run_id,
        "experiment": cfg.get("experiment_name"), "run_name": cfg.get("run_name"),
        "config": cfg, "config_sha256": config_hash(cfg), "git": git,
        "environment": environment, "seed": cfg.get("seed"),
        "backend": "sim", "simulated": True, "system": {"name": system_name},
        "status": "failed", "reason": f"{type(exc).__name__}: {exc}",
        "error": error_info(exc, kind), "metrics": None, "trace": None,
        "calibration_trace": None,
        "timing": {"created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
                   "wall_s": wall_s},
    }


def read_result(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "result.json").read_text())


def complete_run(run_dir: Path) -> dict | None:
    """result.json of the finished run in `run_dir` (status valid or oom), or None: no folder,
    no readable record, or a failure record. A valid record counts even when some of its
    tables were deleted since: its metrics are a result a failure must not replace."""
    try:
        old = read_result(run_dir)
    except (OSError, ValueError):
        return None
    return old if isinstance(old, dict) and old.get("status") in COMPLETE_STATUSES else None
