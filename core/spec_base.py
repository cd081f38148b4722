"""What every spec builder shares: the error type, GiB, and the strict key and number checks.

Units: memory sizes named `*_gb` are GiB (2**30 bytes, as GPU vendors count memory);
rates named `*_gbps` are 10**9 bytes per second; `*_tflops` are 10**12 FLOP/s.
"""

from __future__ import annotations

import math
from typing import Any

GIB = 2**30


class SpecError(ValueError):
    """A spec (model, hardware or run config) is malformed; the message names the key."""


def check_keys(where: str, data: dict, required: set[str], optional: set[str]) -> None:
    """Refuse unknown and missing keys, naming them and the allowed set."""
    unknown = sorted(set(data) - required - optional)
    if unknown:
        allowed = sorted(required | optional)
        raise SpecError(f"{where}: unknown key(s) {unknown}; allowed: {allowed}")
    missing = sorted(required - set(data))
    if missing:
        raise SpecError(f"{where}: missing key(s) {missing}")


def positive(where: str, key: str, value: Any, *, integer: bool = False, zero_ok=False) -> Any:
    """A finite positive (or, with zero_ok, non-negative) number; `where.key` names it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where}.{key}: expected a number, got {value!r}")
    if math.isnan(value) or math.isinf(value) or value < 0 or (value == 0 and not zero_ok):
        kind = "non-negative" if zero_ok else "positive"
        raise SpecError(f"{where}.{key}: must be a finite {kind} number, got {value!r}")
    if integer and int(value) != value:
        raise SpecError(f"{where}.{key}: expected an integer, got {value!r}")
    return int(value) if integer else float(value)


def build_spec(cls, data, where: str, zero_ok=frozenset(), integers=frozenset(),
                strings=frozenset()):
    """A spec dataclass from a mapping: exactly its fields, `name` and `display_name` (and
    `strings`) non-empty strings, every other field a positive number (`zero_ok`: or zero;
    `integers`: whole)."""
    from dataclasses import fields

    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping of keys, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    check_keys(where, data, names, set())
    data = dict(data)
    name_keys(where, data, ("name", "display_name", *sorted(strings)))
    for key in names - {"name", "display_name", *strings}:
        data[key] = positive(where, key, data[key], zero_ok=key in zero_ok,
                             integer=key in integers)
    return cls(**data)


def name_keys(where: str, data: dict, keys=("name", "display_name")) -> None:
    """Each of `keys` is a non-empty string."""
    for key in keys:
        if not isinstance(data[key], str) or not data[key]:
            raise SpecError(f"{where}.{key}: expected a non-empty string")
