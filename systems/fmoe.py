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
takes the lowest p * freq. Matching is asynchronous: a prediction is usable
`match_us_per_map` * stored maps after it is issued (modelled, never measured), and the
engine takes it at its next hook. Choices and divergences: docs/systems.md.
"""

from __future__ import annotations

import numpy as np

from systems.base import System

PREFILL, DECODE = 0, 1
# Added to the p * freq (<= 1 * iterations) of protected keys: a prefetch never evicts them,
# a demand fetch only as a last resort.
_PROTECTED_TIER = 1e12


def select_experts(row: np.ndarray, score: float, top_k: int) -> np.ndarray:
    """Ids of the smallest most-probable set with probability sum >= delta = clip(1 - score,
    0, 1), at least top_k; most probable first, ties by lowest id. row: [E] probabilities."""
    delta = min(1.0, max(0.0, 1.0 - float(score)))
    order = np.argsort(-row, kind="stable")
    mass = np.cumsum(row[order], dtype=np.float64)
    count = min(max(int(np.count_nonzero(mass < delta)) + 1, top_k), len(row))
    return order[:count]


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return (v / np.where(n > 0, n, 1.0)).astype(np.float32)


class TrajectoryState:
    """One request's incremental trajectory cosine against every stored map (one iteration)."""

    __slots__ = ("dots", "query_sq", "kind")

    def __init__(self, n: int, kind: int):
        self.dots = np.zeros(n, np.float32)  # [n] sum over seen layers of stored . query
        self.query_sq = 0.0
        self.kind = kind


