"""A sweep given as an explicit list of jobs: the job file of `hydra/sweeper=job_file`.

Hydra's basic sweeper turns one command line into the cartesian product of its sweep
overrides. `moebench reproduce` needs many such products (every sweep of every experiment,
times the seeds) run as ONE sweep, so that one launcher call (a Ray cluster, a SLURM array)
gets them all at once. It expands each product here, `expand` (Hydra's own parser and the
basic sweeper's rule: a job's overrides are the same strings the basic sweeper would give
it, so its run name, config hash and folder are those of a plain `moebench -m`), and
writes the jobs to a job file that the project's sweeper plug-in
(hydra_plugins/moebench_job_sweeper) hands to the launcher.

The job file (JSON):

  {"version": 1,
   "jobs": [["experiment=table1", "system=lru", "seed=0", ...], ...],
   "records": {"results/table1": ["experiment=table1", "system=glob(...)", ...], ...}}

`records`: for each experiment folder, the overrides of the sweep that writes it last, which
the sweeper saves as the folder's multirun.yaml (what a `moebench -m` of that sweep leaves
there), so tools that read a folder's declared sweep (`moebench table1 DIR`, `compare`)
keep working.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from core.atomic import write_json
from core.specs import SpecError

VERSION = 1
KEY = "hydra.sweeper.job_file"  # the sweeper's setting that names the job file


def expand(overrides: list[str], config_loader=None) -> list[list[str]]:
    """The jobs of one sweep, in the basic sweeper's order: every sweep override's values
    crossed, each job a list of `key=value` strings (a repeated key keeps its first place
    and its last value, as in Hydra). `config_loader` lists a config group's options for a
    glob sweep (`system=glob(*)`); SpecError for an override Hydra cannot parse or list."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(
            list(overrides))
        axes: dict[str, list[str]] = {}
        for o in parsed:
            key = o.get_key_element()
            if not o.is_sweep_override():
                axes[key] = [f"{key}={o.get_value_element_as_str()}"]
            elif o.is_discrete_sweep():
                axes[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
            else:  # an interval: values for an optimizing sweeper, not a list of jobs
                raise SpecError(f"{o.input_line}: an interval sweep has no list of jobs")
    except HydraException as exc:
        raise SpecError(f"overrides: {exc}") from exc
    return [list(job) for job in itertools.product(*axes.values())]


def write_job_file(path, jobs: list[list[str]], records: dict[str, list[str]]) -> None:
    write_json(Path(path), {"version": VERSION, "jobs": [list(j) for j in jobs],
                            "records": {str(k): list(v) for k, v in records.items()}})


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(s, str) for s in value)


def read_job_file(path) -> dict:
    """The job file's contents, checked; ValueError naming the file and what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{KEY}={path}: not a readable job file ({exc})") from exc
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"{KEY}={path}: not a version {VERSION} job file")
    jobs, records = data.get("jobs"), data.get("records", {})
    if not isinstance(jobs, list) or not jobs or not all(_strings(j) for j in jobs):
        raise ValueError(f"{KEY}={path}: 'jobs' must be a non-empty list of override lists")
    if not isinstance(records, dict) or not all(_strings(v) for v in records.values()):
        raise ValueError(f"{KEY}={path}: 'records' must map folders to override lists")
    return {"jobs": jobs, "records": records}


def job_count(config) -> int | None:
    """The number of jobs of a sweep run from a job file (None: no job file, or unreadable,
    which the sweeper itself then reports)."""
    from omegaconf import OmegaConf

    path = OmegaConf.select(config, KEY, default=None)
    if not path:
        return None
    try:
        return len(read_job_file(path)["jobs"])
    except ValueError:
        return None
