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

Cost (every decision is that of the plain float64 rules, bit for bit): the m requests of an
iteration are matched together, one pass over the layer's [E, maps] block per layer: compiled,
exact float64 products of every map (systems/fmoe/kernels/fast.pyx, when built), else a float32
product with exact float64 checks of the few maps that can be the best
(maps.observe_many); the store's replacement search likewise (maps_rdy.py); the
eviction state is python lists and its victim order is edited per change, not rebuilt, by
compiled loops over those lists when built (eviction.py, victim_order.py,
kernels/); the per-hook work on predictions is python lists (predictions.py).
"""

from __future__ import annotations

import numpy as np

from core.blocks import block_expert_counts
from core.knobs import bool_knob, float_knob, int_knob
from systems.base import HISTORY_CAP, System
from systems.fmoe.eviction import EvictionScores
from systems.fmoe.kernels import load_kernels
from systems.fmoe.maps import (
    DECODE,
    PREFILL,
    ExpertMapStore,
    TrajectoryState,
    unit,
)
from systems.fmoe.predictions import (
    LayerGroup,
    Prediction,
    from_store,
    groups,
    merged_proposal,
    proposal,
)


class FMoE(System):
    name = "fmoe"
    label = "fMoE / FineMoE (expert maps; semantic + trajectory matching)"
    uses_fields = ("probs", "embeddings")

    def __init__(self, prefetch_distance: int = 3, store_capacity: int = 1000,
                 match_us_per_map: float = 0.05, online_update: bool = True,
                 semantic_same_kind: bool = True, protect_prefetched: bool = True,
                 admission_margin: float | None = 0.4, count_smoothing: float = 0.25,
                 semantic_matching: bool = True, delta_rule: bool = True,
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
        # ablations (fmoe_ablation): false = no semantic matches (every request runs
        # trajectory-only; embeddings still join the store), false = a prediction takes the
        # matched row's top-k experts instead of the delta rule
        self.semantic_matching = bool_knob(semantic_matching, "semantic_matching")
        self.delta_rule = bool_knob(delta_rule, "delta_rule")

    def bind(self, ctx):
        super().bind(ctx)
        L, E = ctx.num_layers, ctx.num_experts
        self.E = E
        # Layers an iteration passes through: a decode step skips encoder MoE layers.
        self.active = {PREFILL: list(range(L)),
                       DECODE: [i for i, s in enumerate(ctx.moe_layer_stacks) if s != "encoder"]}
        self.kernels = load_kernels(self.policy_kernels)  # compiled or python: the same bits
        self.store = ExpertMapStore(self.capacity, L, E, self.d, self.active, self.kernels)
        self.pos = {k: {layer: i for i, layer in enumerate(v)} for k, v in self.active.items()}
        self.scores = EvictionScores(L, E, self.kernels)
        # The per-key eviction state (python lists; tests and describe() read them here).
        sc = self.scores
        self.p, self.freq, self.last_use, self.visits = sc.p, sc.freq, sc.last_use, sc.visits
        self.clock = 0  # MoE layer visits so far: the recency order of eviction ties
        self.expected_for: list[Prediction] = []  # the usable predictions of the last proposal
        self.grouped: dict[int, LayerGroup] = {}  # the same by layer, merged (batch > 1)
        self.protected: list[Prediction] = []
        self.p_epoch = [-1] * L  # epoch whose predictions last set a layer's p
        self.epoch = 0  # one per upcoming iteration: its predictions merge by max
        self.pending: list[Prediction] = []
        self._last_usable: tuple | None = None  # _apply_usable's last question and answer
        self.kind, self.iter, self.pos_now = DECODE, -1, -1
        self.traj: TrajectoryState | None = None  # the iteration's members, in member order
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
        if emb is None or self.store.n == 0 or not self.semantic_matching:
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
                self.pending.append(x.copy())
                self.stats["predictions"] += 1

    def _predictions(self, layer: int, idx: list[int], score: list[float], ready_ms: float):
        """The delta-rule predictions of stored maps idx [m] at `layer` (from_store); without
        probs, the probabilities read from the count rows (queue priority, eviction p,
        expected use) are smoothed toward 1/E (the delta rule selects from the rows)."""
        smooth = self.smoothing if not self.use_probs else 0.0
        return from_store(self.store, layer, idx, score, ready_ms, self.ctx.top_k, smooth,
                          self.delta_rule)

    def _prediction(self, layer: int, idx: int, score: float, ready_ms: float):
        return self._predictions(layer, [idx], [score], ready_ms)[0]

    def on_layer_routed(self, routing, now_ms):
        it, layer = routing.iteration, routing.layer
        if it.index != self.iter:
            self.iter, self.traj = it.index, None
            self.kind = PREFILL if it.kind == "prefill" else DECODE
        self.pos_now = pos = self.pos[self.kind][layer]
        self.clock += 1
        self.scores.route(layer, routing.experts, self.clock)
        self._match_layer(routing, pos, now_ms)
        self._apply_usable(now_ms)

    def _match_layer(self, routing, pos: int, now_ms: float) -> None:
        """Record the layer's rows of the members' maps; match trajectories for layer pos+d,
        every member in one product."""
        it, layer = routing.iteration, routing.layer
        active, target = self.active[self.kind], pos + self.d
        want_traj = target < len(active) and self.store.n > 0
        if not (want_traj or self.online_update):
            return
        members = it.members
        queries = self._queries(routing, members)  # [m, E]
        if self.online_update:
            for (r, _), q in zip(members, queries):
                self.requests[r]["maps"].append((layer, q))
        if not want_traj:
            return
        if self.traj is None:
            self.traj = TrajectoryState(self.store.n, self.kind, len(members), self.store.fast)
        idx, score = self.store.observe_many(self.traj, pos, queries)
        self.stats["trajectory_matches"] += len(members)
        for x in self._predictions(active[target], idx, score, now_ms + self._match_ms()):
            if x is not None:
                self.pending.append(x)
                self.stats["predictions"] += 1

    def _queries(self, routing, members) -> np.ndarray:
        """The members' rows of this layer [m, E]: router probabilities as float32 (float16
        ones kept: float32 holds them exactly), else top-k count shares (float32)."""
        if self.use_probs:
            q = (routing.probs(members[0][0])[None] if len(members) == 1 else
                 routing.probs_rows([r for r, _ in members]))
            return q if q.dtype == np.float16 else q.astype(np.float32)
        per_request = routing.per_request()
        return np.stack([(np.bincount(ids.ravel(), minlength=self.E) / max(ids.size, 1)
                          ).astype(np.float32) for ids in (per_request[r] for r, _ in members)])

    # ---- eviction scores (systems/fmoe/eviction.py) ---------------------------------------
    @property
    def vscore(self) -> np.ndarray:
        """p * freq where resident, else inf [L*E]."""
        return self.scores.vscore()

    def _rescore(self, keys) -> None:
        """`keys` changed p, freq or last use (set from outside): their order now."""
        self.scores.changed(keys)
        self.scores.flush()

    def _apply_usable(self, now_ms) -> list[Prediction]:
        """Write the usable predictions for layers still ahead into the eviction p (and their
        protection); returns them. Run at every hook, so `prefetch: false` keeps the maps'
        eviction guidance and differs from `prefetch: true` only by the copies."""
        # The engine asks again at the same time right after on_layer_routed: with the same
        # pending list (not appended to), layer and time, the answer and the state are as
        # the last call left them (its predictions applied, its protection set).
        again = (self.pending, len(self.pending), now_ms, self.pos_now, self.kind)
        last = self._last_usable
        if last is not None and again[0] is last[0] and again[1:] == last[1:-1]:
            return last[-1]
        pos, pos_now = self.pos[self.kind], self.pos_now
        self.pending = live = [x for x in self.pending if pos[x.layer] > pos_now]
        usable = [x for x in live if x.ready_ms <= now_ms]
        fresh = [x for x in usable if not x.applied]
        if fresh:
            self._apply_rows(fresh)
        if self.protect_prefetched:
            self._set_protect(usable)
        self._last_usable = (live, len(live), now_ms, pos_now, self.kind, usable)
        return usable

    def _apply_rows(self, fresh: list[Prediction]) -> None:
        """Eviction probabilities: per layer, the max over this epoch's predictions (the
        first of an epoch replaces the layer's p). A layer's new rows are merged in one go:
        max is exact, so the grouping does not matter."""
        by_layer: dict[int, list[list[float]]] = {}
        for x in fresh:
            x.applied = True
            by_layer.setdefault(x.layer, []).append(x.row)
        for layer, rows in by_layer.items():
            first = self.p_epoch[layer] != self.epoch
            self.p_epoch[layer] = self.epoch
            self.scores.set_p(layer, rows, first)

    def _set_protect(self, usable: list[Prediction]) -> None:
        """Protect the keys of the usable predictions (counted: requests may share keys)."""
        if usable == self.protected:  # the same predictions (identity: no __eq__)
            return
        new, old = {id(x) for x in usable}, {id(x) for x in self.protected}
        dropped = [k for x in self.protected if id(x) not in new for k in x.keys]
        added = [k for x in usable if id(x) not in old for k in x.keys]
        self.protected = usable
        # counted with several requests (one request names a key in one prediction at most)
        self.scores.protect(dropped, added, counted=self.ctx.max_batch > 1)

    def propose_prefetch(self, now_ms):
        """Usable predictions for layers still ahead, by p / (l - l_now), ties lowest key."""
        usable = self._apply_usable(now_ms)
        if not usable:
            return []
        self.expected_for = usable  # _admits reads their expected use
        if self.ctx.max_batch == 1:
            return proposal(usable, self.pos[self.kind], self.pos_now)
        # several requests: predictions merged per layer; one key keeps its best place
        self.grouped = groups(usable, self.grouped, self.ctx.top_k, self.kernels)
        return merged_proposal(self.grouped, self.pos[self.kind], self.pos_now)

    def _admits(self, incoming: int, victim: int) -> bool:
        """A prefetch may evict only a victim whose use rate (accesses per visit of its layer)
        is below the incoming's expected use by at least the margin."""
        rate = self.freq[victim] / max(self.visits[victim // self.E], 1)
        return self._expected(incoming) - rate >= self.margin

    def _expected(self, key: int) -> float:
        """expected_use of `key` over the predictions of the last proposal (0: none names
        it): per prediction (one request), else from the layer's merged group."""
        if self.ctx.max_batch > 1:
            g = self.grouped.get(key // self.E)
            return 0.0 if g is None else g.use.get(key, 0.0)
        best, top_k = 0.0, self.ctx.top_k
        for x in self.expected_for:  # expected_use's value for this key, one prediction each
            p = x.prob_of().get(key)
            if p is not None:
                u = max(x.score, 0.0) * min(1.0, top_k * p)
                if u > best:
                    best = u
        return best

    def on_load(self, key, demand, now_ms):
        self.scores.load(key)

    def choose_victim(self, candidates, incoming, demand, now_ms):
        """Lowest p * freq (eviction priority 1 / (p * freq)), ties to the least recently used
        (then the lowest key). Experts still expected by this iteration's predictions are
        never evicted for a prefetch and only last for a demand fetch; a prefetch that fails
        admission (`_admits`) is declined."""
        if not candidates.full:
            return None
        key = self.scores.victim(candidates, demand)
        if key is None:
            return None
        if not demand and self.margin is not None and not self._admits(incoming, key):
            # A diagnostic count of the declines answered (describe()); no decision reads it.
            self.stats["admission_declined"] += 1
            return None
        return key

    def on_evict(self, key, now_ms):
        self.scores.evict(key)

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
                    "admission_margin": self.margin, "count_smoothing": self.smoothing,
                    "delta_rule": self.delta_rule})
        if hasattr(self, "store"):
            s = self.stats
            out.update(s)
            out["map_source"] = "probs" if self.use_probs else "topk_counts (no probs)"
            out["semantic_matching"] = (
                "off: semantic_matching=false (trajectory-only)" if not self.semantic_matching
                else "off: no request had an embedding (trajectory-only)"
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
