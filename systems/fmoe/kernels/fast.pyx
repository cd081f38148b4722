# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of fMoE's hottest per-hook loops (systems/fmoe/kernels chooses): the
eviction scores' edits (eviction.py), the victim order's update (victim_order.py) and
the trajectory step (maps_trajectory.py). They read and write the same python lists
and give the same values: the scores are the same IEEE double operations, one rounding each
(built with -ffp-contract=off: no fused multiply-add), and the trajectory dot products are
exact (grid values, see maps), so any summation order gives the same bits.
tests/systems/test_fmoe_fast.py runs both paths."""

from bisect import insort

from libc.math cimport INFINITY, sqrt
from libc.stdlib cimport calloc, free


cdef extern from "fast_step.h":
    void fmoe_traj_add(double *row, const float *cols, long stride, const double *q, long E,
                       long n) nogil
    void fmoe_traj_add16_many(double *dots, long ldd, const unsigned short *bits, long stride,
                              const double *q, long m, long E, long n) nogil
    int fmoe_half_ok()

# traj_step16 needs F16C (kernels/fast_step.h); without it stores keep no float16 copy
HALF_OK = bool(fmoe_half_ok())


cdef inline bint _before(double s, long u, long k, tuple e):
    """(s, u, k) < e, as python compares the tuples (no NaN: scores are finite or inf)."""
    cdef double es = e[0]
    if s != es:
        return s < es
    cdef long eu = e[1]
    if u != eu:
        return u < eu
    return k < <long>e[2]


cdef class ScoreKernel:
    """The per-key lists of one EvictionScores (the same list objects) and scratch marks."""

    cdef list p, freq, last_use, resident, penalty, protect_cnt, visits
    cdef long E, n
    cdef char *gone
    cdef char *rise

    def __init__(self, scores):
        self.p, self.freq, self.last_use = scores.p, scores.freq, scores.last_use
        self.resident, self.penalty = scores.resident, scores.penalty
        self.protect_cnt, self.visits = scores.protect_cnt, scores.visits
        self.E, self.n = scores.E, len(scores.p)
        self.gone = <char *>calloc(self.n, 1)
        self.rise = <char *>calloc(self.n, 1)
        if self.gone == NULL or self.rise == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.gone)
        free(self.rise)

    def route(self, long layer, list experts, long clock, set raised):
        """EvictionScores.route."""
        cdef long lo = layer * self.E, k
        cdef list freq = self.freq, last_use = self.last_use
        for e in experts:
            k = lo + <long>e
            freq[k] = <double>freq[k] + 1.0
            last_use[k] = clock
            raised.add(k)
        self.visits[layer] = <long>self.visits[layer] + 1

    def set_p(self, long layer, list rows, bint first):
        """EvictionScores.set_p's values: the layer's p becomes the elementwise max of `rows`
        [r][E] (python floats), and of its own p unless `first`. The python path's
        comparisons (`a if a > b else b`; numpy's maximum for many rows gives the same
        values: probabilities, no NaN), without building an [r, E] array per call."""
        cdef long lo = layer * self.E, E = self.E, j
        cdef list p = self.p, row
        cdef double b
        cdef double *acc = <double *>calloc(E, sizeof(double))
        if acc == NULL:
            raise MemoryError()
        try:
            head = rows[0] if first else p[lo:lo + E]
            rest = rows[1:] if first else rows
            for row in [head, *rest]:  # unchecked reads below: the lengths first
                if len(row) != E:
                    raise ValueError(f"fmoe: a prediction row has {len(row)} entries, not {E}")
            row = head
            for j in range(E):
                acc[j] = row[j]
            for row in rest:
                for j in range(E):
                    b = row[j]
                    if not (acc[j] > b):
                        acc[j] = b
            for j in range(E):
                p[lo + j] = acc[j]
        finally:
            free(acc)

    def protect(self, list dropped, list added, bint counted, double tier, set raised,
                set moved):
        """EvictionScores.protect (with its _set_penalty)."""
        cdef list cnt = self.protect_cnt
        if counted:
            for k in dropped:
                cnt[k] = <long>cnt[k] - 1
            for k in added:
                cnt[k] = <long>cnt[k] + 1
            for k in dropped:
                self._penalty(k, tier if <long>cnt[k] > 0 else 0.0, raised, moved)
            for k in added:
                self._penalty(k, tier if <long>cnt[k] > 0 else 0.0, raised, moved)
            return
        for k in dropped:
            self._penalty(k, 0.0, raised, moved)
        for k in added:
            self._penalty(k, tier, raised, moved)

    cdef inline void _penalty(self, long k, double value, set raised, set moved):
        cdef double old = self.penalty[k]
        if value != old:
            self.penalty[k] = value
            (raised if value > old else moved).add(k)

    def flush(self, list entries, set raised, set moved, set layers, long keep):
        """EvictionScores.flush's edit of the prefix `entries` (not None, changes recorded):
        the new prefix, or None when nothing of it is kept. New entries are inserted in any
        order: their keys differ from each other and from the kept ones, so the sorted result
        is the same."""
        cdef long E = self.E, k, lo, i, u
        cdef char *gone = self.gone
        cdef char *rise = self.rise
        cdef list kept = [], back = [], p = self.p, freq = self.freq, pen = self.penalty
        cdef list res = self.resident, last_use = self.last_use
        cdef double s, thr
        cdef tuple e, last
        for x in moved:
            gone[<long>x] = 1
        for x in layers:
            lo = <long>x * E
            for k in range(lo, lo + E):
                gone[k] = 1
        for x in raised:
            rise[<long>x] = 1
        for x in entries:
            e = <tuple>x
            k = e[2]
            if gone[k]:
                continue
            if rise[k]:
                back.append(k)
            else:
                kept.append(e)
        for x in raised:
            rise[<long>x] = 0
        if not kept:
            self._clear(moved, layers)
            return None
        last = kept[len(kept) - 1]
        thr = last[0]
        for x in back:
            self._offer(<long>x, thr, last, kept)
        for x in moved:
            k = x
            if (k // E) not in layers:
                self._offer(k, thr, last, kept)
        for x in layers:
            lo = <long>x * E
            for k in range(lo, lo + E):
                s = (<double>p[k] * <double>freq[k] + <double>pen[k]) if res[k] else INFINITY
                if s <= thr:
                    u = last_use[k]
                    if _before(s, u, k, last):
                        insort(kept, (s, u, k))
        self._clear(moved, layers)
        del kept[keep:]
        return kept

    cdef void _offer(self, long k, double thr, tuple last, list kept):
        cdef double s = ((<double>self.p[k] * <double>self.freq[k]) if self.resident[k]
                         else INFINITY) + <double>self.penalty[k]
        cdef long u
        if s <= thr:
            u = self.last_use[k]
            if _before(s, u, k, last):
                insort(kept, (s, u, k))

    cdef void _clear(self, set moved, set layers):
        cdef long k, lo
        for x in moved:
            self.gone[<long>x] = 0
        for x in layers:
            lo = <long>x * self.E
            for k in range(lo, lo + self.E):
                self.gone[k] = 0


def order_update(list entries, long key, double score, long last_use, long keep):
    """VictimOrder.update on a prefix (not None): False when it became empty."""
    cdef Py_ssize_t i, n = len(entries)
    for i in range(n):
        if <long>(<tuple>entries[i])[2] == key:
            del entries[i]
            break
    if not entries:
        return False
    if _before(score, last_use, key, <tuple>entries[len(entries) - 1]):
        insort(entries, (score, last_use, key))
        del entries[keep:]
    return True


def traj_step(const float[:, ::1] cols, const double[:, ::1] q, double[:, ::1] dots,
              const float[::1] inv, list query_sq):
    """maps_trajectory.observe's step for m queries q [m, E] against n maps: dots
    [m, n] += q . cols [E, >= n] (float32 map values, exact on the grid: the products and
    sums are exact doubles, kernels/fast_step.h), query_sq [m] += |q|^2 (exact); returns (index
    [m], cosine [m]) of each query's first largest dots * inv, cosine = that / |query|."""
    cdef Py_ssize_t i
    for i in range(dots.shape[0]):
        fmoe_traj_add(&dots[i, 0], &cols[0, 0], cols.strides[0] // sizeof(float), &q[i, 0],
                      q.shape[1], dots.shape[1])
    return _best(q, dots, inv, query_sq)


