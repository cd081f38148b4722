"""fMoE's rules in plain python and numpy, one call each, from scratch: the reference that
the store (maps.py, maps_rdy.py, maps_trajectory.py), the eviction scores (eviction.py,
victim_order.py), the per-hook state and the compiled loops (kernels/) are tested against
(tests/systems/test_fmoe.py, test_fmoe_fast.py, test_fmoe_reference.py). Read top to bottom;
no state, no caches.

1. An expert map: one iteration's router probabilities [L, E] of a request, stored with the
   prompt's embedding. A full store replaces the most redundant stored map: the first of
   largest RDY = w * semantic cosine + (1 - w) * trajectory cosine, w = d / L (d: the
   prefetch distance; the trajectory term alone unless both maps have an embedding).
   Paper §4.1, §4.4.
2. Matching: the first d layers of an iteration come from the map whose prompt embedding is
   closest; after layer l, layer l + d from the map whose probabilities over the layers seen
   so far are closest (cosine). Paper §4.2.
3. The delta rule: from the matched row, experts most probable first (ties: lowest id) until
   their probabilities sum to delta = clip(1 - cosine, 0, 1), at least top-k. Paper §4.3.
4. Eviction: the victim is the resident expert of lowest p * freq (eviction priority
   1 / (p * freq)), ties to the least recently used, then the lowest key; an expert that a
   usable prediction still expects is never evicted for a prefetch, and last for a demand
   fetch. Paper §4.5; the tie rule is ours, the protection the artifact's
   (core/prefetch/task_scheduler.cpp); admission (fmoe_admission) is system.py's, not here.

Cosines are float64 products of values on the 2**-24 grid (maps.py's docstring), added layer
by layer in layer order as the store does: the same bits as the fast paths.
"""

from __future__ import annotations

import math

import numpy as np

from core.numerics import on_grid
from systems.fmoe.eviction import PROTECTED_TIER
from systems.fmoe.maps import GRID_BITS, unit


def select_experts(row: np.ndarray, score: float, top_k: int) -> np.ndarray:
    """The delta rule (paper §4.3): ids of the smallest most-probable set with probability
    sum >= delta = clip(1 - score, 0, 1), at least top_k; most probable first, ties by lowest
    id. row: [E] probabilities."""
    delta = min(1.0, max(0.0, 1.0 - float(score)))
    order = np.argsort(-row, kind="stable")
    mass = np.cumsum(row[order], dtype=np.float64)
    count = min(max(int(np.count_nonzero(mass < delta)) + 1, top_k), len(row))
    return order[:count]


def stored_maps(maps: np.ndarray, embs: np.ndarray, has: np.ndarray, capacity: int,
                d: int) -> tuple[np.ndarray, int]:
    """Replacement (paper §4.4): the store after inserting maps [B, L, E] (embs [B, D], has
    [B]: which have one) one at a time into `capacity` rows, and how many replaced a stored
    map: a full store replaces the first row of largest RDY = w sem + (1 - w) traj, w = d / L
    (traj alone unless both have an embedding), float64 products of unit vectors on the
    grid."""
    B, L, E = maps.shape
    w, rows = d / L, []  # rows: [flat, emb, has, map]
    replaced = 0
    for i in range(B):
        f = unit(on_grid(maps[i].astype(np.float64), GRID_BITS).reshape(-1))
        e = unit(np.where(has[i], embs[i].astype(np.float32), 0))
        if len(rows) < capacity:
            rows.append(None)
            idx = len(rows) - 1
        else:
            t = np.array([f @ r[0] for r in rows])
            s = np.array([e @ r[1] for r in rows])
            both = has[i] & np.array([r[2] for r in rows])
            idx = int(np.argmax(np.where(both, w * s + (1 - w) * t, t)))
            replaced += 1
        rows[idx] = (f, e, bool(has[i]), maps[i])
    return np.stack([r[3] for r in rows]), replaced


