# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""moe_infinity's batch path (systems/moe_infinity/batch.py) in one compiled call per
batch-layer and step: a loop over the member rows that does what the per-row calls of
RequestTable (systems/moe_infinity/requests.py) do, reading and writing the rows'
RequestState flags (best, summed, stale, new_p, own_dirty, q_layers, reached) directly.
Python then does O(1) calls per batch-layer instead of O(rows); the per-row python call
cost more than its C arithmetic.

The same bits as the numpy path and the per-row kernels (systems/moe_infinity/kernels/fast.pyx,
sharing systems/moe_infinity/kernels/fast.h): token counts, their dot products and sums are
integers held in doubles (exact in any order), every other value is the same sequence of
IEEE double operations (built with -ffp-contract=off), and rankings break ties by the lowest
index. tests/systems/test_moe_infinity_fast.py checks the batch path with and without it.
"""

cimport cython
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.math cimport sqrt

import numpy as np

from systems.moe_infinity.kernels.fast_c cimport *  # the C helpers, MAX_TOP, the planes

cdef enum:
    ALL = -2  # RequestState.own_dirty: several layers changed (requests.ALL)
    NONE = -1  # RequestState.own_dirty: nothing changed


ctypedef fused expert_id:  # the trace's top-k dtypes (core/trace.py)
    unsigned char
    unsigned short


def bincount_rows(list rows, Py_ssize_t num_experts):
    """batch.bincount_rows: tokens per expert [R, E] (float64, integers) of R
    requests' top-k ids ([tokens, k] each), counted in one pass; None when an array is not
    the trace's uint8 or uint16 (the numpy code counts those)."""
    cdef Py_ssize_t i
    for arr in rows:
        if arr.ndim != 2 or arr.dtype not in (np.uint8, np.uint16):
            return None
    out = np.zeros((len(rows), num_experts))
    cdef double[:, ::1] o = out
    for i in range(len(rows)):
        if rows[i].dtype == np.uint8:
            _count[cython.uchar](rows[i], o, i)
        else:
            _count[cython.ushort](rows[i], o, i)
    return out


cdef int _count(const expert_id[:, :] ids, double[:, ::1] out, Py_ssize_t i) except -1:
    """out[i, x] += 1 for every id x of ids [tokens, k]."""
    cdef Py_ssize_t t, j, x
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            x = ids[t, j]
            if x >= out.shape[1]:
                raise ValueError(f"expert id {x} >= {out.shape[1]}")
            out[i, x] += 1.0
    return 0


