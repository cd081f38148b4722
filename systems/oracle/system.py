"""oracle: a bound, not a system. Belady's MIN over the run's accesses in
(iteration, layer, expert id) order, executed with loads issued as early as the copy engine
and the victim allow. Flagged `oracle: true`; reads the whole trace (future routing).

Its number of loads is MIN's (a true lower bound for any policy at the same budget, when
the cache holds at least one layer's experts of a step); its latency is a heuristic (MIN
minimises loads, not stall). The cache starts with the first `capacity` distinct experts of
the sequence (what MIN would load first anyway, with no eviction); like every system's
preload they are timed copies before serving, counted in h2d bytes, so its copies are MIN's
loads. Needs a schedule that does not depend on timing
(max_batch = 1 or every request arriving at once).
"""

from __future__ import annotations

from array import array

import numpy as np

from core.access import access_sequence
from core.knobs import int_knob
from systems.base import System
from systems.oracle.kernels import load_kernels
from systems.oracle.rule import belady_plan


def belady_plan_columns(keys: np.ndarray, next_use: np.ndarray, capacity: int, fast=None):
    """`belady_plan` (rule.py) as (preload keys, load keys, victims, victims' last
    positions), lists but the last (int64 array); fast: the compiled plan (kernels/plan.pyx,
    the same plan), None: the python rule."""
    if fast is not None:
        pre, key, victim, victim_last = fast.belady_plan_arrays(keys, next_use, capacity)
        return pre.tolist(), key.tolist(), victim.tolist(), victim_last
    preload, plan = belady_plan(keys.tolist(), next_use.tolist(), capacity)
    cols = list(zip(*plan)) or [(), (), (), ()]
    return preload, list(cols[1]), list(cols[2]), np.array(cols[3], dtype=np.int64)


class Oracle(System):
    name = "oracle"
    label = "Belady MIN + earliest prefetch (bound; loads exact, latency heuristic)"
    oracle = True

    def __init__(self, lookahead: int = 64, prefetch: bool = True):
        super().__init__(prefetch)  # false: Belady MIN eviction with demand fetches only
        self.lookahead = int_knob(lookahead, "lookahead", lo=1)

    def bind(self, ctx):
        super().bind(ctx)
        seq = access_sequence(ctx.trace, ctx.max_batch, ctx.gpu_accesses)
        self.preload, self.plan_key, self.plan_victim, victim_last = belady_plan_columns(
            seq.keys_array, seq.next_use_array, ctx.capacity_slots,
            load_kernels(self.policy_kernels))
        # The block of each victim's last use; array('q'): 8 bytes per load, not an int object
        self.victim_last_block = array("q", (np.searchsorted(
            seq.block_starts_array, victim_last, side="right") - 1).tobytes())
        self.next = 0  # next plan entry to issue
        self.block = -1  # current block index

    def initial_residents(self):
        return self.preload

    def on_layer_routed(self, routing, now_ms):
        self.block += 1

    def propose_prefetch(self, now_ms):
        out, last_block, block = [], self.victim_last_block, self.block
        for i in range(self.next, min(len(last_block), self.next + self.lookahead)):
            if last_block[i] >= block:
                break
            out.append(self.plan_key[i])
        return out

    def choose_victim(self, candidates, incoming, demand, now_ms):
        """The plan's next victim when the plan's next load is `incoming` and the victim is
        evictable; else None (a demand fetch waits until the victim has run)."""
        if self.next < len(self.plan_key) and self.plan_key[self.next] == incoming:
            victim = self.plan_victim[self.next]
            if victim in candidates:
                return victim
        return None

    def on_evict(self, key, now_ms):
        # Only the victim choose_victim named is evicted: the plan's next entry is done.
        if self.next < len(self.plan_victim) and self.plan_victim[self.next] == key:
            self.next += 1

    def describe(self):
        out = super().describe()
        if hasattr(self, "plan_key"):
            out["min_loads"] = len(self.plan_key)
        return out
