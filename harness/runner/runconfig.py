"""Checks of a run's top-level config keys, before any work (conf/config.yaml lists them).

Types are strict: an integer key takes an integer (not 2.7, not true), a boolean key a
boolean; a key nobody reads (`+foo=1`) is refused instead of entering the config hash and the
folder name. Every message starts with the key, as the user writes it on the command line.
Groups (model, hardware, system, workload) are checked by their own builders; the
prompts and arrivals groups are parts of `workload` (conf/prompts, conf/arrivals).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import yaml

from core import checks
from core.paths import CONF_DIR
from core.specs import SpecError
from harness.runner.logger import check_logger
from harness.runner.store import run_dir_of
from harness.sim.cores import CORES
from systems.base import POLICY_KERNELS

GROUPS = ("model", "hardware", "system", "workload")
# Groups a run may leave out (absent or null), each checked by its own builder.
OPTIONAL_GROUPS = ("host_evictor", "placement")
# Groups that change how a run is reported, not what it computes (absent: none).
REPORTING_GROUPS = ("logger",)


@lru_cache(maxsize=1)
def known_keys() -> frozenset[str]:
    """Top-level keys of conf/config.yaml plus the config groups."""
    data = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    return (frozenset(k for k in data if k not in ("defaults", "hydra")) | set(GROUPS)
            | set(OPTIONAL_GROUPS) | set(REPORTING_GROUPS))


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


def check_workload_groups(cfg: dict) -> None:
    """The old workload=poisson|azure_* names (conf/workload stubs carrying `replaced_by`) are
    an error naming the arrivals option that replaced them; prompts (conf/prompts) with
    routing=FILE are refused: the file's routing already fixes the prompts."""
    workload = cfg.get("workload")
    if not isinstance(workload, dict):
        return
    new = workload.get("replaced_by")
    if new is not None:
        old = new.split("=", 1)[-1]
        raise SpecError(f"workload: workload={old} was replaced by the arrivals and prompts "
                        f"groups: use {new} (workload=synthetic stays the generator; "
                        f"`moebench list arrivals` and `moebench list prompts` show them)")
    if cfg.get("routing") is not None and workload.get("prompts") is not None:
        raise SpecError(f"prompts: routing={cfg['routing']} already fixes the prompts (the "
                        f"file's routing came from them); drop prompts= (or routing=)")


def check_before_naming(cfg: dict) -> None:
    """What must hold before the config is hashed into a folder name: no unknown top-level
    key (it would enter the hash and the name), no NaN or infinity (JSON cannot hold it), and
    the workload groups' rules (check_workload_groups)."""
    check_logger(cfg)  # first: it names logger=wandb for the old `+wandb=true`
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
    check_workload_groups(cfg)


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
    checks.boolean(cfg.get("time_policy", False), "time_policy", error=SpecError)
    core = cfg.get("engine_core", "auto")
    if core not in CORES:
        raise SpecError(f"engine_core: must be one of {', '.join(CORES)}, got {core!r}")
    kernels = cfg.get("policy_kernels", "auto")
    if kernels not in POLICY_KERNELS:  # systems/base.py
        raise SpecError(f"policy_kernels: must be one of {', '.join(POLICY_KERNELS)}, got "
                        f"{kernels!r}")
    for key in ("resume", "save_rows"):  # sweep keys (docs/sweeps.md); absent: true
        checks.boolean(cfg.get(key, True), key, error=SpecError)
    checks.number(cfg.get("timeout_s"), "timeout_s", lo=0, lo_open=True, null="no limit",
                  error=SpecError)
    checks.integer(cfg.get("blas_threads"), "blas_threads", lo=1,
                   null="the libraries' own setting", error=SpecError)
    cache = cfg.get("trace_cache_dir")
    if cache is not None and (not isinstance(cache, str) or not cache):
        raise SpecError(f"trace_cache_dir: must be a folder path or null (off), got {cache!r}")
    _trace_path(cfg, "routing")
    _trace_path(cfg, "calibration_routing")
    return run_dir_of(cfg)
