"""How many jobs a sweep's overrides make (the N of the progress line `job i/N`)."""

from __future__ import annotations

from core.paths import CONF_DIR


def _group_options(group: str) -> list[str]:
    """The options of a config group: conf/<group>/*.yaml (system/evictor: a nested group)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def sweep_size(task_overrides: list[str]) -> int | None:
    """The product of every sweep override's length, as Hydra's basic sweeper expands them
    (a glob over a config group filtered against its options); None when an override does
    not parse here (the progress line then shows `job i/?`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    try:
        overrides = OverridesParser.create().parse_overrides(list(task_overrides))
        total = 1
        for o in overrides:
            if not o.is_sweep_override():
                continue
            value = o.value()
            if isinstance(value, Glob):
                total *= len(value.filter(_group_options(o.key_or_group)))
            else:
                total *= len(list(o.sweep_iterator()))
        return total
    except Exception:  # noqa: BLE001 (any parse problem: Hydra itself reports real errors)
        return None


def sweep_total(config) -> int | None:
    """The N of a sweep about to start: its job file's length (hydra/sweeper=job_file), else
    the product of its command line's sweep overrides."""
    from harness.runner.sweep_jobs import job_count

    count = job_count(config)
    return count if count is not None else sweep_size(list(config.hydra.overrides.task))
