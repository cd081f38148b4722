"""The sweeper of `hydra/sweeper=job_file hydra.sweeper.job_file=FILE`.

It reads the jobs from the file (harness/runner/sweep_jobs.py) instead of expanding the
command line, checks that the jobs compose (as the basic sweeper does, so a bad job stops
the sweep before any run starts), saves each experiment folder's multirun.yaml, and hands
all jobs to the launcher in one call: joblib, Ray or SLURM then see the whole list at once.

Each job also gets, through `hydra.job.env_set` (a Hydra setting, so not one of the job's
own overrides: its run name and config are unchanged), the sweep's state folder and the
directory the sweep was started in: a worker on another machine reports its outcome to the
same state folder and reads the same relative paths (harness/runner/sweep.py), provided the
filesystem is shared.
"""

# No `from __future__ import annotations`: Hydra's plug-in scan runs this module outside
# sys.modules, where a dataclass with string annotations cannot be built
import copy
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf, open_dict

from core.atomic import write_text
from harness.runner.overrides import assign
from harness.runner.sweep import CWD_ENV, STATE_ENV
from harness.runner.sweep_jobs import read_job_file


@dataclass
class JobFileSweeperConf:
    _target_: str = "hydra_plugins.moebench_job_sweeper.job_file_sweeper.JobFileSweeper"
    job_file: Any = None  # the JSON job file (harness/runner/sweep_jobs.py)


ConfigStore.instance().store(group="hydra/sweeper", name="job_file", node=JobFileSweeperConf,
                             provider="moebench")


class JobFileSweeper(Sweeper):
    def __init__(self, job_file: str | None = None) -> None:
        super().__init__()
        self.job_file = job_file
        self.hydra_context = self.config = self.launcher = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        if arguments:
            raise HydraException(f"hydra/sweeper=job_file: every job's overrides come from "
                                 f"the job file; {arguments} would apply to none of them")
        if not self.job_file:
            raise HydraException("hydra/sweeper=job_file: set hydra.sweeper.job_file=FILE")
        try:
            spec = read_job_file(self.job_file)
        except ValueError as exc:
            raise HydraException(str(exc)) from exc
        env = [assign(f"++hydra.job.env_set.{CWD_ENV}", os.getcwd())]
        if os.environ.get(STATE_ENV):  # set by SweepCallback, before the sweeper starts
            env.append(assign(f"++hydra.job.env_set.{STATE_ENV}", os.environ[STATE_ENV]))
        jobs = [[*job, *env] for job in spec["jobs"]]
        # Jobs that differ only in their seed (a plain number in conf/config.yaml) compose
        # alike: one of each is checked (a composition takes ~0.1 s, the suite has 5 seeds)
        checks = {tuple(o for o in job if not o.startswith("seed=")): job for job in jobs}
        self.validate_batch_is_legal(list(checks.values()))
        for folder, declared in spec["records"].items():
            self._record(Path(folder), declared)
        returns = self.launcher.launch(jobs, initial_job_idx=0)
        for num, r in enumerate(returns):
            # A job records its own failures (harness/runner/sweep.py); one that raised
            # anyway (a worker that cannot reach the sweep's directory) never reported, so
            # the summary counts it failed. Unlike the basic sweeper, it does not end the
            # sweep: the other jobs' counts and reports still come.
            try:
                _ = r.return_value
            except Exception as exc:  # noqa: BLE001 (any job's crash is that job's)
                print(f"sweep: job {num} raised {type(exc).__name__}: {exc}", file=sys.stderr,
                      flush=True)
        return [returns]

    def _record(self, folder: Path, declared: list[str]) -> None:
        """The folder's multirun.yaml: this sweep's config with the folder's own sweep as
        its task overrides (analysis/runs.py reads its swept keys)."""
        cfg = copy.deepcopy(self.config)
        with open_dict(cfg):
            cfg.hydra.overrides.task = list(declared)
            cfg.hydra.sweep.dir = str(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_text(folder / "multirun.yaml", OmegaConf.to_yaml(cfg))
