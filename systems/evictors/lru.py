"""lru (global): evict the least recently accessed evictable expert of the whole cache.

Recency is per MoE layer step: the step's routed keys are touched in ascending key order, so
within one step the lower key counts as older (ties: lowest key goes first). A copy that
arrives without an access (a prefetch) counts as used when it lands, after every key touched
so far; a demand copy keeps the position its access gave it. This is on_demand's rule
(MoE-OnDemand): `composed(lru, none)` is that system, by construction (systems/on_demand.py).
"""

from __future__ import annotations

from collections import OrderedDict

from systems.evictors.base import Evictor


class LRUEvictor(Evictor):
    name = "lru"

    def bind(self, ctx):
        super().bind(ctx)
        self.recency: OrderedDict[int, None] = OrderedDict()  # oldest first

    def on_access(self, iteration, layer, keys, now_ms):
        recency = self.recency
        for key in keys:
            recency[key] = None
            recency.move_to_end(key)

    def on_insert(self, key, demand, now_ms):
        if key not in self.recency:  # a prefetch: the copy's arrival is its first use
            self.recency[key] = None

    def on_evict(self, key, now_ms):
        self.recency.pop(key, None)

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        return candidates.first_of(self.recency)
