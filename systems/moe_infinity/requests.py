"""The running requests of moe_infinity (systems/moe_infinity/system.py): their EAMs, queries, dot
products with the EAMC, matches, predicted EAMs and blended reuse, one table row per request.

Rows let one MoE layer update every member request of a batch with a few array operations
(systems/moe_infinity/batch.py). This module holds the table and the path of a single request
(batch 1, the common case), which works on views made once per row and does the few-element
work (the k routed experts, the m matched entries) in python: a numpy call costs more than
such work; when built, the compiled kernels (systems/moe_infinity/kernels/fast.pyx, one RowKernel
per row) do that path's arithmetic in C loops instead, with the same bits. It skips what
cannot change a value: the predicted EAM when the matched set is the same (only the order
moved), the sum of matched rows for the entries that stayed, the blend and the variance
outside the layer whose own counts changed. The variance of the predicted reuse is kept per
key (plane VAR), so the admission rule reads it at the keys it tests.

Every path gives the numbers of the per-request formulas bit for bit: token counts, their dot
products and sums are float64 integers (exact in any order, also through BLAS), and every
other value is a fixed sequence of IEEE operations (docs/trace-format.md, "Portable
determinism"), the same for an array element and a python float.

Shapes: K routed experts of a layer, n stored EAMC entries, m = min(match_top, n) matched
entries per request, L layers of E experts, keys = layer * E + expert.
"""

from __future__ import annotations

import math

import numpy as np

from systems.moe_infinity.eamc import EAMC, shares_into
from systems.moe_infinity.kernels import PYTHON, Kernels

ARGMAX_TOP = 8  # match_top up to this: repeated argmax; above: a stable sort
# planes of RequestTable.parts: the predicted EAM P and its variance terms per key
SHARE, PVAR, KEEP2, OWN_VAR, VAR = range(5)
ALL = -2  # RequestState.own_dirty: more than one layer changed, blend the whole row


class RequestState:
    """One running request: its table row and the python-side matching state."""

    __slots__ = ("table", "row", "best", "best_cos", "q_iter", "q_layers", "version",
                 "reached", "stale", "summed", "new_p", "own_dirty")

    def __init__(self, table: RequestTable, row: int):
        self.table, self.row = table, row
        self.best: tuple[int, ...] = ()  # matched slots, best first; empty before a match
        self.best_cos = 0.0
        self.q_iter = -1  # iteration the query belongs to (iteration-level query)
        self.q_layers: set[int] = set()  # layers with counts in that query
        self.version = -1  # EAMC version of the row's dot products
        self.reached: set[int] = set()  # layers the request has reached (own EAM blended)
        self.stale = False  # best changed (or its entries did): predicted EAM to check
        self.summed: frozenset[int] = frozenset()  # slots the table's acc row sums
        self.new_p = False  # predicted EAM changed: blend the whole row
        self.own_dirty = -1  # layer whose own shares changed since the blend (ALL: several)

    # views of the row, for tests and benchmarks (the hot path indexes the table)
    eam = property(lambda s: s.table.eam[s.row])  # [L*E] token counts so far
    q = property(lambda s: s.table.q[s.row])  # [L*E] query EAM
    dots = property(lambda s: s.table.dots[s.row])  # [capacity] q . entry
    own = property(lambda s: s.table.own[s.row])  # [L*E] own EAM, row-normalised
    norm2 = property(lambda s: float(s.table.norm2[s.row]))  # |q|^2

    def own_changed(self, layer: int) -> None:
        self.own_dirty = layer if self.own_dirty in (-1, layer) else ALL


