"""Constructor-argument checks for policies: the strict checks of core/checks.py raising
KnobError, whose message starts with the knob's name."""

from __future__ import annotations

from functools import partial

from core import checks


class KnobError(ValueError):
    """A system's constructor argument has the wrong type or is out of range. The message
    starts with the knob's name (the runner reports it as `system.<message>`), e.g.
    `slots_per_layer: must be an integer >= 1 or null (auto), got 0`."""


# The strict checks of core/checks.py, raising KnobError: systems check every constructor
# argument in __init__ (type, static range) and the ranges that depend on the model or the
# budget in bind(ctx).
int_knob = partial(checks.integer, error=KnobError)
float_knob = partial(checks.number, error=KnobError)
bool_knob = partial(checks.boolean, error=KnobError)
numbers_knob = partial(checks.numbers, error=KnobError)
