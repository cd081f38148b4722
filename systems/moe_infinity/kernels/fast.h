/* C helpers of moe_infinity's compiled kernels (systems/moe_infinity/kernels/fast.pyx, one row;
 * systems/moe_infinity/kernels/rows.pyx, a batch's member rows): elementwise loops and the top-m
 * insertion, shared so both give the same bits. */
#ifndef MOE_INFINITY_FAST_H
#define MOE_INFINITY_FAST_H

#include <Python.h>

/* Elementwise loops in 4-wide vectors (GCC/clang vector extensions): each lane is the
   same IEEE double operation as the scalar loop (no fusing: -ffp-contract=off, and no
   reassociation), so the bits do not depend on the width; an AVX2 clone on x86-64. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MI_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MI_CLONES
#endif
typedef double mi_v4 __attribute__((vector_size(32), aligned(8)));
MI_CLONES static void mi_blend(const double* p, const double* own, const double* mix, double* out,
                        Py_ssize_t lo, Py_ssize_t hi) {  /* out = (own - p) * mix + p */
    Py_ssize_t e = lo;
    for (; e + 4 <= hi; e += 4) {
        mi_v4 pv = *(const mi_v4*)(p + e);
        *(mi_v4*)(out + e) = (*(const mi_v4*)(own + e) - pv) * *(const mi_v4*)(mix + e) + pv;
    }
    for (; e < hi; e++)
        out[e] = (own[e] - p[e]) * mix[e] + p[e];
}
MI_CLONES static void mi_axpy(double* y, double a, const double* x, Py_ssize_t n) {
    /* y += a * x: integers, exact */
    Py_ssize_t e = 0;
    mi_v4 av = {a, a, a, a};
    for (; e + 4 <= n; e += 4)
        *(mi_v4*)(y + e) = *(mi_v4*)(y + e) + av * *(const mi_v4*)(x + e);
    for (; e < n; e++) y[e] += a * x[e];
}

/* Keep the m highest (value, then lowest index) of those offered in index order: v goes
   after every kept value >= v (numpy argmax's first of equal values). val, idx [m].
   Returns the new count. */
static inline int mi_insert(double* val, Py_ssize_t* idx, int n, int m, double v,
                            Py_ssize_t i) {
    int p;
    if (n == m) {
        if (!(v > val[m - 1]))
            return n;
        n -= 1;
    }
    p = n;
    while (p > 0 && val[p - 1] < v) {
        val[p] = val[p - 1];
        idx[p] = idx[p - 1];
        p -= 1;
    }
    val[p] = v;
    idx[p] = i;
    return n + 1;
}

/* The m highest of dots[j] * scale[j] over j < n, as mi_insert keeps them offered in index
   order; returns the count. Once m are kept, four products at a time are compared with the
   m-th kept value and only a lane that beats it is offered: the lanes skipped are those
   mi_insert would refuse (NaN included), and every product is the same IEEE multiply, so
   the result is the scalar loop's. */
typedef long long mi_m4 __attribute__((vector_size(32)));
MI_CLONES static int mi_top_scaled(const double* dots, const double* scale, Py_ssize_t n,
                                   int m, double* val, Py_ssize_t* idx) {
    Py_ssize_t j = 0;
    int kept = 0, lane;
    mi_v4 p, lo;
    mi_m4 beats;
    for (; j < n && kept < m; j++)
        kept = mi_insert(val, idx, kept, m, dots[j] * scale[j], j);
    for (; j + 4 <= n; j += 4) {
        p = *(const mi_v4*)(dots + j) * *(const mi_v4*)(scale + j);
        lo = (mi_v4){val[m - 1], val[m - 1], val[m - 1], val[m - 1]};
        beats = p > lo;
        if (beats[0] | beats[1] | beats[2] | beats[3])
            for (lane = 0; lane < 4; lane++)
                kept = mi_insert(val, idx, kept, m, p[lane], j + lane);
    }
    for (; j < n; j++)
        kept = mi_insert(val, idx, kept, m, dots[j] * scale[j], j);
    return kept;
}

/* The own shares of one row's layer block lo..hi - 1 after its counts changed: own = eam *
   inv (inv = 1 / the layer's tokens), own_var = (1 - own) own inv w2 (w2 = own_weight^2),
   var = keep2 * pvar + own_var. Every pointer is the row's [L*E]. */
static void mi_own_block(const double* eam, double* own, double* own_var, double* var,
                         const double* keep2, const double* pvar, double inv, double w2,
                         Py_ssize_t lo, Py_ssize_t hi) {
    Py_ssize_t e;
    double s, ov;
    for (e = lo; e < hi; e++) {
        s = eam[e] * inv;
        own[e] = s;
        ov = 1.0 - s;
        ov = ov * s;
        ov = ov * inv;
        ov = ov * w2;
        own_var[e] = ov;
        var[e] = keep2[e] * pvar[e] + ov;
    }
}

