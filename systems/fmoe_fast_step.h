/* The trajectory step's product for systems/fmoe_fast.pyx: row[j] += sum_e q[e] * cols[e][j].
 * Every term is a product of two values on the 2**-24 grid, so every partial sum is exact in
 * double: the grouping (four expert rows per pass) and the vector width change no bit.
 * target_clones: the widest vectors the running CPU has, chosen at load time. */
#ifndef FMOE_FAST_STEP_H
#define FMOE_FAST_STEP_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define FMOE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FMOE_CLONES
#endif

FMOE_CLONES
static void fmoe_traj_add(double *restrict row, const float *restrict cols, long stride,
                          const double *restrict q, long E, long n)
{
    long e = 0, j;
    for (; e + 4 <= E; e += 4) {
        const double w0 = q[e], w1 = q[e + 1], w2 = q[e + 2], w3 = q[e + 3];
        const float *c0 = cols + e * stride, *c1 = c0 + stride, *c2 = c1 + stride,
                    *c3 = c2 + stride;
        for (j = 0; j < n; j++)
            row[j] += (w0 * (double)c0[j] + w1 * (double)c1[j])
                      + (w2 * (double)c2[j] + w3 * (double)c3[j]);
    }
    for (; e < E; e++) {
        const double w = q[e];
        const float *c = cols + e * stride;
        for (j = 0; j < n; j++)
            row[j] += w * (double)c[j];
    }
}

#endif
