"""Where a finished run is also reported: the `logger` config group (conf/logger/*.yaml).

  logger=none    (default) the run folder is the record
  logger=csv     one tidy row per run in <results_dir>/<experiment_name>/runs.csv
  logger=wandb   one wandb run per job (harness/runner/wandb_log.py, in a child process)

`log_run` is called after result.json is written and only reads it: instrumentation never
changes a metric, and `logger` is left out of the config hash (harness/runner/results.py).
A logger that fails (wandb missing, offline, a dead endpoint, a full disk) prints a warning
and the run still succeeds: the run folder is the record.

runs.csv: one row per run_id (config hash + code version). Columns are the run's identity,
then `config.<key>` (the flattened config; lists as JSON) and `metrics.<key>` (the flattened
metrics), sorted; a rerun of the same run_id replaces its row, a run with new columns
rewrites the file with the union of columns (empty where a run has no value). Every update
rewrites the file atomically (core/atomic.py) under an flock on `.runs.csv.lock`, so
concurrent jobs of a sweep never lose or interleave rows.
"""

from __future__ import annotations

import csv
import fcntl
import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from core import checks
from core.atomic import write_text
from core.specs import SpecError
from harness.runner.wandb_log import UNREACHABLE

# logger name -> its keys besides `name` (conf/logger/<name>.yaml lists the defaults)
FIELDS = {
    "none": (),
    "csv": (),
    "wandb": ("project", "entity", "mode", "group", "tags", "dir", "timeout_s",
              "max_table_rows"),
}
# Old spellings that once did nothing: refused with the name that works.
OLD_KEYS = {"wandb": "logger=wandb"}
WANDB_MODES = ("offline", "online", "disabled")
CSV_NAME = "runs.csv"
IDENTITY = ("run_id", "experiment", "run_name", "status", "reason", "system", "model",
            "hardware", "simulated", "synthetic_routing", "trace_sha256", "config_sha256",
            "git_sha", "git_dirty", "created_utc", "wall_s")


def warn(msg: str) -> None:
    print(f"moebench: warning: {msg}", file=sys.stderr, flush=True)


def check_logger(cfg: dict) -> None:
    """SpecError naming the first bad `logger.` key (or an old spelling); absent: none."""
    for key, new in OLD_KEYS.items():
        if key in cfg:
            raise SpecError(f"{key}: no such key; logging to wandb is the logger group: "
                            f"use {new} (logger=none|csv|wandb, docs/sweeps.md 'Loggers')")
    node = cfg.get("logger")
    if node is None:
        return
    if not isinstance(node, dict) or node.get("name") not in FIELDS:
        raise SpecError(f"logger: must be one of {sorted(FIELDS)} (logger=NAME), got {node!r}")
    name = node["name"]
    unknown = sorted(set(node) - {"name", *FIELDS[name]})
    if unknown:
        raise SpecError(f"logger.{unknown[0]}: unknown key of logger={name} (known: "
                        f"{sorted(FIELDS[name])})")
    if name == "wandb":
        _check_wandb(node)


def _check_wandb(node: dict) -> None:
    for key in ("project", "entity", "group", "dir"):
        value = node.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise SpecError(f"logger.{key}: must be a non-empty string or null, got {value!r}")
    if node.get("mode") not in (None, *WANDB_MODES):
        raise SpecError(f"logger.mode: must be one of {list(WANDB_MODES)} or null (WANDB_MODE, "
                        f"else offline), got {node.get('mode')!r}")
    tags = node.get("tags")
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise SpecError(f"logger.tags: must be a list of non-empty strings, got {tags!r}")
    checks.number(node.get("timeout_s"), "logger.timeout_s", lo=5, error=SpecError,
                  note="the wandb child is killed past it")
    checks.integer(node.get("max_table_rows"), "logger.max_table_rows", lo=0, error=SpecError)


def log_run(cfg: dict, result: dict, run_dir: Path) -> None:
    """Report one finished run to the configured logger; never raises."""
    node = cfg.get("logger") or {"name": "none"}
    try:
        if node["name"] == "csv":
            append_csv_row(Path(run_dir).parent / CSV_NAME, csv_row(result))
        elif node["name"] == "wandb":
            log_wandb(node, cfg, Path(run_dir))
    except Exception as exc:  # noqa: BLE001 - a logger never fails the run it reports
        warn(f"logger={node['name']} failed ({type(exc).__name__}: {exc}); the run's own "
             f"folder {run_dir} is the record")


# ---- csv --------------------------------------------------------------------------------------

