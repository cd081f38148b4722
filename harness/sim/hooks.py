"""The system's engine-facing methods as one namespace, optionally timed.

The engine, the layer step and the copy engine call a policy only through a Hooks object:
each attribute is the system's own bound method, so an untimed call costs what a direct call
costs. With `timed=True` (config `time_policy: true`) each one is wrapped to add its wall time
to `policy_s`; that costs two clock reads per call (about 0.15 us, several percent of an lru
run's engine time), so it is off unless asked for and `timing.policy_s` is then null.
"""

from __future__ import annotations

import time

from systems.base import System

# The hooks the engine calls during a run, in the order docs/engine.md lists them.
HOOKS = ("on_request_start", "on_layer_routed", "propose_prefetch", "choose_victim",
         "on_load", "on_evict", "on_step_end", "on_request_end")


class Hooks:
    def __init__(self, system: System, timed: bool = False):
        self.system, self.timed = system, timed
        self.policy_s = 0.0  # wall seconds inside the hooks (timed only)
        for name in HOOKS:
            fn = getattr(system, name)
            setattr(self, name, self._timed(fn) if timed else fn)
        # Hooks a system leaves at the base class's no-op are not called at all.
        self.wants_load = type(system).on_load is not System.on_load
        self.wants_evict = type(system).on_evict is not System.on_evict

    def _timed(self, fn):
        clock = time.perf_counter

        def call(*args):
            t0 = clock()
            try:
                return fn(*args)
            finally:
                self.policy_s += clock() - t0

        return call
