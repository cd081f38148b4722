"""fmoe: fMoE / FineMoE (Yu et al. 2025, arXiv 2502.05370): fine-grained expert offloading
guided by iteration-level expert maps and prompt semantics.

An expert map is one iteration's router probabilities of one request, [L, E] (trace field
`probs`). The store keeps up to `store_capacity` maps with the prompt's embedding; when full,
an incoming map replaces the stored map most redundant with it,
RDY = d/L * sem + (L - d)/L * traj (cosine of embeddings, cosine of whole maps). Matching:
the first d layers of an iteration come from the map whose prompt embedding is closest
(semantic); after layer l has run, layer l + d comes from the map whose probabilities over
the layers seen so far are closest (trajectory, cosine, updated incrementally per layer).
From the matched row, experts are taken most probable first until they cover
delta = clip(1 - score, 0, 1) (at least top-k). Prefetch priority p / (l - l_now); eviction
takes the lowest p * freq, ties to the least recently used. Not in the paper: a prefetch may
evict only a victim whose use rate is below the incoming's expected use by `admission_margin`;
without `probs`, the probabilities read from a top-k count map are smoothed
(`count_smoothing`).
Matching is asynchronous: a prediction is usable `match_us_per_map` * stored maps after it is
issued (modelled, never measured), and the engine takes it at its next hook. Choices,
divergences and the sweeps behind the defaults: docs/systems.md.
"""

from __future__ import annotations

import numpy as np

from core.blocks import block_expert_counts
from core.knobs import bool_knob, float_knob, int_knob
from systems.base import HISTORY_CAP, System
from systems.expert_maps import (
    DECODE,
    PREFILL,
    ExpertMapStore,
    TrajectoryState,
    unit,
)
from systems.victim_order import VictimOrder

# Added to the p * freq (<= 1 * iterations) of protected keys: a prefetch never evicts them,
# a demand fetch only as a last resort.
_PROTECTED_TIER = 1e12


class _Prediction:
    """Experts predicted for one layer of an iteration by one match."""

    __slots__ = ("layer", "ready_ms", "keys", "probs", "row", "score", "applied")

    def __init__(self, layer, ready_ms, keys, probs, row, score=1.0):
        self.layer, self.ready_ms, self.keys, self.probs, self.row = (
            layer, ready_ms, keys, probs, row)
        self.score = score  # the match's cosine
        self.applied = False  # its row has been written into the eviction probabilities


