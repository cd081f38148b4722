"""moe_infinity: MoE-Infinity (Xue et al., arXiv 2401.14361): request-level expert activation
matrices (EAM) matched against a fixed-capacity collection (EAMC) drive prefetch and eviction.

EAM of a request: counts [L, E] of tokens routed to each expert, over prefill and decode.
EAMC: `capacity` EAMs of finished requests (warmed from the calibration split, then every
finished request of the run); when full, a new EAM replaces the stored one most similar to it
(cosine), which keeps the collection diverse. While a request runs, its partial EAM is matched
after every MoE layer by cosine over the layers seen so far (prefill: layers 0..l; decode: all
layers) and the best match, row-normalised, is the predicted EAM: P[l, e] = probability that a
token of this request uses expert e at layer l. Prefetch ranks experts by
P[l, e] * (1 - d / L), with d = 1..L-1 the layers ahead of the current one (cyclic, so the last
layers prefetch the next token's first ones); eviction removes the resident expert with the
lowest P (predicted reuse); a prefetch never evicts an expert predicted at least as useful.
Misses are fetched on demand. Choices where the paper is loose: docs/systems.md.

Matching is incremental: per request the dot products with every stored EAM are updated with
the layer's new counts only (O(N * experts routed)), and cosine uses per-entry prefix norms.
"""

from __future__ import annotations

import math

import numpy as np

from harness.blocks import block_expert_counts
from systems.base import HISTORY_CAP, System, bool_knob, float_knob, int_knob


class EAMC:
    """Expert activation matrix collection: up to `capacity` EAMs [L, E] with prefix norms.

    Stored layer-major, `cols` [L*E, capacity] (one column per EAM), so that matching one layer's
    k routed experts reads k contiguous rows. float64 holding integer token counts: every dot
    product of counts is exact (its sums stay far below 2**53), so the BLAS kernel's summation
    order cannot change a match (docs/trace-format.md, "Portable determinism")."""

    def __init__(self, capacity: int, num_layers: int, num_experts: int):
        if capacity < 1:
            raise ValueError(f"moe_infinity: eamc_capacity must be >= 1, got {capacity}")
        self.capacity, self.L, self.E = capacity, num_layers, num_experts
        self.cols = np.zeros((num_layers * num_experts, capacity))
        self.prefix = np.zeros((num_layers, capacity))  # [l, slot]: sum of squares, layers 0..l
        # [l, slot]: 1 / sqrt(prefix) (0 for an empty prefix)
        self.inv_norm = np.zeros((num_layers, capacity))
        self.n = 0
        self.replaced = 0
        self.version = 0  # bumped on every insert: cached dot products are then stale

    def insert(self, eam: np.ndarray) -> int:
        """Store an EAM [L, E]; when full, overwrite the most similar entry. Returns its slot."""
        eam = np.asarray(eam, dtype=np.float64)
        if self.n < self.capacity:
            slot = self.n
            self.n += 1
        else:
            slot = int(np.argmax(self.cosine(eam.ravel())))
            self.replaced += 1
        self.cols[:, slot] = eam.ravel()
        self.prefix[:, slot] = np.cumsum(np.square(eam, dtype=np.float64).sum(axis=1))
        p = self.prefix[:, slot]
        self.inv_norm[:, slot] = np.divide(1.0, np.sqrt(p), out=np.zeros_like(p), where=p > 0)
        self.version += 1
        return slot

    def entry(self, slot: int) -> np.ndarray:
        """Stored EAM [L, E] of one slot."""
        return self.cols[:, slot].reshape(self.L, self.E)

    def cosine(self, flat_eam: np.ndarray, upto_layer: int | None = None) -> np.ndarray:
        """Cosine [n] of an EAM (flattened [L*E]) with every entry, over layers 0..upto_layer."""
        lim = self.L - 1 if upto_layer is None else upto_layer
        width = (lim + 1) * self.E
        q = np.asarray(flat_eam[:width], dtype=np.float64)
        dots = q @ self.cols[:width, :self.n]
        return _cos(dots, float(np.dot(q, q)), self.prefix[lim, :self.n])

    def query(self, flat_eam: np.ndarray, upto_layer: int | None = None) -> tuple[int, float]:
        """Best match (slot, cosine); ties go to the lowest slot."""
        cos = self.cosine(flat_eam, upto_layer)
        best = int(np.argmax(cos))
        return best, float(cos[best])

    def predicted(self, slot: int) -> np.ndarray:
        """Row-normalised EAM of one entry, flattened [L*E] (all-zero rows stay zero)."""
        return _per_layer_shares(self.entry(slot)).ravel()

    def mean_predicted(self) -> np.ndarray:
        """Average predicted EAM over the collection: the prior before a request's first match."""
        m = self.cols[:, :self.n].T.reshape(self.n, self.L, self.E)
        return _per_layer_shares(m).mean(axis=0).ravel()


