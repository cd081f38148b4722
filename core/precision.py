"""Lossy settings: a run whose expert or dense weights are below 16 bits is labelled LOSSY
wherever it is shown (docs/quantization.md, "The lossy label").

The rule is numeric and the same for every model: bf16 (16 bits) is the reference width of
every paper this suite mirrors, so fewer bits are lossy whatever the checkpoint ships in
(DeepSeek-V3's fp8 release included); 16 and 32 bits are not. The label names the widths,
so a reader sees which.
"""

from __future__ import annotations

from collections.abc import Iterable

LOSSLESS_BITS = 16  # bf16: the reference width; fewer bits are lossy


def is_lossy(expert_bits: float, dense_bits: float) -> bool:
    return expert_bits < LOSSLESS_BITS or dense_bits < LOSSLESS_BITS


def _widths(values: Iterable[float]) -> str:
    return "/".join(f"{b:g}" for b in sorted(set(values)))


def lossy_label(settings: Iterable[tuple[float, float]]) -> str | None:
    """`LOSSY: 2-bit experts, 4-bit dense` for (expert bits, dense bits) pairs of which one
    at least is lossy (several widths: `2/3-bit experts`; lossless pairs beside lossy ones:
    the label says only some rows are); None when every pair is lossless."""
    pairs = set(settings)
    lossy = [p for p in pairs if is_lossy(*p)]
    if not lossy:
        return None
    some = "" if len(lossy) == len(pairs) else " (rows at these widths)"
    return (f"LOSSY: {_widths(e for e, _ in lossy)}-bit experts, "
            f"{_widths(d for _, d in lossy)}-bit dense{some}")


def config_bits(config: dict | None) -> tuple[float, float] | None:
    """(expert bits, dense bits) of a run's config (result.json's `config`), or None when it
    records no model (a failure record written before its config was composed)."""
    model = (config or {}).get("model") or {}
    if "expert_bits" not in model or "dense_bits" not in model:
        return None
    return float(model["expert_bits"]), float(model["dense_bits"])


def results_label(results: Iterable[dict]) -> str | None:
    """The LOSSY label of a set of result.json dicts (lossy_label over their configs)."""
    bits = (config_bits(r.get("config")) for r in results)
    return lossy_label(b for b in bits if b is not None)
