"""moe_infinity's batch path: one MoE layer of R > 1 member requests of a RequestTable
(systems/moe_infinity/requests.py) at once, as array operations over their rows, and the
variance of the predicted reuse at a few keys over several requests. With the compiled
kernels built, the table's TableKernel (systems/moe_infinity/kernels/rows.pyx) does the counts, the
match, the predicted EAM and the blend of every member row in one call each: a C loop over
one row costs less than these gathers and whole-array passes over every member row, and one
call per batch-layer less than a python call per row (the per-row kernels of
systems/moe_infinity/kernels/fast.pyx, used when only those are built).

Each function gives, row by row, the bits of the single-request path in that module (the
same integer sums, the same elementwise IEEE operations in the same order); the golden and
reference runs at batch 1 and above check that.
"""

from __future__ import annotations

import math

import numpy as np

from systems.moe_infinity.eamc import EAMC, shares_into
from systems.moe_infinity.requests import (
    ARGMAX_TOP,
    KEEP2,
    OWN_VAR,
    PVAR,
    SHARE,
    VAR,
    RequestState,
    RequestTable,
)


def rows_index(states: list[RequestState]):
    """The states' table rows as a slice when they are consecutive (views, no copies), else
    an index array."""
    r0 = states[0].row
    if all(st.row == r0 + i for i, st in enumerate(states)):
        return slice(r0, r0 + len(states))
    return np.array([st.row for st in states])


def bincount_rows(rows: list[np.ndarray], num_experts: int, tab: RequestTable) -> np.ndarray:
    """Tokens per expert [R, E] (float64) of R requests' top-k rows ([tokens, k] each); in
    one compiled pass with the table's kernel (the same integers)."""
    if tab.kernel is not None:
        counts = tab.kernels.rows.bincount_rows(rows, num_experts)
        if counts is not None:
            return counts
    flat = np.concatenate([r.ravel() for r in rows]).astype(np.intp)
    flat += np.repeat(np.arange(len(rows)) * num_experts, [r.size for r in rows])
    counts = np.bincount(flat, minlength=len(rows) * num_experts)
    return counts.reshape(len(rows), num_experts).astype(np.float64)


def add_counts(tab: RequestTable, states: list[RequestState], ri, layer: int,
               counts: np.ndarray) -> None:
    """RequestTable.add_one for the member rows `ri` (a slice or rows) with counts [R, E]
    (with the table's kernel: row by row in one compiled call, the same bits)."""
    if tab.kernel is not None:
        tab.kernel.add(states, layer, counts)
        return
    blk = slice(layer * tab.E, (layer + 1) * tab.E)
    old = tab.q[ri, blk]  # [R, E]
    tab.norm2[ri] += ((2.0 * old + counts) * counts).sum(axis=1)  # integers, exact
    tab.q[ri, blk] = old + counts
    if tab.iteration_query:
        tab.eam[ri, blk] += counts
        for st in states:
            st.q_layers.add(layer)
    w = tab.own_weight
    if w > 0:
        n = tab.own_n[ri, layer] + counts.sum(axis=1)  # [R] the layer's tokens so far
        tab.own_n[ri, layer] = n
        inv = (1.0 / n)[:, None]
        share = tab.eam[ri, blk] * inv
        tab.own[ri, blk] = share
        own_var = (1.0 - share) * share * inv * (w * w)
        tab.parts[ri, OWN_VAR, blk] = own_var
        for st in states:
            if layer not in st.reached:
                tab.first_visit(st, layer)
            st.own_changed(layer)
        tab.parts[ri, VAR, blk] = tab.parts[ri, KEEP2, blk] * tab.parts[ri, PVAR, blk] + own_var


def match(tab: RequestTable, states: list[RequestState], ri, layer: int,
          counts: np.ndarray, lim: int, c: EAMC, match_top: int) -> list[float]:
    """RequestTable.match_one for the member rows: their counts [R, E] at `layer`. Returns
    each row's best cosine."""
    n, m = c.n, min(match_top, c.n)
    if tab.kernel is not None and m <= ARGMAX_TOP:  # the rows in one compiled call
        return tab.kernel.match(states, c.cols, layer, counts, c.inv_norm[lim], n, m)
    ids = np.flatnonzero(counts.any(axis=0))  # the experts routed, [K]
    keys, counts = layer * c.E + ids, counts[:, ids]  # [K], [R, K]
    if tab.views[0].kernel is not None and m <= ARGMAX_TOP:
        return _match_rows(tab, states, keys.tolist(), counts.tolist(), lim, c, m)
    dots = tab.dots[ri, :n] + counts @ c.cols[keys, :n]  # [R, n], exact
    tab.dots[ri, :n] = dots
    best, top = top_slots(dots * c.inv_norm[lim, :n], m)
    for st, slots in zip(states, best.tolist()):
        slots = tuple(slots)
        if slots != st.best:
            st.best, st.stale = slots, True
    return (top / np.sqrt(tab.norm2[ri])).tolist()


