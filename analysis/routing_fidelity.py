"""Per-model routing targets (analysis/routing_targets/<model>.yaml) and how a routing meets
them: the rows of the `routing_fidelity` experiment (docs/routing.md, "Targets").

A target names a statistic of analysis/routing_structure.structure, its value, an absolute
tolerance, an optional bound (upper: the value may be anything up to target + tolerance;
lower: anything from target - tolerance) and its source; `estimate: true` marks a value that
is neither published nor measured for that model. Targets are routing statistics only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from analysis.characterize import cross_layer, request_sequences
from analysis.routing_structure import decode_sequences, structure

TARGETS_DIR = Path(__file__).resolve().parent / "routing_targets"
BOUNDS = (None, "upper", "lower")
FIELDS = ("statistic", "target", "tolerance", "source", "estimate")


def target_models() -> list[str]:
    """The models with a targets file."""
    return sorted(p.stem for p in TARGETS_DIR.glob("*.yaml"))


def load_targets(model: str) -> list[dict]:
    """The targets of `model`, checked: every entry has FIELDS, a known bound, a source."""
    path = TARGETS_DIR / f"{model}.yaml"
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("model") != model:
        raise ValueError(f"{path}: field 'model' must be {model!r}")
    out = []
    for i, entry in enumerate(doc.get("targets") or []):
        where = f"{path}: targets[{i}]"
        missing = [f for f in FIELDS if f not in entry]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        if entry.get("bound") not in BOUNDS:
            raise ValueError(f"{where}: bound must be upper, lower or absent")
        if not str(entry["source"]).strip():
            raise ValueError(f"{where}: empty source")
        if float(entry["tolerance"]) < 0:
            raise ValueError(f"{where}: negative tolerance")
        out.append({**entry, "bound": entry.get("bound")})
    if not out:
        raise ValueError(f"{path}: no targets")
    return out


def within(value, target: dict) -> bool | None:
    """Whether `value` meets the target (None: not measured)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    t, tol = float(target["target"]), float(target["tolerance"])
    if target["bound"] == "upper":
        return value <= t + tol
    if target["bound"] == "lower":
        return value >= t - tol
    return abs(value - t) <= tol


def target_text(target: dict) -> str:
    """`<= 0.3 (+0.05)`, `>= 0.05`, `0.0264 +- 0.01` for tables."""
    t, tol = f"{float(target['target']):g}", float(target["tolerance"])
    if target["bound"] == "upper":
        return f"<= {t}" + (f" (+{tol:g})" if tol else "")
    if target["bound"] == "lower":
        return f">= {t}" + (f" (-{tol:g})" if tol else "")
    return f"{t} +- {tol:g}"


def trace_structure(tr, seed: int = 0) -> dict:
    """analysis/routing_structure.structure of a trace (decode window = its decode steps,
    task and dataset labels from the trace) and the cross-layer statistics of
    analysis/characterize.cross_layer (xl_precision, xl_mi_bits, ...) over every token."""
    seqs = request_sequences(tr)
    st = structure(seqs, decode_sequences(tr), tr.num_experts, tr.top_k, tr.tasks,
                   tr.datasets, seed)
    st.update(cross_layer(seqs, tr.num_experts, tr.top_k, seed))
    return st


def fidelity_rows(model: str, stats: dict, targets: list[dict] | None = None) -> list[dict]:
    """One row per target of `model`: statistic, target, tolerance, bound, synthetic value,
    within tolerance (yes / no / n/a when the routing does not give the statistic), estimate,
    source."""
    rows = []
    for t in targets if targets is not None else load_targets(model):
        value = stats.get(t["statistic"])
        ok = within(value, t)
        rows.append({"model": model, "statistic": t["statistic"], "target": target_text(t),
                     "synthetic": value, "within_tolerance": {True: "yes", False: "no",
                                                              None: "n/a"}[ok],
                     "estimate": bool(t["estimate"]), "source": t["source"],
                     "target_value": float(t["target"]), "tolerance": float(t["tolerance"]),
                     "bound": t["bound"] or ""})
    return rows
