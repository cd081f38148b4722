"""Checks of a run's top-level config keys, before any work (conf/config.yaml lists them).

Types are strict: an integer key takes an integer (not 2.7, not true), a boolean key a
boolean; a key nobody reads (`+foo=1`) is refused instead of entering the config hash and the
folder name. Every message starts with the key, as the user writes it on the command line.
Groups (model, hardware, system, workload) are checked by their own builders.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import yaml

from core import checks
from core.paths import PROJECT_ROOT
from core.specs import SpecError
from harness.runner.store import run_dir_of

GROUPS = ("model", "hardware", "system", "workload")


@lru_cache(maxsize=1)
def known_keys() -> frozenset[str]:
    """Top-level keys of conf/config.yaml plus the config groups."""
    data = yaml.safe_load((PROJECT_ROOT / "conf" / "config.yaml").read_text())
    return frozenset(k for k in data if k not in ("defaults", "hydra")) | set(GROUPS)


def _trace_path(cfg: dict, key: str) -> None:
    value = cfg.get(key)
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise SpecError(f"{key}: must be a trace file path or null, got {value!r}")
    if not Path(value).is_file():
        raise SpecError(f"{key}: {value}: no such file")


def _non_finite(node, where: str = "") -> str | None:
    """Dotted key of the first NaN or infinity in a config tree, or None."""
    if isinstance(node, float) and not math.isfinite(node):
        return where
    items = node.items() if isinstance(node, dict) else (
        enumerate(node) if isinstance(node, list) else ())
    for key, value in items:
        found = _non_finite(value, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def check_before_naming(cfg: dict) -> None:
    """What must hold before the config is hashed into a folder name: no unknown top-level
    key (it would enter the hash and the name) and no NaN or infinity (JSON cannot hold it)."""
    unknown = sorted(set(cfg) - known_keys())
    if unknown:
        raise SpecError(f"{unknown[0]}: unknown top-level key (unknown: {unknown}); known keys: "
                        f"{sorted(known_keys())}")
    bad = _non_finite(cfg)
    if bad is not None:
        value = cfg
        for part in bad.split("."):
            value = value[int(part) if isinstance(value, list) else part]
        raise SpecError(f"{bad}: must be a finite number, got {value!r}")


def check_run_config(cfg: dict) -> Path:
    """Raise SpecError naming the first bad top-level key; returns the run folder."""
    check_before_naming(cfg)
    for group in GROUPS:
        if not isinstance(cfg.get(group), dict):
            raise SpecError(f"{group}: must be a config group (a mapping), got "
                            f"{cfg.get(group)!r}")
    for key, lo in (("seed", 0), ("max_batch", 1), ("calibration_requests", 1)):
        checks.integer(cfg.get(key), key, lo=lo, error=SpecError)
    for key in ("slo_ttft_ms", "slo_tpot_ms"):
        checks.number(cfg.get(key), key, lo=0, lo_open=True, error=SpecError)
    checks.number(cfg.get("expert_cache_gb"), "expert_cache_gb", lo=0, lo_open=True,
                  null="what GPU memory leaves", error=SpecError)
    checks.boolean(cfg.get("progress"), "progress", error=SpecError)
    _trace_path(cfg, "routing")
    _trace_path(cfg, "calibration_routing")
    return run_dir_of(cfg)