cdef class TableKernel:
    """The member rows of a RequestTable at once: add_counts, match, predict_one and
    blend_one for every row in one call (rebuilt with the table's arrays when it grows)."""

    cdef double[:, ::1] q, eam, dots, own, own_n, mix, acc, blend
    cdef double[::1] norm2
    cdef double[:, :, ::1] parts
    cdef Py_ssize_t L, E
    cdef double w
    cdef bint apart
    cdef object tab

    def __init__(self, tab):
        self.q, self.eam, self.dots, self.own = tab.q, tab.eam, tab.dots, tab.own
        self.own_n, self.mix, self.acc, self.blend = tab.own_n, tab.mix, tab.acc, tab.blend
        self.norm2, self.parts = tab.norm2, tab.parts
        self.L, self.E, self.w = tab.L, tab.E, tab.own_weight
        self.apart, self.tab = tab.iteration_query, tab

    def add(self, list states, Py_ssize_t layer, const double[:, :] counts):
        """batch.add_counts: one layer's counts [R, E] of the member rows
        (query, EAM, |q|^2, and the own shares of the layer with their variance)."""
        cdef Py_ssize_t i, e, r, key, base = layer * self.E
        cdef double cnt, old, d, total
        cdef int dirty
        for i in range(len(states)):
            st = states[i]
            r = st.row
            d = total = 0.0
            for e in range(self.E):
                cnt = counts[i, e]
                if cnt == 0.0:
                    continue  # adds nothing
                key = base + e
                old = self.q[r, key]
                self.q[r, key] = old + cnt
                d += (2.0 * old + cnt) * cnt  # integers, exact in any order
                total += cnt
                if self.apart:  # else q is the EAM itself
                    self.eam[r, key] = self.eam[r, key] + cnt
            self.norm2[r] += d
            if self.apart:
                st.q_layers.add(layer)
            if not self.w > 0:
                continue
            if layer not in st.reached:
                self.tab.first_visit(st, layer)  # mix and KEEP2, before VAR reads KEEP2
            dirty = st.own_dirty
            st.own_dirty = layer if dirty == NONE or dirty == layer else ALL
            self.own_n[r, layer] = self.own_n[r, layer] + total
            mi_own_block(&self.eam[r, 0], &self.own[r, 0], &self.parts[r, OWN_VAR, 0],
                         &self.parts[r, VAR, 0], &self.parts[r, KEEP2, 0],
                         &self.parts[r, PVAR, 0], 1.0 / self.own_n[r, layer],
                         self.w * self.w, base, base + self.E)

    def match(self, list states, const double[:, ::1] cols, Py_ssize_t layer,
              const double[:, :] counts, const double[::1] inv_norm, Py_ssize_t n, int m):
        """batch.match (m <= MAX_TOP): each row's dot products gain its nonzero
        counts [R, E] of `layer`, its m best slots of dots * inv_norm over the first n
        become its best (stale when they changed). Returns each row's best cosine."""
        cdef Py_ssize_t i, e, j, r, base = layer * self.E
        cdef double cnt
        cdef double* dots
        cdef double val[MAX_TOP]
        cdef Py_ssize_t idx[MAX_TOP]
        cdef int kept
        cdef list out = []
        for i in range(len(states)):
            st = states[i]
            r = st.row
            dots = &self.dots[r, 0]
            for e in range(self.E):
                cnt = counts[i, e]
                if cnt != 0.0:  # the row's unrouted experts: nothing to add
                    mi_axpy(dots, cnt, &cols[base + e, 0], n)  # past n: zero columns
            kept = mi_top_scaled(dots, &inv_norm[0], n, m, val, idx)
            if not _same(st.best, idx, kept):
                st.best, st.stale = tuple([idx[j] for j in range(kept)]), True
            out.append(val[0] / sqrt(self.norm2[r]))
        return out

    def predict_blend(self, list states, c):
        """batch.predict_and_blend: predict_one for the stale rows (of the
        EAMC `c`), then blend_one for every row (with the prediction: in its pass).
        Returns the rows' blend, max over them [L*E] (a new array)."""
        cdef Py_ssize_t i, r
        cdef const double[:, ::1] rows = c.rows  # [capacity, L*E + L]
        cdef int dirty
        for i in range(len(states)):
            st = states[i]
            r = st.row
            if st.stale:
                if len(st.best) > MAX_TOP or len(st.summed) > MAX_TOP:
                    self.tab.predict_one(st, c)  # long rankings: python lists
                elif self._predict(st, r, rows):
                    st.new_p, st.own_dirty = False, NONE  # blended with the new P
                    continue
            dirty = st.own_dirty
            if st.new_p or dirty == ALL:
                self._blend(r, 0, self.L * self.E)
            elif dirty >= 0:
                self._blend(r, dirty * self.E, (dirty + 1) * self.E)
            else:
                continue
            st.new_p, st.own_dirty = False, NONE
        return self._max_rows(states)

    cdef object _max_rows(self, list states):
        """blend[rows].max(axis=0) [L*E]: numpy's maximum, a NaN kept once met."""
        cdef Py_ssize_t i, nrows = len(states)
        score = np.empty(self.L * self.E)
        cdef double[::1] out = score
        cdef const double** ptr = <const double**>PyMem_Malloc(nrows * sizeof(double*))
        if ptr == NULL:
            raise MemoryError()
        try:
            for i in range(nrows):
                ptr[i] = &self.blend[<Py_ssize_t>states[i].row, 0]
            mi_max_rows(&out[0], ptr, <int>nrows, self.L * self.E)
        finally:
            PyMem_Free(ptr)
        return score

    cdef bint _predict(self, st, Py_ssize_t r, const double[:, ::1] rows) except -1:
        """RequestTable.predict_one of row r with at most MAX_TOP slots: nothing for the same
        set; else its matched rows summed (the kept sum updated when fewer change), then P
        and the whole row's blend in one pass. Returns whether it blended."""
        cdef tuple slots = st.best
        summed = st.summed
        cdef const double* add[MAX_TOP]
        cdef const double* sub[MAX_TOP]
        cdef Py_ssize_t slot[MAX_TOP]
        cdef Py_ssize_t i, j, ns = len(slots)
        cdef int nadd = 0, nsub = 0
        cdef double* acc = &self.acc[r, 0]
        cdef bint kept
        st.stale = False
        for i in range(ns):
            slot[i] = slots[i]
            if slots[i] not in summed:
                add[nadd] = &rows[slot[i], 0]
                nadd += 1
        if nadd == 0 and ns == len(summed):
            return False  # the same entries in another order: the same sums
        for x in summed:
            j = x
            if not _has(slot, ns, j):
                sub[nsub] = &rows[j, 0]
                nsub += 1
        kept = len(summed) > 0 and nadd + nsub < ns  # update the kept sum
        st.summed, st.new_p = frozenset(slots), True
        if not kept:  # the matched rows alone, in slot order
            nadd, nsub = ns, 0
            for i in range(ns):
                add[i] = &rows[slot[i], 0]
        mi_sum_rows(acc, add, nadd, sub, nsub, not kept, rows.shape[1])
        mi_predicted(acc, &self.parts[r, SHARE, 0], &self.parts[r, PVAR, 0],
                     &self.parts[r, KEEP2, 0], &self.parts[r, OWN_VAR, 0],
                     &self.parts[r, VAR, 0], &self.own[r, 0], &self.mix[r, 0],
                     &self.blend[r, 0], self.L, self.E)
        return True

    cdef inline void _blend(self, Py_ssize_t r, Py_ssize_t lo, Py_ssize_t hi):
        """blend_one on row r's keys lo..hi - 1: P + mix (own - P)."""
        mi_blend(&self.parts[r, SHARE, 0], &self.own[r, 0], &self.mix[r, 0],
                 &self.blend[r, 0], lo, hi)


cdef bint _same(tuple best, Py_ssize_t* idx, int kept):
    """best (a tuple of slots) == idx[:kept]."""
    cdef int i
    if len(best) != kept:
        return False
    for i in range(kept):
        if <Py_ssize_t>best[i] != idx[i]:
            return False
    return True


cdef inline bint _has(Py_ssize_t* a, Py_ssize_t n, Py_ssize_t x) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        if a[i] == x:
            return True
    return False
