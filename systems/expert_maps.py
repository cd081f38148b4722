"""fMoE's expert-map store (systems/fmoe.py): maps [L, E] with prompt embeddings, RDY
de-duplication, semantic and incremental trajectory matching, and the delta rule.

Kept apart from the policy so the matching can be timed and tested on its own
(`ExpertMapStore.match`). numpy only.

Portable (docs/trace-format.md, "Portable determinism"): maps, queries and unit vectors are
float64 on the grid of multiples of 2**-24 (float16 probabilities already are), so every
product of two is a multiple of 2**-48 and every BLAS dot product of probability rows
(each summing to about 1) or unit vectors is exact: the same cosines, so the same matches,
with any BLAS kernel. Sums over layers and the rest are elementwise, in a fixed order.
"""

from __future__ import annotations

import numpy as np

from core.numerics import on_grid

PREFILL, DECODE = 0, 1
GRID_BITS = 24  # maps, queries and unit vectors: multiples of 2**-24


def select_experts(row: np.ndarray, score: float, top_k: int) -> np.ndarray:
    """Ids of the smallest most-probable set with probability sum >= delta = clip(1 - score,
    0, 1), at least top_k; most probable first, ties by lowest id. row: [E] probabilities."""
    delta = min(1.0, max(0.0, 1.0 - float(score)))
    order = np.argsort(-row, kind="stable")
    mass = np.cumsum(row[order], dtype=np.float64)
    count = min(max(int(np.count_nonzero(mass < delta)) + 1, top_k), len(row))
    return order[:count]


def unit(v: np.ndarray) -> np.ndarray:
    """Rows of v [..., D] scaled to unit norm (zero rows stay zero), on the 2**-24 grid,
    float64: dot products of two such rows are exact."""
    v = np.asarray(v, np.float64)
    n = np.sqrt(np.square(v).sum(axis=-1, keepdims=True))
    return on_grid(v / np.where(n > 0, n, 1.0), GRID_BITS)


class TrajectoryState:
    """One request's incremental trajectory cosine against every stored map (one iteration)."""

    __slots__ = ("dots", "query_sq", "kind")

    def __init__(self, n: int, kind: int):
        self.dots = np.zeros(n)  # [n] sum over seen layers of stored . query
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
        self.maps = np.zeros((num_layers, capacity, num_experts))  # layer-major, on the grid
        # Per row and layer, for the delta rule: ids by probability (descending, ties lowest
        # id) and the running sum of those probabilities.
        self.order = np.zeros((num_layers, capacity, num_experts), np.int32)
        self.mass = np.zeros((num_layers, capacity, num_experts), np.float32)
        # 1 / |stored prefix| over the first i+1 active layers of each kind: [kind][i, row]
        self.inv_prefix = {k: np.zeros((len(v), capacity), np.float32)
                           for k, v in self.active.items()}
        self.flat = np.zeros((capacity, num_layers * num_experts))  # unit maps (unit())
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
                self.emb = np.zeros((self.capacity, embs.shape[1]))
            elif embs.shape[1] != self.emb.shape[1]:
                raise ValueError(f"fmoe: embedding dimension {embs.shape[1]} differs from the "
                                 f"store's {self.emb.shape[1]} (field 'embeddings')")
        for c0 in range(0, len(maps), chunk):
            sl = slice(c0, c0 + chunk)
            e = None if embs is None else embs[sl]
            self._add_chunk(on_grid(maps[sl], GRID_BITS), e, has_emb[sl], kinds[sl])

    def _add_chunk(self, maps, embs, has, kinds) -> None:
        # Similarities to the store as it was (one GEMM) and among the chunk; a row replaced
        # earlier in the chunk is looked up among the chunk's own similarities.
        B, n0 = len(maps), self.n
        order, mass, inv_prefix = self._derived(maps)
        flat = unit(maps.reshape(B, -1))
        emb = np.zeros((B, 1)) if embs is None else unit(
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
        sq = np.square(maps).sum(axis=2)  # [B, L]
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
        sims = np.where(ok, self.emb[:n] @ on_grid(emb, GRID_BITS), -np.inf)
        idx = int(np.argmax(sims))
        return idx, float(sims[idx])

    def observe(self, state: TrajectoryState, pos: int, q: np.ndarray):
        """Add the query's probabilities q [E] at active layer number `pos` of its kind (layers
        skipped count as zero rows); returns (map index, cosine over the prefix)."""
        n = len(state.dots)
        q = on_grid(q, GRID_BITS)
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
