"""How `moebench reproduce` hands its jobs to a Hydra launcher: one child `moebench -m` with
the project's job-file sweeper (hydra_plugins/moebench_job_sweeper), so the launcher gets
every job of the command at once.

  --launcher joblib          worker processes on this machine, `--jobs N` at a time (N = 1:
                             Hydra's basic launcher, one job after another in the child)
  --launcher ray             Ray tasks: a local instance, or a running cluster with
                             --launcher-arg ray.init.address=auto
  --launcher submitit_local  one subprocess per job through submitit (SLURM's code path)
  --launcher submitit_slurm  one SLURM job per run (--launcher-arg partition=..., ...)

`--launcher-arg KEY=VALUE` sets `hydra.launcher.KEY` (the plug-in's own config: `moebench -m
hydra/launcher=ray --cfg hydra` prints it); an `--override hydra.launcher.KEY=VALUE` goes to
the same place.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from core.specs import SpecError
from harness.runner.overrides import assign
from harness.runner.parent import launching
from harness.runner.sweep import COUNTS_ENV, discard_state
from harness.runner.sweep_jobs import KEY, write_job_file

# --launcher -> (Hydra's launcher option, the plug-in module that provides it)
LAUNCHERS = {
    "joblib": ("joblib", "hydra_plugins.hydra_joblib_launcher"),
    "ray": ("ray", "hydra_plugins.hydra_ray_launcher"),
    "submitit_local": ("submitit_local", "hydra_plugins.hydra_submitit_launcher"),
    "submitit_slurm": ("submitit_slurm", "hydra_plugins.hydra_submitit_launcher"),
}
PREFIX = "hydra.launcher."


def launcher_arg(line: str) -> str:
    """`KEY=VALUE` (KEY with or without `hydra.launcher.`) as the override that sets it,
    added where the launcher's config lacks the key (`ray.init.num_cpus`); SpecError naming
    --launcher-arg for anything else."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    key, sep, value = line.partition("=")
    if not sep or not key or key[0] in "+~" or "/" in key:
        raise SpecError(f"--launcher-arg: {line!r} is not KEY=VALUE (e.g. "
                        "ray.init.address=auto, partition=cpu)")
    key = key if key.startswith(PREFIX) else PREFIX + key
    try:
        parsed = OverridesParser.create().parse_override(f"++{key}={value}")
    except HydraException as exc:
        raise SpecError(f"--launcher-arg: {line!r}: {exc}") from exc
    if parsed.is_sweep_override():
        raise SpecError(f"--launcher-arg: {line!r}: one value, not a sweep")
    return f"++{key}={value}"


def launcher_overrides(launcher: str, jobs: int, args: list[str]) -> list[str]:
    """The Hydra overrides that choose the launcher and its settings; SpecError naming the
    option when it cannot be used (nothing is run then)."""
    if launcher not in LAUNCHERS:
        raise SpecError(f"--launcher: unknown launcher {launcher!r}; one of "
                        f"{', '.join(LAUNCHERS)}")
    if jobs < 1:
        raise SpecError(f"--jobs: {jobs}; at least 1")
    option, module = LAUNCHERS[launcher]
    settings = [launcher_arg(a) for a in args]
    if importlib.util.find_spec(module) is None:
        if launcher != "joblib":
            raise SpecError(f"--launcher {launcher}: its Hydra plug-in ({module}) is not "
                            "installed (pip install -e '.[sweep]')")
        print(f"reproduce: the joblib launcher is not installed ({module}); running the jobs "
              "one at a time with Hydra's basic launcher", flush=True)
        jobs = 1
    if launcher == "joblib" and jobs == 1:
        if settings:
            raise SpecError("--launcher-arg: one job at a time runs in Hydra's basic "
                            "launcher, which has no settings (--jobs 2 or more: joblib)")
        return []
    if launcher == "joblib":
        settings.insert(0, f"{PREFIX}n_jobs={jobs}")
    return [f"hydra/launcher={option}", *settings]


def run_jobs(jobs: list[list[str]], records: dict[str, list[str]], results: Path,
             hydra_overrides: list[str]) -> dict | None:
    """Run the jobs as one sweep in a child `moebench -m`: its counts (harness/runner/sweep.py,
    with `code`, the child's exit status, and `folders`, counts per experiment folder), or
    None when it stopped before its first job (a job that does not compose, a launcher that
    cannot start)."""
    with tempfile.TemporaryDirectory(prefix="moebench-sweep-") as tmp:
        job_file, counts = Path(tmp) / "jobs.json", Path(tmp) / "counts.json"
        write_job_file(job_file, jobs, records)
        # the sweep's own folder (hydra.sweep.dir) holds only its hidden state while it runs
        cmd = [sys.executable, "-m", "moebench.cli", "-m", "hydra/sweeper=job_file",
               assign(KEY, str(job_file)), assign("hydra.sweep.dir", str(results)),
               *hydra_overrides]
        print(f"reproduce: {len(jobs)} jobs in one sweep: {' '.join(cmd[3:])}", flush=True)
        child = subprocess.Popen(cmd, env={**launching(), COUNTS_ENV: str(counts)})
        code = child.wait()
        if not counts.is_file():
            discard_state(results, child.pid)  # its callback, which removes it, never ran
            return None
        out = json.loads(counts.read_text())
    out["code"] = code
    return out
