"""`moebench reproduce|report|claims|figures`: run the experiments, rebuild their outputs.

  moebench reproduce NAME... | all [--jobs N]   run each experiment's sweeps (resumable and
                                                failure-isolated: harness/runner/sweep.py;
                                                joblib launcher with N jobs), then its report
  moebench report NAME... | all                 results/<name>/<name>.{md,tex,csv,png,pdf}
  moebench claims                               results/claims.{md,csv} from every experiment
  moebench figures                              every report, then the claims (no run)

Reports read result.json files only: rebuilding them reruns nothing, and the same results
give the same bytes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from analysis.repro.frame import checked_frame
from analysis.repro.layout import folders, sweep_plan
from analysis.repro.output import write_figure, write_table
from analysis.repro.real import real_overrides
from analysis.repro.registry import EXPERIMENTS, names
from analysis.runs import ReportError
from core.specs import SpecError
from harness.runner.overrides import assign, parse
from harness.runner.parent import launching
from harness.runner.sweep import COUNTS_ENV

JOBLIB = "hydra_plugins.hydra_joblib_launcher"  # the joblib launcher's plug-in module


def _launcher(jobs: int) -> list[str]:
    if jobs <= 1:
        return []
    import importlib.util

    if importlib.util.find_spec(JOBLIB) is None:
        print(f"reproduce: the joblib launcher is not installed ({JOBLIB}); running the jobs "
              "one at a time with Hydra's basic launcher", flush=True)
        return []
    return ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]


def _sweep(name: str, overrides: tuple[str, ...], jobs: int, extra: list[str]) -> dict | None:
    """Run one sweep in a child `moebench -m`; its outcome counts, or None when it stopped
    before its first job (a config Hydra cannot compose, a launcher it cannot find)."""
    cmd = [sys.executable, "-m", "moebench.cli", "-m", f"experiment={name}", *overrides,
           *extra, "progress=false", *_launcher(jobs)]
    print(f"reproduce {name}: {' '.join(cmd[3:])}", flush=True)
    with tempfile.TemporaryDirectory(prefix="moebench-sweep-") as tmp:
        counts = Path(tmp) / "counts.json"
        code = subprocess.run(cmd, env={**launching(), COUNTS_ENV: str(counts)}).returncode
        if not counts.is_file():
            return None
        out = json.loads(counts.read_text())
    out["code"] = code
    return out


def _fresh(results: Path, folder: str) -> None:
    """Delete one experiment folder of the results folder (FRESH=1), and nothing else."""
    path = results / folder
    if path.is_dir() and not path.is_symlink():
        print(f"reproduce: --fresh: removing {path}", flush=True)
        shutil.rmtree(path)


def reproduce(name: str, jobs: int, results: Path, override: list[str],
              fresh: bool = False) -> int:
    """Run every sweep of `name` (a failed sweep does not stop the others), then report."""
    exp, status, t0 = EXPERIMENTS[name], 0, time.perf_counter()
    main_dir, real_dir = folders(name, override)
    own_routing = any(i.key == "routing" for i in parse(override))
    if fresh:
        for folder in (main_dir, real_dir):
            _fresh(results, folder)
    counts = {"done": 0, "failed": 0, "skipped": 0}
    for sweep in exp.sweeps:
        extra = [f"results_dir={results}", *override, assign("experiment_name", main_dir)]
        if sweep.real:
            if own_routing:
                print(f"reproduce {name}: real-routing sweep skipped: routing= is given",
                      flush=True)
                continue
            try:
                real = real_overrides(exp, results)
            except ReportError as exc:  # the sample is there but does not import
                print(f"reproduce {name}: real-routing sweep skipped: {exc}", flush=True)
                status = 1
                continue
            if real is None:
                print(f"reproduce {name}: real-routing sweep skipped: the shared sample for "
                      f"{exp.real_model} is absent (MOEBENCH_SHARED_DATA)", flush=True)
                continue
            # the sample fixes its requests: a request count override is not for it
            kept = [o for o in override if not o.startswith("workload.num_requests=")]
            extra = [f"results_dir={results}", *kept, *real, assign("experiment_name", real_dir)]
        got = _sweep(name, sweep.overrides, jobs, extra)
        if got is None:
            print(f"reproduce {name}: error: the sweep stopped before any run started "
                  "(its message is above); no run of it was made", file=sys.stderr, flush=True)
            status = 1
            continue
        for key in counts:
            counts[key] += got.get(key, 0)
        status |= got["code"] != 0
    print(f"reproduce {name}: sweeps done in {time.perf_counter() - t0:.0f} s: "
          f"{counts['done']} done, {counts['failed']} failed, {counts['skipped']} skipped",
          flush=True)
    return max(status, report(name, results, override, allow_partial=True))


def report(name: str, results: Path, override: list[str] = (), *, allow_mixed: bool = False,
           allow_partial: bool = False) -> int:
    """The experiment's table and figure from its folder, and from its real-sample folder
    when that exists (a table and figure of its own)."""
    status = 0
    for folder, real in zip(folders(name, list(override)), (False, True)):
        if real and not (results / folder).is_dir():
            continue
        axes, count = sweep_plan(name, list(override), real)
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
    paths = write_table(table, out, name, header, [*notes, *exp.notes,
                                                   *(f"Not expressible: {c}"
                                                     for c in exp.cannot_express)])
    paths += write_figure(fig, out, name)
    print(f"report {name}: wrote {', '.join(str(p) for p in paths)}")


def claims(results: Path) -> int:
    from analysis.repro.claims import write_claims

    return write_claims(results)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench reproduce|report|claims|figures")
    ap.add_argument("command", choices=("reproduce", "report", "claims", "figures"))
    ap.add_argument("names", nargs="*", help=f"experiments or 'all': {', '.join(names())}")
    ap.add_argument("--jobs", type=int, default=2, help="parallel runs per sweep (joblib)")
    ap.add_argument("--results", default="results", help="results folder (default: results)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="reproduce, report: a Hydra override added to every sweep, for a "
                         "quick look (e.g. workload.num_requests=20); such runs differ from "
                         "the pinned setting and go to a folder of their own, "
                         "results/<name>-<key>=<value>/")
    ap.add_argument("--fresh", action="store_true",
                    help="reproduce: delete the folders this command writes first")
    ap.add_argument("--allow-mixed", action="store_true",
                    help="report: tabulate runs that differ in other keys (noted)")
    ap.add_argument("--allow-partial", action="store_true",
                    help="report: tabulate a folder with missing runs (marked PARTIAL)")
    args = ap.parse_args(argv)
    results = Path(args.results)
    chosen = names() if args.names in ([], ["all"]) else args.names
    bad = [n for n in chosen if n not in EXPERIMENTS]
    if bad:
        ap.error(f"unknown experiments {bad}; known: {', '.join(names())}")
    try:
        parse(args.override)
    except SpecError as exc:
        ap.error(str(exc))
    if args.command == "claims":
        return claims(results)
    status = 0
    for name in chosen:
        if args.command == "reproduce":
            code = reproduce(name, args.jobs, results, args.override, args.fresh)
        else:
            # figures rebuilds whatever ran: an incomplete folder's table is marked PARTIAL
            code = report(name, results, args.override, allow_mixed=args.allow_mixed,
                          allow_partial=args.allow_partial or args.command == "figures")
        status = max(status, code)
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
