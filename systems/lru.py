"""lru: Mixtral-Offloading (Eliseev & Mazur 2023): a per-layer LRU cache of
`slots_per_layer` experts plus speculative prefetch of the next layer's experts, guessed by
applying the next layer's router to this layer's hidden state (trace field `spec_topk`).

slots_per_layer = floor(cache slots / MoE layers) (at most E) unless set; a set value must be
in [1, E]. Without `spec_topk` in the trace the system runs without speculative prefetch (LRU
only) and the result lists the field as missing. Guesses are ordered by how many tokens voted
for them and capped at the slots of the next layer, since more would evict each other.
"""

from __future__ import annotations

from collections import OrderedDict

from core.knobs import int_knob
from systems.base import System


class LRU(System):
    name = "lru"
    label = "Mixtral-Offloading (per-layer LRU + speculative next-layer prefetch)"
    uses_fields = ("spec_topk",)

    def __init__(self, slots_per_layer: int | None = None, prefetch: bool = True):
        super().__init__(prefetch)
        self.slots_per_layer_cfg = int_knob(slots_per_layer, "slots_per_layer", lo=1,
                                            null="auto")

    def bind(self, ctx):
        super().bind(ctx)
        if self.slots_per_layer_cfg is None:  # auto: the budget's share, at most a layer
            slots = ctx.capacity_slots // ctx.num_layers
            if slots < 1:
                raise ValueError(f"lru: the cache ({ctx.capacity_slots} experts) cannot hold "
                                 f"one expert per layer ({ctx.num_layers} layers)")
            self.slots_per_layer = min(slots, ctx.num_experts)
        else:  # more slots than a layer has experts is a config mistake, not a clamp
            self.slots_per_layer = int_knob(
                self.slots_per_layer_cfg, "slots_per_layer", lo=1, hi=ctx.num_experts,
                null="auto", note=f"the model has {ctx.num_experts} experts per layer")
        self.layers = [OrderedDict() for _ in range(ctx.num_layers)]  # key -> None, LRU first
        self.proposal: list[int] | None = None
        self.use_spec = self.prefetch and "spec_topk" in ctx.trace_fields

    def on_layer_routed(self, routing, now_ms):
        layer, E = routing.layer, self.ctx.num_experts
        lru = self.layers[layer]
        for e in routing.experts:
            key = layer * E + e
            if key in lru:
                lru.move_to_end(key)
        nxt = layer + 1
        if not self.use_spec:
            return
        if nxt >= self.ctx.num_layers:
            self.proposal = []  # clear stale guesses at the last layer
            return
        ids, votes = routing.spec_votes()  # guesses over the iteration's tokens, ascending
        base = nxt * E
        # Most-voted first, ties by lowest id; at most the next layer's slots. With one vote
        # each (decode at batch 1) ascending id is already that order.
        if max(votes, default=0) > 1:
            ids = [ids[i] for i in sorted(range(len(ids)), key=lambda i: -votes[i])]
        self.proposal = [base + e for e in ids[: self.slots_per_layer]]

    def propose_prefetch(self, now_ms):
        proposal, self.proposal = self.proposal, None
        return proposal

    def on_load(self, key, demand, now_ms):
        self.layers[key // self.ctx.num_experts][key] = None

    def choose_victim(self, candidates, incoming, demand, now_ms):
        lru = self.layers[incoming // self.ctx.num_experts]
        victim = None
        if len(lru) >= self.slots_per_layer or candidates.full:
            victim = candidates.first_of(lru)
        if victim is None and candidates.full:
            # Every expert of this layer is in use (a step routed to more experts than the
            # layer's slots): borrow the least recent slot of the layer furthest over quota.
            for other in sorted((d for d in self.layers if d is not lru), key=len, reverse=True):
                victim = candidates.first_of(other)
                if victim is not None:
                    break
        if victim is not None:
            del self.layers[victim // self.ctx.num_experts][victim]
        return victim
