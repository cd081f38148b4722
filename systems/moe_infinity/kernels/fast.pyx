# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""The compiled kernels of moe_infinity's batch-1 path (systems/moe_infinity/requests.py,
systems/moe_infinity/propose.py): the same values as their numpy code, bit for bit, in C
loops, which cost less than the numpy calls on a layer's few keys and a row's L*E.

Bit-identity: token counts and their sums are integers held in doubles (exact in any order),
every other value is the same sequence of IEEE double operations as the numpy code (built
with -ffp-contract=off, so a * b + c is never fused), and rankings break ties by the lowest
index as numpy's argmax does. tests/systems/test_moe_infinity_fast.py checks both paths alike.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.math cimport INFINITY, sqrt

from systems.moe_infinity.kernels.fast_c cimport *  # the C helpers, MAX_TOP, the planes


cdef class RowKernel:
    """One table row of a RequestTable: add_one's, match_one's, predict_one's and
    blend_one's arithmetic on the table's arrays (rebuilt with them when the table grows)."""

    cdef double[:, ::1] q, eam, dots, own, own_n, mix, acc, blend
    cdef double[::1] norm2
    cdef double[:, :, ::1] parts
    cdef Py_ssize_t r, L, E
    cdef double w

    def __init__(self, tab, Py_ssize_t r):
        self.q, self.eam, self.dots, self.own = tab.q, tab.eam, tab.dots, tab.own
        self.own_n, self.mix, self.acc, self.blend = tab.own_n, tab.mix, tab.acc, tab.blend
        self.norm2, self.parts = tab.norm2, tab.parts
        self.r, self.L, self.E, self.w = r, tab.L, tab.E, tab.own_weight

    def add(self, Py_ssize_t layer, keys, counts, bint apart, bint fresh):
        """RequestTable.add_one's arithmetic (first_visit already done where due)."""
        cdef Py_ssize_t r = self.r, i, key, base = layer * self.E
        cdef double cnt, old, d = 0.0, total = 0.0, inv
        for i in range(len(keys)):
            key, cnt = keys[i], counts[i]
            total += cnt
            if apart and fresh:
                self.q[r, key] = cnt
                self.eam[r, key] = self.eam[r, key] + cnt
                d += cnt * cnt
            else:
                old = self.q[r, key]
                self.q[r, key] = old + cnt
                d += cnt * (2.0 * old + cnt)
                if apart:
                    self.eam[r, key] = self.eam[r, key] + cnt
        self.norm2[r] += d
        if not self.w > 0:
            return
        self.own_n[r, layer] = self.own_n[r, layer] + total
        inv = 1.0 / self.own_n[r, layer]
        mi_own_block(&self.eam[r, 0], &self.own[r, 0], &self.parts[r, OWN_VAR, 0],
                     &self.parts[r, VAR, 0], &self.parts[r, KEEP2, 0], &self.parts[r, PVAR, 0],
                     inv, self.w * self.w, base, base + self.E)

    def match(self, const double[:, ::1] cols, keys, counts,
              const double[::1] inv_norm, Py_ssize_t n, int m):
        """match_one's dot products and top_few (m <= MAX_TOP): the m best slots of
        dots * inv_norm over the first n, and the best value."""
        cdef Py_ssize_t i
        cdef double cnt
        cdef double* dots = &self.dots[self.r, 0]
        cdef double val[MAX_TOP]
        cdef Py_ssize_t idx[MAX_TOP]
        cdef int kept
        for i in range(len(keys)):
            cnt = counts[i]
            if cnt != 0.0:  # a batch row's unrouted keys: nothing to add
                mi_axpy(dots, cnt, &cols[keys[i], 0], n)  # past n: zero columns, never read
        kept = mi_top_scaled(dots, &inv_norm[0], n, m, val, idx)
        return tuple([idx[i] for i in range(kept)]), val[0]

    def predict(self, const double[:, ::1] rows, list add, list sub, bint fresh):
        """predict_one's sums (fresh: the rows of `add` alone, else the kept sum plus `add`
        minus `sub`), then P, its variance and VAR."""
        cdef Py_ssize_t i, nadd = len(add), nsub = len(sub)
        cdef double* acc = &self.acc[self.r, 0]
        if fresh and nadd == 0:
            raise ValueError("predict: a fresh sum needs at least one matched entry")
        # row pointers, added then subtracted (any match_top: not bounded by MAX_TOP here)
        cdef const double** ptr = <const double**>PyMem_Malloc(
            max(nadd + nsub, 1) * sizeof(double*))
        if ptr == NULL:
            raise MemoryError()
        try:
            for i in range(nadd):
                ptr[i] = &rows[add[i], 0]
            for i in range(nsub):
                ptr[nadd + i] = &rows[sub[i], 0]
            mi_sum_rows(acc, ptr, nadd, ptr + nadd, nsub, fresh, rows.shape[1])
        finally:
            PyMem_Free(ptr)
        mi_predicted(acc, &self.parts[self.r, SHARE, 0], &self.parts[self.r, PVAR, 0],
                     &self.parts[self.r, KEEP2, 0], &self.parts[self.r, OWN_VAR, 0],
                     &self.parts[self.r, VAR, 0], NULL, NULL, NULL, self.L, self.E)

    def blend_keys(self, Py_ssize_t lo, Py_ssize_t hi):
        """blend_one on keys lo..hi - 1: P + mix (own - P)."""
        cdef Py_ssize_t e
        cdef const double* p = &self.parts[self.r, SHARE, 0]
        cdef const double* own = &self.own[self.r, 0]
        cdef const double* mix = &self.mix[self.r, 0]
        cdef double* out = &self.blend[self.r, 0]
        mi_blend(p, own, mix, out, lo, hi)


