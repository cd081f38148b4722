"""lfru: recency-frequency eviction, the LFRU expert cache proposed for vLLM (vllm-project/
vllm PR #37190, "frequency-weighted LRU"; the rule of its reference implementation,
tinyserve's LFRUPolicy): evict the resident expert with the lowest score freq / age.

A clock ticks once per hit access and once per landed copy. A resident key's freq counts its
accesses since it was copied in (the copy counts 1; eviction forgets it); age = clock - the
tick of its last hit or landing + 1. Here an access is one MoE layer step whose routing
includes the key (not one per token): on_access ticks the step's resident keys in ascending
key order; keys not resident then are counted by their copy's landing instead (a demand miss
is freq 1 when it lands, as in tinyserve). A prefetched copy lands with freq 1; its first
use makes it 2.
Ties (equal freq / age, compared exactly): the least recently ticked first, then the lowest
key. The cache is global (one score order across layers); the vLLM PR sizes it per layer.
"""

from __future__ import annotations

import numpy as np

from systems.evictors.base import Evictor


class LFRUEvictor(Evictor):
    name = "lfru"

    def bind(self, ctx):
        super().bind(ctx)
        n = ctx.num_layers * ctx.num_experts
        self.freq = np.zeros(n, dtype=np.int64)
        self.last = np.zeros(n, dtype=np.int64)  # clock of the last hit or landing
        self.resident = np.zeros(n, dtype=bool)
        self.clock = 0

    def on_access(self, iteration, layer, keys, now_ms):
        idx = np.asarray(keys, dtype=np.int64)
        hits = idx[self.resident[idx]]  # ascending, like the keys
        if len(hits):
            self.freq[hits] += 1
            self.last[hits] = np.arange(self.clock + 1, self.clock + 1 + len(hits))
            self.clock += len(hits)

    def on_insert(self, key, demand, now_ms):
        self.clock += 1
        self.resident[key] = True
        self.freq[key] = 1
        self.last[key] = self.clock

    def on_evict(self, key, now_ms):
        self.resident[key] = False

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        keys = np.flatnonzero(self.resident)
        freq, last = self.freq[keys], self.last[keys]
        # freq / age in float64: equal fractions give equal floats (correct rounding), and
        # distinct ones with ages below 2**26 stay distinct, so the order is the exact one.
        score = freq / (self.clock - last + 1)
        order = np.lexsort((keys, last, score))
        return candidates.first_of(keys[order].tolist())
