"""fMoE's expert-map store (systems/fmoe/system.py): maps [L, E] with prompt embeddings, RDY
de-duplication, semantic and incremental trajectory matching, and the delta rule.

Kept apart from the policy so the matching can be timed and tested on its own
(`ExpertMapStore.match`). numpy, and the compiled trajectory step where built
(kernels/fast.pyx).

Portable (docs/trace-format.md, "Portable determinism"): maps, queries and unit vectors are
float64 on the grid of multiples of 2**-24 (float16 probabilities already are), so every
product of two is a multiple of 2**-48 and every BLAS dot product of probability rows
(each summing to about 1) or unit vectors is exact: the same cosines, so the same matches,
with any BLAS kernel, summation order or batching (a GEMM over several queries gives each
the bits of its own product). Sums over layers and the rest are elementwise, in a fixed
order. The two large products, trajectory matching against a large store
(maps_trajectory.py) and the replacement search (maps_rdy.py), run in float32
under a proven error bound and recompute exactly the few rows that can win: the same choices.
"""

from __future__ import annotations

import bisect

import numpy as np

from core.numerics import on_grid
from systems.fmoe.maps_rdy import ChunkRedundancy
from systems.fmoe.maps_trajectory import TrajectoryState, observe

PREFILL, DECODE = 0, 1
GRID_BITS = 24  # maps, queries and unit vectors: multiples of 2**-24


def unit(v: np.ndarray) -> np.ndarray:
    """Rows of v [..., D] scaled to unit norm (zero rows stay zero), on the 2**-24 grid,
    float64: dot products of two such rows are exact."""
    v = np.asarray(v, np.float64)
    n = np.sqrt(np.square(v).sum(axis=-1, keepdims=True))
    return on_grid(v / np.where(n > 0, n, 1.0), GRID_BITS)