class RowViews:
    """Views into one table row and its per-layer blocks, made once per row (slicing an
    array is a call of its own; batch 1 touches a dozen blocks per layer)."""

    __slots__ = ("q", "eam", "dots", "own", "acc", "counts", "totals", "blend", "mix", "parts",
                 "layers", "eam_b", "own_b", "mix_b", "blend_b", "share_b", "pvar_b",
                 "keep2_b", "own_var_b", "var_b", "kernel")

    def __init__(self, tab: RequestTable, r: int):
        L, E = tab.L, tab.E
        self.q, self.eam, self.dots, self.own = tab.q[r], tab.eam[r], tab.dots[r], tab.own[r]
        self.acc, self.blend, self.mix = tab.acc[r], tab.blend[r], tab.mix[r]
        self.counts, self.totals = self.acc[:L * E].reshape(L, E), self.acc[L * E:, None]
        self.parts = tab.parts[r]  # [5, L*E]
        self.layers = self.parts.reshape(5, L, E)  # [5, L, E]
        blocks = [slice(i * E, (i + 1) * E) for i in range(L)]
        self.eam_b = [self.eam[b] for b in blocks]
        self.own_b = [self.own[b] for b in blocks]
        self.mix_b = [self.mix[b] for b in blocks]
        self.blend_b = [self.blend[b] for b in blocks]
        self.share_b, self.pvar_b, self.keep2_b, self.own_var_b, self.var_b = (
            [plane[b] for b in blocks] for plane in self.parts)
        # the compiled arithmetic of the row (the table's kernels; None: numpy)
        fast = tab.kernels.fast
        self.kernel = fast.RowKernel(tab, r) if fast is not None else None


