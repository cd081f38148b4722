"""frequency: prefetch the next layer's most frequently used experts so far.

Count of a key = the MoE layer steps (one per iteration and layer) whose routed union held
it, over this run so far; with `warm_from_calibration` the calibration split's steps are
counted first (the same way). After layer l is routed, propose the `max_proposal` experts of
layer l + 1 with the highest counts, highest first, ties by lowest expert id; experts never
counted are not proposed. After the last MoE layer the next layer is layer 0 (the next
iteration's first). Resident experts stay in the proposal (the engine skips them), so the
proposal is the top set itself, not the best non-resident ones.
max_proposal auto = min(E, max_batch * top_k): the most experts one step can route.
"""

from __future__ import annotations

import numpy as np

from core.blocks import block_expert_counts
from core.knobs import bool_knob, int_knob
from systems.prefetchers.base import Prefetcher


class FrequencyPrefetch(Prefetcher):
    name = "frequency"

    def __init__(self, max_proposal: int | None = None, warm_from_calibration: bool = False):
        self.max_proposal_cfg = int_knob(max_proposal, "max_proposal", lo=1,
                                         null="auto: min(E, max_batch * top_k)")
        self.warm = bool_knob(warm_from_calibration, "warm_from_calibration")

    def bind(self, ctx):
        super().bind(ctx)
        E = ctx.num_experts
        self.m = (min(E, ctx.max_batch * ctx.top_k) if self.max_proposal_cfg is None
                  else min(E, self.max_proposal_cfg))
        self.counts = np.zeros((ctx.num_layers, E), np.int64)  # [L, E] steps holding each
        self.proposal: list[int] | None = None

    def needs_calibration(self) -> bool:
        return self.warm

    def warmup(self, calibration) -> None:
        if self.warm:
            L, E = self.ctx.num_layers, self.ctx.num_experts
            held = block_expert_counts(calibration).reshape(-1, L, E) > 0  # [S, L, E]
            self.counts += held.sum(axis=0)

    def on_layer_routed(self, routing, now_ms):
        layer, L = routing.layer, self.ctx.num_layers
        row = self.counts[layer]
        row[routing.experts] += 1  # the union's ids are distinct
        nxt = (layer + 1) % L
        counts = self.counts[nxt]
        top = np.argsort(-counts, kind="stable")[:self.m]  # highest first, ties: lowest id
        top = top[counts[top] > 0]
        self.proposal = (nxt * self.ctx.num_experts + top).tolist()

    def propose(self, now_ms):
        proposal, self.proposal = self.proposal, None
        return proposal

    def describe(self):
        return {"name": self.name, "max_proposal": self.max_proposal_cfg,
                "warm_from_calibration": self.warm}
