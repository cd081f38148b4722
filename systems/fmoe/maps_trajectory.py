"""Trajectory matching of fMoE's map store (systems/fmoe/maps.py): after each layer of an
iteration, the stored map whose probabilities over the layers seen so far have the largest
cosine with the query's (the first on ties), and that cosine. Dot products over the prefix
are kept per stored map and extended by one [m, E] @ [E, n] product per layer, m the
iteration's requests matched together.

Exact results whatever the BLAS kernel (the module docstring of maps): maps and
queries are on the 2**-24 grid, so float64 products of them are exact. A small store is
matched that way. A large one streams its layer block in float32, half the bytes: every term
is >= 0, so each approximate dot product is within a relative `rel_err` of the exact one
(gamma_k = k u / (1 - k u), u = 2**-24, for any summation order and FMA use; k counts the
products, the layer sums and the input roundings), and so is each approximate cosine up to
the query's norm, common to its maps. Every map whose cosine can equal the best is within
3 rel_err of the best approximate one; those few (usually one) get exact float64 dot products,
kept and extended as layers come, and the best is taken among them: the map and the cosine
of the all-float64 computation. Where the compiled step is built (kernels/), every
store keeps exact dot products of every map, computed from the float32 block (which holds the
grid values exactly: `exact32`), or from its float16 copy while every map is exact in
float16 (half the bytes; F16C), in one compiled pass: the same map and cosine again.
"""

from __future__ import annotations

import math

import numpy as np

from core.numerics import on_grid

GRID_BITS = 24  # maps.GRID_BITS (that module imports this one)
SMALL_STORE = 256  # at most this many maps: float64 products (fewer numpy calls per layer)
_FEW = 16  # more candidates than this: every map's exact dot product


class TrajectoryState:
    """One iteration's trajectory matching of m queries against the n stored maps.
    Small stores: dots [m, n], the exact dot products over the observed layers. Large ones:
    approx [m, n] float32 within rel_err of them, and exact ones of the candidates."""

    __slots__ = ("kind", "layers", "queries", "query_sq", "dots", "approx", "exact", "fast")

    def __init__(self, n: int, kind: int, m: int = 1, fast=None):
        self.kind = kind
        self.layers: list[int] = []  # the observed layers, in order
        self.queries: np.ndarray | None = None  # [m, P, E] their query rows (large stores)
        self.query_sq = [0.0] * m  # exact: sums of squares of grid values
        # fast (kernels/fast.pyx): every store keeps exact dots, the compiled step
        # computes them from the float32 block (grid values: exact) in one pass
        self.fast = fast
        small = n <= SMALL_STORE or fast is not None
        self.dots = np.zeros((m, n)) if small else None
        self.approx = None if small else np.zeros((m, n), np.float32)
        # per query: {map index: (exact dot product, layers it covers)}
        self.exact: list[dict[int, tuple[float, int]]] = [{} for _ in range(m)]


def observe(store, state: TrajectoryState, pos: int, queries: np.ndarray):
    """Add the queries' probabilities [m, E] at active layer number `pos` of their kind
    (layers skipped count as zero rows); returns (map index [m], cosine [m]) as lists."""
    m, s = len(queries), len(state.layers)
    layer = store.active[state.kind][pos]
    half = queries.dtype == np.float16  # float16 values are on the grid (and exact in float32)
    q = queries.astype(np.float64) if half else on_grid(queries, GRID_BITS)  # [m, E]
    if state.fast is not None and store.exact32:  # the whole step compiled, the same values
        state.layers.append(layer)
        inv = store.inv_prefix[state.kind][pos, :state.dots.shape[1]]
        if store.cols16 is not None:
            return state.fast.traj_step16(store.cols16[layer], q, state.dots, inv,
                                          state.query_sq)
        return state.fast.traj_step(store.float32_cols()[layer], q, state.dots, inv,
                                    state.query_sq)
    if state.dots is None:  # kept for the candidates' exact dot products
        if state.queries is None:
            state.queries = np.zeros((m, len(store.active[state.kind]), store.E))
        state.queries[:, s] = q
    state.layers.append(layer)
    n = (state.dots if state.dots is not None else state.approx).shape[1]
    inv = store.inv_prefix[state.kind][pos, :n]  # float32 [n]: 1 / |stored prefix|
    if state.dots is not None:
        state.dots += q @ store.maps[layer, :n].T
        c = state.dots * inv  # float64 [m, n]: cosines times |query|
        idx = c.argmax(axis=1)
        found = zip(idx.tolist(), c[np.arange(m), idx].tolist())
    else:
        block = store.float32_cols()[layer, :, :n]
        state.approx += (queries if half else q).astype(np.float32) @ block
        found = _filtered(store, state, inv)
    idx, score = [], []
    for i, ((j, best), sq) in enumerate(zip(found, np.einsum("ij,ij->i", q, q).tolist())):
        state.query_sq[i] += sq  # exact
        qn = math.sqrt(state.query_sq[i])
        idx.append(j)
        score.append(best / qn if qn > 0 else 0.0)
    return idx, score


def _filtered(store, state: TrajectoryState, inv: np.ndarray):
    """(map index, exact dot * inv) per query, from the float32 approximations."""
    m, s = len(state.approx), len(state.layers)
    approx = state.approx * inv  # [m, n] cosines times |query|, approximate
    shrink = 1.0 - 3.0 * 2.0 * (store.E + s + 4) * 2.0 ** -24  # 1 - 3 rel_err
    floor = np.array(approx.max(axis=1).tolist()) * shrink  # float64 comparisons below
    cand = ([np.flatnonzero(approx[0] >= floor[0]).tolist()] if m == 1 else
            _by_row(*np.nonzero(approx >= floor[:, None]), m))
    return [_best_of(store, state, i, c, inv) if len(c) <= _FEW else
            _best_exact(store, state, i, inv) for i, c in enumerate(cand)]


def _best_of(store, state: TrajectoryState, i: int, cand: list[int], inv: np.ndarray):
    """(index, exact dot * inv) of the best of maps `cand` (ascending) for query i; each map's
    exact dot product is kept and extended as layers come (products and sums of grid values:
    exact in any order)."""
    exact, s, qs = state.exact[i], len(state.layers), state.queries[i]
    best_j, best = -1, -math.inf
    for j in cand:
        dot, k = exact.get(j, (0.0, 0))
        if k == s - 1:
            dot += float(store.maps[state.layers[k], j] @ qs[k])
        elif k < s:
            dot += float(np.einsum("ij,ij->", store.maps[state.layers[k:], j], qs[k:s]))
        exact[j] = (dot, s)
        c = dot * float(inv[j])  # float64, as dots * inv over every map would give
        if c > best:
            best_j, best = j, c
    return best_j, best


def _best_exact(store, state: TrajectoryState, i: int, inv: np.ndarray):
    """_best_of over every map (when the approximation cannot narrow them down)."""
    n = state.approx.shape[1]
    dots = np.zeros(n)
    for k, layer in enumerate(state.layers):
        dots += store.maps[layer, :n] @ state.queries[i, k]
    c = dots * inv
    j = int(c.argmax())
    return j, float(c[j])


def _by_row(rows: np.ndarray, cols: np.ndarray, m: int) -> list[list[int]]:
    """np.nonzero's (rows ascending, cols) of an [m, n] mask as each row's columns."""
    ends = np.searchsorted(rows, np.arange(1, m + 1)).tolist()
    cols = cols.tolist()
    return [cols[a:b] for a, b in zip([0, *ends], ends)]