class RequestTable:
    """Rows of per-request arrays (grown by doubling; a finished request's row is reused).

    eam, q [rows, L*E]: token counts so far and the query EAM (this iteration's counts with
    `iteration_query`, else the eam array itself); dots [rows, capacity]: q . entry (first
    n valid); norm2 [rows]: |q|^2; own [rows, L*E]: the own EAM row-normalised on reached
    layers (else 0); own_n [rows, L]: its row sums; mix [rows, L*E]: own_weight on reached
    layers, else 0; acc [rows, L*E + L]: the matched entries' summed EAMC rows (counts,
    then the layer totals that divide them); blend [rows, L*E]: the predicted reuse
    P + mix (own - P).
    parts [rows, 5, L*E]: SHARE the predicted EAM P; PVAR its shares' binomial variance
    s (1 - s) / n (n: the layer's total in acc; 0 for an all-zero layer); KEEP2 (1 - mix)^2;
    OWN_VAR mix^2 s (1 - s) / n_own, the own shares' variance weighted (0 where not
    reached); VAR = KEEP2 * PVAR + OWN_VAR, the variance of the predicted reuse (valid once
    the request has a P).
    """

    def __init__(self, num_layers: int, num_experts: int, capacity: int, own_weight: float,
                 iteration_query: bool, rows: int = 1, kernels: Kernels = PYTHON):
        self.L, self.E, self.capacity = num_layers, num_experts, capacity
        self.kernels = kernels  # systems/moe_infinity/kernels: compiled, or PYTHON (numpy)
        self.own_weight, self.iteration_query = own_weight, iteration_query
        self.rows = 0
        self.free: list[int] = []
        self._grow(max(rows, 1))

    def _grow(self, rows: int) -> None:
        """Resize every array to `rows` rows, keeping the used ones."""
        L, LE, old = self.L, self.L * self.E, self.rows
        shapes = {"eam": (LE,), "dots": (self.capacity,), "norm2": (), "own": (LE,),
                  "own_n": (L,), "mix": (LE,), "acc": (LE + L,), "blend": (LE,),
                  "parts": (5, LE)}
        if self.iteration_query:
            shapes["q"] = (LE,)
        for name, shape in shapes.items():
            new = np.zeros((rows, *shape))
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)
        if not self.iteration_query:
            self.q = self.eam  # request-level query: the EAM itself
        self.free.extend(range(rows - 1, old - 1, -1))  # popped lowest first
        self.rows = rows
        self.views = [RowViews(self, r) for r in range(rows)]
        # the batch path's compiled rows, with the per-row kernels
        fast, rows_kernel = self.kernels
        self.kernel = (rows_kernel.TableKernel(self) if fast is not None and rows_kernel is not None
                       else None)

    def new_state(self) -> RequestState:
        if not self.free:
            self._grow(2 * self.rows)
        row = self.free.pop()
        for name in ("eam", "q", "dots", "norm2", "own", "own_n", "mix"):
            getattr(self, name)[row] = 0.0
        self.parts[row, KEEP2] = 1.0
        self.parts[row, OWN_VAR] = 0.0
        return RequestState(self, row)

    def release(self, st: RequestState) -> None:
        """The row is free for the next request; its values stay until then (the scores of
        the last update may still read them)."""
        self.free.append(st.row)

    # ---- before a layer's counts (any number of requests) ---------------------------------
    def start_iteration(self, states: list[RequestState], iteration: int, version: int) -> None:
        """Iteration-level query: an empty query for each request's new iteration."""
        for st in states:
            if st.q_iter != iteration:
                r = st.row
                self.q[r] = 0.0
                self.dots[r] = 0.0
                self.norm2[r] = 0.0
                st.q_layers.clear()
                st.version, st.q_iter = version, iteration

    def refresh(self, states: list[RequestState], c: EAMC) -> None:
        """Dot products of the rows whose collection version is old, recomputed in full."""
        stale = [st.row for st in states if st.version != c.version]
        if stale:
            self.dots[stale, :c.n] = self.q[stale] @ c.cols[:, :c.n]  # [S, n], exact
            for st in states:
                st.version = c.version

    def first_visit(self, st: RequestState, layer: int) -> None:
        """The request reaches `layer`: its own EAM is blended there from now on."""
        st.reached.add(layer)
        w, blk = self.own_weight, slice(layer * self.E, (layer + 1) * self.E)
        self.mix[st.row, blk] = w
        self.parts[st.row, KEEP2, blk] = (1.0 - w) * (1.0 - w)

    # ---- one request -----------------------------------------------------------------------
    def add_one(self, st: RequestState, layer: int, keys: list[int], counts: list[int]) -> None:
        """Add one layer's counts at flat `keys` (python lists): query, EAM, |q|^2 and the
        own shares of the layer with their variance."""
        v, apart, w = self.views[st.row], self.iteration_query, self.own_weight
        fresh = apart and layer not in st.q_layers  # the layer's query is still empty
        if w > 0 and layer not in st.reached:
            self.first_visit(st, layer)  # KEEP2 before VAR reads it (the shares do not)
        if v.kernel is not None:
            v.kernel.add(layer, keys, counts, apart, fresh)
        else:
            self._add_numpy(st.row, v, layer, keys, counts, fresh)
        if apart:
            st.q_layers.add(layer)
        if w > 0:
            st.own_changed(layer)

    def _add_numpy(self, r: int, v: RowViews, layer: int, keys: list[int],
                   counts: list[int], fresh: bool) -> None:
        q, eam = v.q, v.eam
        apart = self.iteration_query
        d = 0.0  # |q|^2 grows by sum cnt (2 old + cnt): integers, exact
        if fresh:
            for key, cnt in zip(keys, counts):
                q[key] = cnt
                eam[key] = eam.item(key) + cnt
                d += cnt * cnt
        else:
            for key, cnt in zip(keys, counts):
                old = q.item(key)
                q[key] = old + cnt
                d += cnt * (2.0 * old + cnt)
                if apart:
                    eam[key] = eam.item(key) + cnt
        self.norm2[r] += d
        w = self.own_weight
        if w > 0:
            n = self.own_n.item(r, layer) + sum(counts)  # the layer's tokens so far
            self.own_n[r, layer] = n
            inv = 1.0 / n
            share = np.multiply(v.eam_b[layer], inv, out=v.own_b[layer])
            own_var = v.own_var_b[layer]  # w^2 * share (1 - share) / n, in place
            np.subtract(1.0, share, out=own_var)
            own_var *= share
            own_var *= inv
            own_var *= w * w
            var = np.multiply(v.keep2_b[layer], v.pvar_b[layer], out=v.var_b[layer])
            var += own_var

    def match_one(self, st: RequestState, keys: list[int], counts: list[int], lim: int,
                  c: EAMC, match_top: int) -> float:
        """The EAMC query of one request, incrementally: its dot products gain the new counts
        of `keys` (K rows of the layer-major store), then the `match_top` best cosines over
        layers 0..lim (ties: lowest slot) become its best. Returns the best cosine."""
        r, n, cols, m = st.row, c.n, c.cols, min(match_top, c.n)
        v = self.views[r]
        # cosine = dots / (|query| |entry prefix|); |query| is the same for every entry
        if v.kernel is not None and m <= ARGMAX_TOP:
            slots, top = v.kernel.match(cols, keys, counts, c.inv_norm[lim], n, m)
        else:
            dots = v.dots[:n]  # slots past n: zero columns, never read
            dots += np.dot(counts, cols[keys, :n])  # [n], exact
            slots, top = top_few(dots * c.inv_norm[lim, :n], m)
        if slots != st.best:
            st.best, st.stale = slots, True
        return top / math.sqrt(self.norm2.item(r))

    def predict_one(self, st: RequestState, c: EAMC) -> None:
        """Predicted EAM of one request's matched entries (nothing to do for the same set):
        their counts and layer totals summed (exact; updated by the entries that changed
        when fewer), then the counts divided by their layer's total."""
        st.stale = False
        slots, summed = st.best, st.summed
        added = [j for j in slots if j not in summed]
        if not added and len(slots) == len(summed):
            return  # the same entries in another order: the same sums
        v = self.views[st.row]
        acc, x = v.acc, c.rows  # [L*E + L]; c.rows [capacity, L*E + L]
        keep = frozenset(slots)
        removed = [j for j in summed if j not in keep]
        st.summed, st.new_p = keep, True
        kept = summed and len(added) + len(removed) < len(slots)  # update the kept sum
        if v.kernel is not None:
            v.kernel.predict(x, added if kept else list(slots), removed if kept else [],
                             not kept)
            return
        if kept:
            for j in added:
                acc += x[j]
            for j in removed:
                acc -= x[j]
        elif len(slots) > ARGMAX_TOP:
            acc[:] = x[list(slots)].sum(axis=0)
        else:
            np.copyto(acc, x[slots[0]])
            for j in slots[1:]:
                acc += x[j]
        counts, totals, parts = v.counts, v.totals, v.layers
        share, pvar = parts[SHARE], parts[PVAR]
        # any(...): then every layer total is > 0
        shares_into(counts, totals, share, pvar, any(c.all_layers[j] for j in slots))
        var = np.multiply(parts[KEEP2], pvar, out=parts[VAR])
        var += parts[OWN_VAR]

    def blend_one(self, st: RequestState) -> slice | None:
        """Predicted reuse P + mix (own - P) of one row: the whole row after a new P, else
        the block of the layer whose own shares changed. Returns what it wrote (a slice of
        the row; None: nothing changed)."""
        v, layer = self.views[st.row], st.own_dirty
        if st.new_p or layer == ALL:
            blk = slice(None)
            p, out, own, mix = v.parts[SHARE], v.blend, v.own, v.mix
        elif layer >= 0:
            blk = slice(layer * self.E, (layer + 1) * self.E)
            p, out, own, mix = v.share_b[layer], v.blend_b[layer], v.own_b[layer], v.mix_b[layer]
        else:
            return None
        st.new_p, st.own_dirty = False, -1
        if v.kernel is not None:
            v.kernel.blend_keys(*blk.indices(self.L * self.E)[:2])
            return blk
        np.subtract(own, p, out=out)
        out *= mix
        out += p
        return blk

    # ---- variance of the predicted reuse ---------------------------------------------------
    def variance_one(self, st: RequestState, keys: np.ndarray) -> np.ndarray:
        """Variance of one request's predicted reuse at `keys` [K]."""
        return self.parts[st.row, VAR].take(keys)

    def variance_of(self, states: list[RequestState], key: int) -> float:
        """Variance of the predicted reuse at `key`, max over `states`."""
        return max(self.parts.item(st.row, VAR, key) for st in states)


def top_few(scaled: np.ndarray, m: int) -> tuple[tuple[int, ...], float]:
    """The m highest positions of scaled [n], highest first, ties by lowest position, and
    the highest value: repeated argmax, which returns the first of equal values whatever
    numpy's SIMD path (a stable sort for m > ARGMAX_TOP). `scaled` is overwritten."""
    if m > ARGMAX_TOP:
        order = np.argsort(-scaled, kind="stable")[:m]
        return tuple(order.tolist()), float(scaled[order[0]])
    slots = []
    top = 0.0
    for i in range(m):
        j = int(scaled.argmax())
        if i == 0:
            top = float(scaled[j])
        slots.append(j)
        scaled[j] = -np.inf
    return tuple(slots), top