def propose(const double[::1] score, const double[::1] w, const double[::1] apen, plane,
            list rows, Py_ssize_t victim, double margin, int m):
    """moe_infinity_propose's top (victim < 0) or admitted ranking: up to m keys (m <=
    MAX_TOP) of score * w > 0 that the gate allows, highest first, ties by the lowest key;
    with a victim only those admitted over it, score - sv > margin sqrt(var + var_victim),
    a key's variance the max over `rows` of plane [N, L*E] (plane None: zeros)."""
    cdef const double[:, :] v  # [N, L*E], rows strided
    cdef Py_ssize_t i, nr = len(rows) if plane is not None else 0
    cdef Py_ssize_t* rw = <Py_ssize_t*> PyMem_Malloc((nr + 1) * sizeof(Py_ssize_t))
    if rw == NULL:
        raise MemoryError()
    try:
        if nr:
            v = plane
            for i in range(nr):
                rw[i] = rows[i]
        return _propose(score, w, apen, v, rw, nr, victim, margin, m)
    finally:
        PyMem_Free(rw)


cdef list _propose(const double[::1] score, const double[::1] w, const double[::1] apen,
                   const double[:, :] v, Py_ssize_t* rw, Py_ssize_t nr, Py_ssize_t victim,
                   double margin, int m):
    cdef Py_ssize_t k, nk = score.shape[0]
    cdef double sv = 0.0, vv = 0.0, thresh = 0.0, s, p, vk
    cdef double val[MAX_TOP]
    cdef Py_ssize_t idx[MAX_TOP]
    cdef int kept = 0
    if victim >= 0:
        sv = score[victim]
        vv = _var_max(v, rw, nr, victim)
        thresh = (sv + margin * sqrt(vv)) * (1.0 - 1e-12)
    for k in range(nk):
        s = score[k]
        if victim >= 0:
            if not s + apen[k] > thresh:
                continue
            vk = _var_max(v, rw, nr, k)
            if not s - sv > margin * sqrt(vk + vv):
                continue
            p = s * w[k]
        else:
            p = s * w[k] + apen[k]
        if p > 0:
            kept = mi_insert(val, idx, kept, m, p, k)
    return [idx[k] for k in range(kept)]


cdef inline double _var_max(const double[:, :] v, Py_ssize_t* rw, Py_ssize_t nr,
                            Py_ssize_t k) noexcept nogil:
    """The max over rows rw[:nr] of v[row, k]; 0 for no rows."""
    cdef double x, y
    cdef Py_ssize_t i
    if nr == 0:
        return 0.0
    x = v[rw[0], k]
    for i in range(1, nr):
        y = v[rw[i], k]
        if y > x:
            x = y
    return x


def lowest_evictable(double[::1] ranks, candidates):
    """ranks.lowest_evictable: repeated argmin (the first of equal values, as
    numpy's), skipping keys not in `candidates` (None: any) by setting them to inf until
    the search ends, then restoring them. Returns the key, or -1 when only inf is left."""
    cdef Py_ssize_t k, key = -1, n = ranks.shape[0]
    cdef list skipped = []
    while True:
        k = _argmin(&ranks[0], n)
        if ranks[k] == INFINITY:
            break
        if candidates is None or k in candidates:
            key = k
            break
        skipped.append((k, ranks[k]))
        ranks[k] = INFINITY  # in use by the running layer or still in flight
    for k, value in skipped:
        ranks[k] = value
    return key


cdef inline Py_ssize_t _argmin(const double* v, Py_ssize_t n) noexcept nogil:
    """numpy's argmin: the first lowest value, or the first NaN."""
    cdef Py_ssize_t i, best = 0
    cdef double low = v[0]
    if low != low:
        return 0
    for i in range(1, n):
        if v[i] < low:
            low, best = v[i], i
        elif v[i] != v[i]:
            return i
    return best
