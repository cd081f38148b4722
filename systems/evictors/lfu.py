"""lfu: evict the resident expert with the fewest accesses (Least Frequently Used; the
frequency baseline of SpecMD and of MoE-Infinity's activation-aware caching).

Count: one per MoE layer step whose routing includes the key (not one per token), since the
start of the run. Counts survive eviction ("perfect" LFU): a popular expert that was evicted
comes back with its history, which is what a frequency signal is for in expert caching.
Ties: the least recently touched first, where a touch is an access or the landing of a copy,
ordered by event (a step's accesses in ascending key order, then its copies as they land);
then the lowest key (never needed: touches are totally ordered). A prefetched copy that was
never accessed has count 0 and goes first.
"""

from __future__ import annotations

import numpy as np

from systems.evictors.base import Evictor


class LFUEvictor(Evictor):
    name = "lfu"

    def bind(self, ctx):
        super().bind(ctx)
        n = ctx.num_layers * ctx.num_experts
        self.count = np.zeros(n, dtype=np.int64)  # accesses per key since the run began
        self.touch = np.full(n, -1, dtype=np.int64)  # sequence number of the last touch
        self.resident = np.zeros(n, dtype=bool)
        self.seq = 0

    def on_access(self, iteration, layer, keys, now_ms):
        idx = np.asarray(keys, dtype=np.int64)
        self.count[idx] += 1
        self.touch[idx] = np.arange(self.seq, self.seq + len(keys))
        self.seq += len(keys)

    def on_insert(self, key, demand, now_ms):
        self.resident[key] = True
        self.touch[key] = self.seq
        self.seq += 1

    def on_evict(self, key, now_ms):
        self.resident[key] = False

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        keys = np.flatnonzero(self.resident)
        # lexsort: the last key is the primary one (count, then last touch, then key).
        order = np.lexsort((keys, self.touch[keys], self.count[keys]))
        return candidates.first_of(keys[order].tolist())
