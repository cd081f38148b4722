"""What `moebench reproduce` runs: every sweep of the chosen experiments, times the seeds,
as one explicit list of jobs (harness/runner/sweep_jobs.py) for one launcher call.

Each sweep is the command line a `moebench -m` of it would get (`SweepCall.overrides`):
`experiment=<name>`, the sweep's overrides, `seed=<the seeds>` unless the sweep (or the
command's --override) sets the seed itself, then the folder it writes: `results_dir=`, the
command's --override, `experiment_name=` (results/<name>/, results/<name>_real/ or the
folder of an overridden setting, analysis/repro/layout.py). Every job carries all of them,
so a job lands where that `moebench -m` would have put it, under the same name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analysis.repro.layout import chosen_seeds, folders, seeded
from analysis.repro.real import real_overrides
from analysis.repro.registry import EXPERIMENTS
from analysis.repro.spec import Sweep
from analysis.runs import ReportError
from harness.runner.overrides import assign, check_sweep, parse
from harness.runner.sweep_jobs import expand


@dataclass(frozen=True)
class SweepCall:
    experiment: str
    folder: str  # the experiment folder it writes, under the results folder
    overrides: tuple[str, ...]  # `moebench -m <these>` would run it


def job_overrides(override: list[str]) -> list[str]:
    """The --override items a job carries: Hydra's own settings (`hydra.launcher.*`) are the
    launcher's, given once on the sweep's command line (`launcher_settings`)."""
    return [o for o in override if not _is_hydra(o)]


def launcher_settings(override: list[str]) -> list[str]:
    return [o for o in override if _is_hydra(o)]


def _is_hydra(line: str) -> bool:
    return line.lstrip("+~").startswith(("hydra.", "hydra/"))


def _call(name: str, sweep: Sweep, seeds, results: Path, override: list[str],
          folder: str) -> SweepCall:
    return SweepCall(name, folder, (f"experiment={name}", *seeded(sweep, seeds, override),
                                    f"results_dir={results}", *override,
                                    assign("experiment_name", folder), "progress=false"))


def synthetic_calls(name: str, results: Path, override: list[str],
                    n_seeds: int | None) -> list[SweepCall]:
    """The experiment's sweeps on synthetic routing (or on the command's routing=), each
    checked as `moebench -m` checks its command line (SpecError: nothing is run)."""
    exp, main_dir = EXPERIMENTS[name], folders(name, override)[0]
    override = job_overrides(override)
    calls = [_call(name, s, chosen_seeds(exp, n_seeds), results, override, main_dir)
             for s in exp.sweeps if not s.real]
    for call in calls:
        check_sweep(list(call.overrides), multirun=True)
    return calls


def real_calls(name: str, results: Path, override: list[str],
               n_seeds: int | None) -> tuple[list[SweepCall], int]:
    """The experiment's sweeps on its shared real routing sample (imported on first use,
    analysis/repro/real.py), and 1 when the sample is there but does not import. Skipped,
    and said so, when the command sets routing= or the sample is absent."""
    exp, real_dir = EXPERIMENTS[name], folders(name, override)[1]
    sweeps = [s for s in exp.sweeps if s.real]
    if not sweeps:
        return [], 0
    if any(i.key == "routing" for i in parse(override)):
        _say(f"reproduce {name}: real-routing sweep skipped: routing= is given")
        return [], 0
    try:
        real = real_overrides(exp, results)
    except ReportError as exc:
        _say(f"reproduce {name}: real-routing sweep skipped: {exc}")
        return [], 1
    if real is None:
        _say(f"reproduce {name}: real-routing sweep skipped: the shared sample for "
             f"{exp.real_model} is absent (MOEBENCH_SHARED_DATA)")
        return [], 0
    # the sample fixes its requests: a request count override is not for it
    kept = [o for o in job_overrides(override) if not o.startswith("workload.num_requests=")]
    return [_call(name, s, chosen_seeds(exp, n_seeds), results, [*kept, *real], real_dir)
            for s in sweeps], 0


def _say(line: str) -> None:
    print(line, flush=True)


def expand_calls(calls: list[SweepCall], before: list[list[str]] = ()) -> list[list[str]]:
    """`before`, then the jobs of every call in order, each listed once (two sweeps making
    the same job would race for its folder); globs are expanded against the config tree,
    as Hydra does (SpecError for a sweep Hydra cannot expand)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from core.paths import CONF_DIR

    jobs = [tuple(job) for job in before]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        jobs += [tuple(job) for call in calls for job in expand(list(call.overrides), loader)]
    return [list(job) for job in dict.fromkeys(jobs)]


def records(calls: list[SweepCall], results: Path) -> dict[str, list[str]]:
    """{experiment folder: the overrides of the last sweep writing it}: its multirun.yaml,
    what a `moebench -m` of each sweep in turn would leave there."""
    return {str(Path(results) / c.folder): list(c.overrides) for c in calls}


def describe(calls: list[SweepCall]) -> None:
    """One line per sweep on stdout, as `moebench -m` would be called."""
    for call in calls:
        print(f"reproduce {call.experiment}: {' '.join(call.overrides)}", flush=True)
