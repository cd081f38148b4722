"""The verdict rule of the claims report (analysis/repro/verdict.py) on hand-made rows: the
expected verdicts are read off the rule's definition, not computed by the code."""

from __future__ import annotations

import pytest

from analysis.repro.verdict import (
    ClaimRow,
    judge,
    location_verdict,
    ordering_verdict,
    ratio_verdict,
)


@pytest.mark.parametrize(("paper", "ours", "want"), [
    (4.75, 4.75, "reproduced"),
    (4.75, 4.0, "reproduced"),          # 4.75 / 4.0 = 1.19 < 1.25
    (4.75, 3.7, "direction only"),      # 1.28 > 1.25, still a speed-up
    (4.75, 1.79, "direction only"),
    (4.75, 0.9, "not reproduced"),      # a slow-down where the paper has a speed-up
    (4.75, 1.0, "not reproduced"),      # no change
    (0.54, 0.6, "reproduced"),          # a 46 % reduction against a 40 % one: 1.11
    (0.54, 0.9, "direction only"),
    (0.54, 1.2, "not reproduced"),
    (1.14, 1.10, "reproduced"),         # hit rate +14 % against +10 %
    (1.19, 0.997, "not reproduced"),    # within 25 % but no gain: the claim is a gain
    (0.9, 1.05, "not reproduced"),      # within 25 % but a loss claimed, a gain measured
    (1.0, 1.0, "reproduced"),
    (1.0, 1.3, "not reproduced"),       # the paper claims no change; 1.3 is outside
])
def test_ratio_verdicts(paper, ours, want):
    assert ratio_verdict(paper, ours) == want


def test_ordering_and_location_verdicts():
    assert ordering_verdict(["a", "b", "c"], ["a", "b", "c"]) == "reproduced"
    assert ordering_verdict(["a", "b", "c"], ["a", "c", "b"]) == "direction only"
    assert ordering_verdict(["a", "b", "c"], ["b", "a", "c"]) == "not reproduced"
    with pytest.raises(ValueError):
        ordering_verdict(["a", "b"], ["a", "c"])
    assert location_verdict(120, 200, falls=True) == "reproduced"     # within 2x
    assert location_verdict(120, 1000, falls=True) == "direction only"
    assert location_verdict(120, 1, falls=False) == "not reproduced"


def test_reasons_tell_no_effect_from_a_reversed_one():
    none = judge(ClaimRow("t", "e", "s", "c", "ratio", paper=15.0, ours=1.0,
                          baseline="recovery at the first request"))
    assert none.verdict == "not reproduced"
    assert none.reason == ("ours 1x against the paper's 15x: no difference from recovery "
                           "at the first request")
    back = judge(ClaimRow("t", "e", "s", "c", "ratio", paper=1.5, ours=0.8, baseline="lru"))
    assert back.reason.endswith("the opposite direction relative to lru")


def test_reasons_name_the_headroom_when_it_caps_the_claim():
    row = judge(ClaimRow("t", "table1", "paper T1", "x faster than y", "ratio", paper=4.75,
                         ours=1.79, baseline="layer_offload", headroom=2.16))
    assert row.verdict == "direction only"
    assert row.reason.startswith("a perfect policy is at most 2.16x faster than layer_offload")
    # a reproduced claim is not explained away by headroom
    ok = judge(ClaimRow("t", "e", "s", "c", "ratio", paper=1.5, ours=1.4, baseline="b",
                        headroom=1.3))
    assert ok.verdict == "reproduced" and "within 25%" in ok.reason
    # no measurement: not expressible, with the note as its reason
    na = judge(ClaimRow("t", "e", "s", "c", "not_expressible",
                        note="a framework's own overheads are not modelled"))
    assert (na.verdict, na.reason) == ("not expressible",
                                       "a framework's own overheads are not modelled")
    with pytest.raises(ValueError):
        judge(ClaimRow("t", "e", "s", "c", "vibes", paper=1, ours=1))
