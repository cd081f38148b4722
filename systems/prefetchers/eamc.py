"""eamc: MoE-Infinity's EAMC prefetcher (systems/moe_infinity/system.py) with any evictor.

Rule (MoE-Infinity, docs/systems.md): each request's expert activation matrix (EAM, tokens
per expert and layer) is matched by cosine, after every MoE layer, against a collection of
finished requests' EAMs (warmed from the calibration split; with `learn_online` every
finished request joins). The `match_top` best entries, summed and row-normalised, give the
predicted reuse P; blended with the request's own EAM by `own_weight`. Proposal: non-resident
experts by P * (1 - d / L), d = layers ahead (cyclic), highest first, ties by lowest key, at
most `max_proposal`; experts evicted in this or the previous iteration are left out with
`refetch_guard`. Once the cache is full, only experts whose reuse beats the lowest-reuse
resident's by more than `admit_margin` standard errors are proposed (MoE-Infinity's
hysteresis, used here as a proposal filter: the composed evictor still picks the victim).

Adapter (systems/prefetchers/joint.py): it drives a MoEInfinity instance's prefetch side and
forwards the cache events to it (residency, evictions for the refetch guard), so matching
and ranking are MoE-Infinity's own code; its choose_victim is never asked.
"""

from __future__ import annotations

from systems.moe_infinity.system import MoEInfinity
from systems.prefetchers.joint import JointPrefetch


class EAMCPrefetch(JointPrefetch):
    name = "eamc"
    dropped = ("freq_decay_eviction",)  # its eviction side

    def __init__(self, eamc_capacity: int = 1000, max_proposal: int = 8,
                 learn_online: bool = True, own_weight: float = 0.5,
                 admit_margin: float = 16.0, match_top: int = 4, iteration_query: bool = True,
                 refetch_guard: bool = True):
        self.joint = MoEInfinity(eamc_capacity=eamc_capacity, max_proposal=max_proposal,
                                 learn_online=learn_online, own_weight=own_weight,
                                 admit_margin=admit_margin, match_top=match_top,
                                 iteration_query=iteration_query, refetch_guard=refetch_guard)