def traj_step16(const unsigned short[:, ::1] cols, const double[:, ::1] q,
                double[:, ::1] dots, const float[::1] inv, list query_sq):
    """traj_step over the maps' float16 bits (every stored map exact in float16)."""
    fmoe_traj_add16_many(&dots[0, 0], dots.strides[0] // sizeof(double), &cols[0, 0],
                         cols.strides[0] // sizeof(unsigned short), &q[0, 0], dots.shape[0],
                         q.shape[1], dots.shape[1])
    return _best(q, dots, inv, query_sq)


cdef tuple _best(const double[:, ::1] q, double[:, ::1] dots, const float[::1] inv,
                 list query_sq):
    cdef Py_ssize_t m = dots.shape[0], n = dots.shape[1], E = q.shape[1], i, j, bj
    cdef double c, best, sq, qn
    cdef double *row
    idx, val = [], []
    for i in range(m):
        row = &dots[i, 0]
        bj, best = 0, row[0] * <double>inv[0]
        for j in range(1, n):
            c = row[j] * <double>inv[j]
            if c > best:
                bj, best = j, c
        sq = 0.0
        for j in range(E):
            sq += q[i, j] * q[i, j]
        sq += <double>query_sq[i]
        query_sq[i] = sq
        qn = sqrt(sq)
        idx.append(bj)
        val.append(best / qn if qn > 0 else 0.0)
    return idx, val


