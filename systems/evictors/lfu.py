"""lfu: evict the resident expert with the fewest accesses since its copy arrived (in-cache
Least Frequently Used, the rule the caching literature and libCacheSim's LFU mean; the
frequency baseline of SpecMD, and the LFU of fMoE's ablation, its Fig. 12b).

Count: one per MoE layer step whose routing includes the key (not one per token), since the
copy now resident was inserted; the access that demand-loads a key is its first. Eviction
resets the count: an expert that comes back starts again (lfu_perfect keeps it instead).
Ties: the least recently touched first, where a touch is an access or the landing of a copy,
ordered by event (a step's accesses in ascending key order, then its copies as they land);
then the lowest key (never needed: touches are totally ordered). This is libCacheSim's LFU
tie-break (per-count buckets, a touched object appended to its bucket's tail, the victim at
the head of the lowest bucket): tests/systems/test_cache_conformance.py replays one stream
through both and expects the same misses. A prefetched copy lands with count 1, as an insert
does in libCacheSim (its landing is its first touch; the access that then uses it makes 2):
with count 0 every prefetch would be the next victim, dropped before its layer runs.
"""

from __future__ import annotations

import numpy as np

from systems.evictors.base import Evictor


class LFUEvictor(Evictor):
    name = "lfu"
    reset_on_evict = True  # in-cache counts; lfu_perfect (systems/evictors/lfu_perfect.py): False

    def bind(self, ctx):
        super().bind(ctx)
        n = ctx.num_layers * ctx.num_experts
        self.count = np.zeros(n, dtype=np.int64)  # accesses per key (see the module)
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
        if self.reset_on_evict:  # in-cache: a copy counts from 1 (a demand copy: its access)
            self.count[key] = max(self.count[key], 1)
        self.touch[key] = self.seq
        self.seq += 1

    def on_evict(self, key, now_ms):
        self.resident[key] = False
        if self.reset_on_evict:
            self.count[key] = 0

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        keys = np.flatnonzero(self.resident)
        # lexsort: the last key is the primary one (count, then last touch, then key).
        order = np.lexsort((keys, self.touch[keys], self.count[keys]))
        return candidates.first_of(keys[order].tolist())
