"""Replicate hot experts: the most activated experts may be cached on every GPU and run on
the token's own GPU; the others are sharded by expert (systems/placements/shard_expert.py).

Hot = the round(`hot_cache_fraction` x one GPU's cache slots) (layer, expert) keys with the
most tokens in the calibration split (requests disjoint from the measured ones), ties by the
lowest key: the frequency rule of systems/placement.py. Sized by the cache, not by the
model: replicas every GPU may want then take at most that share of each GPU's slots, and the
rest is left to the GPU's own shard (a share of all keys could exceed a GPU's cache: a
quarter of Mixtral's 256 experts is more than an RTX 3090 holds beside its dense part).

A hot expert is not pinned: each GPU's system caches it as it caches any expert, and a GPU
that misses it copies it from a peer that holds it before the host (harness/sim/
copies_gpu.py). The redundant experts of DeepSeek's load balancer (EPLB) and Lina's
replication of popular experts are the pattern; the share is our default [G], not a
paper's value.
"""

from __future__ import annotations

from core.knobs import KnobError
from systems.placement import activation_counts, frequency_keys
from systems.placements.base import Placement, at_most, contiguous


class ReplicateHot(Placement):
    name = "replicate_hot"

    def __init__(self, hot_cache_fraction: float = 0.25):
        f = hot_cache_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f <= 1.0:
            raise KnobError(f"hot_cache_fraction: must be a number in (0, 1], got {f!r}")
        self.hot_cache_fraction = float(f)
        self.counts = None  # [L, E] calibration tokens

    def needs_calibration(self) -> bool:
        return True

    def fit(self, calibration) -> None:
        self.counts = activation_counts(calibration, calibration.num_layers,
                                        calibration.num_experts)

    def check(self, num_gpus: int, num_layers: int, num_experts: int) -> None:
        at_most(num_gpus, num_experts, "experts per layer", self.name)

    def hot_keys(self, num_layers: int, num_experts: int, capacity_slots: int) -> int:
        return min(num_layers * num_experts, round(self.hot_cache_fraction * capacity_slots))

    def bind(self, num_gpus: int, num_layers: int, num_experts: int,
             capacity_slots: int) -> None:
        if self.counts is None:
            raise KnobError("placement: replicate_hot ranks experts by the calibration split; "
                            "fit(calibration) was not called")
        n = self.hot_keys(num_layers, num_experts, capacity_slots)
        self.hot = frozenset(frequency_keys(self.counts, n))
        super().bind(num_gpus, num_layers, num_experts, capacity_slots)

    def most_keys(self, num_gpus: int, num_layers: int, num_experts: int,
                  capacity_slots: int) -> int:
        """At most the hot keys and a whole expert shard of every layer (the hot set is
        known after `fit`; this bound holds for any)."""
        hot = self.hot_keys(num_layers, num_experts, capacity_slots)
        return min(num_layers * num_experts, hot + num_layers * -(-num_experts // num_gpus))

    def owners_of(self, layer, expert, num_gpus, num_layers, num_experts):
        if layer * num_experts + expert in self.hot:
            return tuple(range(num_gpus))
        return (contiguous(expert, num_experts, num_gpus),)

    def describe(self) -> dict:
        return {"name": self.name, "hot_cache_fraction": self.hot_cache_fraction,
                "hot_experts": len(getattr(self, "hot", ()))}
