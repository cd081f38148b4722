"""mrs: HybriMoE's score-based caching, "Minus Recent Score" (arXiv 2504.05897; code
PKU-SEC-Lab/HybriMoE 508a85b, ktransformers/operators/experts.py `KScoreAwareCache`).

A score S per expert, 0 at the start. At every MoE layer step the router's scores s over the
layer's E experts update the layer: the `top_p` highest scores' experts get
S = alpha * s + (1 - alpha) * S, every other expert of the layer decays to (1 - alpha) * S
(`update_priority_scores`, commented "S = α×TopP(s)+(1−α)×S"). alpha = 0.5 and top_p =
2 * top_k, the release's (ktransformers/models/modeling_deepseek.py: `KScoreAwareCache(
num_hidden_layers, n_routed_experts, 0.5, 2 * self.top_k)`, updated in the gate's forward).
Victim: the evictable resident with the lowest S, ties by the lowest key
(`get_expert_to_unload`: argmin; torch.topk's and argmin's ties are left unspecified there).

s is the trace's `probs` (step-mean router probabilities), averaged over the iteration's
requests; the release takes the first token's scores (`top_p_scores[0]`), the same at batch 1
in decode. Without `probs` (ours): each routed expert's share of the step's top-k choices.
Without the routing at all (ours; the host evictor, which the host tier tells only the step's
keys, docs/hardware.md): an equal share for each key of the step. A system that forwards the
routing (the composed system, right after on_access) has that provisional update undone and
redone from the routing, so the scores are exactly the routing's.
Scope: the release gives each layer a fixed number of slots (`load_size`) and evicts the
lowest S of the incoming expert's layer; the engine has one pool, so the victim is the
lowest S over all layers (the README: "prioritizes high-demand experts across layers").
"""

from __future__ import annotations

import numpy as np

from core.knobs import float_knob, int_knob
from systems.evictors.base import Evictor


class MRSScores:
    """The scores S [L * E] and their per-layer-step update (shared with the mrs prefetcher)."""

    def __init__(self, alpha: float = 0.5, top_p: int | None = None):
        self.alpha = float_knob(alpha, "alpha", lo=0.0, hi=1.0, lo_open=True)
        self.top_p_cfg = int_knob(top_p, "top_p", lo=1, null="auto: 2 * top_k")

    def bind(self, ctx) -> None:
        self.E = ctx.num_experts
        p = 2 * ctx.top_k if self.top_p_cfg is None else self.top_p_cfg
        self.top_p = min(p, self.E)
        self.use_probs = "probs" in ctx.trace_fields
        self.score = np.zeros(ctx.num_layers * self.E, np.float64)
        self._undo: tuple[int, np.ndarray] | None = None  # (layer, its row before update_keys)

    def router_scores(self, routing) -> np.ndarray:
        """s [E] float64: the members' probs averaged, else the routed experts' shares."""
        if self.use_probs:
            rows = routing.probs_rows([r for r, _ in routing.iteration.members])
            return rows.astype(np.float64).mean(axis=0)
        s = np.zeros(self.E, np.float64)
        s[routing.experts] = routing.counts
        return s / s.sum()

    def update(self, routing) -> None:
        row = self._row(routing.layer)
        if self._undo is not None and self._undo[0] == routing.layer:
            row[:] = self._undo[1]  # the provisional update from the keys alone
        self._undo = None
        self._apply(row, self.router_scores(routing))

    def update_keys(self, layer: int, keys) -> None:
        """Provisional update from the step's keys only: an equal share each."""
        row = self._row(layer)
        self._undo = (layer, row.copy())
        s = np.zeros(self.E, np.float64)
        s[np.asarray(keys, np.int64) - layer * self.E] = 1.0 / len(keys)
        self._apply(row, s)

    def _row(self, layer: int) -> np.ndarray:
        return self.score[layer * self.E:(layer + 1) * self.E]  # a view

    def _apply(self, row: np.ndarray, s: np.ndarray) -> None:
        top = np.lexsort((np.arange(self.E), -s))[:self.top_p]  # highest s, ties lowest id
        row *= 1.0 - self.alpha
        row[top] += self.alpha * s[top]

    def describe(self) -> dict:
        return {"alpha": self.alpha,
                "top_p": self.top_p_cfg if not hasattr(self, "top_p") else self.top_p}


class MRSEvictor(Evictor):
    name = "mrs"
    uses_fields = ("probs",)

    def __init__(self, alpha: float = 0.5, top_p: int | None = None):
        self.scores = MRSScores(alpha, top_p)

    def bind(self, ctx):
        super().bind(ctx)
        self.scores.bind(ctx)
        self.resident = np.zeros(ctx.num_layers * ctx.num_experts, bool)

    def on_access(self, iteration, layer, keys, now_ms):
        self.scores.update_keys(layer, keys)

    def on_layer_routed(self, routing, now_ms):
        self.scores.update(routing)

    def preloaded(self, keys) -> None:
        """Keys its system preloads (the engine reports no insert for a preload)."""
        self.resident[list(keys)] = True

    def on_insert(self, key, demand, now_ms):
        self.resident[key] = True

    def on_evict(self, key, now_ms):
        self.resident[key] = False

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if candidates.full:  # else a free slot
            keys = np.flatnonzero(self.resident)  # ascending: the stable sort keeps ties so
            by_score = np.argsort(self.scores.score[keys], kind="stable")
            return candidates.first_of(keys[by_score].tolist())  # lowest S, then lowest key
        return None

    def describe(self):
        return {"name": self.name, **self.scores.describe()}
