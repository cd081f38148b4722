"""lru: Mixtral-Offloading (Eliseev & Mazur 2023): a per-layer LRU cache of
`slots_per_layer` experts plus speculative prefetch of the next layer's experts, guessed by
applying the next layer's router to this layer's hidden state (trace field `spec_topk`).

By construction composed(lru_per_layer, spec_next_layer) with max_proposal = slots_per_layer
(systems/evictors/lru_per_layer.py, systems/prefetchers/spec_next_layer.py have the rules);
tests/systems/test_composed.py checks the equivalence through the runner.

slots_per_layer = floor(cache slots / MoE layers) (at most E) unless set; a set value must be
in [1, E]. Without `spec_topk` in the trace the system runs without speculative prefetch (LRU
only) and the result lists the field as missing. Guesses are ordered by how many tokens voted
for them and capped at the slots of the next layer, since more would evict each other.
"""

from __future__ import annotations

from systems.composed import Composed
from systems.evictors.lru_per_layer import LRUPerLayer
from systems.prefetchers.spec_next_layer import SpecNextLayer


class LRU(Composed):
    name = "lru"
    label = "Mixtral-Offloading (per-layer LRU + speculative next-layer prefetch)"
    uses_fields = ("spec_topk",)  # read by its prefetcher (set per instance by Composed too)

    def __init__(self, slots_per_layer: int | None = None, prefetch: bool = True):
        evictor = LRUPerLayer(slots_per_layer)  # checks the knob first: `slots_per_layer: ...`
        super().__init__(evictor=evictor, prefetcher=SpecNextLayer(max_proposal=slots_per_layer),
                         prefetch=prefetch)