class ExpertMapStore:
    """Up to `capacity` expert maps [L, E] with their prompt embeddings and iteration kind.

    `active[kind]`: the MoE layers an iteration of that kind passes through, in order (a decode
    step skips encoder layers); trajectory prefixes follow that order. Default: all layers."""

    def __init__(self, capacity: int, num_layers: int, num_experts: int, distance: int,
                 active: dict[int, list[int]] | None = None):
        self.capacity, self.L, self.E, self.distance = capacity, num_layers, num_experts, distance
        self.w_sem = distance / num_layers  # RDY weight of the semantic term
        self.active = active or {PREFILL: list(range(num_layers)),
                                 DECODE: list(range(num_layers))}
        self.maps = np.zeros((num_layers, capacity, num_experts), np.float32)  # layer-major
        # Per row and layer, for the delta rule: ids by probability (descending, ties lowest
        # id) and the running sum of those probabilities.
        self.order = np.zeros((num_layers, capacity, num_experts), np.int32)
        self.mass = np.zeros((num_layers, capacity, num_experts), np.float32)
        # 1 / |stored prefix| over the first i+1 active layers of each kind: [kind][i, row]
        self.inv_prefix = {k: np.zeros((len(v), capacity), np.float32)
                           for k, v in self.active.items()}
        self.flat = np.zeros((capacity, num_layers * num_experts), np.float32)  # unit maps
        self.emb: np.ndarray | None = None  # [capacity, D] unit rows; zero when absent
        self.has_emb = np.zeros(capacity, bool)
        self.kind = np.zeros(capacity, np.int8)
        self.n = 0
        self.replaced = 0

    def add(self, maps: np.ndarray, embs: np.ndarray | None, has_emb: np.ndarray,
            kinds: np.ndarray, chunk: int = 256) -> None:
        """Insert maps [B, L, E] in order; embs [B, D] (rows where has_emb is False ignored)."""
        if embs is not None:
            if self.emb is None:
                self.emb = np.zeros((self.capacity, embs.shape[1]), np.float32)
            elif embs.shape[1] != self.emb.shape[1]:
                raise ValueError(f"fmoe: embedding dimension {embs.shape[1]} differs from the "
                                 f"store's {self.emb.shape[1]} (field 'embeddings')")
        for c0 in range(0, len(maps), chunk):
            sl = slice(c0, c0 + chunk)
            e = None if embs is None else embs[sl]
            self._add_chunk(np.asarray(maps[sl], np.float32), e, has_emb[sl], kinds[sl])

    def _add_chunk(self, maps, embs, has, kinds) -> None:
        # Similarities to the store as it was (one GEMM) and among the chunk; a row replaced
        # earlier in the chunk is looked up among the chunk's own similarities.
        B, n0 = len(maps), self.n
        order, mass, inv_prefix = self._derived(maps)
        flat = _unit(maps.reshape(B, -1))
        emb = np.zeros((B, 1), np.float32) if embs is None else _unit(
            np.where(has[:, None], embs.astype(np.float32), 0))
        t_old = flat @ self.flat[:n0].T  # [B, n0]
        t_new = flat @ flat.T  # [B, B]
        s_old = emb @ self.emb[:n0].T if self.emb is not None and embs is not None else None
        s_new = emb @ emb.T
        src = np.full(self.capacity, -1, np.int64)  # chunk member now held by each row
        for i in range(B):
            if self.n < self.capacity:
                idx = self.n
                self.n += 1
            else:
                rdy = np.empty(self.capacity)
                rdy[:n0] = self._rdy(t_old[i], None if s_old is None else s_old[i], has[i],
                                     self.has_emb[:n0])
                changed = np.flatnonzero(src >= 0)
                rdy[changed] = self._rdy(t_new[i, src[changed]], s_new[i, src[changed]],
                                         has[i], has[src[changed]])
                idx = int(np.argmax(rdy))
                self.replaced += 1
            self.maps[:, idx], self.order[:, idx], self.mass[:, idx] = maps[i], order[i], mass[i]
            for kind, inv in inv_prefix.items():
                self.inv_prefix[kind][:, idx] = inv[i]
            self.flat[idx] = flat[i]
            if self.emb is not None:
                self.emb[idx] = emb[i] if embs is not None and has[i] else 0.0
            self.has_emb[idx] = bool(has[i]) and embs is not None
            self.kind[idx] = kinds[i]
            src[idx] = i

    def _derived(self, maps: np.ndarray):
        """Per map of a chunk [B, L, E]: id order, running mass, inverse prefix norms."""
        order = np.argsort(-maps, axis=2, kind="stable")
        mass = np.cumsum(np.take_along_axis(maps, order, 2), axis=2, dtype=np.float64)
        sq = np.einsum("ble,ble->bl", maps, maps, dtype=np.float64)  # [B, L]
        inv = {}
        for kind, layers in self.active.items():
            norm = np.sqrt(np.cumsum(sq[:, layers], axis=1))  # [B, len(layers)]
            inv[kind] = np.where(norm > 0, 1 / np.maximum(norm, 1e-300), 0.0)
        return order, mass, inv

    def select(self, layer: int, idx: int, score: float, top_k: int) -> np.ndarray:
        """select_experts on stored row (layer, idx), from its precomputed order and mass."""
        delta = min(1.0, max(0.0, 1.0 - score))
        count = int(np.searchsorted(self.mass[layer, idx], delta, side="left")) + 1
        return self.order[layer, idx, :min(max(count, top_k), self.E)]

    def _rdy(self, traj, sem, has_new, has_old) -> np.ndarray:
        """RDY = d/L * sem + (L-d)/L * traj; traj alone where either map has no embedding."""
        if sem is None or not has_new:
            return np.array(traj, np.float64)
        w = self.w_sem
        return np.where(has_old, w * sem + (1 - w) * traj, traj).astype(np.float64)

    def match_semantic(self, emb: np.ndarray, kind: int, same_kind: bool = True):
        """(map index, cosine) of the closest prompt embedding, or None. emb: unit [D]."""
        n = self.n
        if self.emb is None or not self.has_emb[:n].any():
            return None
        if emb.shape != self.emb.shape[1:]:
            raise ValueError(f"fmoe: a request embedding has shape {emb.shape}; the stored "
                             f"maps' embeddings have {self.emb.shape[1:]} (field 'embeddings')")
        ok = self.has_emb[:n]
        if same_kind and (ok & (self.kind[:n] == kind)).any():
            ok = ok & (self.kind[:n] == kind)
        sims = np.where(ok, self.emb[:n] @ emb, -np.inf)
        idx = int(np.argmax(sims))
        return idx, float(sims[idx])

    def observe(self, state: TrajectoryState, pos: int, q: np.ndarray):
        """Add the query's probabilities q [E] at active layer number `pos` of its kind (layers
        skipped count as zero rows); returns (map index, cosine over the prefix)."""
        n = len(state.dots)
        state.dots += self.maps[self.active[state.kind][pos], :n] @ q
        state.query_sq += float(q @ q)
        # The query's norm is common to every map, so the argmax needs only the stored one.
        inv = self.inv_prefix[state.kind][pos, :n]
        idx = int((state.dots * inv).argmax())
        qn = np.sqrt(state.query_sq)
        return idx, float(state.dots[idx] * inv[idx] / qn) if qn > 0 else 0.0

    def match(self, probs: np.ndarray, embedding: np.ndarray | None = None,
              kind: int = DECODE, distance: int | None = None) -> list[tuple[int, int, float]]:
        """All matching of one iteration of one request, as the system does it: a semantic
        match for layers 0..d-1, then one trajectory step per layer l predicting l + d.
        probs [L, E]; embedding unit [D] or None; distance defaults to the store's d.
        Returns [(predicted layer, map index, score)]."""
        distance = self.distance if distance is None else distance
        out = []
        if embedding is not None:
            m = self.match_semantic(embedding, kind)
            if m is not None:
                out.extend((layer, m[0], m[1]) for layer in self.active[kind][:distance])
        if self.n == 0:
            return out
        state, active = TrajectoryState(self.n, kind), self.active[kind]
        for pos in range(len(active) - distance):
            idx, score = self.observe(state, pos, probs[active[pos]])
            out.append((active[pos + distance], idx, score))
        return out


