"""on_demand: fetch an expert when it is routed to and missing; evict the least recently used.

Stands for "MoE-OnDemand", the baseline that Pre-gated MoE and Diff-MoE call DeepSpeed.
"""

from __future__ import annotations

from collections import OrderedDict

from systems.base import System


class OnDemand(System):
    name = "on_demand"
    label = "MoE-OnDemand (the baseline Pre-gated MoE and Diff-MoE call DeepSpeed)"

    def bind(self, ctx):
        super().bind(ctx)
        self.recency: OrderedDict[int, None] = OrderedDict()  # oldest first

    def on_layer_routed(self, routing, now_ms):
        base, recency = routing.layer * self.ctx.num_experts, self.recency
        for e in routing.experts:
            recency[base + e] = None
            recency.move_to_end(base + e)

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        victim = candidates.first_of(self.recency)
        if victim is not None:
            del self.recency[victim]
        return victim
