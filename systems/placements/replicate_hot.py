"""Replicate hot experts: the most activated experts may be cached on every GPU and run on
the token's own GPU; the others are sharded by expert (systems/placements/shard_expert.py).

Hot = the `hot_fraction` of all (layer, expert) keys with the most tokens in the calibration
split (requests disjoint from the measured ones), ties by the lowest key: the frequency rule
of systems/placement.py. A hot expert is not pinned: each GPU's system caches it as it
caches any expert, and a GPU that misses it copies it from a peer that holds it before the
host (harness/sim/copies_gpu.py). The redundant experts of DeepSeek's load balancer (EPLB)
and Lina's replication of popular experts are the pattern; the fraction is our default [G],
not a paper's value.
"""

from __future__ import annotations

from core.knobs import KnobError
from systems.placement import activation_counts, frequency_keys
from systems.placements.base import Placement, at_most, contiguous


class ReplicateHot(Placement):
    name = "replicate_hot"

    def __init__(self, hot_fraction: float = 0.25):
        if (isinstance(hot_fraction, bool) or not isinstance(hot_fraction, (int, float))
                or not 0.0 < hot_fraction <= 1.0):
            raise KnobError(f"hot_fraction: must be a number in (0, 1], got {hot_fraction!r}")
        self.hot_fraction = float(hot_fraction)
        self.counts = None  # [L, E] calibration tokens

    def needs_calibration(self) -> bool:
        return True

    def fit(self, calibration) -> None:
        self.counts = activation_counts(calibration, calibration.num_layers,
                                        calibration.num_experts)

    def check(self, num_gpus: int, num_layers: int, num_experts: int) -> None:
        at_most(num_gpus, num_experts, "experts per layer", self.name)

    def bind(self, num_gpus: int, num_layers: int, num_experts: int) -> None:
        if self.counts is None:
            raise KnobError("placement: replicate_hot ranks experts by the calibration split; "
                            "fit(calibration) was not called")
        n = round(self.hot_fraction * num_layers * num_experts)
        self.hot = frozenset(frequency_keys(self.counts, n))
        super().bind(num_gpus, num_layers, num_experts)

    def owners_of(self, layer, expert, num_gpus, num_layers, num_experts):
        if layer * num_experts + expert in self.hot:
            return tuple(range(num_gpus))
        return (contiguous(expert, num_experts, num_gpus),)

    def describe(self) -> dict:
        return {"name": self.name, "hot_fraction": self.hot_fraction,
                "hot_experts": len(getattr(self, "hot", ()))}
