"""fMoE's rules in plain python and numpy, one call each, from scratch: the reference that
the store (maps.py, maps_rdy.py, maps_trajectory.py), the per-hook state and the compiled
loops (kernels/) are tested against (tests/systems/test_fmoe.py, test_fmoe_fast.py).

1. An expert map: one iteration's router probabilities [L, E] of a request, stored with the
   prompt's embedding. A full store replaces the most redundant stored map: the first of
   largest RDY = w * semantic cosine + (1 - w) * trajectory cosine, w = d / L (d: the
   prefetch distance; the trajectory term alone unless both maps have an embedding).
2. Matching: the first d layers of an iteration come from the map whose prompt embedding is
   closest; after layer l, layer l + d from the map whose probabilities over the layers seen
   so far are closest (cosine).
3. The delta rule: from the matched row, experts most probable first (ties: lowest id) until
   their probabilities sum to delta = clip(1 - cosine, 0, 1), at least top-k.
"""

from __future__ import annotations

import numpy as np

from core.numerics import on_grid
from systems.fmoe.maps import GRID_BITS, unit


def select_experts(row: np.ndarray, score: float, top_k: int) -> np.ndarray:
    """Ids of the smallest most-probable set with probability sum >= delta = clip(1 - score,
    0, 1), at least top_k; most probable first, ties by lowest id. row: [E] probabilities."""
    delta = min(1.0, max(0.0, 1.0 - float(score)))
    order = np.argsort(-row, kind="stable")
    mass = np.cumsum(row[order], dtype=np.float64)
    count = min(max(int(np.count_nonzero(mass < delta)) + 1, top_k), len(row))
    return order[:count]


def stored_maps(maps: np.ndarray, embs: np.ndarray, has: np.ndarray, capacity: int,
                d: int) -> tuple[np.ndarray, int]:
    """The store after inserting maps [B, L, E] (embs [B, D], has [B]: which have one) one at
    a time into `capacity` rows, and how many replaced a stored map: a full store replaces
    the first row of largest RDY = w sem + (1 - w) traj, w = d / L (traj alone unless both
    have an embedding), float64 products of unit vectors on the grid."""
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
