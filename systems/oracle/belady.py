"""belady and belady_lookahead: bounds, not systems. Belady's MIN victims with demand fetches
only (no prefetch, no preload), by construction composed(belady, none): the evictor
systems/evictors/belady.py, which reads the future (flagged `oracle: true`).

belady: its loads are MIN's over the access sequence (core/access.py) at the cache's slots,
cold loads included: a lower bound on the copies of any policy at the same budget (prefetches
are copies too). belady_lookahead: the same victim rule knowing only the next
`lookahead_iterations` iterations (uses further away count as never; ties lowest key first),
so its loads are >= belady's and equal them once the window covers the run.
Needs a timing-independent schedule (max_batch = 1 or every request arriving at once).
"""

from __future__ import annotations

from core.knobs import int_knob
from systems.composed import Composed
from systems.evictors.belady import BeladyEvictor
from systems.prefetchers.none import NoPrefetch


class Belady(Composed):
    name = "belady"
    label = "Belady MIN victims, demand fetches only (bound; loads exact)"

    def __init__(self, prefetch: bool = True):  # prefetch: accepted, nothing to prefetch
        super().__init__(evictor=BeladyEvictor(), prefetcher=NoPrefetch(), prefetch=prefetch)


class BeladyLookahead(Composed):
    name = "belady_lookahead"
    label = "Belady victims with a k-iteration window, demand only (bound)"

    def __init__(self, lookahead_iterations: int = 1, prefetch: bool = True):
        k = int_knob(lookahead_iterations, "lookahead_iterations", lo=1)
        super().__init__(evictor=BeladyEvictor(lookahead_iterations=k), prefetcher=NoPrefetch(),
                         prefetch=prefetch)
        self.lookahead_iterations = k

    def describe(self):
        return {**super().describe(), "lookahead_iterations": self.lookahead_iterations}
