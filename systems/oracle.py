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

import heapq

from core.access import access_sequence
from core.knobs import int_knob
from systems.base import System


def belady_plan(keys: list[int], next_use: list[int], capacity: int):
    """MIN with `capacity` slots over `keys` (next_use: core.access.AccessSequence.next_use).
    Returns (preload keys, [(pos, key, victim, victim_last_pos)]); ties between keys never used
    again: the lowest key leaves first."""
    n, width = len(keys), max(keys, default=0) + 1
    # One int per heap entry, ordered as (-next use, key): (n - next use) * width + key, a
    # never-used-again key counting as next use n. Lazily invalidated: an entry is current
    # while it equals the key's code in `resident`.
    resident: dict[int, int] = {}  # key -> its current code
    last: dict[int, int] = {}  # key -> its last position so far
    heap: list[int] = []
    preload, plan = [], []
    push, pop = heapq.heappush, heapq.heappop
    for p, key in enumerate(keys):
        if key not in resident:
            if len(resident) < capacity:
                preload.append(key)
            else:
                while True:
                    code = pop(heap)
                    victim = code % width
                    if resident.get(victim) == code:
                        break
                del resident[victim]
                plan.append((p, key, victim, last[victim]))
        nu = next_use[p]
        code = (n - (nu if nu < n else n)) * width + key
        resident[key] = code
        last[key] = p
        push(heap, code)
    return preload, plan


class Oracle(System):
    name = "oracle"
    label = "Belady MIN + earliest prefetch (bound; loads exact, latency heuristic)"
    oracle = True

    def __init__(self, lookahead: int = 64, prefetch: bool = True):
        super().__init__(prefetch)  # false: Belady MIN eviction with demand fetches only
        self.lookahead = int_knob(lookahead, "lookahead", lo=1)

    def bind(self, ctx):
        super().bind(ctx)
        seq = access_sequence(ctx.trace, ctx.max_batch)
        keys, starts = seq.keys, seq.block_starts
        self.preload, self.plan = belady_plan(keys, seq.next_use, ctx.capacity_slots)
        block_of = [0] * len(keys)
        for b in range(seq.num_blocks):
            block_of[starts[b]:starts[b + 1]] = [b] * (starts[b + 1] - starts[b])
        self.victim_last_block = [block_of[v_last] for _, _, _, v_last in self.plan]
        self.next = 0  # next plan entry to issue
        self.block = -1  # current block index

    def initial_residents(self):
        return self.preload

    def on_layer_routed(self, routing, now_ms):
        self.block += 1

    def propose_prefetch(self, now_ms):
        out = []
        for i in range(self.next, min(len(self.plan), self.next + self.lookahead)):
            if self.victim_last_block[i] >= self.block:
                break
            out.append(self.plan[i][1])
        return out

    def choose_victim(self, candidates, incoming, demand, now_ms):
        """The plan's next victim when the plan's next load is `incoming` and the victim is
        evictable; else None (a demand fetch waits until the victim has run)."""
        if self.next < len(self.plan) and self.plan[self.next][1] == incoming:
            victim = self.plan[self.next][2]
            if victim in candidates:
                return victim
        return None

    def on_evict(self, key, now_ms):
        # Only the victim choose_victim named is evicted: the plan's next entry is done.
        if self.next < len(self.plan) and self.plan[self.next][2] == key:
            self.next += 1

    def describe(self):
        out = super().describe()
        if hasattr(self, "plan"):
            out["min_loads"] = len(self.plan)
        return out
