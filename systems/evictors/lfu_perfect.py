"""lfu_perfect: "perfect" LFU, evict the resident expert with the fewest accesses since the run
began. Counts survive eviction: an expert that was evicted comes back with its history. The
caching literature's LFU is the in-cache rule, the zoo's `lfu` (decision record
docs/decisions/2026-12-06-lfu-names.md); ProMoE's cache in the fmoe experiments keeps it
(analysis/repro/experiments/fmoe_overall.py says why).

Count: one per MoE layer step whose routing includes the key, whether it was resident or not.
Ties as lfu's (systems/evictors/lfu.py): the least recently touched first, then the lowest
key. A prefetched copy brings its key's count, 0 for a key never accessed (it goes first).
"""

from __future__ import annotations

from systems.evictors.lfu import LFUEvictor


class LFUPerfectEvictor(LFUEvictor):
    name = "lfu_perfect"
    reset_on_evict = False
