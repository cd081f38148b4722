"""fmoe_maps: fMoE's expert-map prefetcher (systems/fmoe/system.py) with any evictor.

Rule (fMoE, docs/systems.md): a store of expert maps (one iteration's router probabilities
[L, E] per request, with the prompt's embedding), warmed from the calibration split and,
with `online_update`, extended by every finished request. The first d layers of an iteration
come from the map whose prompt embedding is closest; after layer l, layer l + d comes from
the map whose probabilities over the layers seen so far are closest. From the matched row,
experts are taken most probable first until they cover delta = clip(1 - cosine, 0, 1) (at
least top-k). A prediction is usable `match_us_per_map` * stored maps after it is issued.
Proposal: the usable predictions for layers still ahead, by p / (layers ahead), ties by lowest
key; with several requests one key keeps its best place.

Adapter (systems/prefetchers/joint.py): it drives an FMoE instance's prefetch side and forwards
the cache events to it, so the matching is fMoE's own code. fMoE's eviction side (p * freq,
protection of predicted experts, prefetch admission) is not used: `protect_prefetched` and
`admission_margin` are off, the composed system's evictor chooses every victim.
"""

from __future__ import annotations

from systems.fmoe.system import FMoE
from systems.prefetchers.joint import JointPrefetch


class FMoEMaps(JointPrefetch):
    name = "fmoe_maps"
    dropped = ("protect_prefetched", "admission_margin", "admission_declined")  # eviction side
    uses_fields = FMoE.uses_fields

    def __init__(self, prefetch_distance: int = 3, store_capacity: int = 1000,
                 match_us_per_map: float = 0.05, online_update: bool = True,
                 semantic_same_kind: bool = True, count_smoothing: float = 0.25,
                 semantic_matching: bool = True, delta_rule: bool = True):
        self.joint = FMoE(prefetch_distance=prefetch_distance, store_capacity=store_capacity,
                          match_us_per_map=match_us_per_map, online_update=online_update,
                          semantic_same_kind=semantic_same_kind, protect_prefetched=False,
                          admission_margin=None, count_smoothing=count_smoothing,
                          semantic_matching=semantic_matching, delta_rule=delta_rule)
