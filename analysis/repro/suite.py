"""`moebench reproduce|report|claims|figures`: run the experiments, rebuild their outputs.

  moebench reproduce NAME... | all [--jobs N] [--seeds N] [--launcher L [--launcher-arg K=V]]
                                       every run of the experiments' sweeps at their seeds
                                       as one sweep (analysis/repro/plan.py; resumable and
                                       failure-isolated: harness/runner/sweep.py) through
                                       one launcher call (analysis/repro/launch.py), then
                                       each experiment's report
  moebench report NAME... | all [--seeds N]     results/<name>/<name>.{md,tex,csv,png,pdf}
  moebench claims                               results/claims.{md,csv} from every experiment
  moebench figures [--seeds N]                  every report, then the claims (no run)

Reports read result.json files only: rebuilding them reruns nothing, and the same results
give the same bytes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from analysis.repro.claims_table import ONE_SEED_NOTE
from analysis.repro.frame import checked_frame
from analysis.repro.launch import LAUNCHERS, launcher_overrides, run_jobs
from analysis.repro.layout import folders, sweep_plan
from analysis.repro.output import write_figure, write_table
from analysis.repro.plan import (
    describe,
    expand_calls,
    launcher_settings,
    real_calls,
    records,
    synthetic_calls,
)
from analysis.repro.registry import EXPERIMENTS, names
from analysis.repro.spec import SEEDS
from analysis.runs import ReportError
from core.precision import results_label
from core.specs import SpecError
from harness.runner.overrides import parse


def _fresh(results: Path, folder: str) -> None:
    """Delete one experiment folder of the results folder (FRESH=1), and nothing else."""
    path = results / folder
    if path.is_dir() and not path.is_symlink():
        print(f"reproduce: --fresh: removing {path}", flush=True)
        shutil.rmtree(path)


def reproduce(names: list[str], results: Path, override: list[str], *, jobs: int = 2,
              launcher: str = "joblib", launcher_args: list[str] = (),
              n_seeds: int | None = None, fresh: bool = False) -> int:
    """Every run of the experiments `names` (their sweeps times their seeds) as ONE sweep
    through the launcher (a failed run does not stop the others), then each experiment's
    report. Bad input (a launcher that cannot be used, a sweep `moebench -m` would refuse):
    exit 2, nothing written."""
    t0 = time.perf_counter()
    try:
        hydra_overrides = [*launcher_overrides(launcher, jobs, list(launcher_args)),
                           *launcher_settings(override)]
        synthetic = {n: synthetic_calls(n, results, override, n_seeds) for n in names}
        jobs = expand_calls([c for n in names for c in synthetic[n]])
    except SpecError as exc:
        print(f"reproduce: error: {exc}", file=sys.stderr, flush=True)
        return 2
    if fresh:
        for name in names:
            for folder in folders(name, override):
                _fresh(results, folder)
    calls, real, status = [], [], 0
    for name in names:
        own, code = real_calls(name, results, override, n_seeds)
        calls += [*synthetic[name], *own]
        real += own
        status |= code
    describe(calls)
    jobs = expand_calls(real, before=jobs)
    got = run_jobs(jobs, records(calls, results), results, hydra_overrides)
    if got is None:
        print("reproduce: error: the sweep stopped before any run started (its message is "
              "above); no run of it was made", file=sys.stderr, flush=True)
        status = 1
    else:
        status |= got["code"] != 0
        for name in names:
            own = [got["folders"].get(f, {}) for f in folders(name, override)]
            print(f"reproduce {name}: " + ", ".join(
                f"{sum(c.get(k, 0) for c in own)} {k}" for k in ("done", "failed", "skipped")),
                flush=True)
        print(f"reproduce: sweep done in {time.perf_counter() - t0:.0f} s: {got['done']} done, "
              f"{got['failed']} failed, {got['skipped']} skipped", flush=True)
    for name in names:
        status = max(status, report(name, results, override, allow_partial=True,
                                    n_seeds=n_seeds))
    return status


def report(name: str, results: Path, override: list[str] = (), *, allow_mixed: bool = False,
           allow_partial: bool = False, n_seeds: int | None = None) -> int:
    """The experiment's table and figure from its folder, and from its real-sample folder
    when that exists (a table and figure of its own); complete when the first `n_seeds`
    seeds ran (None: all)."""
    status = 0
    for folder, real in zip(folders(name, list(override)), (False, True)):
        if real and not (results / folder).is_dir():
            continue
        axes, count = sweep_plan(name, list(override), real, n_seeds)
        status = max(status, report_folder(name, results / folder, axes=axes,
                                           expected_count=count, allow_mixed=allow_mixed,
                                           allow_partial=allow_partial))
    return status


def report_folder(name: str, folder, *, axes: list[str] | None = None,
                  expected_count: int | None = None, allow_mixed: bool = False,
                  allow_partial: bool = False) -> int:
    """The experiment's report of the runs in one folder, checked as every report is
    (analysis/runs.py): exit 2 and nothing written when the runs are mixed or (without
    allow_partial) incomplete. `moebench table1 DIR` calls it with the folder's own
    multirun.yaml (axes None); the suite with the experiment's sweep plan."""
    try:
        runs = checked_frame(Path(folder), axes=axes, allow_mixed=allow_mixed,
                             allow_partial=allow_partial, expected_count=expected_count)
    except ReportError as exc:
        print(f"report {name}: error: {exc}", file=sys.stderr)
        return 2
    write_report(name, Path(folder), runs)
    return 0