class FMoE(System):
    name = "fmoe"
    label = "fMoE / FineMoE (expert maps; semantic + trajectory matching)"
    uses_fields = ("probs", "embeddings")

    def __init__(self, prefetch_distance: int = 3, store_capacity: int = 1000,
                 match_us_per_map: float = 0.05, online_update: bool = True,
                 semantic_same_kind: bool = True, protect_prefetched: bool = True,
                 admission_margin: float | None = 0.4, count_smoothing: float = 0.25,
                 prefetch: bool = True):
        super().__init__(prefetch)  # false: maps still set eviction priorities, no copies
        self.d = int_knob(prefetch_distance, "prefetch_distance", lo=1)
        self.capacity = int_knob(store_capacity, "store_capacity", lo=1, hi=HISTORY_CAP)
        self.match_us_per_map = float_knob(match_us_per_map, "match_us_per_map", lo=0.0)
        self.online_update = bool_knob(online_update, "online_update")
        self.semantic_same_kind = bool_knob(semantic_same_kind, "semantic_same_kind")
        self.protect_prefetched = bool_knob(protect_prefetched, "protect_prefetched")
        self.margin = float_knob(admission_margin, "admission_margin", lo=0.0,
                                 null="off: every prefetch may evict, the paper's rule")
        self.smoothing = float_knob(count_smoothing, "count_smoothing", lo=0.0, hi=1.0)

    def bind(self, ctx):
        super().bind(ctx)
        L, E = ctx.num_layers, ctx.num_experts
        # Layers an iteration passes through: a decode step skips encoder MoE layers.
        self.active = {PREFILL: list(range(L)),
                       DECODE: [i for i, s in enumerate(ctx.moe_layer_stacks) if s != "encoder"]}
        self.store = ExpertMapStore(self.capacity, L, E, self.d, self.active)
        self.pos = {k: {layer: i for i, layer in enumerate(v)} for k, v in self.active.items()}
        self.p = np.full(L * E, 1.0 / E)  # latest predicted probability; 1/E before any
        self.freq = np.zeros(L * E)  # accesses since the run began
        self.last_use = np.zeros(L * E, np.int64)  # `clock` at each key's last access
        self.clock = 0  # MoE layer visits so far: the recency order of eviction ties
        self.visits = np.zeros(L, np.int64)  # iterations that ran each layer
        self.expected: dict[int, float] = {}  # key -> expected use, for the queued prefetches
        self.resident = np.zeros(L * E, bool)
        self.vscore = np.full(L * E, np.inf)  # p * freq where resident, else inf
        self.victims = VictimOrder()  # the lowest of (vscore + penalty, last_use, key)
        self.protect_cnt = np.zeros(L * E, np.int32)  # usable predictions naming each key
        self.protected: list[_Prediction] = []
        self.penalty = np.zeros(L * E)  # _PROTECTED_TIER on protected keys
        self.p_epoch = np.full(L, -1)  # epoch whose predictions last set a layer's p
        self.epoch = 0  # one per upcoming iteration: its predictions merge by max
        self.pending: list[_Prediction] = []
        self.kind, self.iter, self.pos_now = DECODE, -1, -1
        self.traj: dict[int, TrajectoryState] = {}
        self.requests: dict[int, dict] = {}
        self.use_probs = "probs" in ctx.trace_fields
        self.stats = {"requests": 0, "requests_without_embedding": 0, "predictions": 0,
                      "semantic_matches": 0, "trajectory_matches": 0, "admission_declined": 0}

    # ---- history -----------------------------------------------------------------------
    def warmup(self, calibration) -> None:
        """Fill the map store from the calibration trace, one map per (request, step)."""
        L, E = self.ctx.num_layers, self.ctx.num_experts
        steps = int(calibration.step_offsets[-1])
        maps = (calibration.probs.reshape(steps, L, E) if calibration.probs is not None
                else _topk_maps(calibration, steps, L, E))
        req_of = np.repeat(np.arange(calibration.num_requests), calibration.output_len)
        kinds = np.where(np.arange(steps) == calibration.step_offsets[:-1][req_of],
                         PREFILL, DECODE).astype(np.int8)
        embs, has = None, np.zeros(steps, bool)
        if calibration.embeddings is not None:
            embs, has = calibration.embeddings[req_of], calibration.has_embedding[req_of]
        self.store.add(maps, embs, has, kinds)
        self.calibration_maps = steps

    def _match_ms(self) -> float:
        return self.store.n * self.match_us_per_map / 1e3

    # ---- requests and iterations -------------------------------------------------------
    def on_request_start(self, request, now_ms):
        if self.kind != PREFILL:  # a prefill pre-empts the decode predicted at the step end
            self.kind, self.pending = PREFILL, []
            self.epoch += 1
        emb = request.embedding
        if emb is not None:
            emb = unit(np.asarray(emb, np.float32))
            if not emb.any():
                emb = None
        self.stats["requests"] += 1
        self.stats["requests_without_embedding"] += emb is None
        state = {"info": request, "maps": [], "emb": emb, "sem": {}}
        self.requests[request.index] = state
        if emb is None or self.store.n == 0:
            return
        # Both kinds' semantic matches are issued now, one after the other on the matcher.
        for i, kind in enumerate((PREFILL, DECODE)):
            m = self.store.match_semantic(emb, kind, self.semantic_same_kind)
            if m is not None:
                layers = self.active[kind][:self.d]
                state["sem"][kind] = [self._prediction(layer, m[0], m[1],
                                                       now_ms + (i + 1) * self._match_ms())
                                      for layer in layers]
                self.stats["semantic_matches"] += 1
        self._semantic(request.index, PREFILL)

    def _semantic(self, r: int, kind: int) -> None:
        for x in self.requests[r]["sem"].get(kind, ()):
            if x is not None:
                self.pending.append(_Prediction(x.layer, x.ready_ms, x.keys, x.probs, x.row,
                                                x.score))
                self.stats["predictions"] += 1

    def _prediction(self, layer: int, idx: int, score: float, ready_ms: float):
        """The delta-rule set of stored map `idx` at `layer`; None for a layer without tokens.
        Without probs, the probabilities read from the count row (queue priority, eviction p,
        expected use) are smoothed toward 1/E; the delta rule selects from the row itself."""
        store = self.store
        if store.mass[layer, idx, -1] <= 0:
            return None
        ids = store.select(layer, idx, score, self.ctx.top_k)
        row = store.maps[layer, idx].copy()
        if not self.use_probs and self.smoothing:  # the fallback's probability estimate
            row = (1.0 - self.smoothing) * row + self.smoothing / self.ctx.num_experts
        return _Prediction(layer, ready_ms, layer * self.ctx.num_experts + ids, row[ids], row,
                           score)

    def on_layer_routed(self, routing, now_ms):
        it, layer, E = routing.iteration, routing.layer, self.ctx.num_experts
        if it.index != self.iter:
            self.iter, self.traj = it.index, {}
            self.kind = PREFILL if it.kind == "prefill" else DECODE
        self.pos_now = pos = self.pos[self.kind][layer]
        keys = layer * E + np.asarray(routing.experts)
        self.freq[keys] += 1
        self.clock += 1
        self.last_use[keys] = self.clock
        self.visits[layer] += 1
        self._rescore(keys)
        self._match_layer(routing, pos, now_ms)
        self._apply_usable(now_ms)

    def _match_layer(self, routing, pos: int, now_ms: float) -> None:
        """Record the layer's rows of the members' maps; match trajectories for layer pos+d."""
        it, layer, E = routing.iteration, routing.layer, self.ctx.num_experts
        active, target = self.active[self.kind], pos + self.d
        want_traj = target < len(active) and self.store.n > 0
        if not (want_traj or self.online_update):
            return
        per_request = None if self.use_probs else routing.per_request()
        for r, _ in it.members:
            if self.use_probs:
                q = routing.probs(r).astype(np.float32)
            else:
                ids = per_request[r]
                q = (np.bincount(ids.ravel(), minlength=E) / max(ids.size, 1)).astype(
                    np.float32)
            if self.online_update:
                self.requests[r]["maps"].append((layer, q))
            if want_traj:
                state = self.traj.get(r)
                if state is None:
                    state = self.traj[r] = TrajectoryState(self.store.n, self.kind)
                idx, score = self.store.observe(state, pos, q)
                self.stats["trajectory_matches"] += 1
                x = self._prediction(active[target], idx, score, now_ms + self._match_ms())
                if x is not None:
                    self.pending.append(x)
                    self.stats["predictions"] += 1

    def _rescore(self, keys) -> None:
        self.victims.invalidate()
        self.vscore[keys] = np.where(self.resident[keys], self.p[keys] * self.freq[keys],
                                     np.inf)

    def _apply_usable(self, now_ms) -> list[_Prediction]:
        """Write the usable predictions for layers still ahead into the eviction p (and their
        protection); returns them. Run at every hook, so `prefetch: false` keeps the maps'
        eviction guidance and differs from `prefetch: true` only by the copies."""
        pos, pos_now, E = self.pos[self.kind], self.pos_now, self.ctx.num_experts
        self.pending = live = [x for x in self.pending if pos[x.layer] > pos_now]
        usable = [x for x in live if x.ready_ms <= now_ms]
        for x in usable:
            if not x.applied:  # eviction probabilities: max over this iteration's requests
                x.applied = True
                block = slice(x.layer * E, (x.layer + 1) * E)
                if self.p_epoch[x.layer] == self.epoch:
                    np.maximum(self.p[block], x.row, out=self.p[block])
                else:
                    self.p[block] = x.row
                    self.p_epoch[x.layer] = self.epoch
                self._rescore(block)
        if self.protect_prefetched:
            self._set_protect(usable)
        return usable

    def propose_prefetch(self, now_ms):
        """Usable predictions for layers still ahead, by p / (l - l_now), ties lowest key."""
        usable = self._apply_usable(now_ms)
        if not usable:
            return []
        pos, pos_now = self.pos[self.kind], self.pos_now
        keys = np.concatenate([x.keys for x in usable])
        prio = np.concatenate([x.probs / (pos[x.layer] - pos_now) for x in usable])
        if self.margin is not None:
            self._expect(keys, usable)
        order = np.lexsort((keys, -prio))  # priority descending, then lowest key
        keys = keys[order]
        if len(usable) > 1 and self.ctx.max_batch > 1:  # one key, several requests: best wins
            _, first = np.unique(keys, return_index=True)
            keys = keys[np.sort(first)]
        return keys.tolist()

    def _expect(self, keys: np.ndarray, usable: list[_Prediction]) -> None:
        """Expected use of each proposed key in its predicted iteration: the match's score
        times the map's share of top-k slots, min(1, k * p); the best over predictions."""
        k = self.ctx.top_k
        use = np.concatenate([max(x.score, 0.0) * np.minimum(1.0, k * x.probs)
                              for x in usable])
        self.expected = {}
        for key, u in zip(keys.tolist(), use.tolist()):
            if u > self.expected.get(key, -1.0):
                self.expected[key] = u

    def _admits(self, incoming: int, victim: int) -> bool:
        """A prefetch may evict only a victim whose use rate (accesses per visit of its layer)
        is below the incoming's expected use by at least the margin."""
        rate = self.freq[victim] / max(int(self.visits[victim // self.ctx.num_experts]), 1)
        return self.expected.get(incoming, 0.0) - rate >= self.margin

    def _set_protect(self, usable: list[_Prediction]) -> None:
        """Protect the keys of the usable predictions (counted: requests may share keys)."""
        new, old = {id(x) for x in usable}, {id(x) for x in self.protected}
        for x in self.protected:
            if id(x) not in new:
                self._protect(x.keys, -1)
        for x in usable:
            if id(x) not in old:
                self._protect(x.keys, 1)
        self.protected = usable

    def _protect(self, keys: np.ndarray, delta: int) -> None:
        self.victims.invalidate()
        if self.ctx.max_batch == 1:  # one request: a key is named by one prediction at most
            self.penalty[keys] = _PROTECTED_TIER if delta > 0 else 0.0
            return
        self.protect_cnt[keys] += delta
        self.penalty[keys] = (self.protect_cnt[keys] > 0) * _PROTECTED_TIER

    def on_load(self, key, demand, now_ms):
        self.resident[key] = True
        self.vscore[key] = self.p[key] * self.freq[key]
        self.victims.update(key, float(self.vscore[key] + self.penalty[key]),
                            int(self.last_use[key]))

    def choose_victim(self, candidates, incoming, demand, now_ms):
        """Lowest p * freq (eviction priority 1 / (p * freq)), ties to the least recently used
        (then the lowest key). Experts still expected by this iteration's predictions are
        never evicted for a prefetch and only last for a demand fetch; a prefetch that fails
        admission (`_admits`) is declined."""
        if not candidates.full:
            return None
        entries = self.victims.get(self.vscore, self.penalty, self.last_use)
        key = None
        while key is None:
            for low, _, k in entries:
                if low == np.inf or (not demand and low >= _PROTECTED_TIER):
                    return None
                if k in candidates:
                    key = k
                    break
            else:  # every key of the kept prefix is busy: a longer one
                entries = self.victims.deepen(self.vscore, self.penalty, self.last_use)
                if entries is None:
                    return None  # every key busy
        if not demand and self.margin is not None and not self._admits(incoming, key):
            # A diagnostic count of the declines answered (describe()); no decision reads it.
            self.stats["admission_declined"] += 1
            return None
        return key

    def on_evict(self, key, now_ms):
        self.resident[key] = False
        self.vscore[key] = np.inf
        self.victims.update(key, np.inf, int(self.last_use[key]))

    def on_step_end(self, iteration, now_ms):
        """Predict the next decode step's first d layers for the requests that continue."""
        self.pending, self.pos_now, self.kind, self.iter = [], -1, DECODE, -1
        self.epoch += 1
        for r, step in iteration.members:
            state = self.requests[r]
            if self.online_update:
                self._keep_map(state, step)
            if step + 1 < state["info"].output_len:
                self._semantic(r, DECODE)
        self._apply_usable(now_ms)

    def _keep_map(self, state: dict, step: int) -> None:
        L, E = self.ctx.num_layers, self.ctx.num_experts
        m = np.zeros((L, E), np.float32)
        for layer, q in state["maps"]:
            m[layer] = q
        state["maps"] = []
        state.setdefault("done", []).append((m, PREFILL if step == 0 else DECODE))

    def on_request_end(self, request, now_ms):
        """The request's maps join the store (de-duplicated) once it has finished."""
        state = self.requests.pop(request.index)
        done = state.get("done")
        if self.online_update and done:
            emb = state["emb"]
            self.store.add(np.stack([m for m, _ in done]),
                           None if emb is None else np.repeat(emb[None], len(done), 0),
                           np.full(len(done), emb is not None),
                           np.array([k for _, k in done], np.int8))

    def describe(self):
        out = super().describe()
        out.update({"prefetch_distance": self.d, "store_capacity": self.capacity,
                    "match_us_per_map": self.match_us_per_map,
                    "online_update": self.online_update,
                    "semantic_same_kind": self.semantic_same_kind,
                    "protect_prefetched": self.protect_prefetched,
                    "admission_margin": self.margin, "count_smoothing": self.smoothing})
        if hasattr(self, "store"):
            s = self.stats
            out.update(s)
            out["map_source"] = "probs" if self.use_probs else "topk_counts (no probs)"
            out["semantic_matching"] = (
                "off: no request had an embedding (trajectory-only)"
                if s["requests"] and s["requests_without_embedding"] == s["requests"] else
                f"on ({s['requests_without_embedding']} requests without an embedding ran "
                "trajectory-only)")
            out["store_maps"], out["store_replacements"] = self.store.n, self.store.replaced
            out["calibration_maps"] = getattr(self, "calibration_maps", 0)
        return out


def _topk_maps(trace, steps: int, L: int, E: int) -> np.ndarray:
    """Fallback maps without `probs`: each block's top-k counts over its tokens, summing to 1."""
    counts = block_expert_counts(trace)  # [steps * L, E]
    counts /= np.maximum(np.diff(trace.block_offsets) * trace.topk.shape[1], 1)[:, None]
    return counts.reshape(steps, L, E)
