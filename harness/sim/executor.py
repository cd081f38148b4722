"""Executors: how the engine's layer step runs one expert on the compute stream.

One interface for both drivers, so the per-MoE-layer step has one code path:
`run(expert, count, ready_ms, now_ms) -> (start_ms, end_ms)` runs `expert` of the running
layer for `count` tokens once its copy has finished (`ready_ms`, later than `now_ms` while
the copy is in flight) and compute is free (`now_ms`); start_ms - now_ms is the access's
stall. SimExecutor advances the virtual clock by the cost model; the live executor
(harness/live/driver.py, which also has `bind_layer(run)` for the engine's `live_layer`)
waits for the real copy, runs the expert and reads the backend's clock. `run_ready` runs a
layer whose experts are all ready with no copy queued; an executor may override it with a
faster loop that records the same rows (tests/sim/test_engine.py checks that it does).
"""

from __future__ import annotations

from harness.sim.recorder import HIT


class Executor:
    """Base: subclasses define run(); run_ready() is the generic loop over it."""

    # tokens -> expert call ms where the duration is a pure cost model (the layer step then
    # inlines `run`: start = max(ready, now), end = start + memo[count]); None: call run().
    memo = None

    def run(self, expert: int, count: int, ready_ms: float, now_ms: float):
        raise NotImplementedError

    def run_ready(self, experts, counts, base: int, owner, first_owner: int, now: float,
                  rec, transfer_of) -> float:
        """Every expert is ready and no copy can start meanwhile: each access is a hit, run in
        the given (ascending id) order. Returns the time compute is free again."""
        add = rec.add_access
        for e, c in zip(experts, counts):
            tid = transfer_of[base + e]
            start, end = self.run(e, c, now, now)
            add((e, HIT, tid, now, start, first_owner if owner is None else owner[e]))
            now = end
        return now


class SimExecutor(Executor):
    """Cost-model time: start = max(ready, now), end = start + backend.expert_ms(count)."""

    def __init__(self, backend):
        self.memo = Durations(backend)  # tokens -> expert call ms

    def run(self, expert: int, count: int, ready_ms: float, now_ms: float):
        start = ready_ms if ready_ms > now_ms else now_ms
        return start, start + self.memo[count]

    def run_ready(self, experts, counts, base: int, owner, first_owner: int, now: float,
                  rec, transfer_of) -> float:
        """The common decode case, kept lean: the same rows as Executor.run_ready with the
        cost model inlined (no call per access)."""
        add, memo = rec.add_access, self.memo
        for e, c in zip(experts, counts):
            add((e, HIT, transfer_of[base + e], now, now,
                 first_owner if owner is None else owner[e]))
            now += memo[c]
        return now


class Durations(dict):
    """tokens -> ms of one expert call, asked of the backend's `cost` method (expert_ms: on
    the GPU; cpu_expert_ms: on the host CPU, harness/sim/cpu_misses.py) once per token count.
    The method is looked up on first use: a live backend has no cost model."""

    def __init__(self, backend, cost: str = "expert_ms"):
        super().__init__()
        self.backend, self.cost = backend, cost

    def __missing__(self, count: int) -> float:
        dur = self[count] = getattr(self.backend, self.cost)(count)
        return dur
