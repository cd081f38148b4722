"""predictor: Diff-MoE's numpy next-layer predictor (systems/predictor.py) as a prefetcher.

Trained in warmup on the calibration split (transition counts between the same token's
experts at layers l and l + 1, plus a recency weight picked on held-out requests). After
layer l is routed: score every expert of layer l + 1, take the m best (m = the step's union
size at layer l; ties by lowest id), drop the resident ones (as this prefetcher saw them
inserted and evicted), keep at most `max_proposal`. Layers whose next layer is not the same
token's (the last layer, an encoder -> decoder boundary) propose nothing, which clears the
queue. The run-time side (recency term, top-m) is diff_moe's own (PredictorRuntime).
"""

from __future__ import annotations

import numpy as np

from core.knobs import int_knob
from systems.predictor import NextLayerPredictor, PredictorRuntime, check_predictor_knobs
from systems.prefetchers.base import Prefetcher


class PredictorPrefetch(Prefetcher):
    name = "predictor"

    def __init__(self, max_proposal: int | None = None, recency_grid=(0.0, 0.25, 0.5, 0.75),
                 holdout_fraction: float = 0.2, train_prefill_stride: int = 8,
                 smoothing: float = 1.0):
        self.max_proposal = int_knob(max_proposal, "max_proposal", lo=1,
                                     null="no cap beyond the step's union size")
        grid, holdout, stride, alpha = check_predictor_knobs(
            recency_grid, holdout_fraction, train_prefill_stride, smoothing)
        self.knobs = {"recency_grid": list(grid), "holdout_fraction": holdout,
                      "train_prefill_stride": stride, "smoothing": alpha}
        self.runtime: PredictorRuntime | None = None

    def bind(self, ctx):
        super().bind(ctx)
        self.resident: set[int] = set()
        self.proposal: list[int] | None = None

    def warmup(self, calibration) -> None:
        ctx, k = self.ctx, self.knobs
        pred = NextLayerPredictor(ctx.num_layers, ctx.num_experts, ctx.top_k,
                                  ctx.moe_layer_stacks, k["recency_grid"],
                                  k["holdout_fraction"], k["train_prefill_stride"],
                                  k["smoothing"])
        pred.fit(calibration, ctx.max_batch)
        self.runtime = PredictorRuntime(pred)

    def on_layer_routed(self, routing, now_ms):
        rt = self.runtime
        if rt is None:
            return  # not warmed up: no guesses
        rt.new_step(routing.iteration)
        layer, E = routing.layer, self.ctx.num_experts
        act = np.array(routing.experts, dtype=np.intp)
        top = rt.guess(layer, act, routing.counts, min(len(routing.experts), E))
        nxt = (layer + 1) * E
        out = [nxt + e for e in top if nxt + e not in self.resident]
        self.proposal = out if self.max_proposal is None else out[:self.max_proposal]

    def propose(self, now_ms):
        proposal, self.proposal = self.proposal, None
        return proposal

    def on_insert(self, key, demand, now_ms):
        self.resident.add(key)

    def on_evict(self, key, now_ms):
        self.resident.discard(key)

    def describe(self):
        out = {"name": self.name, "max_proposal": self.max_proposal, **self.knobs}
        if self.runtime is not None:
            out["report"] = dict(self.runtime.pred.report)
        return out
