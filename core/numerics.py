"""Float primitives whose bits do not depend on the CPU, the BLAS kernel or numpy's SIMD paths.

numpy's exp and log have SIMD versions (AVX2, AVX512) whose last bits differ from the
scalar path, BLAS sums in a kernel-dependent order (with or without FMA), and numpy's
samplers (`gumbel`, `standard_normal`) call the C library's exp and log, which have
FMA variants. Everything here is instead a fixed sequence of separate elementwise numpy
operations that IEEE 754 makes exact or correctly rounded on every path (+, -, *, /, sqrt,
rint, frexp, ldexp, comparisons, where, casts) and integer bit manipulation of the raw
generator output. docs/trace-format.md ("Portable determinism") gives the rule and where it
is used.

Accuracy (tests/core/test_numerics.py, against the math module and mpmath): `exp` within 1.5 ulp
in float32 and float64, `log` within 1 ulp in float64, `normal_quantile` within ~2e-16
relative. About 20 (exp) to 40 (log) array passes each: a few times slower than np.exp.
"""

from __future__ import annotations

import math

import numpy as np

# exp: x = n * ln2 + r with |r| <= ln2 / 2 (Cody-Waite: the high part of ln2 has trailing
# zero bits, so n * hi is exact), exp(r) by its Taylor series, times 2**n by ldexp.
_EXP = {  # dtype -> (ln2 high part, ln2 low part, Taylor degree, clip bounds of x)
    np.dtype(np.float32): (0.693359375, -2.12194440e-4, 7, (-110.0, 89.0)),
    np.dtype(np.float64): (6.93147180369123816490e-01, 1.90821492927058770002e-10, 13,
                           (-760.0, 710.0)),
}
_INV_LN2 = 1.4426950408889634
# log: fdlibm's e_log.c split of ln2 and its minimax coefficients for log(1+f) on
# sqrt(2)/2 <= 1+f < sqrt(2) (error below 2**-58.45)
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_LG = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
       2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01,
       1.479819860511658591e-01)
_SQRT_HALF = 0.7071067811865476
# Wichura's AS241 (PPND16): rational approximations of the normal quantile, relative error
# about 1e-16. Coefficients lowest degree first: central |q| <= 0.425 in r = 0.180625 - q*q,
# then the tails in r = sqrt(-log(min(p, 1-p))) - 1.6 (r <= 5) and r - 5 (beyond).
_AS241 = (
    ((3.387132872796366608, 133.14166789178437745, 1971.5909503065514427,
      13731.693765509461125, 45921.953931549871457, 67265.770927008700853,
      33430.575583588128105, 2509.0809287301226727),
     (1.0, 42.313330701600911252, 687.1870074920579083, 5394.1960214247511077,
      21213.794301586595867, 39307.89580009271061, 28729.085735721942674,
      5226.4952788528545610)),
    ((1.42343711074968357734, 4.6303378461565452959, 5.7694972214606914055,
      3.64784832476320460504, 1.27045825245236838258, 0.24178072517745061177,
      0.0227238449892691845833, 7.7454501427834140764e-4),
     (1.0, 2.05319162663775882187, 1.6763848301838038494, 0.68976733498510000455,
      0.14810397642748007459, 0.0151986665636164571966, 5.475938084995344946e-4,
      1.05075007164441684324e-9)),
    ((6.6579046435011037772, 5.4637849111641143699, 1.7848265399172913358,
      0.29656057182850489123, 0.026532189526576123093, 0.0012426609473880784386,
      2.71155556874348757815e-5, 2.01033439929228813265e-7),
     (1.0, 0.59983220655588793769, 0.13692988092273580531, 0.0148753612908506148525,
      7.868691311456132591e-4, 1.8463183175100546818e-5, 1.4215117583164458887e-7,
      2.04426310338993978564e-15)),
)


def exp(x: np.ndarray) -> np.ndarray:
    """e**x elementwise for float32 or float64 `x` (same dtype out), within 1.5 ulp; 0 below
    the dtype's smallest subnormal, inf above its largest float, nan for nan."""
    x = np.asarray(x)
    if x.dtype not in _EXP:
        raise TypeError(f"numerics.exp: float32 or float64, got {x.dtype}")
    return _blocked(_exp, x)


