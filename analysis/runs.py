"""Collect the finished runs of an experiment folder for a report, and refuse to mix runs that do
not belong in one table.

Rows of one report may differ only in the system and in the *axes*: the keys Hydra's
`multirun.yaml` records as swept (`expert_cache_gb=4,8`), or the keys a report is told to
treat as axes. Every other config key, the trace and the calibration trace must agree; a
difference is an error naming the key and two run folders (`allow_mixed` turns it into a
note). Expected rows (the systems asked for, times every swept value) that have no run are
named; a report of a partial sweep is an error unless `allow_partial`.

Hidden names (leftovers of killed writes, locks: core/atomic.py) are never read.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from core.atomic import is_hidden, write_text
from harness.runner.results import NON_SEMANTIC_KEYS

# Axes that change the routing trace: rows with other values of these may have other traces.
TRACE_KEYS = ("routing", "calibration_routing", "workload", "seed", "model",
              "calibration_requests", "prompts", "arrivals")
GROUP_AXES = ("model", "hardware", "system", "workload")
# The prompts and arrivals groups write workload.prompts / workload.arrivals (conf/config.yaml);
# as axes they show the group's option name, read back from that node (workloads/labels.py).
WORKLOAD_GROUPS = {"prompts": "workload.prompts", "arrivals": "workload.arrivals"}


class ReportError(ValueError):
    """The runs cannot make one table (mixed, malformed or partial); the message says why."""


class RunRecord(dict):
    """One run's result.json as read; `folder`: the name of the run folder it was read from
    (an attribute, not a key: the record stays what the run wrote)."""

    def __init__(self, record: dict, folder: str):
        super().__init__(record)
        self.folder = folder


@dataclass
class RunSet:
    results: list[RunRecord]  # one result.json per row
    axes: list[str]  # dotted config keys that vary between rows (system excluded)
    missing: list[str] = field(default_factory=list)  # expected rows with no run
    notes: list[str] = field(default_factory=list)  # mixing allowed by the user, etc.


def flatten(node, prefix: str = "") -> dict:
    """{"hardware.h2d_gbps": 24, ...}: every leaf of a config tree under its dotted key."""
    if not isinstance(node, dict):
        return {prefix: node}
    out = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def axis_value(config: dict, key: str):
    """The value a row shows for an axis; a config group shows its `name`, the prompts and
    arrivals groups their option name (`mmlu`, `poisson`)."""
    group = key if key in WORKLOAD_GROUPS else next(
        (g for g, node in WORKLOAD_GROUPS.items() if node == key), None)
    if group is not None:  # `prompts=` or a swept `workload.prompts={...}`: its option name
        from workloads.labels import arrivals_name, prompts_name

        label = prompts_name if group == "prompts" else arrivals_name
        return label(config.get("workload") or {})
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, dict):
        return node.get("name", node.get("_target_"))
    return node


def _no_constant(name: str):
    """result.json is written without NaN or infinity (allow_nan=False): one that holds them
    was edited or written by something else, and its numbers cannot be trusted."""
    raise ValueError(f"{name} is not a JSON number")


def _read(path: Path) -> RunRecord:
    try:
        result = json.loads(path.read_text(), parse_constant=_no_constant)
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: not a readable result.json ({exc})") from exc
    for key, kind in (("config", dict), ("system", dict), ("status", str)):
        if not isinstance(result, dict) or not isinstance(result.get(key), kind):
            raise ReportError(f"{path}: field '{key}' missing or not a {kind.__name__}")
    return RunRecord(result, path.parent.name)


def read_runs(results_dir: Path) -> list[RunRecord]:
    """Every complete run folder directly under results_dir (hidden names skipped)."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise ReportError(f"{results_dir}: no such results folder")
    paths = sorted(p / "result.json" for p in results_dir.iterdir()
                   if p.is_dir() and not is_hidden(p) and (p / "result.json").is_file())
    if not paths:
        raise ReportError(f"{results_dir}: no */result.json: run the experiment first")
    return [_read(p) for p in paths]


def declared_sweep(results_dir: Path, system_names: list[str]) -> dict[str, list] | None:
    """{swept key: its declared values} from the folder's multirun.yaml (None without one).
    `system` lists the systems asked for; a range or glob is expanded."""
    path = Path(results_dir) / "multirun.yaml"
    if not path.is_file():
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    try:
        task = yaml.safe_load(path.read_text())["hydra"]["overrides"]["task"]
        overrides = OverridesParser.create().parse_overrides(list(task))
    except Exception as exc:  # noqa: BLE001 (any parse failure: the file is not Hydra's)
        raise ReportError(f"{path}: not a Hydra multirun record ({exc})") from exc
    out = {}
    for o in overrides:
        if not o.is_sweep_override():
            continue
        value = o.value()
        key = o.key_or_group
        out[key] = (value.filter(system_names) if isinstance(value, Glob) and key == "system"
                    else None if isinstance(value, Glob) else list(o.sweep_iterator()))
    return out


def _signature(result: dict, axes: list[str]) -> dict:
    flat = flatten(result["config"])
    skip = (*NON_SEMANTIC_KEYS, "system", *axes,
            *(WORKLOAD_GROUPS[a] for a in axes if a in WORKLOAD_GROUPS))
    return {k: v for k, v in flat.items()
            if not any(k == s or k.startswith(f"{s}.") for s in skip)}


