"""Iteration scheduler: which requests run together in each engine iteration.

Arrival-driven, prefill first: at each iteration boundary, requests that have arrived are
admitted FIFO while the batch has room (max_batch active requests) and run their prefills
together in one iteration; otherwise the active requests decode one token each in one
iteration. A static batch is every request arriving at time 0. With max_batch = 1, or with
every arrival at the same time, the schedule does not depend on timing, so an offline
oracle can plan it in advance (`static_schedule`).
"""

from __future__ import annotations

from collections import deque

import numpy as np


class Scheduler:
    def __init__(self, arrival_ms: np.ndarray, output_len: np.ndarray, max_batch: int):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        order = np.lexsort((np.arange(len(arrival_ms)), arrival_ms))
        self.pending = deque(int(r) for r in order)
        self.arrival_ms = arrival_ms
        self.output_len = output_len
        self.max_batch = max_batch
        self.active: list[int] = []  # decoding requests, admission order
        self.step: dict[int, int] = {}  # request -> next step to run

    def done(self) -> bool:
        return not self.pending and not self.active

    def next_arrival_ms(self) -> float:
        return float(self.arrival_ms[self.pending[0]])

    def next_iteration(self, now_ms: float) -> tuple[str, list[tuple[int, int]]] | None:
        """(kind, [(request, step)]) to run at now_ms, or None if idle until an arrival."""
        admitted = []
        while (self.pending and self.arrival_ms[self.pending[0]] <= now_ms
               and len(self.active) + len(admitted) < self.max_batch):
            admitted.append(self.pending.popleft())
        if admitted:
            for r in admitted:
                self.step[r] = 0
            return "prefill", [(r, 0) for r in admitted]
        if self.active:
            return "decode", [(r, self.step[r]) for r in self.active]
        return None

    def finish_iteration(self, members: list[tuple[int, int]]) -> list[int]:
        """Advance each member one step; returns the requests that finished."""
        finished = []
        for r, s in members:
            if s == 0:
                self.active.append(r)
            self.step[r] = s + 1
            if s + 1 >= self.output_len[r]:
                finished.append(r)
        if finished:
            gone = set(finished)
            self.active = [r for r in self.active if r not in gone]
        return finished


def static_schedule(arrival_ms: np.ndarray, output_len: np.ndarray, max_batch: int):
    """The iteration sequence when timing cannot change it (all arrivals treated as 0).

    Equals the engine's schedule when max_batch == 1 or every request arrives at once.
    """
    sched = Scheduler(np.zeros_like(arrival_ms, dtype=np.float64), output_len, max_batch)
    # Keep FIFO by the real arrival order, as the engine does.
    sched.pending = deque(int(r) for r in np.lexsort((np.arange(len(arrival_ms)), arrival_ms)))
    out = []
    while not sched.done():
        kind, members = sched.next_iteration(0.0)
        out.append((kind, members))
        sched.finish_iteration(members)
    return out


def schedule_is_timing_independent(arrival_ms: np.ndarray, max_batch: int) -> bool:
    return max_batch == 1 or len(arrival_ms) == 0 or bool(np.all(arrival_ms == arrival_ms[0]))
