"""moe_infinity: MoE-Infinity (Xue et al., arXiv 2401.14361): expert activation matrices (EAM)
matched against a fixed-capacity collection of finished requests' EAMs (EAMC,
systems/moe_infinity/eamc.py) drive prefetch and eviction.

EAM of a request: counts [L, E] of tokens routed to each expert at each layer, over prefill and
decode. EAMC: `eamc_capacity` EAMs of finished requests (warmed from the calibration split, then
every finished request of the run); when full, a new EAM replaces the stored one most similar to
it (cosine), which keeps the collection diverse. After every MoE layer the query EAM is matched
by cosine over the layers it has seen: with `iteration_query` (the paper's rule) the counts of
the running iteration only, over its layers 0..l; otherwise the request's cumulative EAM (all
layers once it decodes). The `match_top` most similar entries, summed and row-normalised, are
the predicted EAM: P[l, e] = share of layer l's routings that expert e takes. Predicted reuse
= (1 - own_weight) * P + own_weight * the request's own row-normalised EAM on the layers the
request has reached (P alone on the others), with a binomial variance per share.

Prefetch ranks non-resident experts by reuse * (1 - d / L), d = 1..L-1 the layers ahead of the
current one (cyclic, so the last layers prefetch the next token's first ones). Eviction removes
the resident expert with the lowest predicted reuse (with `freq_decay_eviction`, the released
code's product of reuse, access frequency and a layer factor). Admission with hysteresis: a
prefetch evicts only an expert whose predicted reuse is below the incoming one's by more than
`admit_margin` standard errors of the difference; otherwise it is declined (null: no admission,
every prefetch evicts the lowest-reuse resident, the paper's rule). Misses are fetched
on demand. Choices where the paper is loose, defaults and the sweeps that chose them:
docs/systems.md, "moe_infinity: choices and divergences".

Matching is incremental: the dot products with every stored EAM gain the layer's new counts
only, and cosine uses per-entry prefix norms. Requests live in table rows (one request:
systems/moe_infinity/requests.py; a batch: systems/moe_infinity/batch.py), eviction ranks in
systems/moe_infinity/ranks.py. Only what changed is recomputed (the predicted EAM when the
matched set changed, the blend where own counts changed, variances where admission needs
them), with the same bits as the plain formulas (integer sums exact, the same IEEE operations).
"""

from __future__ import annotations

import math

import numpy as np

from core.knobs import bool_knob, float_knob, int_knob
from systems.base import HISTORY_CAP, System
from systems.moe_infinity import batch, propose
from systems.moe_infinity.eamc import EAMC, request_eams
from systems.moe_infinity.kernels import load_kernels
from systems.moe_infinity.ranks import (
    ResidentRanks,
    lowest_evictable,
    released_layer_factor,
    released_priority,
)
from systems.moe_infinity.requests import VAR, RequestState, RequestTable

_RESIDENT = 2**62  # gate value of a resident key: above every iteration index