def _first_difference(a: dict, b: dict) -> str | None:
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            return key
    return None


def _sha(result: dict, block: str):
    info = result.get(block)
    return info.get("sha256") if isinstance(info, dict) else None


def check_mixing(runs: list[RunRecord], axes: list[str]) -> list[str]:
    """Problems that make the rows incomparable, as messages (empty: they compare)."""
    problems = []
    ref = runs[0]
    ref_sig = _signature(ref, axes)
    trace_axes = any(a == t or a.startswith(f"{t}.") for a in axes for t in TRACE_KEYS)
    for r in runs[1:]:
        sig = _signature(r, axes)
        key = _first_difference(ref_sig, sig)
        if key is not None:
            problems.append(
                f"{key}: {ref.folder} has {ref_sig.get(key, '<absent>')!r}, {r.folder} "
                f"has {sig.get(key, '<absent>')!r}")
    for block in ("trace", "calibration_trace"):
        groups: dict = {}
        for r in runs:
            if _sha(r, block) is None:
                continue
            group = tuple(repr(axis_value(r["config"], a)) for a in axes) if trace_axes else ()
            groups.setdefault(group, []).append(r)
        for members in groups.values():
            shas = {_sha(r, block) for r in members}
            if len(shas) > 1:
                a, b = members[0], next(r for r in members if _sha(r, block) != _sha(
                    members[0], block))
                problems.append(f"{block}.sha256: {a.folder} replayed "
                                f"{_sha(a, block)[:16]}, {b.folder} {_sha(b, block)[:16]}")
    return problems


def _row_key(result: dict, axes: list[str]) -> tuple:
    return (result["system"].get("name"), *(repr(axis_value(result["config"], a))
                                           for a in axes))


def collect(results_dir: Path, *, axes: list[str] | None = None, allow_mixed: bool = False,
            allow_partial: bool = False, expected_systems: list[str] | None = None,
            system_names: list[str] | None = None, expected_count: int | None = None) -> RunSet:
    """The runs of one report, checked (ReportError names what is wrong). A failure record
    (a job that raised before it had a result: docs/sweeps.md) is no row: its folder and
    reason become a note, and its row counts as missing. `expected_count`: the number of
    runs the folder's sweeps make, for a folder that several sweeps wrote (its multirun.yaml
    records only the last one); rows are then counted instead of named."""
    runs = read_runs(results_dir)
    failures = [r for r in runs if r.get("error") and r.get("trace") is None]
    runs = [r for r in runs if not (r.get("error") and r.get("trace") is None)]
    if not runs:
        raise ReportError(f"{results_dir}: no complete run; failed: "
                          + "; ".join(f"{r.folder}: {r.get('reason')}" for r in failures[:5]))
    declared = declared_sweep(results_dir, system_names or []) or {}
    axis_keys = list(axes) if axes is not None else sorted(k for k in declared if k != "system")
    out = RunSet(results=runs, axes=axis_keys)
    out.notes += [f"failed (failure record): {r.folder}: {r.get('reason')}" for r in failures]
    hint = (f"rows may differ only in the system and the axes {axis_keys}; pass --axes KEY to "
            "make a key a column, or --allow-mixed")
    problems = check_mixing(runs, axis_keys)
    seen: dict[tuple, str] = {}
    for r in runs:
        key = _row_key(r, axis_keys)
        if key in seen:
            problems.append(f"run_name: {seen[key]} and {r.folder} are two runs of the same "
                            f"row {key}")
        seen.setdefault(key, r.folder)
    if problems and not allow_mixed:
        raise ReportError(f"{results_dir}: runs that do not belong in one table: "
                          + "; ".join(problems[:5]) + f". {hint}")
    out.notes += [f"mixed (--allow-mixed): {p}" for p in problems]
    if expected_count is not None:
        if len(runs) < expected_count:
            out.missing.append(f"{expected_count - len(runs)} of the {expected_count} runs "
                               "of the experiment's sweeps")
    else:
        out.missing += _missing_rows(declared, expected_systems, axis_keys, seen)
    if out.missing and not allow_partial:
        raise ReportError(f"{results_dir}: partial: no run for {', '.join(out.missing[:10])}"
                          f"{' ...' if len(out.missing) > 10 else ''}; finish the sweep or pass "
                          "--allow-partial")
    return out


def _missing_rows(declared: dict, expected_systems, axis_keys: list[str], seen) -> list[str]:
    """The systems asked for times every swept value, less the rows that ran."""
    systems = declared.get("system") or expected_systems or sorted({k[0] for k in seen})
    values = [sorted({k[i + 1] for k in seen} | {repr(v) for v in declared.get(a) or []})
              for i, a in enumerate(axis_keys)]
    missing = []
    for combo in itertools.product(systems, *values):
        if combo not in seen:
            where = ", ".join(f"{a}={v}" for a, v in zip(axis_keys, combo[1:]))
            missing.append(combo[0] + (f" ({where})" if where else ""))
    return missing


def publish(out_dir: Path, stem: str, md: str, csv_text: str) -> None:
    """Write <stem>.md and <stem>.csv atomically into `out_dir` and print the markdown."""
    write_text(Path(out_dir) / f"{stem}.md", md)
    write_text(Path(out_dir) / f"{stem}.csv", csv_text)
    print(md)
    print(f"wrote {Path(out_dir) / f'{stem}.md'} and {Path(out_dir) / f'{stem}.csv'}")