def first_victim(list entries, candidates, bint demand, double tier):
    """fmoe's victim scan of the prefix: the first key `candidates` holds; -1: none may go
    (a non-resident entry, or a protected one for a prefetch); -2: every key of it is busy."""
    cdef double low
    cdef tuple e
    for x in entries:
        e = <tuple>x
        low = e[0]
        if low == INFINITY or (not demand and low >= tier):
            return -1
        if e[2] in candidates:
            return e[2]
    return -2


def delta_one(const float[::1] mass, const int[::1] order, const double[::1] row,
              double score, long top_k, double smooth, long lo, bint many=False):
    """maps.delta_ids and from_store's prediction parts for one stored row: None for a
    row without tokens, else (keys, probabilities, row) as lists; the row smoothed toward
    1 / E by `smooth` (0: as stored), by numpy's operations in the same order. many: as
    delta_ids_many counts (every mass below delta; a live row's last mass is > 0)."""
    return _delta(&mass[0], &order[0], &row[0], mass.shape[0], score, top_k, smooth, lo, many)


def delta_rows(const float[:, ::1] mass, const int[:, ::1] order, const double[:, ::1] rows,
               list idx, list score, long top_k, double smooth, long lo):
    """delta_one (many=True) for rows idx of one layer's [capacity, E] blocks, score [m]."""
    cdef Py_ssize_t j, E = mass.shape[1]
    out = []
    for i in range(len(idx)):
        j = idx[i]
        out.append(_delta(&mass[j, 0], &order[j, 0], &rows[j, 0], E, score[i], top_k, smooth,
                          lo, True))
    return out


cdef object _delta(const float *mass, const int *order, const double *row, Py_ssize_t E,
                   double score, long top_k, double smooth, long lo, bint many):
    cdef Py_ssize_t a = 0, b = E, mid, count, j
    cdef double d = 1.0 - score, s = 1.0 - smooth, t
    if (not (<double>mass[E - 1] > 0)) if many else (<double>mass[E - 1] <= 0):
        return None
    if not (d > 0.0):  # min(1.0, max(0.0, 1 - score)), as python's min and max pick
        d = 0.0
    if not (d < 1.0):
        d = 1.0
    if many:
        for j in range(E):
            if <double>mass[j] < d:
                a += 1
    else:
        while a < b:  # bisect.bisect_left over the float32 masses read as doubles
            mid = (a + b) // 2
            if <double>mass[mid] < d:
                a = mid + 1
            else:
                b = mid
    count = a + 1
    if count < top_k:
        count = top_k
    if count > E:
        count = E
    vals = [0.0] * E
    if smooth != 0.0:
        t = smooth / E
        for j in range(E):
            vals[j] = s * row[j] + t
    else:
        for j in range(E):
            vals[j] = row[j]
    keys, probs = [], []
    for j in range(count):
        keys.append(lo + order[j])
        probs.append(vals[order[j]])
    return keys, probs, vals


def group_tables(list preds, long top_k):
    """LayerGroup's tables of predictions `preds`: ({key: best probability}, {key: best
    expected use}), expected_use's rule: score clipped at 0 times min(1, top_k * p)."""
    cdef dict best = {}, use = {}
    cdef double p, sc, tp, u
    cdef list keys, probs
    cdef Py_ssize_t i
    for x in preds:
        keys, probs, sc = x.keys, x.probs, x.score
        if 0.0 > sc:  # python's max(score, 0.0)
            sc = 0.0
        for i in range(len(keys)):
            k, po = keys[i], probs[i]
            p = po
            if p > <double>best.get(k, -1.0):
                best[k] = po
            tp = top_k * p
            u = sc * (tp if tp < 1.0 else 1.0)
            if u > <double>use.get(k, -1.0):
                use[k] = u
    return best, use
