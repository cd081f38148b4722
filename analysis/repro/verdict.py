"""The rule that gives every published claim its verdict, fixed in code before any run.

Claims are compared as ratios, orderings, pairwise comparisons and locations, never as
absolute milliseconds: the simulator models the policy, the link and the compute, not a
framework's own overheads. Every measured value is an `Estimate` (analysis/repro/stats.py):
over >= 5 seeds on synthetic routing (paired t-interval of the per-seed log ratios or
differences), over requests on a real sample (paired bootstrap). "The paper's side" of a
ratio is above 1 for a claimed factor > 1 (a speed-up) and below 1 for one < 1 (a latency
reduction written as 1 + change).

  ratio     reproduced      the interval excludes 1 on the paper's side and the point
                            estimate lies in [paper / BAND, paper x BAND]
            direction only  the interval excludes 1 on the paper's side, the point outside
            no effect       the interval contains 1
            not reproduced  the interval excludes 1 on the other side
  pairs     a qualitative claim judged as comparisons of which `need` must hold (default
            all: "fMoE has the lowest TPOT at every cache size"; a majority for "in most
            cases", the number written in the inventory's rule before running): each an
            Estimate of a paired difference that the paper says is negative (the
            claimed-better system minus the other, lower is better)
            reproduced      at least `need` intervals below 0
            not reproduced  more than len - `need` intervals above 0 (the claim cannot hold)
            direction only  otherwise, when at least `need` point estimates are below 0
            no effect       otherwise
  ordering  the paper's systems best first; the paired differences of adjacent systems
            (system i minus system i + 1, lower is better, so the paper says negative):
            reproduced      every adjacent interval below 0
            not reproduced  any adjacent interval above 0
            direction only  otherwise, when our best system (point estimates) is the paper's
            no effect       otherwise
  location  where a swept curve is lowest, judged with a tolerance factor written in the
            experiment's module before running (with its reason), and `falls`: the paired
            difference curve(first grid point) - curve(paper's point), which the paper's
            claim says is positive:
            reproduced      the location (geometric mean over seeds) within the tolerance
                            of the paper's and `falls` above 0
            direction only  `falls` above 0, the location outside the tolerance
            no effect       `falls` contains 0
            not reproduced  `falls` below 0
  not expressible  the setting or quantity is outside what the simulator models; the claim
            names why and carries no number of ours.

With one seed (or a real sample under MIN_BOOTSTRAP_REQUESTS requests) there is no interval:
the verdict says only whether the direction agrees (ONE_SEED), never more. A real sample
gets its own verdict by the same rule (`real_verdict`); a claim whose synthetic and real
verdicts are both judged and differ is *routing-sensitive*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from analysis.repro.stats import Estimate, point

BAND = 1.25  # ratios: reproduced when ours / paper lies in [1 / 1.25, 1.25]
PRECISION = 0.10  # an interval wider than +-10 % is flagged in the reason
VERDICTS = ("reproduced", "direction only", "no effect", "not reproduced", "not expressible")
ONE_SEED = ("same direction (one seed)", "other direction (one seed)")
NOT_JUDGED = "not judged: sample too small"
KINDS = ("ratio", "pairs", "ordering", "location", "not_expressible")


@dataclass
class ClaimRow:
    """One published claim and what we measured for it (analysis/repro/claims.py).

    `ours` / `ours_real`: an Estimate for ratio and location claims (a float is read as one
    seed's point); for an ordering, our systems best first (point estimates), with `diffs` /
    `real_diffs` the adjacent paired differences in the PAPER's order; for pairs, `diffs`
    only (`ours` may hold a short text). `variant` / `oracle`: the same quantity with the
    best named variant (`variant_name`) or the oracle in place of the paper's system, shown
    beside it, never judged."""

    claim_id: str
    experiment: str
    source: str  # paper, version, table or figure
    claim: str  # the claim in a few words
    kind: str  # one of KINDS
    paper: object = None  # a factor, an ordering (list, best first) or a location
    ours: object = None
    ours_real: object = None
    diffs: list | None = None
    real_diffs: list | None = None
    real_sample: str | None = None  # which sample, and its size
    baseline: str | None = None  # the system the paper's factor is relative to
    headroom: float | None = None  # baseline TPOT / compute floor in our setting
    averaged: str | None = None  # how the value is averaged, as the paper averages it
    need: int | None = None  # pairs: how many comparisons must hold (None: all)
    tolerance: float | None = None  # location: a factor, fixed in the module before running
    falls: Estimate | None = None  # location: curve(first) - curve(paper's point)
    falls_real: Estimate | None = None
    variant_name: str | None = None
    variant: Estimate | None = None
    oracle: Estimate | None = None
    note: str | None = None  # why a claim is not expressible, or a setting caveat
    verdict: str = field(default="", init=False)
    reason: str = field(default="", init=False)
    real_verdict: str = field(default="", init=False)
    routing_sensitive: bool = field(default=False, init=False)


def as_estimate(value) -> Estimate | None:
    if value is None or isinstance(value, Estimate):
        return value
    return point(float(value))


def _side(paper: float) -> int:
    return (paper > 1) - (paper < 1)


def ratio_verdict(paper: float, est: Estimate, band: float = BAND) -> str:
    if paper <= 0 or est.mean <= 0:
        raise ValueError(f"ratios must be positive (paper {paper}, ours {est.mean})")
    side = _side(paper)
    if not est.judged:
        agrees = (est.mean > 1) - (est.mean < 1) == side
        return ONE_SEED[0] if agrees else ONE_SEED[1]
    in_band = abs(math.log(est.mean / paper)) <= math.log(band)
    if side == 0:  # the paper claims no difference
        return "reproduced" if not (est.above(1) or est.below(1)) and in_band else \
            "not reproduced"
    ours_side = est.above(1) if side > 0 else est.below(1)
    other_side = est.below(1) if side > 0 else est.above(1)
    if ours_side:
        return "reproduced" if in_band else "direction only"
    return "not reproduced" if other_side else "no effect"


def pairs_verdict(diffs: list[Estimate], need: int | None = None) -> str:
    """Differences claimed negative, `need` of them (all when None) must hold (the module
    docstring, `pairs`)."""
    if not diffs:
        raise ValueError("a pairs claim needs at least one difference")
    need = len(diffs) if need is None else need
    if not 1 <= need <= len(diffs):
        raise ValueError(f"need must be in [1, {len(diffs)}], got {need}")
    points = sum(d.mean < 0 for d in diffs)
    if not all(d.judged for d in diffs):
        return ONE_SEED[0] if points >= need else ONE_SEED[1]
    if sum(d.below(0) for d in diffs) >= need:
        return "reproduced"
    if sum(d.above(0) for d in diffs) > len(diffs) - need:
        return "not reproduced"
    return "direction only" if points >= need else "no effect"


def ordering_verdict(paper: list, ours: list, diffs: list[Estimate] | None) -> str:
    if sorted(map(str, paper)) != sorted(map(str, ours)):
        raise ValueError(f"orderings name different systems: {paper} vs {ours}")
    if diffs is not None and len(diffs) != len(paper) - 1:
        raise ValueError(f"an ordering of {len(paper)} systems needs {len(paper) - 1} "
                         f"adjacent differences, got {len(diffs)}")
    if diffs is None or not all(d.judged for d in diffs):
        return ONE_SEED[0] if list(ours) == list(paper) else ONE_SEED[1]
    if all(d.below(0) for d in diffs):
        return "reproduced"
    if any(d.above(0) for d in diffs):
        return "not reproduced"
    return "direction only" if ours[0] == paper[0] else "no effect"


def location_verdict(paper: float, ours: Estimate, falls: Estimate, tolerance: float) -> str:
    if tolerance < 1:
        raise ValueError(f"a location tolerance is a factor >= 1, got {tolerance}")
    near = abs(math.log(ours.mean / paper)) <= math.log(tolerance)
    if not falls.judged:
        return ONE_SEED[0] if near or falls.mean > 0 else ONE_SEED[1]
    if falls.above(0):
        return "reproduced" if near else "direction only"
    return "not reproduced" if falls.below(0) else "no effect"


def _text(value) -> str:
    if isinstance(value, Estimate):
        return value.text()
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _verdict(row: ClaimRow, real: bool) -> str:
    ours = row.ours_real if real else row.ours
    diffs = row.real_diffs if real else row.diffs
    if row.kind == "ratio":
        return ratio_verdict(float(row.paper), as_estimate(ours))
    if row.kind == "pairs":
        return pairs_verdict(list(diffs), row.need)
    if row.kind == "ordering":
        return ordering_verdict(list(row.paper), list(ours), diffs)
    falls = row.falls_real if real else row.falls
    if row.tolerance is None or falls is None:
        raise ValueError(f"{row.claim_id}: a location claim needs `tolerance` and `falls`")
    return location_verdict(float(row.paper), as_estimate(ours), falls, row.tolerance)


def _reason(row: ClaimRow) -> str:
    base = row.baseline or "the baseline"
    ours = _text(row.ours)
    if row.kind == "ratio":
        paper = float(row.paper)
        est = as_estimate(row.ours)
        out = f"ours {ours} against the paper's {paper:.3g} (relative to {base})"
        if (row.headroom is not None and paper > 1 and paper > row.headroom
                and row.verdict != "reproduced"):
            out += (f"; a perfect policy is at most {row.headroom:.2f}x faster than {base} at "
                    "this budget: the rest of the paper's factor must come from framework "
                    "overheads the simulator does not model")
        width = est.half_width()
        if width is not None and width > PRECISION:
            out += f"; interval wider than +-{PRECISION:.0%} ({est.n} seeds)"
    elif row.kind == "ordering":
        out = f"ours {ours} (best first) against the paper's {_text(row.paper)}"
        if row.diffs:
            out += "; adjacent differences " + "; ".join(_text(d) for d in row.diffs)
    elif row.kind == "pairs":
        need = f"{row.need} of {len(row.diffs)}" if row.need else "all"
        out = (f"differences (claimed negative, {need} must hold): "
               + "; ".join(_text(d) for d in row.diffs))
    else:
        out = (f"our lowest point at {ours} (tolerance x{row.tolerance:g}), the paper's near "
               f"{_text(row.paper)}; first point minus the paper's point {_text(row.falls)}")
    if row.averaged:
        out += f"; averaged {row.averaged}"
    return out + (f" ({row.note})" if row.note else "")


def judge(row: ClaimRow) -> ClaimRow:
    """Set verdict, reason, real_verdict and routing_sensitive by the rule above."""
    if row.kind not in KINDS:
        raise ValueError(f"{row.claim_id}: kind must be one of {KINDS}, got {row.kind!r}")
    measured = row.diffs if row.kind == "pairs" else row.ours
    if row.kind == "not_expressible" or measured is None:
        row.verdict = "not expressible"
        row.reason = row.note or "no measurement of ours for this claim"
        return row
    row.verdict = _verdict(row, real=False)
    row.reason = _reason(row)
    real = row.real_diffs if row.kind == "pairs" else row.ours_real
    if real is not None:
        if row.kind in ("ordering", "pairs"):
            judged = bool(row.real_diffs) and all(d.judged for d in row.real_diffs)
        elif row.kind == "location":
            judged = row.falls_real is not None and row.falls_real.judged
        else:
            judged = as_estimate(real).judged
        row.real_verdict = _verdict(row, real=True) if judged else NOT_JUDGED
        row.routing_sensitive = (row.verdict in VERDICTS and row.real_verdict in VERDICTS
                                 and row.verdict != row.real_verdict)
    return row