def _per_layer_shares(m: np.ndarray) -> np.ndarray:
    """Counts [..., E] -> float64 shares per row (each layer's row sums to 1; zero rows stay 0)."""
    m = m.astype(np.float64)
    rows = m.sum(axis=-1, keepdims=True)
    return np.divide(m, rows, out=np.zeros_like(m), where=rows > 0)


def _cos(dots: np.ndarray, norm2: float, prefix: np.ndarray) -> np.ndarray:
    denom = np.sqrt(norm2 * prefix)
    return np.divide(dots, denom, out=np.zeros(len(dots)), where=denom > 0)


class _Active:
    """One running request: its partial EAM and dot products with the collection."""

    __slots__ = ("eam", "own", "dots", "norm2", "version", "best", "best_cos")

    def __init__(self, num_keys: int, n_slots: int):
        self.eam = np.zeros(num_keys)  # flattened [L*E] token counts
        self.own = np.zeros(num_keys)  # the same, row-normalised per layer
        self.dots = np.zeros(n_slots)  # exact: integer counts (see EAMC)
        self.norm2 = 0.0
        self.version = -1
        self.best = -1  # matched slot, -1 before the first match
        self.best_cos = 0.0


class MoEInfinity(System):
    name = "moe_infinity"
    label = "MoE-Infinity (request-level EAM matching: prefetch and evict by predicted EAM)"

    def __init__(self, eamc_capacity: int = 1000, max_proposal: int = 8,
                 learn_online: bool = True, own_weight: float = 0.5, prefetch: bool = True):
        super().__init__(prefetch)
        self.own_weight = float_knob(own_weight, "own_weight", lo=0.0, hi=1.0)
        self.capacity = int_knob(eamc_capacity, "eamc_capacity", lo=1, hi=HISTORY_CAP)
        self.max_proposal = int_knob(max_proposal, "max_proposal", lo=1)
        self.learn_online = bool_knob(learn_online, "learn_online")
        self.eamc: EAMC | None = None
        self.matches, self.best_cos_sum = 0, 0.0

    def bind(self, ctx):
        super().bind(ctx)
        L, E = ctx.num_layers, ctx.num_experts
        self.eamc = EAMC(self.capacity, L, E)
        self.active: dict[int, _Active] = {}
        self.resident = np.zeros(L * E, dtype=bool)
        self.n_resident = 0
        self.score = np.zeros(L * E)  # predicted reuse per key (max over active requests)
        self._pred_memo: dict[int, np.ndarray] = {}  # slot -> predicted EAM (this version)
        self._prior: np.ndarray | None = None
        # weight[i] for the current layer l = i - 1: 1 - d/L, d = layers ahead (cyclic), 0 at d = 0
        layer_of_key = np.repeat(np.arange(L), E)
        d = (layer_of_key[None, :] - np.arange(-1, L)[:, None]) % L  # [L+1, L*E]
        self.weight = np.where(d == 0, 0.0, 1.0 - d / L)
        self.proposal: list[int] | None = None

    def warmup(self, calibration):
        for eam in request_eams(calibration):
            self.eamc.insert(eam)
        self._pred_memo.clear()
        self._prior = None

    # ---- matching -------------------------------------------------------------------------
    def _predicted(self, slot: int) -> np.ndarray:
        p = self._pred_memo.get(slot)
        if p is None:
            p = self._pred_memo[slot] = self.eamc.predicted(slot)
        return p

    def _refresh(self, st: _Active) -> None:
        """Recompute dot products after the collection changed."""
        c = self.eamc
        st.dots = st.eam @ c.cols  # [capacity]; unused slots give 0
        st.version = c.version

    def _observe(self, st: _Active, layer: int, ids: list[int], counts: list[int],
                 prefill: bool) -> None:
        """Add one layer's counts (python lists: ids ascending, tokens each) and re-match.

        The k-element bookkeeping is plain python (cheaper than numpy calls at k <= ~8)."""
        c, E = self.eamc, self.ctx.num_experts
        if c.n and st.version != c.version:
            self._refresh(st)  # before adding this layer's counts, which are added below
        base, eam, d = layer * E, st.eam, 0.0
        for e, cnt in zip(ids, counts):
            old = float(eam[base + e])
            eam[base + e] = old + cnt
            d += cnt * (2.0 * old + cnt)
        st.norm2 += d
        if self.own_weight > 0:
            row = eam[base:base + E]
            st.own[base:base + E] = row * (1.0 / row.sum())
        if c.n:
            self._match(st, [base + e for e in ids], counts, layer if prefill else c.L - 1)

    def _match(self, st: _Active, keys: list[int], counts: list[int], lim: int) -> None:
        """The EAMC query, incrementally: add the new counts' dot products with every entry
        (k rows of the layer-major store), then the best cosine over layers 0..lim. Unused
        slots are all-zero columns with inverse norm 0, so they never win."""
        c = self.eamc
        st.dots += np.asarray(counts, dtype=np.float64) @ c.cols.take(keys, axis=0)  # [cap]
        # cosine = dots / (|query| |entry prefix|); |query| is the same for every entry
        scaled = st.dots * c.inv_norm[lim]
        st.best = int(scaled.argmax())
        st.best_cos = float(scaled[st.best]) / math.sqrt(st.norm2)
        self.matches += 1
        self.best_cos_sum += st.best_cos

    def _update_scores(self) -> None:
        w = self.own_weight
        preds = [self._predicted(st.best) if w == 0 else
                 (1 - w) * self._predicted(st.best) + w * st.own
                 for st in self.active.values() if st.best >= 0]
        if not preds:
            if self._prior is None and self.eamc.n:
                self._prior = self.eamc.mean_predicted()
            preds = [self._prior] if self._prior is not None else []
        if not preds:
            return  # empty collection: scores stay zero, eviction by lowest key
        score = preds[0] if len(preds) == 1 else np.max(preds, axis=0)
        self.score = score

    def _propose(self, layer: int) -> None:
        """Queue non-resident experts by P * (1 - d/L), highest first, ties by lowest key.

        Only experts predicted more useful than the least useful resident one are proposed:
        any other prefetch would be declined in choose_victim once the cache is full.
        """
        prio = self.score * self.weight[layer + 1]
        floor = 0.0
        if self.n_resident >= self.ctx.capacity_slots:
            floor = float(self.score[self.resident].min())
        prio[self.resident | (self.score <= floor)] = 0.0
        cand = np.flatnonzero(prio > 0)
        m = self.max_proposal
        if len(cand) > m > 0:
            # Which of several equal priorities at the cut argpartition keeps depends on
            # numpy's SIMD sort: keep all ties with the m-th highest, the lexsort picks.
            kth = np.partition(prio[cand], len(cand) - m)[len(cand) - m]
            cand = cand[prio[cand] >= kth]
        cand = cand[np.lexsort((cand, -prio[cand]))][:m]
        self.proposal = cand.tolist()

    # ---- engine hooks ---------------------------------------------------------------------
    def on_request_start(self, request, now_ms):
        self.active[request.index] = _Active(self.ctx.total_experts, self.eamc.capacity)
        self._update_scores()
        self._propose(-1)

    def on_layer_routed(self, routing, now_ms):
        members, layer = routing.iteration.members, routing.layer
        prefill = routing.iteration.kind == "prefill"
        if len(members) == 1:
            st = self.active[members[0][0]]
            self._observe(st, layer, routing.experts, routing.counts, prefill)
        else:
            E = self.ctx.num_experts
            for r, rows in routing.per_request().items():
                counts = np.bincount(rows.ravel(), minlength=E)[:E]
                ids = np.flatnonzero(counts)
                self._observe(self.active[r], layer, ids.tolist(), counts[ids].tolist(), prefill)
        self._update_scores()
        self._propose(layer)

    def propose_prefetch(self, now_ms):
        proposal, self.proposal = self.proposal, None
        return proposal

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if not candidates.full:
            return None
        # Lowest predicted reuse among evictable residents, ties by lowest key (argmin's).
        masked = np.where(self.resident, self.score, np.inf)
        while True:
            victim = int(np.argmin(masked))
            if masked[victim] == np.inf:
                return None
            if victim in candidates:
                break
            masked[victim] = np.inf  # in use by the running layer or still in flight
        if not demand and self.score[victim] >= self.score[incoming]:
            return None  # a prefetch must not evict an expert predicted at least as useful
        self.resident[victim] = False
        self.n_resident -= 1
        return victim

    def on_load(self, key, demand, now_ms):
        self.resident[key] = True
        self.n_resident += 1

    def on_request_end(self, request, now_ms):
        st = self.active.pop(request.index)
        if self.learn_online:
            self.eamc.insert(st.eam.reshape(self.ctx.num_layers, self.ctx.num_experts))
            self._pred_memo.clear()
            self._prior = None

    def describe(self):
        return {**super().describe(), "eamc_capacity": self.capacity,
                "max_proposal": self.max_proposal, "learn_online": self.learn_online,
                "own_weight": self.own_weight,
                "eamc_entries": self.eamc.n if self.eamc else 0,
                "eamc_replacements": self.eamc.replaced if self.eamc else 0,
                "matches": self.matches,
                "mean_best_cosine": self.best_cos_sum / self.matches if self.matches else None}


def request_eams(trace) -> list[np.ndarray]:
    """EAM [L, E] (token counts over prefill and decode) of every request of a trace."""
    steps = int(trace.step_offsets[-1])
    per_step = block_expert_counts(trace).reshape(steps, trace.num_layers, trace.num_experts)
    return list(np.add.reduceat(per_step, trace.step_offsets[:-1], axis=0))  # R x [L, E]
