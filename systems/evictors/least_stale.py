"""least_stale: SpecMD's Least-Stale (Hoang et al. 2026, "SpecMD: A Comprehensive Study On
Speculative Expert Prefetching", arXiv 2602.03921): experts not touched in the current forward
pass are stale and go first, since an expert of a layer this pass has left will not be used
again before the next pass reaches that layer.

Two FIFO tiers, as in tinyserve's LeastStalePolicy: *fresh* holds the keys touched in the
current iteration (a forward pass over the batch), in the order they were first touched;
*stale* holds the residents last touched in an earlier pass. A touch is an access of a
resident (a step's keys in ascending key order, so layer order then expert id) or the landing
of a copy (appended as it lands). At the end of an iteration the fresh tier is appended to
the stale tier in its order (so stale is FIFO in layer order) and emptied. A stale key that is
touched again moves to the end of fresh. Victim: the first evictable stale key, else the first
evictable fresh key. No ties (both tiers are sequences).
"""

from __future__ import annotations

from systems.evictors.base import Evictor


class LeastStaleEvictor(Evictor):
    name = "least_stale"

    def bind(self, ctx):
        super().bind(ctx)
        self.fresh: dict[int, None] = {}  # touched in the current pass, first touch first
        self.stale: dict[int, None] = {}  # last touched in an earlier pass, oldest first

    def on_access(self, iteration, layer, keys, now_ms):
        fresh, stale = self.fresh, self.stale
        for key in keys:
            if key in stale:
                del stale[key]
                fresh[key] = None

    def on_insert(self, key, demand, now_ms):
        self.fresh[key] = None

    def on_evict(self, key, now_ms):
        if key in self.stale:
            del self.stale[key]
        else:
            self.fresh.pop(key, None)

    def on_step_end(self, iteration, now_ms):
        self.stale.update(self.fresh)
        self.fresh = {}

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        victim = candidates.first_of(self.stale)
        return victim if victim is not None else candidates.first_of(self.fresh)
