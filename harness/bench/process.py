"""What the bench-sim child measures of its own process: peak and current RSS, CPU seconds,
and a heap trimmed between repeated runs (harness/bench/sim.py)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

# One BLAS thread in every bench child: the figures compare within one run
BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_child(module: str, args: list[str]) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` in the caller's working directory (an installed copy's folder
    is no place to run in), importing this process's code: -P keeps the working directory
    off the child's sys.path, and a checkout's root goes first on PYTHONPATH (an installed
    copy's packages are on sys.path already). BLAS pinned to one thread."""
    from core.paths import PROJECT_ROOT, in_checkout

    env = {**os.environ, **BLAS_ENV}
    if in_checkout():
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-P", "-m", module, *args], env=env,
                          capture_output=True, text=True)


def _status_mb(field: str) -> float | None:
    """A memory line of /proc/self/status (Linux) in MiB, None where it cannot be read."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """Peak RSS of this process since its exec, or since the last `reset_peak()` (MiB).

    VmHWM, not getrusage's ru_maxrss: a child that Python starts with vfork inherits the
    parent's high-water mark in ru_maxrss across exec (a child of a 900 MB pytest worker
    reported 900 MB for a 280 MB run); ru_maxrss only where /proc is missing."""
    hwm = _status_mb("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float | None:
    """RSS of this process now (MiB; Linux /proc), None where it cannot be read."""
    return _status_mb("VmRSS")


def reset_peak() -> bool:
    """Reset the peak to the current RSS (Linux: clear_refs 5 resets VmHWM), so
    the engine's own peak is seen under trace generation's; False where not possible (the
    peaks are then cumulative)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def trim_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc malloc_trim), so a repeated run
    faults its arrays in as a fresh process does: without it, a run's arrays under glibc's
    32 MB mmap threshold reuse the pages of the run before (no page faults) and larger ones do
    not, which made small traces look cheaper per access than large ones. False where the C
    library has no malloc_trim."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def cpu_s_of(fn):
    """(fn(), CPU seconds of this process it took: user + system)."""
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0
