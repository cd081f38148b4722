"""Shared pieces of fMoE's sensitivity sweeps and ablation (arXiv 2502.05370 v2 = EuroSys'26;
paper_numbers.md A2): fmoe_cache_limit, fmoe_prefetch_distance, fmoe_store_capacity, fmoe_batch
and fmoe_ablation.

The variants of MoE-Infinity and fMoE (VARIANTS) run beside their seeds in every sweep
where the seed runs, each its own row or line.

All five start from fmoe_overall's setting (conf/experiment/fmoe_overall.yaml: Mixtral-8x7B on
one RTX 3090, bf16, 40-token prompts, 28 calibration requests) and pin one smaller workload
for the suite's time budget: synthetic prompts (task-centroid embeddings, so fMoE's semantic
matching still has prompts to match: docs/routing.md), 12 measured requests of 32 output
tokens. The same workload gives the same trace, generated once and shared on disk
(harness/runner/trace_cache.py); fmoe_batch alone needs its requests to arrive together.
"""

from __future__ import annotations

import math

from analysis.repro.experiments.fmoe_overall import ORDER, PAPER_NAMES, PROMOE_EVICTOR

SOURCE = "fMoE (arXiv 2502.05370 v2)"
# ProMoE as fmoe_overall composes it (a frequency cache: fmoe_overall says why)
PROMOE = ("system=composed", f"system/evictor={PROMOE_EVICTOR}", "system/prefetcher=promoe")
BASELINES = ("layer_offload", "lru", "promoe", "moe_infinity")
# Mixtral-Offloading's per-layer LRU needs one slot per layer; where the cache holds fewer
# (Mixtral at 6 GiB: 18 experts for 32 layers) a global LRU with the same speculative
# next-layer prefetch stands in for it, labelled so
LRU_STANDIN = "composed(lru,spec_next_layer)"
NAMES = {**PAPER_NAMES, LRU_STANDIN: "Mixtral-Offloading stand-in: global LRU"}
# Our named repairs of the two history-based systems (systems/variants.py): each its own
# row beside its seed wherever the seed runs, never a baseline and never judged
VARIANTS = ("moe_infinity_hysteresis", "fmoe_admission")
FMOE_VARIANT = "fmoe_admission"
RANK = {s: i for i, s in enumerate((*ORDER[:2], LRU_STANDIN, "promoe", "moe_infinity",
                                    "moe_infinity_hysteresis", "fmoe", FMOE_VARIANT))}


def config(result: dict, dotted: str):
    """A key of the run's resolved config, e.g. `system.prefetch_distance` (None if absent)."""
    node = result.get("config") or {}
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def num(value) -> float | None:
    """A metric as a float; None for a missing or NaN value (an invalid run's metrics)."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def ratio(a, b) -> float | None:
    a, b = num(a), num(b)
    return a / b if a is not None and b else None


def slots(result: dict) -> int | None:
    """Experts the run's cache holds (its memory plan / one expert's bytes)."""
    cache = (result.get("memory") or {}).get("expert_cache_bytes")
    each = (result.get("model") or {}).get("expert_bytes")
    return int(cache // each) if cache and each else None


def paper_factor(change: float) -> float:
    """A paper's latency reduction of fMoE against a baseline (e.g. -0.36) as the factor
    baseline / fMoE (1.5625)."""
    return 1.0 / (1.0 + change)


def setting(runs, extra: str = "", models: str | None = None) -> str:
    """The header sentence every table of the five carries: model(s), hardware, request
    shape, routing source (read from the first valid run)."""
    ok = runs[runs["status"] == "valid"]
    first = (ok if not ok.empty else runs).iloc[0]
    w = first["_result"]["config"]["workload"]
    return (f"{models or first['model']} on {first['hardware']}, "
            f"{int(first['requests'] or 0)} measured requests (prompt {w.get('prompt_len')}, "
            f"output {w.get('output_len')} tokens), "
            f"{config(first['_result'], 'calibration_requests')} calibration requests, "
            f"{first['routing']} routing, synthetic prompts. {extra}").rstrip()


def lines(ax, tab, x: str, y: str, by: str, names: dict | None = None,
          order: dict | None = None) -> None:
    """One line per value of `by` (sorted by `order`, then name): y against x, points with
    no value left out."""
    keys = sorted(set(tab[by]), key=lambda k: ((order or {}).get(k, 99), str(k)))
    for key in keys:
        sub = tab[tab[by] == key].sort_values(x)
        pts = [(a, b) for a, b in zip(sub[x], sub[y]) if num(b) is not None]
        if pts:
            ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", ms=4,
                    label=(names or {}).get(key, str(key)))
    ax.set_ylabel(y)
    ax.legend(fontsize=7)
