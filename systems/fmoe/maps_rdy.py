"""The replacement choice of fMoE's map store (systems/fmoe/maps.py): which stored map is
most redundant with an incoming one, RDY = w * sem + (1 - w) * traj (w = d/L; traj alone
where either map has no embedding), the first row on ties.

The whole-map cosines (traj) of a chunk's B maps against the n stored ones are a
[B, L*E] @ [L*E, n] product, the bulk of a warm-up. It runs in float32, with a proven bound:
maps are >= 0, so |approx - exact| <= gamma_K * (x . y) <= gamma_K (unit vectors), gamma_K =
K u / (1 - K u), u = 2**-24, for any summation order and FMA use, K counting the products and
the input roundings; the blend adds at most a few float64 roundings. Every row whose exact
RDY can be the largest is within 2 of those bounds of the largest approximate RDY; those few
are recomputed exactly (float64 products of grid values, see maps) and the first
largest is taken, so the choice is the one of the exact products, on any BLAS kernel.
Cosines of embeddings are exact float64 products, one per run of equal rows (the maps of a
request share its prompt).
"""

from __future__ import annotations

import numpy as np

_EXACT_ALL = 64  # more candidates than this: every row exactly


class ChunkRedundancy:
    """RDY of a chunk's members against the store's rows as they were when the chunk began
    (rows 0..n0-1) and against the chunk's own members (rows they replaced or filled).

    flat [B, L*E]: the members' unit maps; emb [B, D]: their unit embeddings (zero rows
    without one); with_emb: the chunk came with embeddings; has [B]: each member has one."""

    def __init__(self, store, flat: np.ndarray, emb: np.ndarray, with_emb: bool,
                 has: np.ndarray):
        n0 = store.n
        self.store, self.flat, self.has, self.n0, self.w = store, flat, has, n0, store.w_sem
        flat32 = flat.astype(np.float32)
        t_old = (flat32 @ store.flat32[:n0].T).astype(np.float64)  # [B, n0] approximate
        self.t_new = (flat32 @ flat32.T).astype(np.float64)  # [B, B] approximate
        self.err = 2.0 * (flat.shape[1] + 4) * 2.0 ** -24 + 1e-12  # absolute, per RDY
        # Runs of equal embedding rows: one exact product per run.
        first = np.r_[True, (emb[1:] != emb[:-1]).any(axis=1)]  # [B] a run starts
        self.run = np.cumsum(first) - 1  # [B] run of each member
        reps = emb[first]
        self.s_new = reps @ reps.T  # [runs, runs]
        # The store's rows have a semantic term only when both sides came with embeddings.
        self.sem_old = store.emb is not None and with_emb
        if self.sem_old:
            self.s_old, self.has_old = reps @ store.emb[:n0].T, store.has_emb[:n0].copy()
            w, s = self.w, self.s_old[self.run]
            both = has[:, None] & self.has_old[None, :]
            self.rdy_old = np.where(both, w * s + (1 - w) * t_old, t_old)
        else:
            self.rdy_old = t_old

    def most_redundant(self, i: int, src: np.ndarray, rows: list[int]) -> int:
        """The row member i replaces: the first largest RDY. src [capacity]: the chunk member
        now in each row (-1: the stored map of the chunk's start); rows: those written."""
        rdy = self._approx(i, src, rows)
        cand = np.flatnonzero(rdy >= rdy.max() - 3.0 * self.err)
        if len(cand) > _EXACT_ALL:
            cand = np.arange(len(rdy))
        best_j, best = -1, -np.inf
        for j in cand.tolist():
            r = self._exact(i, j, int(src[j]))
            if r > best:
                best_j, best = j, r
        return best_j

    def _approx(self, i: int, src: np.ndarray, rows: list[int]) -> np.ndarray:
        """Approximate RDY of member i against every row [capacity]."""
        rdy = np.empty(self.store.capacity)
        rdy[:self.n0] = self.rdy_old[i]
        if rows:
            ch = np.array(rows, np.int64)
            mem = src[ch]
            t = self.t_new[i, mem]
            if self.has[i]:
                s = self.s_new[self.run[i], self.run[mem]]
                t = np.where(self.has[mem], self.w * s + (1 - self.w) * t, t)
            rdy[ch] = t
        return rdy

    def _exact(self, i: int, j: int, m: int) -> float:
        """Exact RDY of member i against row j, which holds member m (or, m < 0, the stored
        map): the float64 values the full products would give."""
        w, has = self.w, self.has
        if m >= 0:
            t = float(self.flat[i] @ self.flat[m])
            if has[i] and has[m]:
                return w * float(self.s_new[self.run[i], self.run[m]]) + (1 - w) * t
            return t
        t = float(self.flat[i] @ self.store.flat[j])
        if self.sem_old and has[i] and self.has_old[j]:
            return w * float(self.s_old[self.run[i], j]) + (1 - w) * t
        return t