def _exp(x: np.ndarray) -> np.ndarray:
    hi, lo, degree, (x_min, x_max) = _EXP[x.dtype]
    t = x.dtype.type
    x = np.clip(x, t(x_min), t(x_max))  # keeps 2**n in int32 range; nan stays nan
    n = x * t(_INV_LN2)
    np.rint(n, out=n)
    r = n * t(hi)
    np.subtract(x, r, out=r)
    r -= n * t(lo)
    p = r * t(1.0 / math.factorial(degree))  # Horner, in place: sum of r**k / k!
    for k in range(degree - 1, 0, -1):
        p += t(1.0 / math.factorial(k))
        p *= r
    p += t(1.0)
    with np.errstate(over="ignore"):  # x above the largest float's log: inf
        return np.ldexp(p, np.fmax(n, t(-4096)).astype(np.int32))  # nan: any n, p is nan


def log(x: np.ndarray) -> np.ndarray:
    """Natural log elementwise in float64, within 1 ulp, for finite x > 0 (normal or
    subnormal); fdlibm's algorithm: x = 2**e * (1 + f), log(1 + f) = 2 atanh(f / (2 + f))."""
    return _blocked(_log, np.asarray(x, np.float64))


def _log(x: np.ndarray) -> np.ndarray:
    m, e = np.frexp(x)  # x = m * 2**e, 0.5 <= m < 1
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)  # now sqrt(2)/2 <= m < sqrt(2)
    k = (e - low).astype(np.float64)
    f = m - 1.0  # exact (Sterbenz)
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    odd = z * _poly(w, _LG[0::2])
    even = w * _poly(w, _LG[1::2])
    r = odd + even
    hfsq = 0.5 * f * f
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + k * _LN2_LO)) - f)


def uniform(rng: np.random.Generator, shape) -> np.ndarray:
    """float64 draws in the open interval (0, 1): (j + 1/2) / 2**52 with j the top 52 bits of
    one raw 64-bit word each, so never 0 or 1 and exact (no rounding anywhere)."""
    n = int(np.prod(shape))
    j = rng.bit_generator.random_raw(n) >> np.uint64(12)
    return np.ldexp(j.astype(np.float64) + 0.5, -52).reshape(shape)


def gumbel(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard Gumbel draws (location 0, scale 1), float64: -log(-log(U))."""
    return -log(-log(uniform(rng, shape)))


def standard_normal(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard normal draws, float64: normal_quantile(uniform(rng, shape)); |draw| < 8.3."""
    return normal_quantile(uniform(rng, shape))


def normal_quantile(p: np.ndarray) -> np.ndarray:
    """The standard normal quantile of p in (0, 1), float64, by Wichura's AS241 (relative
    error about 1e-16)."""
    p = np.asarray(p, np.float64)
    shape, p = p.shape, p.ravel()
    q = p - 0.5
    out = np.empty_like(p)
    mid = np.abs(q) <= 0.425
    qm = q[mid]
    r = 0.180625 - qm * qm
    num, den = _AS241[0]
    out[mid] = qm * _poly(r, num) / _poly(r, den)
    tail = np.flatnonzero(~mid)
    qt = q[tail]
    r = np.sqrt(-log(np.where(qt < 0, p[tail], 1.0 - p[tail])))  # 1 - p exact for p > 1/2
    near = r <= 5.0
    x = np.empty_like(r)
    for sel, shift, (num, den) in ((near, 1.6, _AS241[1]), (~near, 5.0, _AS241[2])):
        rs = r[sel] - shift
        x[sel] = _poly(rs, num) / _poly(rs, den)
    out[tail] = np.where(qt < 0, -x, x)
    return out.reshape(shape)


def on_grid(x: np.ndarray, bits: int) -> np.ndarray:
    """x rounded to the nearest multiple of 2**-bits (ties to even), float64. Products of two
    such values are multiples of 2**(-2 * bits): any sum of them is exact in float64 while
    its magnitude stays below 2**(53 - 2 * bits), whatever the order or FMA use."""
    return np.ldexp(np.rint(np.ldexp(np.asarray(x, np.float64), bits)), -bits)


def _blocked(fn, x: np.ndarray, block: int = 1 << 16) -> np.ndarray:
    """fn (elementwise) over x in blocks that stay in cache; the same bits as one call."""
    if x.size <= block:
        return fn(x)
    flat = x.ravel()
    return np.concatenate([fn(flat[i:i + block]) for i in range(0, flat.size, block)]
                          ).reshape(x.shape)


def _poly(x: np.ndarray, coef) -> np.ndarray:
    """sum(coef[i] * x**i) by Horner, elementwise."""
    p = np.full_like(x, coef[-1])
    for c in coef[-2::-1]:
        p *= x
        p += c
    return p
