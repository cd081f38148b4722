"""Named variants of the seed systems: the one registry.

A seed system (conf/system/<seed>.yaml) runs its paper's rule, or the released code's where the
paper is silent, with no rule or knob of ours switched on. Each improvement of ours is a named
variant with its own conf/system/<variant>.yaml and a `name` of its own (its class lives in
its seed's package: systems/moe_infinity/variant.py, systems/fmoe/variant.py, systems/
diff_moe.py), so its rows never mix with the seed's. Variants are named systems like any
other: harness/runner/config.py's system_names() lists them, so each is its own Table 1 row.
Tables that show a variant beside its seed read this mapping.

Every knob value of a variant that neither paper nor code gives was chosen on the tuning split
(seeds and requests disjoint from every measured setting) by `moebench tune-variants`
(analysis/tune_variants.py). What each variant changes and why: docs/systems.md, "Variants";
the decision: docs/decisions/2026-12-06-paper-rules.md.

Pure data (no imports), so any table code can read it cheaply.
"""

from __future__ import annotations

# seed system name -> its named variants' conf/system names, in display order
VARIANTS: dict[str, tuple[str, ...]] = {
    "moe_infinity": ("moe_infinity_hysteresis",),
    "fmoe": ("fmoe_admission",),
    "diff_moe": ("diff_moe_floor_recency",),
}


def seed_of(name: str) -> str | None:
    """The seed system a variant belongs to; None for a name that is no variant."""
    for seed, variants in VARIANTS.items():
        if name in variants:
            return seed
    return None


def variants_of(seed: str | None) -> tuple[str, ...]:
    """The named variants of a seed system, in display order; () for any other name."""
    return VARIANTS.get(seed or "", ())