def _match_rows(tab: RequestTable, states: list[RequestState], keys: list[int],
                counts: list[list[float]], lim: int, c: EAMC, m: int) -> list[float]:
    """match through each row's compiled kernel (RequestTable.match_one's, the same bits:
    integer dot products, the first of equal values): a row adds only its own nonzero
    counts (the kernel skips zeros), less work than a product over every routed key."""
    cols, inv, norm2, views, out = c.cols, c.inv_norm[lim], tab.norm2, tab.views, []
    for st, row in zip(states, counts):
        slots, top = views[st.row].kernel.match(cols, keys, row, inv, c.n, m)  # skips zeros
        if slots != st.best:
            st.best, st.stale = slots, True
        out.append(top / math.sqrt(norm2.item(st.row)))
    return out


def top_slots(scaled: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """top_few per row of scaled [R, n]: the columns [R, m] and each row's highest value
    [R]. `scaled` is overwritten."""
    R, rows = len(scaled), np.arange(len(scaled))
    if m > ARGMAX_TOP:
        order = np.argsort(-scaled, axis=1, kind="stable")[:, :m]
        return order, scaled[rows, order[:, 0]]
    out = np.empty((R, m), dtype=np.intp)
    top = scaled.max(axis=1)
    for i in range(m):
        j = scaled.argmax(axis=1)
        out[:, i] = j
        scaled[rows, j] = -np.inf
    return out, top


def predict_and_blend(tab: RequestTable, states: list[RequestState], c: EAMC) -> np.ndarray:
    """The predicted EAM of the stale states and the blend of every state whose P or own
    shares changed. With the compiled kernels row by row (RequestTable.predict_one and
    blend_one, the same bits: a row whose matched set stayed keeps its values, and an
    unchanged block blends to the same ones); else predict, one batch per match count (the
    collection may have grown since), and blend_rows. Returns the states' blend, max over
    them [L*E] (a new array)."""
    if tab.kernel is not None:  # the rows in one compiled call
        return tab.kernel.predict_blend(states, c)
    if tab.views[0].kernel is not None:
        for st in states:
            if st.stale:
                tab.predict_one(st, c)
            tab.blend_one(st)
    else:
        by_len: dict[int, list[RequestState]] = {}
        for st in states:
            if st.stale:
                by_len.setdefault(len(st.best), []).append(st)
        for group in by_len.values():
            predict(tab, group, c)
        blend_rows(tab, states)
    return tab.blend[rows_index(states)].max(axis=0)


def predict(tab: RequestTable, states: list[RequestState], c: EAMC) -> None:
    """RequestTable.predict_one for states with the same number of matches: the matched rows
    summed in one gather per match, then P and its variances over the states' rows (in
    place when consecutive; rows whose set did not change get the same values again)."""
    changed = [st for st in states if st.summed != frozenset(st.best)]
    for st in states:
        st.stale = False
    if not changed:
        return
    tab.acc[[st.row for st in changed]] = c.summed_rows(np.array([st.best for st in changed]))
    for st in changed:
        st.new_p, st.summed = True, frozenset(st.best)
    L, E, R, ri = tab.L, tab.E, len(states), rows_index(states)
    acc = tab.acc[ri]
    counts, totals = acc[:, :L * E].reshape(R, L, E), acc[:, L * E:, None]  # [R, L, 1]
    if isinstance(ri, slice):  # views of the rows: written in place
        share, pvar, var = (tab.parts[ri, k].reshape(R, L, E) for k in (SHARE, PVAR, VAR))
    else:
        share, pvar, var = (np.empty((R, L, E)) for _ in range(3))
    shares_into(counts, totals, share, pvar, bool(totals.all()))
    np.multiply(tab.parts[ri, KEEP2].reshape(R, L, E), pvar, out=var)
    var += tab.parts[ri, OWN_VAR].reshape(R, L, E)
    if not isinstance(ri, slice):
        for k, plane in ((SHARE, share), (PVAR, pvar), (VAR, var)):
            tab.parts[ri, k] = plane.reshape(R, L * E)


def blend_rows(tab: RequestTable, states: list[RequestState]) -> None:
    """RequestTable.blend_one of whole rows, for the states whose P or own shares changed
    (in place when their rows are consecutive)."""
    dirty = [st for st in states if st.new_p or st.own_dirty != -1]
    if dirty:
        ri = rows_index(dirty)
        p = tab.parts[ri, SHARE]
        if isinstance(ri, slice):
            out = tab.blend[ri]
            np.subtract(tab.own[ri], p, out=out)
            out *= tab.mix[ri]
            out += p
        else:
            tab.blend[ri] = p + tab.mix[ri] * (tab.own[ri] - p)
    for st in states:
        st.new_p, st.own_dirty = False, -1


def variance(tab: RequestTable, states: list[RequestState], keys: np.ndarray) -> np.ndarray:
    """RequestTable.variance_one at `keys` [K], max over `states`."""
    ri = np.array([st.row for st in states])[:, None]
    return tab.parts[ri, VAR, keys].max(axis=0)  # [R, K] -> [K]
