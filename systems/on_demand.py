"""on_demand: fetch an expert when it is routed to and missing; evict the least recently used.

Stands for "MoE-OnDemand", the baseline that Pre-gated MoE and Diff-MoE call DeepSpeed.
By construction composed(lru, none): the global LRU evictor (systems/evictors/lru.py) and no
prefetcher; tests/systems/test_composed.py checks the equivalence through the runner.
"""

from __future__ import annotations

from systems.composed import Composed
from systems.evictors.lru import LRUEvictor
from systems.prefetchers.none import NoPrefetch


class OnDemand(Composed):
    name = "on_demand"
    label = "MoE-OnDemand (the baseline Pre-gated MoE and Diff-MoE call DeepSpeed)"

    def __init__(self, prefetch: bool = True):
        super().__init__(evictor=LRUEvictor(), prefetcher=NoPrefetch(), prefetch=prefetch)