class MoEInfinity(System):
    name = "moe_infinity"
    label = "MoE-Infinity (EAM matching: prefetch and evict by predicted EAM)"

    def __init__(self, eamc_capacity: int = 1000, max_proposal: int = 8,
                 learn_online: bool = True, own_weight: float = 0.5,
                 admit_margin: float | None = 16.0,
                 match_top: int = 4, iteration_query: bool = True,
                 freq_decay_eviction: bool = False, refetch_guard: bool = True,
                 prefetch: bool = True):
        super().__init__(prefetch)
        self.own_weight = float_knob(own_weight, "own_weight", lo=0.0, hi=1.0)
        self.capacity = int_knob(eamc_capacity, "eamc_capacity", lo=1, hi=HISTORY_CAP)
        self.max_proposal = int_knob(max_proposal, "max_proposal", lo=1)
        self.learn_online = bool_knob(learn_online, "learn_online")
        self.admit_margin = float_knob(admit_margin, "admit_margin", lo=0.0,
                                       null="off: every prefetch may evict, the paper's rule")
        # more than the collection holds: every stored entry matches
        self.match_top = int_knob(match_top, "match_top", lo=1, hi=HISTORY_CAP)
        self.iteration_query = bool_knob(iteration_query, "iteration_query")
        self.freq_decay_eviction = bool_knob(freq_decay_eviction, "freq_decay_eviction")
        # true: never prefetch an expert evicted in this or the previous iteration (churn)
        self.refetch_guard = bool_knob(refetch_guard, "refetch_guard")
        self.eamc: EAMC | None = None
        self.matches, self.best_cos_sum = 0, 0.0

    def bind(self, ctx):
        super().bind(ctx)
        L, E = ctx.num_layers, ctx.num_experts
        self.eamc = EAMC(self.capacity, L, E)
        self.kernels = load_kernels(self.policy_kernels)  # compiled or python: the same bits
        self.table = RequestTable(L, E, self.capacity, self.own_weight, self.iteration_query,
                                  rows=ctx.max_batch, kernels=self.kernels)
        self.active: dict[int, RequestState] = {}
        self.resident = np.zeros(L * E, dtype=bool)
        self.n_resident = 0
        # predicted reuse [L*E], max over active requests: a table row (updated in place by
        self.score = np.zeros(L * E)  # the table, self.ranks told), a max or the prior's P
        # Where the scores came from, for their variance (computed at the few keys that need
        # it): the requests, the prior's variance [L*E], or None (zeros); and a key that tells
        # whether a new update would give the same scores.
        self._var_src: list[RequestState] | np.ndarray | None = None
        self._score_key: object = None
        self._prior: tuple[np.ndarray, np.ndarray] | None = None  # whole collection: P, var
        # eviction ranks by score (not freq_decay)
        self.ranks = ResidentRanks(L * E, E, self.kernels.fast)
        # [L*E] 0 where _propose may queue the key, -inf where the gate holds it back
        self._apen = np.zeros(L * E)
        # weight[i] for the current layer l = i - 1: 1 - d/L, d = layers ahead (cyclic), 0 at d = 0
        layer_of_key = np.repeat(np.arange(L), E)
        d = (layer_of_key[None, :] - np.arange(-1, L)[:, None]) % L  # [L+1, L*E]
        self.weight = np.where(d == 0, 0.0, 1.0 - d / L)
        self.proposal: list[int] | None = None
        self.freq = np.zeros(L * E)  # accesses since the expert was last evicted (integer)
        # [L, L*E], row = the current layer; only the released eviction reads it
        self.topo = released_layer_factor(L, E) if self.freq_decay_eviction else None
        self.layer_now = 0
        self.it_now = 0  # the running iteration's index
        # [L*E] _propose skips a key while gate >= it_now - 1: _RESIDENT while resident, then
        # its eviction's iteration (refetch_guard) or -2 (never blocks); _apen mirrors it
        self.gate = np.full(L * E, -2)

    def warmup(self, calibration):
        for eam in request_eams(calibration):
            self.eamc.insert(eam)
        self._prior = None

    # ---- matching (public: harness/bench/policies.py times observe and match) --------------
    def request_state(self, iteration_query: bool | None = None) -> RequestState:
        """A fresh matching state for this collection, outside the running requests (None:
        the system's `iteration_query`); feed it with observe()."""
        iq = self.iteration_query if iteration_query is None else iteration_query
        ctx = self.ctx
        return RequestTable(ctx.num_layers, ctx.num_experts, self.capacity, self.own_weight,
                            iq, kernels=self.kernels).new_state()

    def observe(self, st: RequestState, layer: int, ids: list[int], counts: list[int],
                prefill: bool, iteration: int = -1) -> None:
        """Add one layer's counts of one request (ids ascending, tokens each) and re-match."""
        c, tab = self.eamc, st.table
        if tab.iteration_query and st.q_iter != iteration:
            tab.start_iteration([st], iteration, c.version)
        if c.n and st.version != c.version:
            tab.refresh([st], c)  # before this layer's counts, which match_one adds
        base = layer * c.E
        keys = [base + e for e in ids]
        tab.add_one(st, layer, keys, counts)
        if c.n:
            # cosine over the layers the query has seen: 0..layer, or all once a request-level
            # query decodes (the prefill filled every layer)
            lim = layer if prefill or tab.iteration_query else c.L - 1
            self._count_matches([st], [tab.match_one(st, keys, counts, lim, c, self.match_top)])

    def match(self, st: RequestState, keys: list[int], counts: list[int], lim: int) -> None:
        """Add the counts of `keys` to one request's dot products and re-match over layers
        0..lim (the incremental EAMC query on its own)."""
        cos = st.table.match_one(st, list(keys), counts, lim, self.eamc, self.match_top)
        self._count_matches([st], [cos])

    def _observe_batch(self, states: list[RequestState], layer: int, counts: np.ndarray,
                       prefill: bool, iteration: int) -> None:
        """observe() for R > 1 member requests of the running table at once: counts [R, E]."""
        c, tab = self.eamc, self.table
        ri = batch.rows_index(states)
        if tab.iteration_query:
            tab.start_iteration(states, iteration, c.version)
        if c.n:
            tab.refresh(states, c)
        batch.add_counts(tab, states, ri, layer, counts)
        if c.n:
            lim = layer if prefill or tab.iteration_query else c.L - 1
            cos = batch.match(tab, states, ri, layer, counts, lim, c, self.match_top)
            self._count_matches(states, cos)

    def _count_matches(self, states: list[RequestState], cos: list[float]) -> None:
        for st, best_cos in zip(states, cos):  # in member order: the same sum
            st.best_cos = best_cos
            self.matches += 1
            self.best_cos_sum += best_cos

    # ---- predicted reuse --------------------------------------------------------------------
    def _update_scores(self) -> None:
        # (1 - w) * P + w * own on the layers a request has reached; P alone on the others,
        # where its own EAM has no counts yet (blending those zeros would halve their reuse).
        # Max over the requests that have matched; before any match, the whole collection.
        if len(self.active) == 1:
            self._update_one(*self.active.values())
            return
        states = [st for st in self.active.values() if st.best]
        if not states:
            self._use_prior()
            return
        rows = [st.row for st in states]
        if rows == self._score_key and not any(
                st.stale or st.new_p or st.own_dirty != -1 for st in states):
            return  # the same scores
        self._set_scores(batch.predict_and_blend(self.table, states, self.eamc), states, rows)

    def _update_one(self, st: RequestState) -> None:
        """Batch 1: the scores are the request's blend row; after a change of its own shares
        only, the ranks are updated on that layer's block."""
        if not st.best:
            self._use_prior()
            return
        tab = self.table
        if st.stale:
            tab.predict_one(st, self.eamc)
        blk = tab.blend_one(st)
        if self._score_key != st.row:
            self._set_scores(tab.blend[st.row], [st], st.row)
        elif blk is not None and blk.stop is None:
            self.ranks.set_scores(self.score)
        elif blk is not None:
            self.ranks.set_block(blk)

    def _use_prior(self) -> None:
        if self._prior is None and self.eamc.n:
            self._prior = self.eamc.predicted()  # the whole collection, before a match
        if self._prior is None:
            return  # empty collection: scores stay zero, eviction by lowest key
        if self._score_key is not self._prior:
            self._set_scores(self._prior[0], self._prior[1], self._prior)

    def _set_scores(self, score: np.ndarray, var_src, key) -> None:
        self.score, self._var_src, self._score_key = score, var_src, key
        self.ranks.set_scores(score)

    def _var_at(self, keys: np.ndarray) -> np.ndarray:
        """Variance of the predicted reuse at `keys` (max over the same requests as the
        scores): (1 - w)^2 var(P) + w^2 var(own), the two estimates independent."""
        src = self._var_src
        if src is None:
            return np.zeros(len(keys))
        if isinstance(src, np.ndarray):
            return src[keys]
        if len(src) == 1:
            return self.table.variance_one(src[0], keys)
        return batch.variance(self.table, src, keys)

    def _var_of(self, key: int) -> float:  # _var_at at one key (the same bits)
        src = self._var_src
        if src is None:
            return 0.0
        if isinstance(src, np.ndarray):
            return float(src[key])
        return self.table.variance_of(src, key)

    @property
    def var(self) -> np.ndarray:
        """Variance of every key's predicted reuse [L*E] (tests; the policy reads a few)."""
        return self._var_at(np.arange(len(self.score)))

    # ---- eviction and admission -----------------------------------------------------------
    def _lowest(self, candidates=None) -> int:
        """Resident key with the lowest eviction rank (ties: lowest key), among `candidates`
        if given; -1 if none. Rank: predicted reuse, or with `freq_decay_eviction` the
        released code's priority (released_priority; it changes with every access)."""
        if not self.freq_decay_eviction:
            return self.ranks.lowest(candidates)
        rank = released_priority(self.score, self.freq * self.resident,
                                 self.topo[self.layer_now])
        return lowest_evictable(np.where(self.resident, rank, np.inf), candidates,
                                self.kernels.fast)

    def _admits(self, incoming: int, victim: int) -> bool:
        """Hysteresis: a prefetch of `incoming` displaces `victim` only if its predicted reuse
        exceeds the victim's by more than `admit_margin` standard errors of the difference,
        sqrt(var_in + var_victim). Python floats: the same IEEE operations as
        propose.admitted's."""
        if self.admit_margin is None:
            return True  # the paper's rule: a prefetch evicts the lowest-reuse resident
        var_in, var_victim = self._var_of(incoming), self._var_of(victim)
        gap = float(self.score[incoming]) - float(self.score[victim])
        return gap > self.admit_margin * math.sqrt(var_in + var_victim)

    def _propose(self, layer: int) -> None:
        """Queue non-resident experts by P * (1 - d/L), highest first, ties by lowest key;
        not those the gate holds back (resident, or with refetch_guard evicted in this or the
        previous iteration).

        Once the cache is full, only experts that the admission rule would let displace the
        next victim are proposed: any other prefetch would be declined in choose_victim.
        """
        if not self.prefetch:
            return
        # without admission (the paper's rule) nothing filters the proposal: no victim to beat
        full = self.n_resident >= self.ctx.capacity_slots and self.admit_margin is not None
        victim = self._lowest() if full else -1
        margin = 0.0 if self.admit_margin is None else self.admit_margin  # unread without victim
        self.proposal = propose.proposal(self.score, self.weight[layer + 1], self._apen, victim,
                                         margin, self.max_proposal,
                                         self._var_rows(), self._var_of, self._var_at,
                                         self.kernels.fast)

    def _var_rows(self) -> tuple[np.ndarray | None, list[int]]:
        """The variances as propose.proposal takes them: (plane, rows), max over the rows."""
        src = self._var_src
        if src is None:
            return None, []
        if isinstance(src, np.ndarray):
            return src.reshape(1, -1), [0]
        return self.table.parts[:, VAR], [st.row for st in src]

    # ---- engine hooks ---------------------------------------------------------------------
    def on_request_start(self, request, now_ms):
        self.active[request.index] = self.table.new_state()
        self._update_scores()
        self._propose(-1)

    def on_layer_routed(self, routing, now_ms):
        members, layer = routing.iteration.members, routing.layer
        prefill, it = routing.iteration.kind == "prefill", routing.iteration.index
        if it != self.it_now:
            self.it_now = it
            self._apen = np.where(self.gate < it - 1, 0.0, -np.inf)
        self.ranks.set_layer(layer, len(routing.experts))
        E = self.ctx.num_experts
        if len(members) == 1:
            self.observe(self.active[members[0][0]], layer, routing.experts, routing.counts,
                         prefill, it)
        else:
            per = routing.per_request()  # {request: top-k ids [tokens, k]}
            counts = batch.bincount_rows(list(per.values()), E, self.table)
            self._observe_batch([self.active[r] for r in per], layer, counts, prefill, it)
        if self.freq_decay_eviction:
            self.layer_now = layer
            self.freq[[layer * E + e for e in routing.experts]] += 1.0  # one visit per access
        self._update_scores()
        self._propose(layer)

    def propose_prefetch(self, now_ms):
        proposal, self.proposal = self.proposal, None
        return proposal

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        victim = self._lowest(candidates)  # evictable, lowest rank
        if victim < 0:
            return None
        if not demand and not self._admits(incoming, victim):
            return None  # declined: not enough more useful than what it would displace
        return victim

    def on_evict(self, key, now_ms):
        self.ranks.evict(key)
        self.resident[key] = False
        self.n_resident -= 1
        self.freq[key] = 0.0
        self.gate[key] = self.it_now if self.refetch_guard else -2
        self._apen[key] = -np.inf if self.refetch_guard else 0.0

    def on_load(self, key, demand, now_ms):
        self.ranks.load(key)
        self.resident[key] = True
        self.n_resident += 1
        self.gate[key] = _RESIDENT
        self._apen[key] = -np.inf

    def on_request_end(self, request, now_ms):
        st = self.active.pop(request.index)
        if self.learn_online:
            c = self.eamc
            replaced = c.replaced
            slot = c.insert(st.eam.reshape(c.L, c.E))
            self._prior = None
            if c.replaced != replaced:  # the predictions that summed that slot are stale
                for other in self.active.values():
                    if slot in other.best:
                        other.stale = True
                    if slot in other.summed:
                        other.summed = frozenset()  # its kept sum no longer holds
        self.table.release(st)

    def describe(self):
        return {**super().describe(), "eamc_capacity": self.capacity,
                "max_proposal": self.max_proposal, "learn_online": self.learn_online,
                "own_weight": self.own_weight, "admit_margin": self.admit_margin,
                "match_top": self.match_top, "iteration_query": self.iteration_query,
                "refetch_guard": self.refetch_guard,
                "freq_decay_eviction": self.freq_decay_eviction,
                "eamc_entries": self.eamc.n if self.eamc else 0,
                "eamc_replacements": self.eamc.replaced if self.eamc else 0,
                "matches": self.matches,
                "mean_best_cosine": self.best_cos_sum / self.matches if self.matches else None}
