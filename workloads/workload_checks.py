"""Strict checks of the synthetic workload's fields (workloads.synthetic.SyntheticConfig).

Integers must be integers (not a bool, not 2.7), floats finite; every message starts with the
key as the user writes it on the command line, `workload.<field>` (docs/serving.md).
"""

from __future__ import annotations

from core.checks import integer, is_integer, number
from core.specs import SpecError
from workloads.arrivals import MAX_REQUEST_TOKENS

# (field, lowest, highest or None); token counts have the per-request bound of replayed
# arrivals
INTEGERS = (("seed", 0, None), ("num_requests", 1, None), ("embed_dim", 1, None),
            ("prompt_len", 1, MAX_REQUEST_TOKENS), ("output_len", 1, MAX_REQUEST_TOKENS))
NON_NEGATIVE = ("arrival_ms", "layer_pref_std", "task_pref_std", "request_pref_std",
                "sticky_std", "token_noise_std", "embed_noise", "dataset_pref_std",
                "group_pref_std", "token_latent_std")
MAX_GROUPS = 1000  # activation groups per dataset (workloads/structure.py)


class WorkloadError(SpecError):
    """A workload knob has the wrong type or is out of range; the message starts with the
    key (`workload.num_requests: ...`). A SpecError: `moebench` reports it without a
    traceback, before anything is written."""


def check_fields(cfg) -> None:
    """Types and ranges of every field of a SyntheticConfig, one at a time."""
    for name, lo, hi in INTEGERS:
        integer(getattr(cfg, name), f"workload.{name}", lo=lo, hi=hi, error=WorkloadError)
    tasks = cfg.tasks
    if not isinstance(tasks, (list, tuple)) or not tasks or not all(
            isinstance(t, (list, tuple)) and len(t) == 2 and isinstance(t[0], str)
            and is_integer(t[1]) and t[1] >= 1 for t in tasks):
        raise WorkloadError(f"workload.tasks: must be a non-empty list of [dataset, number of "
                            f"tasks >= 1] pairs, got {tasks!r}")
    if not isinstance(cfg.split, str) or not cfg.split or "/" in cfg.split:
        raise WorkloadError(f"workload.split: must be a non-empty name without '/', got "
                            f"{cfg.split!r}")
    number(cfg.stickiness, "workload.stickiness", lo=0.0, hi=1.0, hi_open=True,
           error=WorkloadError)
    number(cfg.cross_layer_corr, "workload.cross_layer_corr", lo=0.0, hi=1.0,
           error=WorkloadError)
    for name in NON_NEGATIVE:
        number(getattr(cfg, name), f"workload.{name}", lo=0.0, error=WorkloadError)
    integer(cfg.groups_per_dataset, "workload.groups_per_dataset", lo=0, hi=MAX_GROUPS,
            error=WorkloadError)
    number(cfg.group_decay, "workload.group_decay", lo=0.0, hi=1.0, lo_open=True,
           error=WorkloadError)
    number(cfg.group_stay, "workload.group_stay", lo=0.0, hi=1.0, hi_open=True,
           error=WorkloadError)
    from workloads.length_tables import LENGTH_TABLES
    from workloads.lengths import LENGTH_MODES
    from workloads.spec_guess import MAX_NOISE_NATS

    number(cfg.spec_noise_nats, "workload.spec_noise_nats", lo=0.0, hi=MAX_NOISE_NATS,
           error=WorkloadError)
    for name, allowed in (("lengths", LENGTH_MODES), ("length_source", tuple(LENGTH_TABLES))):
        if getattr(cfg, name) not in allowed:
            raise WorkloadError(f"workload.{name}: must be one of {', '.join(allowed)}, got "
                                f"{getattr(cfg, name)!r}")
    check_task_options(cfg)


def dataset_list(value, key: str, *, null: bool = True) -> list[str] | None:
    """A non-empty list of distinct dataset slugs (a lone slug is a list of one); None where
    `null` allows it. Messages start with `key`."""
    if value is None and null:
        return None
    items = [value] if isinstance(value, str) else value
    if (not isinstance(items, (list, tuple)) or not items
            or not all(isinstance(d, str) and d and "/" not in d for d in items)):
        raise WorkloadError(f"{key}: must be a dataset name or a non-empty list of them"
                            f"{' or null' if null else ''}, got {value!r}")
    if len(set(items)) != len(items):
        raise WorkloadError(f"{key}: a dataset is listed twice in {list(items)!r}")
    return list(items)


def check_task_options(cfg) -> None:
    """The task-shift options of workloads.requests.TaskShiftConfig (absent from a plain
    SyntheticConfig: nothing to check). With synthetic tasks (no `prompts`) every dataset
    named must be one of workload.tasks; with prompts the loaded datasets are checked when
    they are loaded (workloads/requests.py)."""
    if not hasattr(cfg, "task_block"):
        return
    integer(cfg.task_block, "workload.task_block", lo=1, error=WorkloadError)
    known = None if cfg.prompts is not None else [str(t[0]) for t in cfg.tasks]
    for key in ("task_order", "calibration_tasks"):
        for d in dataset_list(getattr(cfg, key), f"workload.{key}") or ():
            if known is not None and d not in known:
                raise WorkloadError(f"workload.{key}: {d!r} is not a dataset of workload.tasks "
                                    f"({', '.join(known)})")