/* P, its shares' binomial variance, VAR and (blend not NULL) the blend of one row from its
   summed matched entries acc [L*E + L] (counts, then the L layer totals), one pass per layer:
   share = acc / t and pvar = (1 - share) share / t for a layer of total t > 0, zeros for an
   all-zero layer; var = keep2 * pvar + own_var; blend = (own - share) mix + share. */
MI_CLONES static void mi_predicted(const double* acc, double* share, double* pvar,
                                   const double* keep2, const double* own_var, double* var,
                                   const double* own, const double* mix, double* blend,
                                   Py_ssize_t L, Py_ssize_t E) {
    Py_ssize_t l, e, hi;
    double t, s1, p1;
    mi_v4 tv, s, pv, one = {1.0, 1.0, 1.0, 1.0}, zero = {0.0, 0.0, 0.0, 0.0};
    for (l = 0; l < L; l++) {
        t = acc[L * E + l];
        tv = (mi_v4){t, t, t, t};
        hi = (l + 1) * E;
        for (e = l * E; e + 4 <= hi; e += 4) {
            s = t > 0 ? *(const mi_v4*)(acc + e) / tv : zero;  /* an all-zero layer: zero */
            pv = t > 0 ? (one - s) * s / tv : zero;
            *(mi_v4*)(share + e) = s;
            *(mi_v4*)(pvar + e) = pv;
            *(mi_v4*)(var + e) = *(const mi_v4*)(keep2 + e) * pv + *(const mi_v4*)(own_var + e);
            if (blend)
                *(mi_v4*)(blend + e) = (*(const mi_v4*)(own + e) - s) * *(const mi_v4*)(mix + e)
                                       + s;
        }
        for (; e < hi; e++) {
            s1 = t > 0 ? acc[e] / t : 0.0;
            p1 = t > 0 ? (1.0 - s1) * s1 / t : 0.0;
            share[e] = s1;
            pvar[e] = p1;
            var[e] = keep2[e] * p1 + own_var[e];
            if (blend)
                blend[e] = (own[e] - s1) * mix[e] + s1;
        }
    }
}

/* out = the element-wise maximum of rows[0..nrows-1] [n], taken row after row as numpy's
   maximum.reduce: a value replaces the running one when it is larger or NaN (so a NaN, once
   met, stays). Selections only, four lanes at a time: the same values as the scalar loop. */
MI_CLONES static void mi_max_rows(double* out, const double* const* rows, int nrows,
                                  Py_ssize_t n) {
    Py_ssize_t e = 0;
    int i;
    mi_v4 o, x;
    mi_m4 take;
    double so, sx;
    for (; e + 4 <= n; e += 4) {
        o = *(const mi_v4*)(rows[0] + e);
        for (i = 1; i < nrows; i++) {
            x = *(const mi_v4*)(rows[i] + e);
            take = (x > o) | (x != x);
            o = (mi_v4)(((mi_m4)x & take) | ((mi_m4)o & ~take));
        }
        *(mi_v4*)(out + e) = o;
    }
    for (; e < n; e++) {
        so = rows[0][e];
        for (i = 1; i < nrows; i++) {
            sx = rows[i][e];
            if (sx > so || sx != sx)
                so = sx;
        }
        out[e] = so;
    }
}

/* acc = add[0] + add[1] + ... (fresh), else acc + add[0] + ... - sub[0] - ...: a row's
   matched entries summed in one pass over acc, each element the same additions in the same
   order as adding whole rows one after another (integers in doubles: exact anyway). */
MI_CLONES static void mi_sum_rows(double* acc, const double* const* add, int nadd,
                                  const double* const* sub, int nsub, int fresh,
                                  Py_ssize_t n) {
    Py_ssize_t e = 0;
    int i;
    mi_v4 v;
    double x;
    for (; e + 4 <= n; e += 4) {
        v = fresh ? *(const mi_v4*)(add[0] + e) : *(const mi_v4*)(acc + e);
        for (i = fresh ? 1 : 0; i < nadd; i++)
            v = v + *(const mi_v4*)(add[i] + e);
        for (i = 0; i < nsub; i++)
            v = v - *(const mi_v4*)(sub[i] + e);
        *(mi_v4*)(acc + e) = v;
    }
    for (; e < n; e++) {
        x = fresh ? add[0][e] : acc[e];
        for (i = fresh ? 1 : 0; i < nadd; i++)
            x += add[i][e];
        for (i = 0; i < nsub; i++)
            x -= sub[i][e];
        acc[e] = x;
    }
}

#endif
