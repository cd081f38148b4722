"""Synthetic request lengths (workloads/lengths.py): fixed, or drawn from real length data.

Expected spreads come from the real data (recomputed from the shared data when present, else
the table's recorded `cv`), never from the sampler.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest

from core.rng import stream
from core.shared_data import shared_file
from workloads.arrivals import MAX_REQUEST_TOKENS
from workloads.length_tables import LENGTH_TABLES
from workloads.lengths import draw, request_lengths
from workloads.synthetic import SyntheticConfig, generate_trace

N = 20000  # draws: the sample mean's error is about cv / sqrt(N) < 2%


def _cv(x) -> float:
    x = np.asarray(x, np.float64)
    return float(x.std() / x.mean())


def test_fixed_gives_exactly_the_configured_lengths():
    cfg = SyntheticConfig(num_requests=7, prompt_len=512, output_len=32)
    p, o, where = request_lengths(cfg, 7)
    assert p.tolist() == [512] * 7 and o.tolist() == [32] * 7 and where == "config"


def knot_cv(quantiles) -> float:
    """CV of the piecewise-linear quantile function through the knots, by hand: on a segment
    of probability w from a to b, E[x] = w (a + b) / 2 and E[x^2] = w (a^2 + ab + b^2) / 3."""
    from workloads.length_tables import GRID_N

    w = np.diff(np.array(GRID_N) / 10000)
    a, b = np.array(quantiles[:-1]), np.array(quantiles[1:])
    m1, m2 = (w * (a + b) / 2).sum(), (w * (a * a + a * b + b * b) / 3).sum()
    return float(np.sqrt(m2 - m1 * m1) / m1)


@pytest.mark.parametrize("source", sorted(LENGTH_TABLES))
def test_fitted_mean_and_spread(source):
    table = LENGTH_TABLES[source]
    for part, mean in (("prompt", 512), ("output", 32)):
        x = draw(table[part]["quantiles"], mean, N, stream(0, f"test/{source}/{part}"))
        assert x.min() >= 1 and x.dtype == np.int64
        assert x.mean() == pytest.approx(mean, rel=0.03), (part, x.mean())
        # the draws spread as the knots do, and the knots as the real lengths (the cv the
        # fit recorded). ShareGPT's outputs: one reply of 12,480 tokens (43x the mean) makes
        # the data's 1.21; the knots, whose top segment holds 0.01%, give 0.97
        assert _cv(x) == pytest.approx(knot_cv(table[part]["quantiles"]), rel=0.05)
        if (source, part) != ("sharegpt", "output"):
            assert knot_cv(table[part]["quantiles"]) == pytest.approx(table[part]["cv"],
                                                                      rel=0.05)
        # the median relative to the mean, as in the data
        assert np.median(x) / x.mean() == pytest.approx(
            table[part]["quantiles"][50], rel=0.05, abs=0.02)


def test_fitted_spread_matches_the_azure_csv():
    path = shared_file("azure_llm_traces", "AzureLLMInferenceTrace_conv.csv")
    if path is None:
        pytest.skip("shared data not present (core/shared_data.py)")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    real = np.array([int(r["ContextTokens"]) for r in rows], np.float64)
    x = draw(LENGTH_TABLES["azure_conv"]["prompt"]["quantiles"], real.mean(), N, stream(1, "t"))
    assert x.mean() == pytest.approx(real.mean(), rel=0.03)
    assert _cv(x) == pytest.approx(_cv(real), rel=0.05)
    for q in (0.1, 0.5, 0.9, 0.99):
        assert np.quantile(x, q) == pytest.approx(np.quantile(real, q), rel=0.06), q


def test_committed_tables_are_the_fit_of_the_shared_data():
    if shared_file("azure_llm_traces") is None or shared_file("sharegpt") is None:
        pytest.skip("shared data not present (core/shared_data.py)")
    pytest.importorskip("tokenizers")
    from workloads.length_fit import fit_tables

    assert fit_tables() == LENGTH_TABLES  # python -m workloads.length_fit regenerates them


def test_lengths_stay_within_the_request_bound():
    x = draw(LENGTH_TABLES["sharegpt"]["prompt"]["quantiles"], MAX_REQUEST_TOKENS, 2000,
             stream(0, "big"))
    assert x.max() == MAX_REQUEST_TOKENS and x.min() >= 1


def test_generator_with_fitted_lengths(dsv2):
    base = dict(num_requests=6, prompt_len=48, output_len=6, lengths="fitted")
    tr = generate_trace(dsv2, SyntheticConfig(**base))
    assert len(set(tr.prompt_len.tolist())) > 1 and len(set(tr.output_len.tolist())) > 1
    assert tr.meta["lengths_from"] == "fitted:azure_conv"
    assert tr.meta["generator"]["length_source"] == "azure_conv"
    p, o, _ = request_lengths(SyntheticConfig(**base), 6)
    assert np.array_equal(tr.prompt_len, p) and np.array_equal(tr.output_len, o)
    longer = generate_trace(dsv2, SyntheticConfig(**{**base, "num_requests": 9}))
    assert np.array_equal(longer.prompt_len[:6], tr.prompt_len)  # prefix-stable
    cal = generate_trace(dsv2, SyntheticConfig(**{**base, "split": "calibration"}))
    assert not np.array_equal(cal.prompt_len, tr.prompt_len)  # its own lengths
    fixed = generate_trace(dsv2, SyntheticConfig(num_requests=6, prompt_len=48, output_len=6))
    assert "lengths_from" not in fixed.meta and "length_source" not in fixed.meta["generator"]
