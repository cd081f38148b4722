"""What the MoE-Infinity experiments' speed-up claims share: the paper rule's value paired by
seed (synthetic routing) or by request (a real sample), and beside it the best named variant's
and the oracle's (analysis/repro/verdict.py `variant`, `oracle`: shown, never judged).

A speed-up is the baseline's TPOT over the system's (above 1: the system is faster), so the
paper's "MoE-Infinity's TPOT is 4.75x below DeepSpeed's" is baseline / moe_infinity.
"""

from __future__ import annotations

from analysis.repro import stats, values
from systems.variants import variants_of

SYSTEM = "moe_infinity"
ORACLE = "oracle"


def real_where(real, **where) -> dict:
    """`where` narrowed to one run per system on a real sample: the sample fixes its requests,
    so runs of several seeds replay the same routing and the lowest seed stands for them."""
    if real is None or "seed" not in real.columns:
        return where
    seeds = sorted({values.seed_of(r) for r in real.to_dict("records")})
    return {**where, "seed": seeds[0]} if len(seeds) > 1 else where


def speedup(runs, base: str, system: str = SYSTEM, column: str = "tpot_mean_ms",
            **where) -> stats.Estimate | None:
    """base / system on synthetic routing, paired by seed (None when either has no run)."""
    if runs is None:
        return None
    return values.seed_ratio(runs, {"system": base, **where}, {"system": system, **where},
                             column)


def real_speedup(real, base: str, system: str = SYSTEM, **where) -> stats.Estimate | None:
    """base / system on a real sample: mean per-request TPOT, paired request bootstrap (a
    point alone under stats.MIN_BOOTSTRAP_REQUESTS requests)."""
    if real is None:
        return None
    w = real_where(real, **where)
    return values.request_ratio(real, {"system": base, **w}, {"system": system, **w})


def best_variant(runs, base: str, column: str = "tpot_mean_ms", **where
                 ) -> tuple[str | None, stats.Estimate | None]:
    """(name, speed-up) of moe_infinity's named variant with the largest speed-up point
    estimate over `base` (systems/variants.py); (None, None) when none was run."""
    found = [(v, speedup(runs, base, v, column, **where)) for v in variants_of(SYSTEM)]
    found = [(v, e) for v, e in found if e is not None]
    return max(found, key=lambda f: f[1].mean) if found else (None, None)


def order(runs, systems: list[str], **where) -> list[str] | None:
    """`systems` best (lowest mean TPOT) first; None unless every one has a run."""
    if runs is None:
        return None
    # the point estimate that orders systems: their TPOT averaged over seeds
    tpot = {s: values.seed_mean(runs, "tpot_mean_ms", system=s, **where) for s in systems}
    if any(t is None for t in tpot.values()):
        return None
    return sorted(systems, key=lambda s: tpot[s])


def adjacent_diffs(runs, paper_order: list[str], **where) -> list | None:
    """TPOT of each system minus the next one's in the PAPER's order, paired by seed (the
    paper says each is negative); None unless every pair has a common seed."""
    out = [values.seed_difference(runs, {"system": a, **where}, {"system": b, **where})
           for a, b in zip(paper_order, paper_order[1:])]
    return None if any(d is None for d in out) else out


def real_adjacent_diffs(real, paper_order: list[str], **where) -> list | None:
    if real is None:
        return None
    w = real_where(real, **where)
    out = [values.request_difference(real, {"system": a, **w}, {"system": b, **w})
           for a, b in zip(paper_order, paper_order[1:])]
    return None if any(d is None for d in out) else out
