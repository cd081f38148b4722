"""Named variants of the seed systems: our repairs, each its own conf/system/<name>.yaml.

A seed system (`moe_infinity`, `fmoe`, `diff_moe`, ...) runs its paper's rule; a change of
ours is a variant with its own name, shown as its own row beside the seed system wherever
that appears, never as the seed's row or as a paper's baseline (docs/systems.md).
"""

from __future__ import annotations

# seed system -> its named variants (conf/system/<variant>.yaml)
VARIANTS: dict[str, tuple[str, ...]] = {
    "moe_infinity": ("moe_infinity_hysteresis",),
    "fmoe": ("fmoe_admission",),
}


def variants_of(system: str) -> tuple[str, ...]:
    return VARIANTS.get(system, ())
