"""mrs: prefetch the next layer's experts with the highest MRS scores (HybriMoE's released
prefetch; PKU-SEC-Lab/HybriMoE 508a85b, ktransformers/operators/experts.py `prefetch_expert`,
`KScoreAwareCache.get_experts_to_prefetch`).

After layer l is routed, the `max_proposal` experts of layer l + 1 with the highest scores S
(systems/evictors/mrs.py: alpha, top_p, the same update, kept here from the same routing)
are proposed, highest first, ties by the lowest id; resident ones are dropped by the engine.
After the last MoE layer nothing is proposed (the release prefetches only `layer_idx + 1 <
num_layers`). The release's `prefetch_size` defaults to 0 (ktransformers/local_chat.py); the
paper's impact-driven prefetch (simulating each candidate's gain in the next layers) is not in
the released code and is not modelled (docs/systems.md, "hybrimoe").
max_proposal auto = min(E, max_batch * top_k): the most experts one step can route.
"""

from __future__ import annotations

import numpy as np

from core.knobs import int_knob
from systems.evictors.mrs import MRSScores
from systems.prefetchers.base import Prefetcher


class MRSPrefetch(Prefetcher):
    name = "mrs"
    uses_fields = ("probs",)

    def __init__(self, max_proposal: int | None = None, alpha: float = 0.5,
                 top_p: int | None = None):
        self.max_proposal_cfg = int_knob(max_proposal, "max_proposal", lo=0,
                                         null="auto: min(E, max_batch * top_k)")
        self.scores = MRSScores(alpha, top_p)

    def bind(self, ctx):
        super().bind(ctx)
        self.scores.bind(ctx)
        E = ctx.num_experts
        self.m = (min(E, ctx.max_batch * ctx.top_k) if self.max_proposal_cfg is None
                  else min(E, self.max_proposal_cfg))
        self.proposal: list[int] | None = None

    def on_layer_routed(self, routing, now_ms):
        self.scores.update(routing)
        nxt, E = routing.layer + 1, self.ctx.num_experts
        if self.m == 0 or nxt >= self.ctx.num_layers:
            return
        row = self.scores.score[nxt * E:(nxt + 1) * E]
        top = np.lexsort((np.arange(E), -row))[:self.m]  # highest S first, ties lowest id
        self.proposal = (nxt * E + top).tolist()

    def propose(self, now_ms):
        proposal, self.proposal = self.proposal, None
        return proposal

    def describe(self):
        return {"name": self.name, "max_proposal": self.m if hasattr(self, "m")
                else self.max_proposal_cfg, **self.scores.describe()}