def write_report(name: str, out: Path, runs) -> None:
    """<out>/<name>.{md,tex,csv,png,pdf}: the table and figure are both built before anything
    is written, so a failure leaves the previous files as they were."""
    exp = EXPERIMENTS[name]
    table, header, notes = exp.table(runs)
    fig = exp.figure(table, runs)
    seeds = sorted(set(runs["seed"])) if "seed" in runs and len(runs) else []
    if len(seeds) == 1:  # a quick run: no interval anywhere in this table
        header = [*header, f"Seed {seeds[0]} only: {ONE_SEED_NOTE}."]
    lossy = results_label(runs["_result"]) if len(runs) else None
    if lossy:  # weights below 16 bits: the title and the figure say so (core/precision.py)
        header = [f"{header[0]} [{lossy}]", *header[1:]] if header else [f"[{lossy}]"]
        fig.text(0.01, 0.01, lossy, ha="left", va="bottom", fontsize=7, color="0.35")
    paths = write_table(table, out, name, header, [*notes, *exp.notes,
                                                   *(f"Not expressible: {c}"
                                                     for c in exp.cannot_express)])
    paths += write_figure(fig, out, name)
    print(f"report {name}: wrote {', '.join(str(p) for p in paths)}")


def claims(results: Path) -> int:
    from analysis.repro.claims import write_claims

    return write_claims(results)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="moebench reproduce|report|claims|figures")
    ap.add_argument("command", choices=("reproduce", "report", "claims", "figures"))
    ap.add_argument("names", nargs="*", help=f"experiments or 'all': {', '.join(names())}")
    ap.add_argument("--jobs", type=int, default=2,
                    help="reproduce: runs at a time with the joblib launcher (1: one after "
                         "another, Hydra's basic launcher)")
    ap.add_argument("--launcher", default="joblib", choices=tuple(LAUNCHERS),
                    help="reproduce: the Hydra launcher that gets every run at once "
                         "(docs/reproduction.md, 'Running the suite on a cluster')")
    ap.add_argument("--launcher-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="reproduce: a setting of the launcher, hydra.launcher.KEY (e.g. "
                         "ray.init.address=auto, partition=cpu, timeout_min=120)")
    ap.add_argument("--seeds", type=int, default=None, metavar="N",
                    help=f"reproduce, report, figures: the first N of the seeds {SEEDS} "
                         "(default: all); a sweep that sets its seed keeps it")
    ap.add_argument("--results", default="results", help="results folder (default: results)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="reproduce, report: a Hydra override added to every sweep, for a "
                         "quick look (e.g. workload.num_requests=20); such runs differ from "
                         "the pinned setting and go to a folder of their own, "
                         "results/<name>-<key>=<value>/ (hydra.launcher.KEY=VALUE: a "
                         "launcher setting)")
    ap.add_argument("--fresh", action="store_true",
                    help="reproduce: delete the folders this command writes first")
    ap.add_argument("--allow-mixed", action="store_true",
                    help="report: tabulate runs that differ in other keys (noted)")
    ap.add_argument("--allow-partial", action="store_true",
                    help="report: tabulate a folder with missing runs (marked PARTIAL)")
    return ap


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    results = Path(args.results)
    chosen = names() if args.names in ([], ["all"]) else args.names
    bad = [n for n in chosen if n not in EXPERIMENTS]
    if bad:
        ap.error(f"unknown experiments {bad}; known: {', '.join(names())}")
    if args.seeds is not None and not 1 <= args.seeds <= len(SEEDS):
        ap.error(f"--seeds: {args.seeds}; between 1 and {len(SEEDS)} (the seeds {SEEDS})")
    try:
        parse(args.override)
    except SpecError as exc:
        ap.error(str(exc))
    if args.command == "claims":
        return claims(results)
    if args.command == "reproduce":
        return reproduce(chosen, results, args.override, jobs=args.jobs,
                         launcher=args.launcher, launcher_args=args.launcher_arg,
                         n_seeds=args.seeds, fresh=args.fresh)
    # figures rebuilds whatever ran: an incomplete folder's table is marked PARTIAL
    status = max([report(name, results, args.override, allow_mixed=args.allow_mixed,
                         allow_partial=args.allow_partial or args.command == "figures",
                         n_seeds=args.seeds) for name in chosen])
    if args.command == "figures":
        status = max(status, claims(results))
    return status


def reproduce_main(argv: list[str]) -> int:
    return main(["reproduce", *argv])


def report_main(argv: list[str]) -> int:
    return main(["report", *argv])


def claims_main(argv: list[str]) -> int:
    return main(["claims", *argv])


def figures_main(argv: list[str]) -> int:
    return main(["figures", *argv])
