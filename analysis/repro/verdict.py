"""The rule that gives every published claim its verdict, fixed in code before any run.

Claims are compared as ratios and orderings, never as absolute milliseconds: the simulator
models the policy, the link and the compute, not a framework's own overheads.

  ratio     the paper's factor (a speed-up, a latency or hit-rate ratio to a baseline, a
            relative change written as 1 + change) against ours for the same pair:
              reproduced      ours within a factor 1 + TOLERANCE of the paper's and on
                              the same side of 1 (a claimed gain must be a gain)
              direction only  outside it, but on the same side of 1 (a gain stays a gain)
              not reproduced  on the other side of 1, or no change where the paper has one
  ordering  the paper's systems best first against ours (the same systems):
              reproduced      the same order
              direction only  the same best system
              not reproduced  otherwise
  location  where a swept curve is lowest (e.g. the EAMC capacity with the lowest latency),
            on the sweep's own grid:
              reproduced      ours within a factor 1 + LOCATION_TOLERANCE of the paper's
              direction only  the curve falls from the sweep's first value to the paper's
              not reproduced  otherwise
  not expressible  the setting or quantity is outside what the simulator models; the claim
            names why and carries no number of ours.

Each verdict comes with one sentence of reason (`reason`). Where the compute floor bounds
what any policy could gain (a perfect policy is at most `headroom` = baseline TPOT / compute
floor faster than the baseline at that budget) and the paper's factor exceeds that bound,
the reason says so: no eviction or prefetch rule can close that gap in this setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TOLERANCE = 0.25  # ratios: ours / paper in [1 / 1.25, 1.25]
LOCATION_TOLERANCE = 1.0  # locations: within a factor 2 of the paper's
VERDICTS = ("reproduced", "direction only", "not reproduced", "not expressible")
KINDS = ("ratio", "ordering", "location", "not_expressible")


@dataclass
class ClaimRow:
    """One published claim and what we measured for it (analysis/repro/claims.py)."""

    claim_id: str
    experiment: str
    source: str  # paper, table or figure
    claim: str  # the claim in a few words
    kind: str  # one of KINDS
    paper: object = None  # a factor, an ordering (list, best first) or a location
    ours: object = None  # the same, on synthetic routing
    ours_real: object = None  # the same on a real routing sample, where one exists
    real_sample: str | None = None  # which sample, and its size
    baseline: str | None = None  # the system the paper's factor is relative to
    headroom: float | None = None  # baseline TPOT / compute floor in our setting
    note: str | None = None  # why a claim is not expressible, or a setting caveat
    grid_first: float | None = None  # location: the sweep's first x
    falls: bool | None = None  # location: ours at the paper's x below ours at grid_first
    verdict: str = field(default="", init=False)
    reason: str = field(default="", init=False)


def _fmt(x) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def ratio_verdict(paper: float, ours: float, tolerance: float = TOLERANCE) -> str:
    if ours <= 0 or paper <= 0:
        raise ValueError(f"ratios must be positive (paper {paper}, ours {ours})")
    side = (paper > 1) - (paper < 1)
    same_side = not side or side == (ours > 1) - (ours < 1)
    if abs(math.log(ours / paper)) <= math.log1p(tolerance) and same_side:
        return "reproduced"
    return "direction only" if side and side == (ours > 1) - (ours < 1) else "not reproduced"


def ordering_verdict(paper: list, ours: list) -> str:
    if sorted(map(str, paper)) != sorted(map(str, ours)):
        raise ValueError(f"orderings name different systems: {paper} vs {ours}")
    if list(paper) == list(ours):
        return "reproduced"
    return "direction only" if paper[0] == ours[0] else "not reproduced"


def location_verdict(paper: float, ours: float, falls: bool,
                     tolerance: float = LOCATION_TOLERANCE) -> str:
    if abs(math.log(ours / paper)) <= math.log1p(tolerance):
        return "reproduced"
    return "direction only" if falls else "not reproduced"


def _ratio_reason(row: ClaimRow, verdict: str) -> str:
    base = row.baseline or "the baseline"
    if (row.headroom is not None and row.paper > 1 and row.paper > row.headroom
            and verdict != "reproduced"):
        return (f"a perfect policy is at most {row.headroom:.2f}x faster than {base} at this "
                f"budget: the paper's {row.paper:.2f}x must come from framework overheads the "
                "simulator does not model")
    if verdict == "reproduced":
        return (f"ours {_fmt(row.ours)}x against the paper's {_fmt(row.paper)}x, within "
                f"{TOLERANCE:.0%}")
    if verdict == "direction only":
        return (f"ours {_fmt(row.ours)}x against the paper's {_fmt(row.paper)}x: the same "
                f"direction relative to {base}, a different size")
    if row.ours == 1:  # neither side: the paper's effect is absent, not reversed
        return (f"ours {_fmt(row.ours)}x against the paper's {_fmt(row.paper)}x: no "
                f"difference from {base}")
    return (f"ours {_fmt(row.ours)}x against the paper's {_fmt(row.paper)}x: the opposite "
            f"direction relative to {base}")


def judge(row: ClaimRow) -> ClaimRow:
    """Set row.verdict and row.reason by the rule above; returns the row."""
    if row.kind not in KINDS:
        raise ValueError(f"{row.claim_id}: kind must be one of {KINDS}, got {row.kind!r}")
    if row.kind == "not_expressible" or row.ours is None:
        row.verdict = "not expressible"
        row.reason = row.note or "no measurement of ours for this claim"
        return row
    if row.kind == "ratio":
        row.verdict = ratio_verdict(float(row.paper), float(row.ours))
        row.reason = _ratio_reason(row, row.verdict)
    elif row.kind == "ordering":
        row.verdict = ordering_verdict(list(row.paper), list(row.ours))
        row.reason = (f"ours {', '.join(map(str, row.ours))} (best first) against the "
                      f"paper's {', '.join(map(str, row.paper))}")
    else:
        row.verdict = location_verdict(float(row.paper), float(row.ours), bool(row.falls))
        row.reason = (f"our lowest point is at {_fmt(row.ours)}, the paper's near "
                      f"{_fmt(row.paper)}" + ("" if row.verdict == "reproduced" else (
                          "; ours still falls from the first point to the paper's"
                          if row.falls else "; ours does not fall toward the paper's")))
    if row.note:
        row.reason += f" ({row.note})"
    return row
