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

from core.blocks import BlockIndex
from core.knobs import int_knob
from core.schedule import schedule_is_timing_independent, static_schedule
from systems.base import System

_NEVER = 1 << 62


def access_sequence(trace, max_batch: int) -> tuple[list[int], list[int]]:
    """Keys in engine order and, per non-empty block, the position of its first access."""
    index = BlockIndex(trace)
    L, E = trace.num_layers, trace.num_experts
    keys, block_starts = [], []
    for _, members in static_schedule(trace.arrival_ms, trace.output_len, max_batch):
        for layer in range(L):
            union, _, _ = index.union({r: index.block(r, s, layer) for r, s in members})
            if union:
                block_starts.append(len(keys))
                keys.extend(layer * E + e for e in union)
    return keys, block_starts


def belady_plan(keys: list[int], capacity: int):
    """MIN with `capacity` slots. Returns (preload keys, [(pos, key, victim, victim_last_pos)])."""
    n = len(keys)
    next_use, seen = [_NEVER] * n, {}
    for p in range(n - 1, -1, -1):
        next_use[p] = seen.get(keys[p], _NEVER)
        seen[keys[p]] = p
    resident: dict[int, int] = {}  # key -> its next use
    last: dict[int, int] = {}
    heap: list[tuple[int, int]] = []  # (-next use, key), lazily invalidated
    preload, plan = [], []
    for p, key in enumerate(keys):
        if key not in resident:
            if len(resident) < capacity:
                preload.append(key)
            else:
                while True:
                    nu, victim = heapq.heappop(heap)
                    if resident.get(victim) == -nu:
                        break
                del resident[victim]
                plan.append((p, key, victim, last[victim]))
        resident[key] = next_use[p]
        last[key] = p
        heapq.heappush(heap, (-next_use[p], key))
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
        trace = ctx.trace
        if not schedule_is_timing_independent(trace.arrival_ms, ctx.max_batch):
            raise ValueError("oracle needs a schedule that does not depend on timing: "
                             "max_batch = 1 or every request arriving at the same time")
        keys, starts = access_sequence(trace, ctx.max_batch)
        self.preload, self.plan = belady_plan(keys, ctx.capacity_slots)
        block_of = [0] * len(keys)
        for b, p0 in enumerate(starts):
            p1 = starts[b + 1] if b + 1 < len(starts) else len(keys)
            block_of[p0:p1] = [b] * (p1 - p0)
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
        if self.next < len(self.plan) and self.plan[self.next][1] == incoming:
            victim = self.plan[self.next][2]
            if victim in candidates:
                self.next += 1
                return victim
        return None

    def describe(self):
        out = super().describe()
        if hasattr(self, "plan"):
            out["min_loads"] = len(self.plan)
        return out
