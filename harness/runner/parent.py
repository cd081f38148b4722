"""A job never outlives the process that launched it.

A sweep's parent (the `moebench -m` process, or `moebench reproduce`, which starts one per
sweep) exports its pid as MOEBENCH_PARENT_PID before it starts workers (joblib's loky
processes, a child sweep). A process that finds the variable naming another process than
itself watches it: a daemon thread polls every POLL_S whether its parent is still that pid
(`os.getppid()`: a dead parent's children are handed to init or a subreaper, so a reused
pid cannot fool it) and ends the process at once when it is not. The store asks
`parent_gone()` again just before it swaps a run folder into place (store.commit), so a
worker killed between two polls writes nothing either: after `kill -9` of the parent, no
run folder changes.

With the basic launcher the jobs run in the parent itself, and die with it.
"""

from __future__ import annotations

import os
import sys
import threading
import time

ENV = "MOEBENCH_PARENT_PID"
POLL_S = 0.1  # how late a worker may notice; the store checks once more before each swap
_watched: list[int] = []  # the pid this process watches (empty: none)


def _expected() -> int | None:
    value = os.environ.get(ENV, "")
    return int(value) if value.isdigit() and int(value) != os.getpid() else None


def parent_gone() -> bool:
    """True when this process was launched by a watched parent that has since died."""
    return bool(_watched) and os.getppid() != _watched[0]


def _watch() -> None:
    while not parent_gone():
        time.sleep(POLL_S)
    print(f"moebench: the launching process (pid {_watched[0]}) is gone; this worker "
          f"(pid {os.getpid()}) stops without writing", file=sys.stderr, flush=True)
    os._exit(3)


def watch_parent() -> None:
    """Start watching MOEBENCH_PARENT_PID when it names this process's parent (once per
    process; a no-op in the parent itself and where the variable is unset)."""
    pid = _expected()
    if _watched or pid is None or os.getppid() != pid:
        return
    _watched.append(pid)
    threading.Thread(target=_watch, name="moebench-parent-watch", daemon=True).start()


def launching(env: dict | None = None) -> dict:
    """The environment for workers this process launches: it names this process."""
    out = dict(os.environ if env is None else env)
    out[ENV] = str(os.getpid())
    return out
