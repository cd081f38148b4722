/* The trajectory step's product for fast.pyx: row[j] += sum_e q[e] * cols[e][j].
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

/* The same over float16 bits (every map exact in float16): half the bytes to stream. F16C
 * converts them (exactly) where the CPU has it (fmoe_half_ok); without it the caller streams
 * the float32 block instead. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>

static int fmoe_half_ok(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

static int fmoe_wide16 = -1; /* AVX-512 present (1) or not (0); -1: not yet asked */

static int fmoe_level16(void)
{
    if (fmoe_wide16 < 0) {
        __builtin_cpu_init();
        fmoe_wide16 = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    return fmoe_wide16;
}

/* Four expert rows' weights and float16 rows from expert e (rows past E: weight 0, whose
 * +0.0 products change nothing). */
static long fmoe_rows4(const unsigned short *bits, long stride, const double *q, long E,
                       long e, const unsigned short **c, double *w)
{
    const long r = E - e < 4 ? E - e : 4;
    for (long k = 0; k < 4; k++) {
        c[k] = bits + (e + (k < r ? k : 0)) * stride;
        w[k] = k < r ? q[e + k] : 0.0;
    }
    return r;
}

__attribute__((target("avx2,f16c")))
static void fmoe_add16_avx2(double *restrict row, const unsigned short *restrict bits,
                            long stride, const double *restrict q, long E, long n)
{
    long e, j, k;
    for (e = 0; e < E; e += 4) {
        const unsigned short *c[4];
        double w[4];
        __m256d wv[4];
        fmoe_rows4(bits, stride, q, E, e, c, w);
        for (k = 0; k < 4; k++)
            wv[k] = _mm256_set1_pd(w[k]);
        for (j = 0; j + 8 <= n; j += 8) {
            __m256d slo = _mm256_setzero_pd(), shi = _mm256_setzero_pd();
            for (k = 0; k < 4; k++) {
                __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c[k] + j)));
                slo = _mm256_add_pd(slo, _mm256_mul_pd(wv[k],
                                    _mm256_cvtps_pd(_mm256_castps256_ps128(f))));
                shi = _mm256_add_pd(shi, _mm256_mul_pd(wv[k],
                                    _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))));
            }
            _mm256_storeu_pd(row + j, _mm256_add_pd(_mm256_loadu_pd(row + j), slo));
            _mm256_storeu_pd(row + j + 4, _mm256_add_pd(_mm256_loadu_pd(row + j + 4), shi));
        }
        for (; j < n; j++) {
            double t = 0.0;
            for (k = 0; k < 4; k++)
                t += w[k] * (double)_cvtsh_ss(c[k][j]);
            row[j] += t;
        }
    }
}

__attribute__((target("avx512f,f16c")))
static void fmoe_add16_avx512(double *restrict row, const unsigned short *restrict bits,
                              long stride, const double *restrict q, long E, long n)
{
    long e, j, k;
    for (e = 0; e < E; e += 4) {
        const unsigned short *c[4];
        double w[4];
        __m512d wv[4];
        fmoe_rows4(bits, stride, q, E, e, c, w);
        for (k = 0; k < 4; k++)
            wv[k] = _mm512_set1_pd(w[k]);
        for (j = 0; j + 16 <= n; j += 16) {
            __m512d slo = _mm512_setzero_pd(), shi = _mm512_setzero_pd();
            for (k = 0; k < 4; k++) {
                __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c[k] + j)));
                __m256 fl = _mm512_castps512_ps256(f);
                __m256 fh = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1));
                slo = _mm512_add_pd(slo, _mm512_mul_pd(wv[k], _mm512_cvtps_pd(fl)));
                shi = _mm512_add_pd(shi, _mm512_mul_pd(wv[k], _mm512_cvtps_pd(fh)));
            }
            _mm512_storeu_pd(row + j, _mm512_add_pd(_mm512_loadu_pd(row + j), slo));
            _mm512_storeu_pd(row + j + 8, _mm512_add_pd(_mm512_loadu_pd(row + j + 8), shi));
        }
        for (; j < n; j++) {
            double t = 0.0;
            for (k = 0; k < 4; k++)
                t += w[k] * (double)_cvtsh_ss(c[k][j]);
            row[j] += t;
        }
    }
}

