"""Estimates with their 95 % interval: what every verdict (analysis/repro/verdict.py) reads.

Two sources of uncertainty, two intervals:

  seeds     synthetic routing: each seed resamples the requests (and the routing), so the
            seeds are independent replicates. A ratio between two systems is paired by seed:
            its estimate is the geometric mean of the per-seed ratios and its interval the
            95 % t-interval of the per-seed log ratios (n - 1 degrees of freedom), mapped
            back with exp. A difference (orderings) is the mean of the per-seed differences
            with the same t-interval.
  requests  a real routing sample is one fixed set of requests: its interval is a
            request-level bootstrap (requests resampled with replacement, the same indices
            for both systems so the pairing is kept; percentile interval; fixed generator
            seed, so the same inputs give the same bytes).

One seed (or one request) gives a point with no interval (`Estimate.low is None`): verdicts
then never go beyond the direction (analysis/repro/verdict.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Two-sided 95 % quantiles of Student's t, t_{0.975, df}, df = 1..30 (standard tables;
# tests/analysis/test_compare.py checks a few against a Student t table)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
Z975 = 1.959964
BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 20261206
MIN_BOOTSTRAP_REQUESTS = 20  # a real sample smaller than this is shown, not judged


def t975(df: int) -> float:
    """t_{0.975, df}; beyond the table, the Cornish-Fisher expansion around the normal
    quantile (error < 1e-3 for df > 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z975
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95 % interval (`low`, `high`; None with one replicate).
    `n`: replicates (seeds or requests); `method`: "t" (paired seeds), "bootstrap"
    (requests) or "point" (one replicate)."""

    mean: float
    low: float | None
    high: float | None
    n: int
    method: str

    @property
    def judged(self) -> bool:
        return self.low is not None and self.high is not None

    def above(self, x: float) -> bool:
        """The interval lies entirely above x."""
        return self.judged and self.low > x

    def below(self, x: float) -> bool:
        return self.judged and self.high < x

    def half_width(self) -> float | None:
        """For a ratio: the larger of high/mean - 1 and 1 - low/mean (0.1 = +-10 %)."""
        if not self.judged or self.mean <= 0:
            return None
        return max(self.high / self.mean - 1, 1 - self.low / self.mean)

    def text(self, digits: int = 3) -> str:
        """'1.23 [1.10, 1.38]'; a point alone with one replicate."""
        def f(x: float) -> str:
            return f"{x:.{digits}g}"
        if not self.judged:
            return f(self.mean)
        return f"{f(self.mean)} [{f(self.low)}, {f(self.high)}]"


def point(value: float) -> Estimate:
    return Estimate(float(value), None, None, 1, "point")


def _t_interval(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None, None
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t975(n - 1) * math.sqrt(var / n)
    return mean, mean - half, mean + half


def _paired(num: Mapping, den: Mapping) -> list:
    common = sorted(set(num) & set(den), key=str)
    if not common:
        raise ValueError(f"no seed in common: {sorted(num, key=str)} vs {sorted(den, key=str)}")
    return common


def log_mean(values: Mapping) -> Estimate:
    """Per-seed positive values (ratios) {seed: value} -> geometric mean and the t-interval
    of their logs, mapped back."""
    vals = [float(values[k]) for k in sorted(values, key=str)]
    if not vals or any(not v > 0 for v in vals):
        raise ValueError(f"ratios must be positive and present, got {vals}")
    m, lo, hi = _t_interval([math.log(v) for v in vals])
    if lo is None:
        return point(math.exp(m))
    return Estimate(math.exp(m), math.exp(lo), math.exp(hi), len(vals), "t")


def ratio(num: Mapping, den: Mapping) -> Estimate:
    """num / den paired by seed ({seed: value}, e.g. a baseline's TPOT over the system's):
    the seeds both have."""
    common = _paired(num, den)
    return log_mean({s: float(num[s]) / float(den[s]) for s in common})


def difference(a: Mapping, b: Mapping) -> Estimate:
    """a - b paired by seed: mean of the per-seed differences and its t-interval."""
    common = _paired(a, b)
    m, lo, hi = _t_interval([float(a[s]) - float(b[s]) for s in common])
    if lo is None:
        return point(m)
    return Estimate(m, lo, hi, len(common), "t")


def mean(values: Mapping) -> Estimate:
    """The mean of per-seed values and its t-interval."""
    vals = [float(values[k]) for k in sorted(values, key=str)]
    m, lo, hi = _t_interval(vals)
    return point(m) if lo is None else Estimate(m, lo, hi, len(vals), "t")


def _percentiles(stat, n: int, draws: int, seed: int) -> tuple[float, float]:
    """The 2.5 % and 97.5 % points of `stat(idx)` over `draws` resamples idx [draws, n] of
    n requests with replacement (fixed generator: the same inputs give the same bytes)."""
    import numpy as np

    rng = np.random.Generator(np.random.PCG64(seed))
    got = np.sort(stat(rng.integers(0, n, size=(draws, n))))
    return float(got[int(0.025 * draws)]), float(got[int(math.ceil(0.975 * draws)) - 1])


def bootstrap_ratio(num: Sequence[float], den: Sequence[float],
                    draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED) -> Estimate:
    """mean(num) / mean(den) over the same requests (num[i] and den[i] are request i under
    two systems), with a paired percentile bootstrap over requests. Fewer than
    MIN_BOOTSTRAP_REQUESTS requests: the point only (the sample is too small to judge)."""
    import numpy as np

    a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"paired per-request values must have one equal length, got "
                         f"{a.shape} and {b.shape}")
    est = float(a.mean() / b.mean())
    if len(a) < MIN_BOOTSTRAP_REQUESTS:
        return Estimate(est, None, None, len(a), "point")
    lo, hi = _percentiles(lambda idx: a[idx].mean(axis=1) / b[idx].mean(axis=1), len(a),
                          draws, seed)
    return Estimate(est, lo, hi, len(a), "bootstrap")


def bootstrap_difference(a: Sequence[float], b: Sequence[float],
                         draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED) -> Estimate:
    """mean(a) - mean(b) over the same requests, paired percentile bootstrap."""
    import numpy as np

    x = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    est = float(x.mean())
    if len(x) < MIN_BOOTSTRAP_REQUESTS:
        return Estimate(est, None, None, len(x), "point")
    lo, hi = _percentiles(lambda idx: x[idx].mean(axis=1), len(x), draws, seed)
    return Estimate(est, lo, hi, len(x), "bootstrap")


def bootstrap_statistic(values: Sequence[float], stat, draws: int = BOOTSTRAP_DRAWS,
                        seed: int = BOOTSTRAP_SEED) -> Estimate:
    """`stat` of one system's per-request values on a real sample, with the percentile
    bootstrap over requests. `stat` maps float [draws, n] to [draws] (e.g. the mean or a
    percentile along axis 1); it is applied to [1, n] for the point. Fewer than
    MIN_BOOTSTRAP_REQUESTS requests: the point only."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or not len(x):
        raise ValueError(f"per-request values must be one non-empty list, got {x.shape}")
    est = float(stat(x[None, :])[0])
    if len(x) < MIN_BOOTSTRAP_REQUESTS:
        return Estimate(est, None, None, len(x), "point")
    lo, hi = _percentiles(lambda idx: stat(x[idx]), len(x), draws, seed)
    return Estimate(est, lo, hi, len(x), "bootstrap")
