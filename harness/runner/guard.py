"""What wraps one job: a wall-clock limit (`timeout_s`) and a BLAS thread cap (`blas_threads`).

Neither changes what a run computes: the limit only decides whether a run is cut short, and
results are identical at any BLAS thread count (docs/trace-format.md, "Portable
determinism"), so a run that finishes writes the same bytes with or without them.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
from collections.abc import Iterator


class JobTimeout(BaseException):
    """The job ran past `timeout_s`. A BaseException (like KeyboardInterrupt) so that no
    `except Exception` inside the run swallows it; the job records it as a failed run."""


def _raise_in(thread_id: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(JobTimeout))


@contextlib.contextmanager
def watchdog(timeout_s: float | None) -> Iterator[None]:
    """Raise JobTimeout in the calling thread once `timeout_s` wall-clock seconds pass.

    In the main thread (the basic launcher, joblib's loky workers, submitit) a SIGALRM
    interval timer raises from its handler; in any other thread (a launcher that runs jobs in
    threads) a timer thread raises asynchronously in the job's thread. Either way the
    exception arrives at the next Python bytecode: one C call that never returns is not cut
    short (the engine's replay loop is Python, so a slow or looping run is)."""
    if timeout_s is None:
        yield
        return
    if threading.current_thread() is threading.main_thread():
        def _fire(signum, frame):
            raise JobTimeout(f"timeout_s: the run took longer than {timeout_s:g} s")

        previous = signal.signal(signal.SIGALRM, _fire)
        signal.setitimer(signal.ITIMER_REAL, float(timeout_s))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return
    tid = threading.get_ident()
    timer = threading.Timer(float(timeout_s), _raise_in, args=(tid,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        # A timer that fired as the body ended leaves an exception pending: clear it.
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)


@contextlib.contextmanager
def blas_threads(threads: int | None) -> Iterator[None]:
    """Cap BLAS and OpenMP pools at `threads` for the job (None: leave them as they are), so
    parallel jobs of one sweep do not oversubscribe the machine's cores."""
    if threads is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=int(threads)):
        yield
