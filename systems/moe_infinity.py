"""moe_infinity: MoE-Infinity (Xue et al., arXiv 2401.14361): expert activation matrices (EAM)
matched against a fixed-capacity collection of finished requests' EAMs (EAMC, systems/eamc.py)
drive prefetch and eviction.

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
`admit_margin` standard errors of the difference; otherwise it is declined. Misses are fetched
on demand. Choices where the paper is loose, defaults and the sweeps that chose them:
docs/systems.md, "moe_infinity: choices and divergences".

Matching is incremental: per request the dot products with every stored EAM are updated with
the layer's new counts only (O(N * experts routed)), and cosine uses per-entry prefix norms.
"""

from __future__ import annotations

import math

import numpy as np

from core.knobs import bool_knob, float_knob, int_knob
from systems.base import HISTORY_CAP, System
from systems.eamc import EAMC, ranked_keys, request_eams

_RESIDENT = 2**62  # gate value of a resident key: above every iteration index


class RequestState:
    """One running request: its EAM, the query EAM and its dot products with the collection."""

    __slots__ = ("eam", "own", "own_var", "mix", "keep2", "mix2", "q", "q_keys", "q_iter",
                 "dots", "norm2", "version", "best", "best_cos")

    def __init__(self, num_keys: int, n_slots: int, iteration_query: bool = False):
        self.eam = np.zeros(num_keys)  # flattened [L*E] token counts of the request so far
        self.own = np.zeros(num_keys)  # the same, row-normalised per layer
        self.own_var = np.zeros(num_keys)  # binomial variance of each own share, s (1 - s) / n
        self.mix = np.zeros(num_keys)  # own_weight on the layers the request has reached, else 0
        self.keep2 = np.ones(num_keys)  # (1 - mix)^2 and mix^2, the blend's variance weights
        self.mix2 = np.zeros(num_keys)
        # The query: this iteration's counts only (reset per iteration) or the request's EAM.
        self.q = np.zeros(num_keys) if iteration_query else self.eam
        self.q_keys: list[int] = []  # keys with counts in an iteration-level q
        self.q_iter = -1  # iteration index q belongs to
        self.dots = np.zeros(n_slots)  # q . entry, exact: integer counts (see EAMC)
        self.norm2 = 0.0  # |q|^2
        self.version = -1
        self.best: tuple[int, ...] = ()  # matched slots, empty before the first match
        self.best_cos = 0.0


