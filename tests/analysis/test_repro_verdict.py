"""The verdict rule of the claims report (analysis/repro/verdict.py) and the intervals it
reads (analysis/repro/stats.py), on hand-made rows: every expected value is read off the
rule's definition or computed by hand in the comment beside it, not by the code."""

from __future__ import annotations

import math

import pytest

from analysis.repro.stats import (
    Estimate,
    bootstrap_ratio,
    difference,
    log_mean,
    point,
    ratio,
    t975,
)
from analysis.repro.verdict import (
    NOT_JUDGED,
    ONE_SEED,
    ClaimRow,
    judge,
    location_verdict,
    ordering_verdict,
    pairs_verdict,
    ratio_verdict,
)


def est(mean, low, high, n=5):
    return Estimate(mean, low, high, n, "t")


def test_t_quantiles_match_the_tables():
    # Student's t tables: t(0.975; 4) = 2.776, t(0.975; 30) = 2.042; 60 -> 2.000, 120 -> 1.980
    assert t975(4) == 2.776 and t975(30) == 2.042
    assert t975(60) == pytest.approx(2.000, abs=1e-3)
    assert t975(120) == pytest.approx(1.980, abs=1e-3)
    with pytest.raises(ValueError):
        t975(0)


def test_paired_log_ratio_interval_by_hand():
    # per-seed ratios e^0.1, e^0.2, e^0.3: mean log 0.2, sd 0.1, n 3,
    # half width 4.303 * 0.1 / sqrt(3) = 0.248434
    num = {0: math.exp(0.1), 1: math.exp(0.2) * 2, 2: math.exp(0.3) * 3}
    den = {0: 1.0, 1: 2.0, 2: 3.0, 7: 9.0}  # seed 7 has no partner: ignored
    got = ratio(num, den)
    assert got.n == 3 and got.method == "t"
    assert got.mean == pytest.approx(math.exp(0.2))
    assert got.low == pytest.approx(math.exp(0.2 - 0.248434), rel=1e-6)
    assert got.high == pytest.approx(math.exp(0.2 + 0.248434), rel=1e-6)
    assert got.text() == "1.22 [0.953, 1.57]"
    with pytest.raises(ValueError, match="no seed in common"):
        ratio({0: 1.0}, {1: 1.0})
    with pytest.raises(ValueError, match="positive"):
        log_mean({0: 0.0, 1: 1.0})


def test_paired_difference_and_one_seed():
    # differences 1, 2, 3: mean 2, sd 1, half width 4.303 / sqrt(3) = 2.484338
    got = difference({0: 11.0, 1: 12.0, 2: 13.0}, {0: 10.0, 1: 10.0, 2: 10.0})
    assert (got.mean, got.n) == (2.0, 3)
    assert got.low == pytest.approx(2 - 2.484338, abs=1e-6)
    one = ratio({0: 3.0}, {0: 2.0})
    assert (one.mean, one.low, one.judged, one.text()) == (1.5, None, False, "1.5")


def test_bootstrap_of_a_real_sample():
    # every request 2x slower under the baseline: every resample gives exactly 2
    base, ours = [2.0 * (i + 1) for i in range(30)], [float(i + 1) for i in range(30)]
    got = bootstrap_ratio(base, ours)
    assert (got.mean, got.low, got.high, got.method) == (2.0, 2.0, 2.0, "bootstrap")
    noisy = bootstrap_ratio([1.0, 3.0] * 15, [2.0] * 30)  # ratio 1 on average, spread
    assert noisy.low < 1 < noisy.high
    assert bootstrap_ratio([1.0, 3.0] * 15, [2.0] * 30) == noisy  # fixed generator seed
    small = bootstrap_ratio([2.0] * 5, [1.0] * 5)  # under 20 requests: a point only
    assert (small.mean, small.judged) == (2.0, False)
    with pytest.raises(ValueError, match="equal length"):
        bootstrap_ratio([1.0, 2.0], [1.0])


@pytest.mark.parametrize(("paper", "ours", "want"), [
    (1.61, est(1.5, 1.3, 1.7), "reproduced"),           # 1.61 / 1.5 = 1.07 < 1.25
    (1.61, est(1.003, 1.001, 1.005), "direction only"),  # a gain, far smaller
    (1.61, est(1.003, 0.99, 1.02), "no effect"),        # the interval holds 1
    (1.61, est(0.8, 0.7, 0.9), "not reproduced"),       # a slow-down
    (1.2, est(1.003, 1.001, 1.005), "reproduced"),      # in [1.2 / 1.25, 1.5], above 1
    (1.2, est(1.003, 0.99, 1.02), "no effect"),         # in the band, but holds 1
    (0.54, est(0.6, 0.5, 0.7), "reproduced"),           # -46 % against -40 %: 1.11
    (0.54, est(0.95, 0.9, 0.99), "direction only"),
    (0.54, est(1.2, 1.1, 1.3), "not reproduced"),
    (1.0, est(1.02, 0.95, 1.1), "reproduced"),          # no change claimed, none measured
    (1.0, est(1.3, 1.2, 1.4), "not reproduced"),
])
def test_ratio_verdicts(paper, ours, want):
    assert ratio_verdict(paper, ours) == want


