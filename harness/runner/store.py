"""The result store: where a run's folder is, what it may be called, and who may write it.

    <results_dir>/<experiment_name>/<run_name>/        one run (harness/runner/results.py writes it)
    <results_dir>/<experiment_name>/.<run_name>.lock   exists and is locked while a process
                                                       writes the run

`run_name` and `experiment_name` are one safe path component each, checked before any work;
the resolved run folder must lie inside the resolved `results_dir`. A default run name is
readable (the system, then the run's overrides) and ends in the first 8 hex digits of the
config hash, so two configs never share a folder and rerunning a command finds its folder
again. The lock is an flock on a hidden sibling file: the kernel drops it when the process
dies, so a killed run never blocks a later one (its lock file stays, hidden, and is reused),
and a second live writer gets a clear error.

One rule decides what may replace a run folder (`commit`): a failure never replaces a finished
run. A record of status `failed` (a failure record: a bad key inside a sweep, an exception, a
timeout, a full disk) is written only where the folder holds no complete run
(results.complete_run); over a complete run the failure is reported to the caller and the
complete run stays byte-identical. A valid or oom record replaces the folder whole (a rerun).
"""

from __future__ import annotations

import fcntl
import os
import re
import unicodedata
from pathlib import Path

from core.specs import SpecError
from harness.runner.parent import parent_gone
from harness.runner.results import NON_SEMANTIC_KEYS, complete_run, write_run

NAME_MAX_CHARS = 200  # leaves room under the usual 255-byte limit for hidden siblings
NAME_MAX_BYTES = 200  # the same in UTF-8 bytes: file systems limit bytes, not characters
HASH_CHARS = 8
# Overrides that do not change what a run computes are left out of its folder name.
NAME_EXCLUDED = ("experiment", *NON_SEMANTIC_KEYS)
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._=,+@%:-]")


def check_component(key: str, value) -> str:
    """`value` as one safe path component, or SpecError naming `key`."""
    if not isinstance(value, str):
        raise SpecError(f"{key}: must be a string (one folder name), got {value!r}")
    bad = None
    if value == "":
        bad = "is empty"
    elif "/" in value or "\\" in value:
        bad = "contains a path separator"
    elif value.startswith("."):
        bad = "starts with '.' (hidden names, '.' and '..' are reserved)"
    elif any(unicodedata.category(ch).startswith("C") for ch in value):
        bad = "contains a control character"
    elif len(value) > NAME_MAX_CHARS:
        bad = f"is longer than {NAME_MAX_CHARS} characters"
    elif len(value.encode()) > NAME_MAX_BYTES:  # surrogates were refused as category C
        bad = f"is {len(value.encode())} bytes in UTF-8, more than {NAME_MAX_BYTES}"
    if bad:
        raise SpecError(f"{key}: {value!r} {bad}; it must be one folder name")
    return value


def run_dir_of(cfg: dict) -> Path:
    """<results_dir>/<experiment_name>/<run_name>, checked to stay inside results_dir."""
    exp = check_component("experiment_name", cfg.get("experiment_name"))
    run = check_component("run_name", cfg.get("run_name"))
    root = cfg.get("results_dir")
    if not isinstance(root, str) or not root:
        raise SpecError(f"results_dir: must be a non-empty path string, got {root!r}")
    base = Path(root).resolve()
    path = (base / exp / run).resolve()
    if base not in path.parents or path.parent.parent != base:
        raise SpecError(f"run_name/experiment_name: {exp}/{run} resolves to {path}, "
                        f"outside results_dir {base}")
    return Path(root) / exp / run


def default_run_name(task_overrides, system: str, config_sha256: str) -> str:
    """`lru-1a2b3c4d` for a plain run; `lru,hardware.h2d_gbps=16-1a2b3c4d` when other settings
    are overridden. A system's own config groups (`system/evictor=lfu`, a path with a slash)
    follow the system as `evictor=lfu`: `composed,evictor=lfu,prefetcher=none-1a2b3c4d`. The
    readable part is shortened to fit; the hash suffix always stays."""
    groups, others = [], []
    last = {item.lstrip("+~").partition("=")[0]: item.lstrip("+~") for item in task_overrides}
    for item in sorted(last.values()):  # a repeated key counts once, its last value (Hydra's)
        key, _, value = item.partition("=")
        if key.startswith("system/"):  # a part of the system chosen as a config group
            groups.append(f"{key[len('system/'):].replace('/', '.')}={value}")
        elif key != "system" and key.partition(".")[0] not in NAME_EXCLUDED:  # logger.x too
            others.append(item)
    parts = [system, *groups, *others]
    head = ",".join(_UNSAFE_IN_NAME.sub("_", p) for p in parts).lstrip(".")
    room = NAME_MAX_CHARS - HASH_CHARS - 1
    if len(head) > room:
        head = head[:room - 1] + "~"
    return f"{head}-{config_sha256[:HASH_CHARS]}"


class LockHeld(SpecError):
    """Another live process holds the run folder's lock: it will write the folder, so this
    process writes nothing there, not even a failure record."""


class ParentGone(RuntimeError):
    """The sweep that launched this worker is gone (harness/runner/parent.py)."""


def _parent_alive() -> None:
    if parent_gone():
        raise ParentGone("the launching process is gone: this worker writes nothing")


def commit(run_dir: Path, result: dict, tables: dict | None = None,
           request_ids: list[str] | None = None) -> bool:
    """Write the run folder under the rule above; the caller holds its RunLock. False when a
    failure record was not written because the folder holds a complete run. A worker whose
    sweep was killed writes nothing (ParentGone), checked again just before the swap."""
    _parent_alive()
    if result.get("status") == "failed" and complete_run(run_dir) is not None:
        return False
    write_run(run_dir, result, tables, request_ids, before_swap=_parent_alive)
    return True


class RunLock:
    """Exclusive flock on `.<run>.lock` beside a run folder for as long as it is held."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir.with_name(f".{self.run_dir.name}.lock")
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise LockHeld(f"{self.run_dir}: another process (pid {holder}) is writing "
                                "this run folder now; wait for it or choose another run_name"
                                ) from None
            # The holder before us removes the file as it lets go: locking a removed file
            # would lock nothing, so retry until the file we hold is the one at the path.
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # still locked: nobody can hold this one now
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
