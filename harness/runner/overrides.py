"""What the command line's overrides decide before Hydra composes anything.

- **Where an experiment's run goes.** `experiment=NAME` pins a published setting
  (conf/experiment/NAME.yaml), and results/NAME/ holds the runs of that setting only. A run
  that changes any semantic key besides the system (`workload.num_requests=30`,
  `routing=FILE`, `hardware.h2d_gbps=16,32`) goes to its own experiment folder,
  `NAME-<key>=<value>,...` (`experiment_folder`), so it never lands beside the pinned runs
  and no report mixes the two. `experiment_name=...` given by the user wins.
- **No two jobs of one sweep share a folder.** A sweep that fixes `run_name` (or sweeps fewer
  names than it has jobs) would write its jobs into one folder, each replacing the last:
  refused before any job (`check_sweep`).
- **A trace file fixes its requests.** `workload.num_requests` with `routing=FILE` would be
  ignored (the file's requests all run) while the folder name said otherwise: refused.

Every refusal is a SpecError naming the key (the CLI: exit 2, nothing written).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from core.specs import SpecError
from harness.runner.store import HASH_CHARS, NAME_EXCLUDED, NAME_MAX_CHARS
from harness.runner.sweep_size import sweep_size

_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+@%:-]")


@dataclass(frozen=True)
class Item:
    key: str  # `workload.num_requests`, `system/evictor`, `hydra.launcher.n_jobs`
    value: str  # as written (a sweep: `16,32`)
    sweep: bool
    line: str  # the override as given


def parse(overrides: list[str]) -> list[Item]:
    """The overrides as Hydra reads them; the last of a repeated key wins, as in Hydra.
    SpecError for one Hydra cannot parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as exc:
        raise SpecError(f"overrides: {exc}") from exc
    last = {}
    for o in parsed:
        if o.is_hydra_override() or o.key_or_group.startswith("hydra/"):
            continue
        value = "" if o.is_delete() else o.get_value_string()
        last[o.key_or_group] = Item(o.key_or_group, value, o.is_sweep_override(), o.input_line)
    return list(last.values())


def _semantic(item: Item) -> bool:
    """A key that changes what a run computes, other than the system's name."""
    head = item.key.split(".", 1)[0]
    return item.key not in ("system", "experiment") and head not in NAME_EXCLUDED


def _shown(item: Item) -> str:
    """`key=value` for a folder name; a path value shows its file name and a hash of the path,
    so two files of one name get two folders."""
    value = item.value
    if "/" in value:
        digest = hashlib.sha256(value.encode()).hexdigest()[:HASH_CHARS]
        value = f"{value.rstrip('/').rsplit('/', 1)[-1]}@{digest}"
    return _UNSAFE.sub("_", f"{item.key.replace('/', '.')}={value}")


def experiment_folder(overrides: list[str]) -> str | None:
    """The experiment folder a command's runs go to when it is not the pinned one: None when
    there is no `experiment=`, the user named `experiment_name`, or nothing semantic besides
    the system is overridden."""
    items = parse(overrides)
    keys = {i.key: i for i in items}
    if "experiment" not in keys or "experiment_name" in keys:
        return None
    changed = sorted((i for i in items if _semantic(i)), key=lambda i: i.key)
    if not changed:
        return None
    name = f"{keys['experiment'].value}-" + ",".join(_shown(i) for i in changed)
    if len(name) > NAME_MAX_CHARS:  # keep it one folder name; the hash keeps it unique
        digest = hashlib.sha256(name.encode()).hexdigest()[:HASH_CHARS]
        name = f"{name[:NAME_MAX_CHARS - HASH_CHARS - 2]}~-{digest}"
    return name


def assign(key: str, value: str) -> str:
    """`key='value'`: a folder name holds `=` and `,`, which Hydra would read as a sweep
    unquoted (names never hold a quote: `_UNSAFE` replaced it)."""
    return f"{key}='{value}'"


def check_sweep(overrides: list[str], multirun: bool) -> None:
    """Refuse, before any job, a sweep whose jobs would share a run folder, and an override
    a trace file would ignore."""
    items = {i.key: i for i in parse(overrides)}
    if "routing" in items and items["routing"].value not in ("", "null") \
            and "workload.num_requests" in items:
        raise SpecError("workload.num_requests: routing=FILE replays every request of the "
                        "file, so this override would be ignored; drop it (or import fewer "
                        "requests: moebench import-routing --requests A:B)")
    name = items.get("run_name")
    if not multirun or name is None or name.value in ("", "null"):
        return
    jobs = sweep_size(overrides)
    names = sweep_size([name.line]) if name.sweep else 1
    if jobs is not None and names is not None and jobs > names:
        raise SpecError(f"run_name: {name.value!r} names {names} folder(s) for a sweep of "
                        f"{jobs} jobs, which would replace each other's results; drop "
                        "run_name (each job then gets its own folder) or set it per job")
