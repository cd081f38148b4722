"""Strict checks of config values, shared by systems' knobs and the workload config.

Each helper returns the value as a plain int, float, bool or list (None where `null` allows
it) or raises `error(message)`; the message starts with the key as the user writes it:
`slots_per_layer: must be an integer >= 1 or null (auto), got 0`. Nothing is coerced: 2.7 is
not an integer, true is not 1, "3" is not a number, NaN is not finite.
"""

from __future__ import annotations

import math

import numpy as np


def is_integer(value) -> bool:
    """An int (Python or numpy) that is not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value) -> bool:
    """An int or float (Python or numpy) that is not a bool; NaN and inf included."""
    return is_integer(value) or isinstance(value, (float, np.floating))


def _bounds(lo, hi, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi}"
    return ""


def _inside(v, lo, hi, lo_open: bool, hi_open: bool) -> bool:
    if lo is not None and (v <= lo if lo_open else v < lo):
        return False
    return hi is None or not (v >= hi if hi_open else v > hi)


def _error(error, key: str, what: str, value, null: str | None, note: str):
    alt = f" or null ({null})" if null else ""
    tail = f" ({note})" if note else ""
    return error(f"{key}: must be {what}{alt}, got {value!r}{tail}")


def integer(value, key: str, *, lo=None, hi=None, null: str | None = None, note: str = "",
            error: type[Exception] = ValueError) -> int | None:
    """An integer in [lo, hi]. `null`: what None means (then None is accepted), e.g. "auto".
    `note`: why the range is what it is, appended to the message."""
    if value is None and null:
        return None
    if not is_integer(value) or not _inside(value, lo, hi, False, False):
        what = f"an integer {_bounds(lo, hi, False, False)}".rstrip()
        raise _error(error, key, what, value, null, note)
    return int(value)


def number(value, key: str, *, lo=None, hi=None, lo_open: bool = False, hi_open: bool = False,
           null: str | None = None, note: str = "",
           error: type[Exception] = ValueError) -> float | None:
    """A finite number in the range (open at an end where asked); None only with `null`."""
    if value is None and null:
        return None
    if not is_number(value) or not math.isfinite(value) or not _inside(
            value, lo, hi, lo_open, hi_open):
        what = f"a finite number {_bounds(lo, hi, lo_open, hi_open)}".rstrip()
        raise _error(error, key, what, value, null, note)
    return float(value)


def boolean(value, key: str, *, error: type[Exception] = ValueError) -> bool:
    """true or false, never 0/1 or a string."""
    if not isinstance(value, (bool, np.bool_)):
        raise _error(error, key, "true or false", value, None, "")
    return bool(value)


def numbers(value, key: str, *, lo=None, hi=None,
            error: type[Exception] = ValueError) -> list[float]:
    """A non-empty list (or tuple) of finite numbers, each in [lo, hi]."""
    ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(
        is_number(v) and math.isfinite(v) and _inside(v, lo, hi, False, False) for v in value)
    if not ok:
        what = f"a non-empty list of finite numbers {_bounds(lo, hi, False, False)}".rstrip()
        raise _error(error, key, what, value, None, "")
    return [float(v) for v in value]