/* Several queries (a batch) in one pass: each float16 block is converted once for up to four
 * queries' rows (dots [m, ldd], q [m, E]). */
__attribute__((target("avx512f,f16c")))
static void fmoe_add16_many512(double *restrict dots, long ldd,
                               const unsigned short *restrict bits, long stride,
                               const double *restrict q, long m, long E, long n)
{
    long i0, e, j, k, i;
    for (i0 = 0; i0 < m; i0 += 4) {
        const long qm = m - i0 < 4 ? m - i0 : 4;
        for (e = 0; e < E; e += 4) {
            const unsigned short *c[4];
            double w[4][4];
            fmoe_rows4(bits, stride, q + i0 * E, E, e, c, w[0]);
            for (i = 1; i < qm; i++) /* the same rows, this query's weights */
                fmoe_rows4(bits, stride, q + (i0 + i) * E, E, e, c, w[i]);
            for (j = 0; j + 16 <= n; j += 16) {
                __m512d lo[4], hi[4];
                for (k = 0; k < 4; k++) {
                    __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c[k] + j)));
                    lo[k] = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
                    hi[k] = _mm512_cvtps_pd(_mm256_castpd_ps(
                        _mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
                }
                for (i = 0; i < qm; i++) {
                    double *row = dots + (i0 + i) * ldd;
                    __m512d slo = _mm512_setzero_pd(), shi = _mm512_setzero_pd();
                    for (k = 0; k < 4; k++) {
                        __m512d wk = _mm512_set1_pd(w[i][k]);
                        slo = _mm512_add_pd(slo, _mm512_mul_pd(wk, lo[k]));
                        shi = _mm512_add_pd(shi, _mm512_mul_pd(wk, hi[k]));
                    }
                    _mm512_storeu_pd(row + j, _mm512_add_pd(_mm512_loadu_pd(row + j), slo));
                    _mm512_storeu_pd(row + j + 8,
                                     _mm512_add_pd(_mm512_loadu_pd(row + j + 8), shi));
                }
            }
            for (i = 0; i < qm; i++) {
                double *row = dots + (i0 + i) * ldd;
                for (long jj = j; jj < n; jj++) {
                    double t = 0.0;
                    for (k = 0; k < 4; k++)
                        t += w[i][k] * (double)_cvtsh_ss(c[k][jj]);
                    row[jj] += t;
                }
            }
        }
    }
}

static void fmoe_traj_add16(double *row, const unsigned short *bits, long stride,
                            const double *q, long E, long n)
{
    if (fmoe_level16())
        fmoe_add16_avx512(row, bits, stride, q, E, n);
    else
        fmoe_add16_avx2(row, bits, stride, q, E, n);
}

/* fmoe_traj_add16 for m queries (rows of dots [m, ldd], q [m, E]). */
static void fmoe_traj_add16_many(double *dots, long ldd, const unsigned short *bits,
                                 long stride, const double *q, long m, long E, long n)
{
    if (m > 1 && fmoe_level16()) {
        fmoe_add16_many512(dots, ldd, bits, stride, q, m, E, n);
        return;
    }
    for (long i = 0; i < m; i++)
        fmoe_traj_add16(dots + i * ldd, bits, stride, q + i * E, E, n);
}
#else
static int fmoe_half_ok(void) { return 0; }

static void fmoe_traj_add16_many(double *dots, long ldd, const unsigned short *bits,
                                 long stride, const double *q, long m, long E, long n)
{
    (void)dots; (void)ldd; (void)bits; (void)stride; (void)q; (void)m; (void)E; (void)n;
}

static void fmoe_traj_add16(double *row, const unsigned short *bits, long stride,
                            const double *q, long E, long n)
{
    (void)row; (void)bits; (void)stride; (void)q; (void)E; (void)n;
}
#endif

#endif
