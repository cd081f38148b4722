"""lifo_inactive: Expert Buffering (Huang et al. 2023, "Towards MoE Deployment: Mitigating
Inefficiencies in Mixture-of-Expert (MoE) Inference", arXiv 2303.06182): experts that are
inactive in the current batch are evicted first, the most recently copied first (LIFO).

Active: accessed or copied in during the current iteration (one forward pass over the
batch); the set empties at the end of each iteration, so copies prefetched for the next
pass count as active in it. Victim: the evictable inactive resident whose copy landed last;
if every evictable resident is active, the active one whose copy landed last. No ties (one
copy at a time). The cache is global (one LIFO order across layers).
"""

from __future__ import annotations

from systems.evictors.base import Evictor


class LIFOInactiveEvictor(Evictor):
    name = "lifo_inactive"

    def bind(self, ctx):
        super().bind(ctx)
        self.order: dict[int, None] = {}  # resident keys, oldest copy first
        self.active: set[int] = set()  # accessed or copied in during this iteration

    def on_access(self, iteration, layer, keys, now_ms):
        self.active.update(keys)

    def on_insert(self, key, demand, now_ms):
        self.order[key] = None
        self.active.add(key)

    def on_evict(self, key, now_ms):
        self.order.pop(key, None)

    def on_step_end(self, iteration, now_ms):
        self.active = set()

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        active = self.active
        victim = candidates.first_of(k for k in reversed(self.order) if k not in active)
        return victim if victim is not None else candidates.first_of(reversed(self.order))