class _Prediction:
    """Experts predicted for one layer of an iteration by one match."""

    __slots__ = ("layer", "ready_ms", "keys", "probs", "row", "applied")

    def __init__(self, layer, ready_ms, keys, probs, row):
        self.layer, self.ready_ms, self.keys, self.probs, self.row = (
            layer, ready_ms, keys, probs, row)
        self.applied = False  # its row has been written into the eviction probabilities


class FMoE(System):
    name = "fmoe"
    label = "fMoE / FineMoE (expert maps; semantic + trajectory matching)"
    uses_fields = ("probs", "embeddings")

    def __init__(self, prefetch_distance: int = 3, store_capacity: int = 1000,
                 match_us_per_map: float = 0.05, online_update: bool = True,
                 semantic_same_kind: bool = True, protect_prefetched: bool = True):
        if prefetch_distance < 1 or store_capacity < 1 or match_us_per_map < 0:
            raise ValueError("fmoe: prefetch_distance and store_capacity must be >= 1 and "
                             "match_us_per_map >= 0")
        self.d, self.capacity = int(prefetch_distance), int(store_capacity)
        self.match_us_per_map, self.online_update = float(match_us_per_map), online_update
        self.semantic_same_kind, self.protect_prefetched = semantic_same_kind, protect_prefetched

    def bind(self, ctx):
        super().bind(ctx)
        L, E = ctx.num_layers, ctx.num_experts
        # Layers an iteration passes through: a decode step skips encoder MoE layers.
        self.active = {PREFILL: list(range(L)),
                       DECODE: [i for i, s in enumerate(ctx.moe_layer_stacks) if s != "encoder"]}
        self.store = ExpertMapStore(self.capacity, L, E, self.d, self.active)
        self.pos = {k: {layer: i for i, layer in enumerate(v)} for k, v in self.active.items()}
        self.p = np.full(L * E, 1.0 / E)  # latest predicted probability of each expert
        self.freq = np.zeros(L * E)  # accesses since the run began
        self.resident = np.zeros(L * E, bool)
        self.vscore = np.full(L * E, np.inf)  # p * freq where resident, else inf
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
                      "semantic_matches": 0, "trajectory_matches": 0}

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
            emb = _unit(np.asarray(emb, np.float32))
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
                self.pending.append(_Prediction(x.layer, x.ready_ms, x.keys, x.probs, x.row))
                self.stats["predictions"] += 1

    def _prediction(self, layer: int, idx: int, score: float, ready_ms: float):
        """The delta-rule set of stored map `idx` at `layer`; None for a layer without tokens."""
        store = self.store
        if store.mass[layer, idx, -1] <= 0:
            return None
        ids = store.select(layer, idx, score, self.ctx.top_k)
        row = store.maps[layer, idx].copy()
        return _Prediction(layer, ready_ms, layer * self.ctx.num_experts + ids, row[ids], row)

    def on_layer_routed(self, routing, now_ms):
        it, layer, E = routing.iteration, routing.layer, self.ctx.num_experts
        if it.index != self.iter:
            self.iter, self.traj = it.index, {}
            self.kind = PREFILL if it.kind == "prefill" else DECODE
        active = self.active[self.kind]
        self.pos_now = pos = self.pos[self.kind][layer]
        keys = layer * E + np.asarray(routing.experts)
        self.freq[keys] += 1
        self._rescore(keys)
        target = pos + self.d
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
        self.vscore[keys] = np.where(self.resident[keys], self.p[keys] * self.freq[keys],
                                     np.inf)

    def propose_prefetch(self, now_ms):
        """Usable predictions for layers still ahead, by p / (l - l_now), ties lowest key."""
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
        if not usable:
            return []
        keys = np.concatenate([x.keys for x in usable])
        prio = np.concatenate([x.probs / (pos[x.layer] - pos_now) for x in usable])
        order = np.lexsort((keys, -prio))  # priority descending, then lowest key
        keys = keys[order]
        if len(usable) > 1 and self.ctx.max_batch > 1:  # one key, several requests: best wins
            _, first = np.unique(keys, return_index=True)
            keys = keys[np.sort(first)]
        return keys.tolist()

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
        if self.ctx.max_batch == 1:  # one request: a key is named by one prediction at most
            self.penalty[keys] = _PROTECTED_TIER if delta > 0 else 0.0
            return
        self.protect_cnt[keys] += delta
        self.penalty[keys] = (self.protect_cnt[keys] > 0) * _PROTECTED_TIER

    def on_load(self, key, demand, now_ms):
        self.resident[key] = True
        self.vscore[key] = self.p[key] * self.freq[key]

    def choose_victim(self, candidates, incoming, demand, now_ms):
        """Lowest p * freq (eviction priority 1 / (p * freq)), ties lowest key. Experts still
        expected by this iteration's predictions are never evicted for a prefetch and only
        last for a demand fetch."""
        if not candidates.full:
            return None
        score = self.vscore + self.penalty
        while True:
            key = int(score.argmin())
            if score[key] == np.inf or (not demand and score[key] >= _PROTECTED_TIER):
                return None
            if key in candidates:
                self.resident[key] = False
                self.vscore[key] = np.inf
                return key
            score[key] = np.inf  # in flight or in use by the running layer

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
                    "protect_prefetched": self.protect_prefetched})
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
    n_blocks = steps * L
    rows = np.diff(trace.block_offsets)  # tokens per block
    block_of_row = np.repeat(np.arange(n_blocks), rows)
    k = trace.topk.shape[1]
    flat = (block_of_row[:, None] * E + trace.topk.astype(np.int64)).ravel()
    counts = np.bincount(flat, minlength=n_blocks * E).reshape(n_blocks, E).astype(np.float32)
    counts /= np.maximum(rows * k, 1)[:, None]
    return counts.reshape(steps, L, E)