def test_one_seed_gives_no_verdict_beyond_direction():
    assert ratio_verdict(1.61, point(1.003)) == ONE_SEED[0]
    assert ratio_verdict(1.61, point(0.9)) == ONE_SEED[1]
    assert ratio_verdict(0.54, point(0.9)) == ONE_SEED[0]


def test_ordering_by_adjacent_paired_differences():
    paper = ["a", "b", "c"]
    below, holds, above = est(-2, -3, -1), est(-1, -3, 1), est(2, 1, 3)
    assert ordering_verdict(paper, ["a", "b", "c"], [below, below]) == "reproduced"
    assert ordering_verdict(paper, ["a", "b", "c"], [below, holds]) == "direction only"
    assert ordering_verdict(paper, ["b", "a", "c"], [holds, below]) == "no effect"
    assert ordering_verdict(paper, ["a", "c", "b"], [below, above]) == "not reproduced"
    assert ordering_verdict(paper, ["a", "b", "c"], None) == ONE_SEED[0]
    with pytest.raises(ValueError, match="different systems"):
        ordering_verdict(["a", "b"], ["a", "c"], None)
    with pytest.raises(ValueError, match="adjacent"):
        ordering_verdict(paper, paper, [below])


def test_pairs_and_location():
    assert pairs_verdict([est(-2, -3, -1), est(-1, -2, -0.5)]) == "reproduced"
    assert pairs_verdict([est(-2, -3, -1), est(-1, -2, 0.5)]) == "direction only"
    assert pairs_verdict([est(-2, -3, -1), est(0.5, -1, 2)]) == "no effect"
    assert pairs_verdict([est(-2, -3, -1), est(1, 0.5, 2)]) == "not reproduced"
    # "in most cases": 3 of 4 must hold
    below, holds, above = est(-2, -3, -1), est(-1, -2, 0.5), est(1, 0.5, 2)
    assert pairs_verdict([below, below, below, above], need=3) == "reproduced"
    assert pairs_verdict([below, below, holds, above], need=3) == "direction only"
    assert pairs_verdict([below, below, above, above], need=3) == "not reproduced"
    assert pairs_verdict([below, holds, est(0.5, -1, 2), above], need=3) == "no effect"
    with pytest.raises(ValueError, match="need"):
        pairs_verdict([below], need=2)
    falls, flat, rises = est(5, 1, 9), est(1, -1, 3), est(-5, -9, -1)
    assert location_verdict(120, point(200), falls, tolerance=2) == "reproduced"
    assert location_verdict(120, point(1000), falls, tolerance=2) == "direction only"
    assert location_verdict(120, point(120), flat, tolerance=2) == "no effect"
    assert location_verdict(120, point(1), rises, tolerance=2) == "not reproduced"


def test_judge_reads_real_samples_and_marks_routing_sensitive_claims():
    row = judge(ClaimRow("t", "table1", "T1", "x faster than lru", "ratio", paper=1.5,
                         ours=est(1.4, 1.3, 1.5), ours_real=Estimate(0.9, 0.85, 0.95, 100,
                                                                     "bootstrap"),
                         baseline="lru"))
    assert (row.verdict, row.real_verdict, row.routing_sensitive) == (
        "reproduced", "not reproduced", True)
    small = judge(ClaimRow("t", "e", "s", "c", "ratio", paper=1.5, ours=est(1.4, 1.3, 1.5),
                           ours_real=Estimate(0.9, None, None, 1, "point")))
    assert (small.real_verdict, small.routing_sensitive) == (NOT_JUDGED, False)


def test_reasons_name_the_headroom_and_a_wide_interval():
    row = judge(ClaimRow("t", "table1", "paper T1", "x faster than y", "ratio", paper=4.75,
                         ours=est(1.79, 1.5, 2.1), baseline="layer_offload", headroom=2.16))
    assert row.verdict == "direction only"
    assert "a perfect policy is at most 2.16x faster than layer_offload" in row.reason
    assert "interval wider than +-10% (5 seeds)" in row.reason  # 2.1 / 1.79 = 1.17
    gone = judge(ClaimRow("t", "e", "s", "c", "ratio", paper=2.0, note="not modelled"))
    assert (gone.verdict, gone.reason) == ("not expressible", "not modelled")
    with pytest.raises(ValueError, match="kind"):
        judge(ClaimRow("t", "e", "s", "c", "median", paper=2.0, ours=1.0))
