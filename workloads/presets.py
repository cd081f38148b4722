"""Per-model score-model presets of the synthetic generator (docs/routing.md, "Generator
parameters").

The score knobs of SyntheticConfig (PRESET_FIELDS) default to None: "this model's preset, else
the DeepSeek-V2-Lite-fitted default (DEFAULTS)". A preset is workloads/presets/<model>.yaml,
chosen by the model's name (conf/model/<model>.yaml `name`), written by `moebench fit-routing
MODEL --write` (analysis/fit_routing.py) from routing statistics only. Precedence: an
explicit value (`workload.<field>=...`, or a SyntheticConfig argument) > the model's preset >
DEFAULTS. The values used are recorded in the trace's meta['generator'], with `preset`
naming the file when it supplied at least one of them; the preset files are code, so a run's
identity (git sha + digest of uncommitted changes, harness/runner/provenance.py) covers them.

File layout: `model: <name>` (must match the file name), `generator: {field: value}` (only
PRESET_FIELDS), optional `fit: {...}` (free provenance: command, seed, statistics). Any other
key is an error naming the file and the key.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from workloads.workload_checks import WorkloadError

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
# The values of a model without a preset: DeepSeek-V2-Lite's fit, equal to
# workloads/presets/deepseek_v2_lite.yaml as written by `moebench fit-routing deepseek_v2_lite
# --write` (routing statistics on the fit seed; tests/analysis/test_fit_routing.py checks equality).
# Change them only by re-running that command and copying its values here.
DEFAULTS = {
    "layer_pref_std": 0.13,  # model-wide popularity: aggregate busiest/mean 1.7
    "task_pref_std": 0.25,  # same-task activation cosine above other pairs
    "request_pref_std": 0.25,  # with the group term: within-prompt entropy, top share, used
    "sticky_std": 0.62,  # slow reuse excess over the preference baseline (lags 2-16)
    "stickiness": 0.7,  # AR(1) coefficient per token: decay of decode locality over 1-4 steps
    "token_noise_std": 1.0,  # fresh per-token noise, the score unit
    "dataset_pref_std": 0.1,  # dataset term D: dataset contrast ~0.04 (target >= 0.02)
    "group_pref_std": 0.3,  # activation-group term C: K-means finds ~17 groups over all
    "groups_per_dataset": 8,  # G groups per dataset
    "group_decay": 0.9,  # group shares r**g normalised: largest share ~0.13 over all
    "group_stay": 0.75,  # P(a task keeps the previous task's group): transitions ~0.5
    "token_latent_std": 0.0,  # per-token low-rank term: cross-layer mutual information
}
PRESET_FIELDS = tuple(DEFAULTS)
TOP_KEYS = ("model", "generator", "fit")


def preset_path(model: str) -> Path:
    return PRESETS_DIR / f"{model}.yaml"


def load_preset(model: str) -> dict | None:
    """The `generator` values of `model`'s preset, checked; None when it has none."""
    path = preset_path(model)
    if not path.exists():
        return None
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        raise WorkloadError(f"{path}: a mapping with keys {', '.join(TOP_KEYS)}")
    for key in doc:
        if key not in TOP_KEYS:
            raise WorkloadError(f"{path}: unknown key {key!r} (known: {', '.join(TOP_KEYS)})")
    if doc.get("model") != model:
        raise WorkloadError(f"{path}: key 'model' must be {model!r}, got {doc.get('model')!r}")
    values = doc.get("generator")
    if not isinstance(values, dict):
        raise WorkloadError(f"{path}: key 'generator' must be a mapping of score knobs")
    for key in values:
        if key not in DEFAULTS:
            raise WorkloadError(f"{path}: generator.{key}: not a preset knob (known: "
                                f"{', '.join(PRESET_FIELDS)})")
    return dict(values)


def resolve(cfg, model: str | None):
    """(cfg with every PRESET_FIELDS value set, preset name or None): explicit values win,
    then `model`'s preset (None: no model, defaults only), then DEFAULTS."""
    preset = load_preset(model) if model else None
    unset = [f for f in PRESET_FIELDS if getattr(cfg, f) is None]
    used = [f for f in unset if preset and f in preset]
    values = {f: (preset[f] if f in used else DEFAULTS[f]) for f in unset}
    return replace(cfg, **values), (model if used else None)