class ExpertMapStore:
    """Up to `capacity` expert maps [L, E] with their prompt embeddings and iteration kind.

    `active[kind]`: the MoE layers an iteration of that kind passes through, in order (a decode
    step skips encoder layers); trajectory prefixes follow that order. Default: all layers."""

    def __init__(self, capacity: int, num_layers: int, num_experts: int, distance: int,
                 active: dict[int, list[int]] | None = None, fast=None):
        self.capacity, self.L, self.E, self.distance = capacity, num_layers, num_experts, distance
        self.w_sem = distance / num_layers  # RDY weight of the semantic term
        self.active = active or {PREFILL: list(range(num_layers)),
                                 DECODE: list(range(num_layers))}
        self.maps = np.zeros((num_layers, capacity, num_experts))  # layer-major, on the grid
        # The same values expert-major and float32, [L, E, capacity]: a trajectory step on a
        # large store streams one layer's [E, n] block (maps_trajectory). Read it by
        # float32_cols(): not kept while the float16 copy (cols16, below) serves instead.
        self._cols32: np.ndarray | None = None
        # Per row and layer, for the delta rule: ids by probability (descending, ties lowest
        # id) and the running sum of those probabilities.
        self.order = np.zeros((num_layers, capacity, num_experts), np.int32)
        self.mass = np.zeros((num_layers, capacity, num_experts), np.float32)
        # 1 / |stored prefix| over the first i+1 active layers of each kind: [kind][i, row]
        self.inv_prefix = {k: np.zeros((len(v), capacity), np.float32)
                           for k, v in self.active.items()}
        self.flat = np.zeros((capacity, num_layers * num_experts))  # unit maps (unit())
        self.flat32 = np.zeros((capacity, num_layers * num_experts), np.float32)  # (rdy)
        self.emb: np.ndarray | None = None  # [capacity, D] unit rows; zero when absent
        self.has_emb = np.zeros(capacity, bool)
        self.kind = np.zeros(capacity, np.int8)
        self.n = 0
        self.replaced = 0
        # float32 holds the maps exactly (grid values in [-1, 1]): the compiled trajectory step
        # (fast: kernels/fast.pyx; None: python) may read it for exact products; a map
        # outside that range turns it off
        self.exact32 = True
        self.fast = fast
        # While every map is exact in float16 (router probabilities are), the compiled step
        # streams this copy [L, E, capacity] (float16 bits): half the bytes of float32.
        self.cols16 = (None if self.fast is None or not self.fast.HALF_OK else
                       np.zeros((num_layers, num_experts, capacity), np.uint16))
        if self.cols16 is None:
            self._cols32 = np.zeros((num_layers, num_experts, capacity), np.float32)

    def float32_cols(self) -> np.ndarray:
        """The maps expert-major as float32 [L, E, capacity], built from `maps` (the same
        float64 -> float32 casts as a write) when only the float16 copy was kept."""
        if self._cols32 is None:
            self._cols32 = np.ascontiguousarray(self.maps.transpose(0, 2, 1), np.float32)
        return self._cols32

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
            self._add_chunk(maps[sl], e, has_emb[sl], kinds[sl])

    def _add_chunk(self, raw, embs, has, kinds) -> None:
        """Insert a chunk of maps raw [B, L, E]: each takes a free row, else the row most
        redundant with it (ChunkRedundancy: against the store as the chunk began and the
        members placed before it). The rows are written once the chunk is placed."""
        B, n0 = len(raw), self.n
        maps = on_grid(raw, GRID_BITS)
        flat = unit(maps.reshape(B, -1))
        emb = np.zeros((B, 1)) if embs is None else unit(
            np.where(has[:, None], embs.astype(np.float32), 0))
        rdy = ChunkRedundancy(self, flat, emb, embs is not None, has) if (
            n0 + B > self.capacity) else None
        src = np.full(self.capacity, -1, np.int64)  # chunk member now held by each row
        rows: list[int] = []  # rows written by the chunk, in order
        for i in range(B):
            if self.n < self.capacity:
                idx = self.n
                self.n += 1
            else:
                idx = rdy.most_redundant(i, src, rows)
                self.replaced += 1
            if src[idx] < 0:
                rows.append(idx)
            src[idx] = i
        at = np.array(rows, np.int64)
        mem = src[at]  # the member each written row ends with
        half = _half(raw[mem])
        order, mass, inv = self._derived(maps[mem], half)
        self._write(at, maps[mem], half, order, mass, inv, flat[mem],
                    emb[mem] if embs is not None else None, has[mem], kinds[mem])

    def _write(self, at, maps, half, order, mass, inv, flat, emb, has, kinds) -> None:
        """Rows `at` [k] := maps [k, L, E] (half: the same as float16, or None) with their
        derived values; emb [k, D] unit rows, None: the chunk came without embeddings."""
        self.maps[:, at] = maps.transpose(1, 0, 2)
        if self.cols16 is not None and half is None:
            self.cols16 = None  # from now on the float32 block, built with these rows
            self.float32_cols()
        if self.cols16 is not None:
            self.cols16[:, :, at] = half.view(np.uint16).transpose(1, 2, 0)
        if self._cols32 is not None:
            self._cols32[:, :, at] = maps.transpose(1, 2, 0)
        # grid values (multiples of 2**-24) in [-1, 1] are exact in float32
        self.exact32 = self.exact32 and -1.0 <= float(maps.min()) and float(maps.max()) <= 1.0
        self.order[:, at], self.mass[:, at] = order.transpose(1, 0, 2), mass.transpose(1, 0, 2)
        for k, v in inv.items():
            self.inv_prefix[k][:, at] = v.T
        self.flat[at], self.flat32[at] = flat, flat
        if self.emb is not None:  # rows without an embedding are zero in emb already
            self.emb[at] = 0.0 if emb is None else emb
        self.has_emb[at] = has & (emb is not None)
        self.kind[at] = kinds

    def _derived(self, maps: np.ndarray, half: np.ndarray | None):
        """Per map [k, L, E]: id order (probability descending, ties lowest id), running
        mass, inverse prefix norms. half: the same maps as float16 (exact and >= 0), whose
        bits sort like the values: a radix sort, the same order."""
        if half is not None:  # the sign bit off: -0 sorts as +0, as the values compare
            order = np.argsort(~(half.view(np.uint16) & np.uint16(0x7FFF)), axis=2,
                               kind="stable")
        else:
            order = np.argsort(-maps, axis=2, kind="stable")
        mass = np.cumsum(np.take_along_axis(maps, order, 2), axis=2, dtype=np.float64)
        sq = np.square(maps).sum(axis=2)  # [k, L]
        inv = {}
        for kind, layers in self.active.items():
            norm = np.sqrt(np.cumsum(sq[:, layers], axis=1))  # [k, len(layers)]
            inv[kind] = np.where(norm > 0, 1 / np.maximum(norm, 1e-300), 0.0)
        return order, mass, inv

    def select(self, layer: int, idx: int, score: float, top_k: int) -> np.ndarray:
        """select_experts on stored row (layer, idx), from its precomputed order and mass."""
        delta = min(1.0, max(0.0, 1.0 - score))
        count = int(np.searchsorted(self.mass[layer, idx], delta, side="left")) + 1
        return self.order[layer, idx, :min(max(count, top_k), self.E)]

    def delta_ids(self, layer: int, idx: int, score: float, top_k: int) -> list[int] | None:
        """select() as a list (bisect on the float32 masses read as python floats: the same
        comparisons as searchsorted); None for a row without tokens (all zero)."""
        mass = self.mass[layer, idx].tolist()
        if mass[-1] <= 0:
            return None
        count = bisect.bisect_left(mass, min(1.0, max(0.0, 1.0 - score))) + 1
        return self.order[layer, idx, :min(max(count, top_k), self.E)].tolist()

    def delta_ids_many(self, layer: int, idx: list[int], score: list[float],
                       top_k: int) -> list[list[int] | None]:
        """delta_ids for rows idx [m] of one layer: #(mass < delta) is bisect_left's count
        (the masses ascend), compared in float64 as there."""
        mass = self.mass[layer, idx]  # [m, E] float32
        delta = np.array([min(1.0, max(0.0, 1.0 - s)) for s in score])
        count = ((mass < delta[:, None]).sum(axis=1) + 1).tolist()
        live = (mass[:, -1] > 0).tolist()
        return [order[:min(max(c, top_k), self.E)] if ok else None
                for order, c, ok in zip(self.order[layer, idx].tolist(), count, live)]

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

    def observe_many(self, state: TrajectoryState, pos: int, queries: np.ndarray):
        """Add the queries' probabilities [m, E] at active layer number `pos` of their kind
        (layers skipped count as zero rows); returns (map index [m], cosine over the prefix
        [m]) as lists, those of float64 dot products (the first best index on ties); see
        maps_trajectory."""
        return observe(self, state, pos, queries)

    def observe(self, state: TrajectoryState, pos: int, q: np.ndarray):
        """observe_many for one query q [E] (a state of m = 1): (map index, cosine)."""
        idx, score = self.observe_many(state, pos, q[None])
        return idx[0], score[0]

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
        state, active = TrajectoryState(self.n, kind, 1, self.fast), self.active[kind]
        for pos in range(len(active) - distance):
            idx, score = self.observe(state, pos, probs[active[pos]])
            out.append((active[pos + distance], idx, score))
        return out


def _half(maps: np.ndarray) -> np.ndarray | None:
    """maps [k, L, E] as float16 when that holds them exactly and none is negative (router
    probabilities are float16 in traces), else None."""
    half = maps.astype(np.float16)
    if maps.dtype == np.float16 or np.array_equal(half, maps):
        return half if not (half < 0).any() else None
    return None
