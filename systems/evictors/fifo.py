"""fifo: evict the resident expert that was copied in first (the classic FIFO baseline of
caching studies; SpecMD and tinyserve list it beside LRU and LFU).

Order: insertion order of the copies (demand or prefetch); an access does not move a key.
No ties arise (one copy at a time). Only evictable keys are considered: the oldest copy that
is in use by the running layer step is skipped and the next oldest goes.
"""

from __future__ import annotations

from systems.evictors.base import Evictor


class FIFOEvictor(Evictor):
    name = "fifo"

    def bind(self, ctx):
        super().bind(ctx)
        self.order: dict[int, None] = {}  # resident keys, oldest copy first (dicts keep order)

    def on_insert(self, key, demand, now_ms):
        self.order[key] = None

    def on_evict(self, key, now_ms):
        self.order.pop(key, None)

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        return candidates.first_of(self.order)