def flatten(node, prefix: str) -> dict[str, object]:
    """{"a.b": leaf} for nested dicts; lists as compact JSON; None as an empty cell."""
    out: dict[str, object] = {}
    for key, value in (node or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value, sort_keys=True, separators=(",", ":"))
        else:
            out[name] = "" if value is None else value
    return out


def csv_row(result: dict) -> dict[str, object]:
    trace, git = result.get("trace") or {}, result.get("git") or {}
    ident = {
        "run_id": result.get("run_id"), "experiment": result.get("experiment"),
        "run_name": result.get("run_name"), "status": result.get("status"),
        "reason": result.get("reason"), "system": (result.get("system") or {}).get("name"),
        "model": (result.get("model") or {}).get("name"), "hardware": result.get("hardware"),
        "simulated": result.get("simulated"), "synthetic_routing": trace.get("synthetic"),
        "trace_sha256": trace.get("sha256"), "config_sha256": result.get("config_sha256"),
        "git_sha": git.get("sha"), "git_dirty": git.get("dirty"),
        "created_utc": (result.get("timing") or {}).get("created_utc"),
        "wall_s": (result.get("timing") or {}).get("wall_s"),
    }
    row = {k: ("" if v is None else v) for k, v in ident.items()}
    row.update(flatten(result.get("config"), "config."))
    row.update(flatten(result.get("metrics"), "metrics."))
    return row


def append_csv_row(path: Path, row: dict[str, object]) -> None:
    """Add (or replace, same run_id) one row of runs.csv, atomically, under its lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for one read-and-rewrite of a small file
        rows = []
        if path.is_file():
            with path.open(newline="") as fh:
                rows = [r for r in csv.DictReader(fh) if r.get("run_id") != str(row["run_id"])]
        rows.append(row)
        seen = {k for r in rows for k in r}
        columns = [*IDENTITY, *sorted(seen - set(IDENTITY))]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        write_text(path, buf.getvalue())
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


# ---- wandb ------------------------------------------------------------------------------------

def wandb_mode(node: dict) -> str:
    """logger.mode, else WANDB_MODE when it names a mode, else offline (never online unasked)."""
    if node.get("mode"):
        return node["mode"]
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    return env if env in WANDB_MODES else "offline"


def log_wandb(node: dict, cfg: dict, run_dir: Path) -> None:
    """Run harness/runner/wandb_log.py on the finished run folder in a child process (its own
    session), killed with everything it started past logger.timeout_s: a hung upload or a
    dead endpoint costs at most that long and never the run."""
    mode = wandb_mode(node)
    if mode == "disabled":
        return
    if importlib.util.find_spec("wandb") is None:
        warn("logger=wandb: the wandb package is not installed (pip install -e '.[wandb]'); "
             f"not logged, the run folder {run_dir} is the record")
        return
    wandb_dir = node.get("dir") or os.environ.get("WANDB_DIR") or str(
        Path(cfg["results_dir"]) / cfg["experiment_name"] / ".wandb")
    spec = {**node, "mode": mode, "dir": wandb_dir,
            "group": node.get("group") or cfg.get("experiment_name")}
    Path(wandb_dir).mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + float(node["timeout_s"])
    code, text = _wandb_child(run_dir, spec, deadline)
    if code == UNREACHABLE:  # online init failed: the same id, offline, for `wandb sync`
        print(text, file=sys.stderr, flush=True)
        code, text = _wandb_child(run_dir, {**spec, "mode": "offline"}, deadline)
    if code is None:
        warn(f"logger=wandb: gave up after logger.timeout_s={node['timeout_s']:g} s; the run "
             f"folder {run_dir} is the record")
    elif code != 0:
        warn(f"logger=wandb: not logged (exit {code}): {text[-800:]}")
    elif text:
        print(text, file=sys.stderr, flush=True)


def _wandb_child(run_dir: Path, spec: dict, deadline: float) -> tuple[int | None, str]:
    """(exit status, output) of one wandb_log child; (None, ...) when killed at the deadline."""
    left_s = deadline - time.monotonic()
    if left_s <= 0:
        return None, ""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.runner.wandb_log", str(run_dir), json.dumps(spec)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, env={**os.environ, "WANDB_MODE": spec["mode"],
                                     "WANDB_SILENT": os.environ.get("WANDB_SILENT", "true")})
    try:
        out, _ = proc.communicate(timeout=left_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return None, ""
    except BaseException:  # a job timeout or ^C while waiting: leave no child behind
        _kill_group(proc)
        raise
    return proc.returncode, out.decode(errors="replace").strip()


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and the wandb service it started
    except ProcessLookupError:
        pass
    proc.wait()
