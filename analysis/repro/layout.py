"""Where an experiment's runs live, and what its report expects there.

  results/<name>/          the synthetic sweeps of the pinned setting (conf/experiment/<name>.yaml)
  results/<name>_real/     its sweeps on a shared real routing sample (analysis/repro/real.py)
  results/<name>-<k>=<v>/  the same sweeps with other settings (`--override k=v`): a folder of
                           their own (harness/runner/overrides.py); results/<name>_real-<k>=<v>/

A folder that one sweep wrote holds Hydra's multirun.yaml, which names its axes and rows
(analysis/runs.py). A folder that several sweeps wrote keeps only the last one's, so its
report takes the axes (every key the sweeps set besides the system) and the expected number
of runs from the experiment's sweeps (`sweep_plan`).
"""

from __future__ import annotations

from analysis.repro.registry import EXPERIMENTS
from harness.runner.overrides import experiment_folder, parse
from harness.runner.sweep_size import sweep_size


def folders(name: str, override: list[str]) -> tuple[str, str]:
    """(folder of the synthetic sweeps, folder of the real-sample sweeps) under the results
    folder: results/<name>/ and results/<name>_real/ for the pinned setting, a folder of
    their own when `override` changes it (harness/runner/overrides.py)."""
    base = experiment_folder([f"experiment={name}", *override]) or name
    return base, f"{name}_real{base[len(name):]}"


def sweep_plan(name: str, override: list[str], real: bool) -> tuple[list[str] | None,
                                                                      int | None]:
    """(axes, expected run count) for a folder several sweeps wrote; (None, None) where one
    sweep did, whose multirun.yaml then names its axes and rows."""
    sweeps = [s for s in EXPERIMENTS[name].sweeps if s.real == real]
    if len(sweeps) <= 1:
        return None, None
    keys = {i.key.replace("/", ".") for s in sweeps for i in parse(list(s.overrides))}
    sizes = [sweep_size([f"experiment={name}", *s.overrides, *override]) for s in sweeps]
    total = None if any(n is None for n in sizes) else sum(sizes)
    return sorted(keys - {"system"}), total


def experiment_frame(name: str, results, override: list[str] = (), real: bool = False, *,
                     allow_mixed: bool = False, allow_partial: bool = False):
    """The checked runs of one of the experiment's folders (analysis/repro/frame.py,
    `checked_frame`: ReportError when they are mixed, absent or incomplete without
    allow_partial)."""
    from pathlib import Path

    from analysis.repro.frame import checked_frame

    folder = Path(results) / folders(name, list(override))[int(real)]
    axes, count = sweep_plan(name, list(override), real)
    return checked_frame(folder, axes=axes, expected_count=count, allow_mixed=allow_mixed,
                         allow_partial=allow_partial)
