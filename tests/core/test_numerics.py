"""core/numerics.py against independent references: the math module (glibc's exp and log,
themselves within 0.5 ulp, so float64 bounds allow 0.5 ulp more than the docstring's),
mpmath when installed (exact), statistics.NormalDist and hand-worked values."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from core import numerics
from core.rng import stream


def ulps(got: np.ndarray, exact: list[float], dtype) -> np.ndarray:
    """|got - exact| in units of the dtype's spacing at the exact value."""
    ref = np.array(exact, np.float64)
    return np.abs(got.astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(dtype))


def exp_inputs(dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    hi = 88.0 if dtype == np.float32 else 709.0
    lo = -87.0 if dtype == np.float32 else -708.0
    return np.concatenate([rng.uniform(lo, hi, 100_000), rng.uniform(-1, 1, 50_000),
                           rng.uniform(-31, 31, 50_000)]).astype(dtype)


@pytest.mark.parametrize("dtype,bound", [(np.float32, 1.5), (np.float64, 2.0)])
def test_exp_within_stated_ulps_of_math(dtype, bound):
    x = exp_inputs(dtype)
    got = numerics.exp(x)
    assert got.dtype == dtype
    assert ulps(got, [math.exp(float(v)) for v in x], dtype).max() <= bound


def test_log_within_stated_ulps_of_math():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(0, 1, 50_000), 1 - rng.uniform(0, 1e-9, 10_000),
                        np.exp(rng.uniform(-744, 709, 50_000)), rng.uniform(0.5, 2, 50_000)])
    assert ulps(numerics.log(x), [math.log(float(v)) for v in x], np.float64).max() <= 1.5


def test_exact_against_mpmath():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 120
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.uniform(-708, 709, 3000), rng.uniform(-1, 1, 3000)])
    e = ulps(numerics.exp(x), [float(mpmath.exp(mpmath.mpf(float(v)))) for v in x], np.float64)
    assert e.max() <= 1.5
    y = np.concatenate([rng.uniform(1e-300, 1, 3000), rng.uniform(0.7, 1.4, 3000)])
    e = ulps(numerics.log(y), [float(mpmath.log(mpmath.mpf(float(v)))) for v in y], np.float64)
    assert e.max() <= 1.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_edges(dtype):
    x = np.array([0.0, np.nan, np.inf, -np.inf, -1000.0, 1000.0], dtype)
    got = numerics.exp(x)
    assert got[0] == 1.0 and np.isnan(got[1]) and got[2] == np.inf
    assert got[3] == 0.0 and got[4] == 0.0 and got[5] == np.inf
    with pytest.raises(TypeError):
        numerics.exp(np.zeros(2, np.float16))


def test_log_edges():
    got = numerics.log(np.array([1.0, 2.0, 0.5, 5e-324, 1.7976931348623157e308]))
    assert got[0] == 0.0 and got[1] == math.log(2) and got[2] == -math.log(2)
    assert got[3] == pytest.approx(-744.4400719213812, rel=1e-15)  # -1074 ln 2
    assert got[4] == pytest.approx(709.782712893384, rel=1e-15)


def test_uniform_is_exact_and_open():
    u = numerics.uniform(stream(0, "u"), (3, 1000))
    assert u.shape == (3, 1000) and (u > 0).all() and (u < 1).all()
    j = u * 2.0**52 - 0.5  # (j + 1/2) / 2**52 with integer j
    assert np.array_equal(j, np.floor(j))
    assert abs(u.mean() - 0.5) < 0.02


def test_normal_quantile_against_statistics():
    rng = np.random.default_rng(3)
    p = np.concatenate([rng.uniform(0, 1, 5000), rng.uniform(0, 1e-12, 500),
                        1 - rng.uniform(0, 1e-12, 500), [2.0**-53, 0.5, 0.925, 0.075]])
    got = numerics.normal_quantile(p)
    ref = np.array([NormalDist().inv_cdf(float(v)) for v in p])
    assert np.allclose(got, ref, rtol=2e-15, atol=0)
    assert got[-3] == 0.0  # q = 0 exactly
    assert numerics.normal_quantile(np.array([0.975]))[0] == pytest.approx(1.959963984540054,
                                                                          rel=1e-15)


def test_draw_moments():
    g = numerics.gumbel(stream(0, "g"), (200_000,))
    assert g.mean() == pytest.approx(np.euler_gamma, abs=0.01)
    assert g.std() == pytest.approx(math.pi / math.sqrt(6), abs=0.01)
    # P(G <= 1) = exp(-exp(-1)) = 0.6922
    assert (g <= 1).mean() == pytest.approx(math.exp(-math.exp(-1)), abs=0.005)
    z = numerics.standard_normal(stream(0, "z"), (200_000,))
    assert abs(z.mean()) < 0.01 and z.std() == pytest.approx(1.0, abs=0.01)
    assert (z <= 1).mean() == pytest.approx(0.8413, abs=0.005)  # Phi(1)


def test_on_grid_by_hand_and_exact_sums():
    assert numerics.on_grid(np.array([0.3, 0.375, 0.625, -0.3]), 2).tolist() == [
        0.25, 0.5, 0.5, -0.25]  # 1.2 -> 1; 1.5 -> 2 and 2.5 -> 2 (ties to even)
    rng = np.random.default_rng(4)
    a = numerics.on_grid(rng.dirichlet(np.ones(1664)), 24)
    b = numerics.on_grid(rng.dirichlet(np.ones(1664)), 24)
    prods = a * b  # exact: multiples of 2**-48 below 1
    assert np.dot(a, b) == math.fsum(prods) == float(np.sum(prods[::-1]))
