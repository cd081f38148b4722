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
import subprocess
import sys
import time
from pathlib import Path

from analysis.repro.frame import frame
from analysis.repro.output import write_figure, write_table
from analysis.repro.real import real_overrides
from analysis.repro.registry import EXPERIMENTS, names
from analysis.runs import ReportError


def _sweep(name: str, overrides: tuple[str, ...], jobs: int, extra: list[str]) -> int:
    launcher = (["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"] if jobs > 1
                else [])
    cmd = [sys.executable, "-m", "moebench.cli", "-m", f"experiment={name}", *overrides,
           *extra, "progress=false", *launcher]
    print(f"reproduce {name}: {' '.join(cmd[3:])}", flush=True)
    return subprocess.run(cmd).returncode


def reproduce(name: str, jobs: int, results: Path, override: list[str]) -> int:
    """Run every sweep of `name` (a failed sweep does not stop the others), then report."""
    exp, status, t0 = EXPERIMENTS[name], 0, time.perf_counter()
    for sweep in exp.sweeps:
        extra = [f"results_dir={results}", *override]
        if sweep.real:
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
            extra = [*extra, *real]
        status |= _sweep(name, sweep.overrides, jobs, extra) != 0
    print(f"reproduce {name}: sweeps done in {time.perf_counter() - t0:.0f} s"
          + (" (some runs failed: see above)" if status else ""), flush=True)
    return max(status, report(name, results))


def report(name: str, results: Path) -> int:
    """The experiment's table and figure from its results folder."""
    exp = EXPERIMENTS[name]
    out = results / name
    try:
        runs = frame(out)
    except ReportError as exc:
        print(f"report {name}: error: {exc}", file=sys.stderr)
        return 2
    table, header, notes = exp.table(runs)
    paths = write_table(table, out, name, header, [*notes, *exp.notes,
                                                   *(f"Not expressible: {c}"
                                                     for c in exp.cannot_express)])
    paths += write_figure(exp.figure(table, runs), out, name)
    print(f"report {name}: wrote {', '.join(str(p) for p in paths)}")
    return 0


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
                    help="reproduce: a Hydra override added to every sweep, for a quick look "
                         "(e.g. workload.num_requests=20; the results then differ from the "
                         "pinned setting)")
    args = ap.parse_args(argv)
    results = Path(args.results)
    chosen = names() if args.names in ([], ["all"]) else args.names
    bad = [n for n in chosen if n not in EXPERIMENTS]
    if bad:
        ap.error(f"unknown experiments {bad}; known: {', '.join(names())}")
    if args.command == "claims":
        return claims(results)
    status = 0
    for name in chosen:
        status = max(status, reproduce(name, args.jobs, results, args.override)
                     if args.command == "reproduce" else report(name, results))
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