class MoEInfinity(System):
    name = "moe_infinity"
    label = "MoE-Infinity (EAM matching: prefetch and evict by predicted EAM)"

    def __init__(self, eamc_capacity: int = 1000, max_proposal: int = 8,
                 learn_online: bool = True, own_weight: float = 0.5, admit_margin: float = 16.0,
                 match_top: int = 4, iteration_query: bool = True,
                 freq_decay_eviction: bool = False, refetch_guard: bool = True,
                 prefetch: bool = True):
        super().__init__(prefetch)
        self.own_weight = float_knob(own_weight, "own_weight", lo=0.0, hi=1.0)
        self.capacity = int_knob(eamc_capacity, "eamc_capacity", lo=1, hi=HISTORY_CAP)
        self.max_proposal = int_knob(max_proposal, "max_proposal", lo=1)
        self.learn_online = bool_knob(learn_online, "learn_online")
        self.admit_margin = float_knob(admit_margin, "admit_margin", lo=0.0)
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
        self.active: dict[int, RequestState] = {}
        self.resident = np.zeros(L * E, dtype=bool)
        self.n_resident = 0
        self.score = np.zeros(L * E)  # predicted reuse per key (max over active requests)
        # [L*E] score where resident, else inf (None: to rebuild); _lowest's argmin reads it
        self._masked: np.ndarray | None = None
        self.var = np.zeros(L * E)  # its variance (max over active requests)
        # slots -> predicted EAM and its variance (this collection version)
        self._pred_memo: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._prior: tuple[np.ndarray, np.ndarray] | None = None
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
        # its eviction's iteration (refetch_guard) or -2 (never blocks)
        self.gate = np.full(L * E, -2)

    def warmup(self, calibration):
        for eam in request_eams(calibration):
            self.eamc.insert(eam)
        self._pred_memo.clear()
        self._prior = None

    # ---- matching (public: harness/bench/policies.py times observe and match) --------------
    def request_state(self, iteration_query: bool | None = None) -> RequestState:
        """A fresh per-request matching state for this collection (None: the system's
        `iteration_query`); feed it with observe()."""
        iq = self.iteration_query if iteration_query is None else iteration_query
        return RequestState(self.ctx.total_experts, self.eamc.capacity, iq)

    def _predicted(self, slots: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        p = self._pred_memo.get(slots)
        if p is None:
            p = self._pred_memo[slots] = self.eamc.predicted(slots)
        return p

    def _refresh(self, st: RequestState) -> None:
        """Recompute dot products after the collection changed."""
        c = self.eamc
        st.dots = st.q @ c.cols  # [capacity]; unused slots give 0
        st.version = c.version

    def _new_iteration(self, st: RequestState, iteration: int) -> None:
        """Iteration-level query: start an empty query EAM for the request's next iteration."""
        st.q[st.q_keys] = 0.0
        st.q_keys.clear()
        st.dots = np.zeros(self.eamc.capacity)
        st.norm2 = 0.0
        st.version = self.eamc.version
        st.q_iter = iteration

    def observe(self, st: RequestState, layer: int, ids: list[int], counts: list[int],
                 prefill: bool, iteration: int = -1) -> None:
        """Add one layer's counts (python lists: ids ascending, tokens each) and re-match.

        The k-element bookkeeping is plain python (cheaper than numpy calls at k <= ~8)."""
        c, E = self.eamc, self.ctx.num_experts
        if self.iteration_query and iteration != st.q_iter:
            self._new_iteration(st, iteration)
        if c.n and st.version != c.version:
            self._refresh(st)  # before adding this layer's counts, which are added below
        base, eam, q, d = layer * E, st.eam, st.q, 0.0
        apart = q is not eam
        for e, cnt in zip(ids, counts):
            key = base + e
            old = float(q[key])
            q[key] = old + cnt
            d += cnt * (2.0 * old + cnt)
            if apart:
                eam[key] += cnt
                st.q_keys.append(key)
        st.norm2 += d
        w = self.own_weight
        if w > 0:
            row = eam[base:base + E]
            n = float(row.sum())
            share = row * (1.0 / n)
            st.own[base:base + E] = share
            st.own_var[base:base + E] = share * (1.0 - share) * (1.0 / n)
            if st.mix[base] != w:  # the request reaches this layer for the first time
                st.mix[base:base + E] = w
                st.keep2[base:base + E] = (1.0 - w) * (1.0 - w)
                st.mix2[base:base + E] = w * w
        if c.n:
            # cosine over the layers the query has seen: 0..layer, or all once a request-level
            # query decodes (the prefill filled every layer)
            lim = layer if prefill or self.iteration_query else c.L - 1
            self.match(st, [base + e for e in ids], counts, lim)

    def match(self, st: RequestState, keys: list[int], counts: list[int], lim: int) -> None:
        """The EAMC query, incrementally: add the new counts' dot products with every entry
        (k rows of the layer-major store), then the `match_top` best cosines over layers
        0..lim (ties: lowest slot). Unused slots are all-zero columns with inverse norm 0."""
        c = self.eamc
        st.dots += np.asarray(counts, dtype=np.float64) @ c.cols.take(keys, axis=0)  # [cap]
        # cosine = dots / (|query| |entry prefix|); |query| is the same for every entry
        scaled = st.dots * c.inv_norm[lim]
        if self.match_top == 1:
            st.best = (int(scaled.argmax()),)
        else:
            st.best = tuple(ranked_keys(scaled[:c.n], self.match_top))
        st.best_cos = float(scaled[st.best[0]]) / math.sqrt(st.norm2)
        self.matches += 1
        self.best_cos_sum += st.best_cos

    def _update_scores(self) -> None:
        # (1 - w) * P + w * own on the layers the request has reached; P alone on the others,
        # where its own EAM has no counts yet (blending those zeros would halve their reuse).
        # Variance of the blend: (1 - w)^2 var(P) + w^2 var(own), the two estimates independent.
        self._masked = None  # the scores change below
        preds = []
        for st in self.active.values():
            if st.best:
                p, v = self._predicted(st.best)
                # keep2 = (1 - mix)^2, mix2 = mix^2: the same products, kept per request
                preds.append((p + st.mix * (st.own - p), st.keep2 * v + st.mix2 * st.own_var))
        if not preds:
            if self._prior is None and self.eamc.n:
                self._prior = self.eamc.predicted()  # the whole collection, before a match
            preds = [self._prior] if self._prior is not None else []
        if not preds:
            return  # empty collection: scores stay zero, eviction by lowest key
        if len(preds) == 1:
            self.score, self.var = preds[0]
        else:
            self.score = np.max([p for p, _ in preds], axis=0)
            self.var = np.max([v for _, v in preds], axis=0)

    # ---- eviction and admission -----------------------------------------------------------
    def _rank(self) -> np.ndarray:
        """Eviction rank per key [L*E], lowest first: predicted reuse, or with
        `freq_decay_eviction` the released code's priority (see released_priority)."""
        if not self.freq_decay_eviction:
            return self.score
        return released_priority(self.score, self.freq * self.resident,
                                 self.topo[self.layer_now])

    def _lowest(self, rank: np.ndarray, candidates=None) -> int:
        """Resident key with the lowest rank (ties: lowest key), among `candidates` if given;
        -1 if none."""
        if self.freq_decay_eviction:  # that rank changes with every access: no cache
            masked = np.where(self.resident, rank, np.inf)
        else:
            masked = self._masked
            if masked is None:
                masked = self._masked = np.where(self.resident, rank, np.inf)
        skipped = []
        key = -1
        while True:
            k = int(masked.argmin())
            if masked[k] == np.inf:
                break
            if candidates is None or k in candidates:
                key = k
                break
            skipped.append((k, masked[k]))
            masked[k] = np.inf  # in use by the running layer or still in flight
        for k, value in skipped:  # restored: the cache stays the resident ranks
            masked[k] = value
        return key

    def _admits(self, incoming, victim: int):
        """Hysteresis: a prefetch of `incoming` (a key, or slice(None) for every key at once)
        displaces `victim` only if its predicted reuse exceeds the victim's by more than
        `admit_margin` standard errors of the difference, sqrt(var_in + var_victim)."""
        if isinstance(incoming, slice):
            gap = self.score - self.score[victim]
            return gap > self.admit_margin * np.sqrt(self.var + self.var[victim])
        # one key: python floats, the same IEEE operations as the vector form
        gap = float(self.score[incoming]) - float(self.score[victim])
        return gap > self.admit_margin * math.sqrt(float(self.var[incoming])
                                                   + float(self.var[victim]))

    def _propose(self, layer: int) -> None:
        """Queue non-resident experts by P * (1 - d/L), highest first, ties by lowest key.

        Once the cache is full, only experts that the admission rule would let displace the
        next victim are proposed: any other prefetch would be declined in choose_victim.
        """
        if not self.prefetch:
            return
        prio = self.score * self.weight[layer + 1]
        # not resident and, with refetch_guard, not evicted in this or the previous iteration
        ok = self.gate < self.it_now - 1
        ok &= prio > 0
        if self.n_resident >= self.ctx.capacity_slots:
            victim = self._lowest(self._rank())
            if victim >= 0:
                ok &= self._admits(slice(None), victim)
        self.proposal = ranked_keys(prio, self.max_proposal, np.flatnonzero(ok))

    # ---- engine hooks ---------------------------------------------------------------------
    def on_request_start(self, request, now_ms):
        self.active[request.index] = RequestState(self.ctx.total_experts, self.eamc.capacity,
                                             self.iteration_query)
        self._update_scores()
        self._propose(-1)

    def on_layer_routed(self, routing, now_ms):
        members, layer = routing.iteration.members, routing.layer
        prefill, it = routing.iteration.kind == "prefill", routing.iteration.index
        self.it_now = it
        E = self.ctx.num_experts
        if len(members) == 1:
            st = self.active[members[0][0]]
            self.observe(st, layer, routing.experts, routing.counts, prefill, it)
        else:
            for r, rows in routing.per_request().items():
                counts = np.bincount(rows.ravel(), minlength=E)[:E]
                ids = np.flatnonzero(counts)
                self.observe(self.active[r], layer, ids.tolist(), counts[ids].tolist(),
                              prefill, it)
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
        victim = self._lowest(self._rank(), candidates)  # evictable, lowest rank
        if victim < 0:
            return None
        if not demand and not self._admits(incoming, victim):
            return None  # declined: not enough more useful than what it would displace
        return victim

    def on_evict(self, key, now_ms):
        if self._masked is not None:
            self._masked[key] = np.inf
        self.resident[key] = False
        self.n_resident -= 1
        self.freq[key] = 0.0
        self.gate[key] = self.it_now if self.refetch_guard else -2

    def on_load(self, key, demand, now_ms):
        if self._masked is not None:
            self._masked[key] = self.score[key]
        self.resident[key] = True
        self.n_resident += 1
        self.gate[key] = _RESIDENT

    def on_request_end(self, request, now_ms):
        st = self.active.pop(request.index)
        if self.learn_online:
            self.eamc.insert(st.eam.reshape(self.ctx.num_layers, self.ctx.num_experts))
            self._pred_memo.clear()
            self._prior = None

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


def released_layer_factor(num_layers: int, num_experts: int) -> np.ndarray:
    """The released code's layer ("topology") factor of eviction, [L, L*E]: row c is for the
    current layer c, normalised over all keys, + 1e-6 (expert_priority_score.priority_score).
    It splits the layers in halves (a leftover of encoder-decoder Switch, applied to every
    model): layers of the current half up to c get 1, later ones of that half 1 - i/n (first
    half) or (i - n) / (n + 1) (second half, i - n counted from its start); the other half
    keeps its later-layer rule. n = L // 2; a single layer (n = 0) gets a uniform factor."""
    n, i = num_layers // 2, np.arange(num_layers)
    if n == 0:
        return np.full((num_layers, num_layers * num_experts), 1.0 / num_experts + 1e-6)
    first, second = 1.0 - i / n, (i - n) / (n + 1.0)
    rows = []
    for c in range(num_layers):
        if c < n:
            t = np.where(i < n, np.where(i > c, first, 1.0), second)
        else:
            t = np.where(i < n, first, np.where(i > c, second, 1.0))
        rows.append(np.repeat(t / (t.sum() * num_experts), num_experts) + 1e-6)
    return np.array(rows)


def released_priority(reuse: np.ndarray, freq: np.ndarray, layer_factor: np.ndarray):
    """The released code's eviction priority [L*E] (lowest evicted first): the product of the
    layer factor, the predicted reuse and the access frequency of the resident experts, each
    normalised to sum 1 and shifted by 1e-6 (an all-zero factor counts as uniform). `freq`:
    accesses since the expert was loaded, 0 for absent keys; integer-valued, so its sum is
    exact."""
    out = layer_factor.copy()
    for f in (reuse, freq):
        total = float(f.sum())
        out *= (f / total if total > 0 else 1.0 / len(f)) + 1e-6
    return out
