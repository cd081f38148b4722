"""spec_next_layer: Mixtral-Offloading's speculative prefetch. After layer l is routed, copy the
experts that the trace's guesses (field `spec_topk`: the next layer's router applied to this
layer's hidden state) name for layer l + 1.

Order: most-voted first (tokens of the iteration guessing the expert), ties by lowest id; at
most `max_proposal` keys, since more would evict each other from the next layer's share.
After the last MoE layer the proposal is empty (it clears stale guesses from the queue).
Without `spec_topk` in the trace it never proposes and the result lists the field as missing.
max_proposal auto = floor(cache slots / MoE layers), at most E, at least 1: the per-layer
quota of lru_per_layer, so composed(lru_per_layer, spec_next_layer) is Mixtral-Offloading.
"""

from __future__ import annotations

from core.knobs import int_knob
from systems.evictors.lru_per_layer import auto_slots_per_layer
from systems.prefetchers.base import Prefetcher


class SpecNextLayer(Prefetcher):
    name = "spec_next_layer"
    uses_fields = ("spec_topk",)

    def __init__(self, max_proposal: int | None = None):
        self.max_proposal_cfg = int_knob(max_proposal, "max_proposal", lo=1, null="auto")

    def bind(self, ctx):
        super().bind(ctx)
        self.max_proposal = (max(1, auto_slots_per_layer(ctx)) if self.max_proposal_cfg is None
                             else self.max_proposal_cfg)
        self.use_spec = "spec_topk" in ctx.trace_fields
        self.proposal: list[int] | None = None

    def on_layer_routed(self, routing, now_ms):
        if not self.use_spec:
            return
        nxt = routing.layer + 1
        if nxt >= self.ctx.num_layers:
            self.proposal = []  # clear stale guesses at the last layer
            return
        ids, votes = routing.spec_votes()  # guesses over the iteration's tokens, ascending
        # Most-voted first, ties by lowest id (sorted is stable over ascending ids). With one
        # vote each (decode at batch 1) ascending id is already that order.
        if max(votes, default=0) > 1:
            ids = [ids[i] for i in sorted(range(len(ids)), key=lambda i: -votes[i])]
        base = nxt * self.ctx.num_experts
        self.proposal = [base + e for e in ids[: self.max_proposal]]

    def propose(self, now_ms):
        proposal, self.proposal = self.proposal, None
        return proposal

    def describe(self):
        out = {"name": self.name, "max_proposal": self.max_proposal_cfg}
        if hasattr(self, "max_proposal"):
            out["max_proposal_used"] = self.max_proposal
        return out