def semantic_match(embs: np.ndarray, has: np.ndarray, kinds: np.ndarray, query: np.ndarray,
                   kind: int, same_kind: bool) -> tuple[int, float] | None:
    """Semantic search (paper §4.2): (row, cosine) of the stored map whose prompt embedding
    is closest to `query` (a unit [D]), the first row on ties; None when no stored map has an
    embedding. embs [n, D]: the embeddings as stored (rows where has [n] is False ignored);
    same_kind: only maps of the iteration's kind (kinds [n]) when the store holds any."""
    ok = [bool(h) for h in has]
    if same_kind and any(o and k == kind for o, k in zip(ok, kinds)):
        ok = [o and k == kind for o, k in zip(ok, kinds)]
    q = on_grid(query, GRID_BITS)
    best = None
    for i in range(len(embs)):
        if ok[i]:
            cos = float(unit(embs[i].astype(np.float32)) @ q)
            if best is None or cos > best[1]:
                best = (i, cos)
    return best


def trajectory_match(maps: np.ndarray, probs: np.ndarray, layers: list[int],
                     distance: int) -> list[tuple[int, int, float]]:
    """Trajectory search (paper §4.2): after each active layer layers[pos] (pos < len(layers)
    - d) of an iteration, (layers[pos + d], row, cosine) of the stored map [n, L, E] whose
    probabilities over layers[:pos + 1] are closest to the iteration's probs [L, E], the
    first row on ties. The stored norm enters as float32 (1 / |prefix|, as the store keeps
    it); a query without mass scores 0."""
    maps, q = on_grid(maps, GRID_BITS), on_grid(probs, GRID_BITS)
    n = len(maps)
    dot, sq, q_sq, out = [0.0] * n, [0.0] * n, 0.0, []
    for pos in range(len(layers) - distance):
        layer = layers[pos]
        q_sq += float(q[layer] @ q[layer])
        best = (-1, -math.inf)
        for j in range(n):
            dot[j] += float(maps[j, layer] @ q[layer])
            sq[j] += float(maps[j, layer] @ maps[j, layer])
            inv = float(np.float32(1.0 / math.sqrt(sq[j]))) if sq[j] > 0 else 0.0
            if dot[j] * inv > best[1]:
                best = (j, dot[j] * inv)
        score = best[1] / math.sqrt(q_sq) if q_sq > 0 else 0.0
        out.append((layers[pos + distance], best[0], score))
    return out


def iteration_matches(maps: np.ndarray, embs: np.ndarray | None, has: np.ndarray,
                      kinds: np.ndarray, probs: np.ndarray, embedding: np.ndarray | None,
                      kind: int, layers: list[int], distance: int,
                      same_kind: bool = True) -> list[tuple[int, int, float]]:
    """One iteration's matches (paper §4.2), [(predicted layer, row, score)]: layers[:d] from
    the semantic match (when the iteration has an embedding and a stored map one), then one
    trajectory match per layer seen, predicting d layers ahead."""
    out = []
    if embedding is not None and embs is not None:
        m = semantic_match(embs, has, kinds, embedding, kind, same_kind)
        if m is not None:
            out.extend((layer, m[0], m[1]) for layer in layers[:distance])
    if len(maps):
        out.extend(trajectory_match(maps, probs, layers, distance))
    return out


def victim_order(p, freq, last_use, resident, protected) -> list[tuple[float, int, int]]:
    """Eviction (paper §4.5) over keys layer * E + expert: every key's (score, last use, key),
    ascending. score = p * freq for a resident key (inf otherwise), plus PROTECTED_TIER where
    a usable prediction still expects it (python floats: the bits of the system's)."""
    score = [(p[k] * freq[k] if resident[k] else math.inf)
             + (PROTECTED_TIER if protected[k] else 0.0) for k in range(len(p))]
    return sorted(zip(score, last_use, range(len(p))))


def victim(p, freq, last_use, resident, protected, candidates, demand: bool) -> int | None:
    """The key the p x freq rule evicts (paper §4.5): the first of victim_order that
    `candidates` holds, None once the order reaches a key not resident or, for a prefetch
    (not `demand`), a protected one. (system.py asks only when the cache is full, and
    fmoe_admission may still decline the victim.)"""
    for score, _, k in victim_order(p, freq, last_use, resident, protected):
        if score == math.inf or (not demand and score >= PROTECTED_TIER):
            return None
        if k in candidates:
            return k
    return None
