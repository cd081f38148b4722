"""Where an experiment's runs live, and what its report expects there.

  results/<name>/          the synthetic sweeps of the pinned setting (conf/experiment/<name>.yaml)
  results/<name>_real/     its sweeps on a shared real routing sample (analysis/repro/real.py)
  results/<name>-<k>=<v>/  the same sweeps with other settings (`--override k=v`): a folder of
                           their own (harness/runner/overrides.py); results/<name>_real-<k>=<v>/

Every sweep runs at the experiment's seeds (analysis/repro/spec.py, `seeds`) unless it sets
`seed` itself: `seed` is an axis of every folder. A folder's multirun.yaml records one
sweep only (the last that wrote it), so its report takes the axes and the expected number
of runs from the experiment's sweeps and the seeds asked for (`sweep_plan`).
"""

from __future__ import annotations

from analysis.repro.registry import EXPERIMENTS
from analysis.repro.spec import Experiment, Sweep
from harness.runner.overrides import experiment_folder, parse
from harness.runner.sweep_size import sweep_size


def folders(name: str, override: list[str]) -> tuple[str, str]:
    """(folder of the synthetic sweeps, folder of the real-sample sweeps) under the results
    folder: results/<name>/ and results/<name>_real/ for the pinned setting, a folder of
    their own when `override` changes it (harness/runner/overrides.py)."""
    base = experiment_folder([f"experiment={name}", *override]) or name
    return base, f"{name}_real{base[len(name):]}"


def chosen_seeds(exp: Experiment, n: int | None) -> tuple[int, ...]:
    """The experiment's first `n` seeds (all of them for None)."""
    return exp.seeds if n is None else exp.seeds[:n]


def seeded(sweep: Sweep, seeds: tuple[int, ...], override: list[str] = ()) -> tuple[str, ...]:
    """The sweep's overrides with the seed axis: `seed=0,1,...` added unless the sweep or the
    command's overrides set `seed` (workload_shift's sweeps pin theirs). A sweep on a real
    sample runs the first seed only: the sample fixes its requests, so its replicates are
    those requests (a request bootstrap, analysis/repro/stats.py), not seeds."""
    seeds = seeds[:1] if sweep.real else seeds
    if not seeds or any(i.key == "seed" for i in parse([*sweep.overrides, *override])):
        return tuple(sweep.overrides)
    return (*sweep.overrides, "seed=" + ",".join(str(s) for s in seeds))


def sweep_plan(name: str, override: list[str], real: bool,
               n_seeds: int | None = None) -> tuple[list[str], int | None]:
    """(axes, expected run count) of one of the experiment's folders when its first
    `n_seeds` seeds ran (None: all). The axes: `seed` and the keys the sweeps sweep, or,
    for a folder several sweeps write, every key they set (one sweep's constant is another's
    axis); the system is the row. The count: the sum of the sweeps' sizes (None when one
    does not parse)."""
    exp = EXPERIMENTS[name]
    sweeps = [seeded(s, chosen_seeds(exp, n_seeds), override)
              for s in exp.sweeps if s.real == real]
    items = [i for s in sweeps for i in parse(list(s))]
    keys = {i.key.replace("/", ".") for i in items if i.sweep or len(sweeps) > 1}
    sizes = [sweep_size([f"experiment={name}", *s, *override]) for s in sweeps]
    total = None if not sizes or any(n is None for n in sizes) else sum(sizes)
    return sorted((keys | {"seed"}) - {"system"}), total


def experiment_frame(name: str, results, override: list[str] = (), real: bool = False, *,
                     allow_mixed: bool = False, allow_partial: bool = False,
                     n_seeds: int | None = None):
    """The checked runs of one of the experiment's folders (analysis/repro/frame.py,
    `checked_frame`: ReportError when they are mixed, absent or incomplete without
    allow_partial) when its first `n_seeds` seeds ran (None: all)."""
    from pathlib import Path

    from analysis.repro.frame import checked_frame

    folder = Path(results) / folders(name, list(override))[int(real)]
    axes, count = sweep_plan(name, list(override), real, n_seeds)
    return checked_frame(folder, axes=axes, expected_count=count, allow_mixed=allow_mixed,
                         allow_partial=allow_partial)
