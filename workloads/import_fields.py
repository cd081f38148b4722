"""Fields of one imported routing record (workloads/importers.py): aliases and strict parsing.

Nothing is coerced. An integer field (layer, position, an expert id) is a JSON integer or a
string of decimal digits (CSV cells, "3 5" lists): 3.7, true and "3.7" are errors, never 3 or
1. Expert ids are >= 0, and < E when the model is known. Weights are finite numbers >= 0 and
at most 65504, the float16 maximum the trace stores them in. Every error is a
RoutingImportError naming the file, the line and the field.
"""

from __future__ import annotations

import math
import re

import numpy as np

from core.checks import is_integer, is_number
from core.trace import TraceError

ALIASES = {
    "request": ("request_id", "prompt_id", "problem_id"),
    "layer": ("layer", "layer_id"),
    "position": ("token_pos", "token_idx", "position"),
    "experts": ("experts", "expert_ids"),
    "weights": ("weights", "gating_probs"),
    "prompt": ("prompt",),
}
FLOAT16_MAX = 65504.0
_DIGITS = re.compile(r"\s*-?[0-9]+\s*")
_is_int_type = np.frompyfunc(lambda v: type(v) is int, 1, 1)  # bool is not int here


class RoutingImportError(TraceError):
    """Malformed routing input; the message names the file, line and field."""


def pick(rec: dict, key: str, where: str, required: bool = True):
    """The record's value for `key` under its first alias present."""
    for name in ALIASES[key]:
        if name in rec:
            return rec[name]
    if required:
        raise RoutingImportError(f"{where}: field {key!r} missing (accepted names: "
                                 f"{', '.join(ALIASES[key])})")
    return None


def _items(value) -> list:
    """A JSON list as is; a CSV/JSON string "3 5", "3;5", "[3, 5]" split into its items."""
    if isinstance(value, str):
        return [v for v in value.replace(";", " ").replace(",", " ").strip("[] ").split() if v]
    return value if isinstance(value, list) else None


def _as_int(value) -> int | None:
    if is_integer(value):
        return int(value)
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    return None


def integer_field(value, where: str, field: str) -> int:
    """A layer or position: an integer, never a truncated float or a bool."""
    out = _as_int(value)
    if out is None:
        raise RoutingImportError(f"{where}: field {field!r}: {value!r} is not an integer")
    return out


def _id_range(ids, where: str, num_experts: int | None) -> None:
    limit = num_experts if num_experts is not None else math.inf
    bad = [e for e in ids if not 0 <= e < limit]
    if bad:
        why = "< 0" if num_experts is None else f"out of range [0, {num_experts})"
        raise RoutingImportError(f"{where}: field 'experts': expert id {bad[0]} {why}")


def expert_ids(value, where: str, num_experts: int | None) -> list[int]:
    """One token's expert ids: integers in [0, E) (E unknown: >= 0)."""
    items = _items(value)
    if items is None:
        raise RoutingImportError(f"{where}: field 'experts': expected a list of integers, got "
                                 f"{value!r}")
    out = [_as_int(v) for v in items]
    if None in out:
        raise RoutingImportError(f"{where}: field 'experts': {items[out.index(None)]!r} is not "
                                 "an integer expert id")
    _id_range(out, where, num_experts)
    return out


def _as_float(value) -> float | None:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return float(value) if is_number(value) else None


def weight_list(value, where: str) -> list[float]:
    """One token's routing weights: finite, >= 0, within float16."""
    items = _items(value)
    out = None if items is None else [_as_float(v) for v in items]
    if out is None or None in out:
        raise RoutingImportError(f"{where}: field 'weights': expected a list of numbers, got "
                                 f"{value!r}")
    for v, w in zip(items, out):
        if not (math.isfinite(w) and 0.0 <= w <= FLOAT16_MAX):
            raise RoutingImportError(f"{where}: field 'weights': {v!r} is not a finite number "
                                     f"in [0, {FLOAT16_MAX:g}]")
    return out


def nested_ids(value, where: str, num_experts: int | None) -> np.ndarray:
    """[layer][token][k] expert ids of a nested record -> int64 [L, T, k]."""
    try:
        obj = np.asarray(value, dtype=object) if isinstance(value, list) else None
    except ValueError:  # ragged below the top levels
        obj = None
    if obj is None or obj.ndim != 3 or not _is_int_type(obj).all():
        raise RoutingImportError(f"{where}: field 'experts': expected [layer][token][k] "
                                 "integers of equal lengths")
    ids = obj.astype(np.int64)
    if ids.shape[1] < 1 or ids.shape[2] < 1:
        raise RoutingImportError(f"{where}: field 'experts': shape {ids.shape}, expected "
                                 "[layers, tokens >= 1, k >= 1]")
    bad = (ids < 0) | (ids >= (num_experts if num_experts is not None else np.inf))
    if bad.any():
        _id_range([int(ids[bad][0])], where, num_experts)
    return ids


def prompt_field(rec: dict, where: str) -> str | None:
    """The optional request text: a string or null."""
    prompt = pick(rec, "prompt", where, required=False)
    if prompt is not None and not isinstance(prompt, str):
        raise RoutingImportError(f"{where}: field 'prompt': expected a string or null, got "
                                 f"{type(prompt).__name__}")
    return prompt


def record_fields(rec: dict, where: str, k: int | None, num_experts: int | None) -> tuple:
    """(request id, layer, position, expert ids, weights or None) of one `records` line, its
    ids k wide (k None: the first record, whose width sets it)."""
    rid = pick(rec, "request", where, required=False)
    rid = "0" if rid in (None, "") else str(rid)
    layer = integer_field(pick(rec, "layer", where), where, "layer")
    pos = integer_field(pick(rec, "position", where), where, "position")
    if pos < 0:
        raise RoutingImportError(f"{where}: field 'position': {pos} < 0")
    experts = expert_ids(pick(rec, "experts", where), where, num_experts)
    k = len(experts) if k is None else k
    if len(experts) != k or k == 0:
        raise RoutingImportError(f"{where}: field 'experts': {len(experts)} ids, expected {k}")
    w = pick(rec, "weights", where, required=False)
    w = weight_list(w, where) if w not in (None, "") else None
    if w is not None and len(w) != k:
        raise RoutingImportError(f"{where}: field 'weights': {len(w)} values, expected {k}")
    return rid, layer, pos, experts, w
