"""evict_after_use: no reuse across steps, what Mixtral-Offloading's "no LRU cache" ablation
(Eliseev & Mazur 2023, Table 1) means: an expert is dropped once its layer step is done.

Every copy names a victim when one exists, even while free slots remain (the one evictor that
does not wait for a full cache: waiting would make it FIFO): the resident copied in first
among those neither accessed in nor copied in during the current layer step (the keys of the
last on_access and copies landed since). So each copy replaces a used expert and residency
stays at the largest step so far (plus prefetches); a used expert survives only while fewer
copies than that are made, so cross-step hits vanish once a pass copies more experts than
one step holds. Ties: none (one copy at a time). When the cache is full and every evictable
resident belongs to the current step (prefetched for it, not yet run), the first copied of
those goes; when nothing is evictable, None.
"""

from __future__ import annotations

from systems.evictors.base import Evictor


class EvictAfterUse(Evictor):
    name = "evict_after_use"

    def bind(self, ctx):
        super().bind(ctx)
        self.order: dict[int, None] = {}  # resident keys, oldest copy first
        self.step: set[int] = set()  # keys of the current layer step and copies since it began

    def on_access(self, iteration, layer, keys, now_ms):
        self.step = set(keys)

    def on_insert(self, key, demand, now_ms):
        self.order[key] = None
        self.step.add(key)

    def on_evict(self, key, now_ms):
        self.order.pop(key, None)

    def choose_victim(self, candidates, incoming, demand, now_ms):
        step = self.step
        victim = candidates.first_of(k for k in self.order if k not in step)
        if victim is None and candidates.full:
            victim = candidates.first_of(self.order)
        return victim
