"""`moebench bench-sim [--json PATH]`: SIMULATED engine timing on synthetic routing.

Per system of the Table 1 setting (and at 1,000 requests, and at batch 32 with every request
arriving at once), in a fresh child process each (so peak RSS is that run's own):
- CPU seconds (time.process_time, BLAS pinned to one thread so idle OpenBLAS workers do not
  count) from the in-memory trace to the finished result tables: Engine construction with
  its indexes, warm-up of history-based systems, engine.run(), rec.tables(), summarize();
  median of the runs (--repeats at least, more while they add up to under --min-cpu-s).
  Trace generation (measure + calibration split), compute_floor_ms and
  result writing (write_run, parquet included) are timed and reported separately;
- RSS of the child (ru_maxrss, VmRSS): the peak through trace generation, the RSS the traces
  keep, the peak from there through the engine's tables and metrics (the peak is reset after
  generation where Linux allows), and the whole run's peak (result writing included);
- in the same process, the reference loop (harness/bench/reference_lru.py) over the same
  trace's access stream at batch 1, run after each engine run, and the ratio engine /
  reference accesses per CPU-s: the median over the runs (`pair_ratios`), each run measured
  against the mean of the reference runs on either side of it, so each ratio compares runs
  made in the same state of a noisy machine;
- at 1,000 requests and at batch 32, the engine at the Table 1 setting too, run after each
  reference run in the same child: each run's per-access cost against the Table 1 runs on
  either side of it (`cost_vs_base`), the binding scaling figure (harness/bench/sim_child.py).
The lru child at the first setting also runs `system=lru system.prefetch=false` once and
checks that the reference's hit / miss counts equal it, per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from harness.bench.process import BLAS_ENV, run_child
from harness.bench.sim_child import MAX_RUNS, child
from harness.bench.sim_targets import TABLE1_SYSTEMS, checks, time_table1

LABEL = "SIMULATED engine timing on synthetic routing"
# (JSON key suffix, requests (None: --requests), max_batch)
SETTINGS = (("", None, 1), ("_1000_requests", 1000, 1), ("_batch32", None, 32))


def _spawn(system: str, requests: int, batch: int, repeats: int, min_cpu_s: float,
           check: bool, base: tuple[int, int] | None) -> dict:
    cmd = ["--child", system, "--requests", str(requests), "--batch", str(batch),
           "--repeats", str(repeats), "--min-cpu-s", str(min_cpu_s)]
    if check:
        cmd.append("--check")
    if base is not None:
        cmd += ["--base", f"{base[0]},{base[1]}"]
    p = run_child("harness.bench.sim", cmd)
    if p.returncode != 0:
        return {"system": system, "status": "failed", "error": p.stderr.strip()[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _cost(requests: int, repeats: int) -> dict:
    """The engine cost model (harness/bench/engine_cost.py) in a fresh child; printed."""
    print(f"\nengine cost model (on_demand, {requests} requests, batch 1/4/16, three budgets; "
          "least squares; microseconds of CPU):")
    p = run_child("harness.bench.sim", ["--cost-child", "--requests", str(requests),
                                        "--repeats", str(repeats)])
    if p.returncode != 0:
        print(f"  FAILED\n{p.stderr.strip()[-2000:]}", file=sys.stderr)
        return {"status": "failed", "error": p.stderr.strip()[-2000:]}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for core, f in out["cores"].items():
        print(f"  {core:<9} per run {f['fixed_ms']:.0f} ms, per block {f['block_us']:.2f} us, "
              f"per access {f['access_us']:.3f} us, per load {f['load_us']:.2f} us "
              f"(largest residual {100 * f['max_relative_residual']:.1f} %)"
              + ("" if f["separable"] else "; NOT SEPARATED: a negative term, read the "
                 "settings' CPU s in the JSON instead"))
    return {"status": "ok", **out}


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="moebench bench-sim", description=LABEL)
    ap.add_argument("--json", help="write the figures here (make bench-sim: results/)")
    ap.add_argument("--systems", help="comma-separated (default: every Table 1 system)")
    ap.add_argument("--requests", type=int, default=290, help="measured requests (Table 1: 290)")
    ap.add_argument("--repeats", type=int, default=3, help="at least this many runs (median)")
    ap.add_argument("--min-cpu-s", type=float, default=12.0,
                    help=f"more runs (at most {MAX_RUNS}) until a setting's engine runs, and "
                         "the Table 1 runs beside them, add up to this many CPU-s (default 12)")
    ap.add_argument("--skip-1000", action="store_true", help="no 1,000-request setting")
    ap.add_argument("--skip-batch32", action="store_true", help="no batch-32 setting")
    ap.add_argument("--skip-table1", action="store_true",
                    help="do not time the whole Table 1 sweep (make reproduce-table1's runs)")
    ap.add_argument("--skip-cost", action="store_true",
                    help="do not fit the engine's per block / access / load costs")
    ap.add_argument("--cost-requests", type=int, default=60,
                    help="requests of the cost-model fit's trace (default 60)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--cost-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)  # "requests,max_batch" of Table 1
    return ap


def _as_child(args: argparse.Namespace) -> dict:
    """This process is a child: the cost model's figures, or one system at one setting."""
    from harness.runner.guard import blas_threads

    with blas_threads(1):
        if args.cost_child:
            from harness.bench.engine_cost import measure

            return measure(args.requests, args.repeats)
        base = tuple(int(x) for x in args.base.split(",")) if args.base else None
        return child(args.child, args.requests, args.batch, args.repeats, args.min_cpu_s,
                     args.check, base)


# the per-system figures the JSON's `systems` block keeps, per setting (key + suffix)
FIGURES = ("accesses", "accesses_per_cpu_s", "peak_rss_mb", "peak_rss_engine_mb",
           "peak_rss_metrics_mb", "rss_after_trace_mb", "ratio",
           "reference_accesses_per_cpu_s", "bytes_per_access_beyond_trace",
           "bytes_per_access_beyond_trace_with_tables",
           "bytes_per_access_beyond_trace_with_metrics", "engine_core",
           "sys_share", "bytes_per_access_beyond_trace_built",
           "bytes_per_access_beyond_trace_warmed",
           "bytes_per_access_beyond_trace_warmup_peak", "cost_vs_base")


def _row(name: str, r: dict) -> str:
    sys_pct = None if r.get("sys_share") is None else 100 * r["sys_share"]
    return (f"{name:<14}{_fmt(r.get('accesses'), 'd'):>10}"
            f"{_fmt(r.get('accesses_per_cpu_s'), ',.0f'):>11}"
            f"{_fmt(r.get('reference_accesses_per_cpu_s'), ',.0f'):>14}"
            f"{_fmt(r.get('ratio'), '.4f'):>8}{_fmt(r.get('rss_after_trace_mb'), '.0f'):>10}"
            f"{_fmt(r.get('peak_rss_engine_mb'), '.0f'):>10}"
            f"{_fmt(r.get('peak_rss_mb'), '.0f'):>9}{'':>3}"
            f"{_fmt(r.get('trace_gen_cpu_s'), '.2f'):>7}"
            f"{_fmt(r.get('write_cpu_s'), '.2f'):>8}"
            f"{_fmt(sys_pct, '.0f'):>6}"
            f"{_fmt(r.get('cost_vs_base'), '.3f'):>8}"
            + ("" if r["status"] == "ok" else f"  {r['status']}"))


def _measure(args: argparse.Namespace, systems: list[str], settings: list) -> tuple:
    """Every system at every setting, each in a fresh child: (details per setting, figures
    per system, the reference check)."""
    details, figures, check = {}, {s: {} for s in systems}, None
    for suffix, n_req, batch in settings:
        n_req = n_req or args.requests
        tag = f"{n_req} requests, batch {batch}"
        details[tag] = {}
        print(f"\n{tag}\n{'system':<14}{'accesses':>10}{'acc/cpu-s':>11}{'ref acc/cpu-s':>14}"
              f"{'ratio':>8}{'rss trace':>10}{'engine pk':>10}{'peak rss':>9}{'MB':>3}"
              f"{'gen s':>7}{'write s':>8}{'sys %':>6}{'cost/T1':>8}")
        for name in systems:
            r = _spawn(name, n_req, batch, args.repeats, args.min_cpu_s,
                       check is None and name == "lru" and batch == 1 and suffix == "",
                       None if suffix == "" else (args.requests, 1))
            details[tag][name] = r
            check = r.get("reference_check", check)
            figures[name]["status" + suffix] = r["status"]
            figures[name].update({key + suffix: r.get(key) for key in FIGURES})
            print(_row(name, r))
            if r["status"] == "failed":
                print(r["error"], file=sys.stderr)
    return details, figures, check


def _print_ratios(systems: list[str], settings: list, figures: dict, check: dict | None):
    for suffix, _, _ in settings:
        line = ", ".join(f"{s} {figures[s]['ratio' + suffix]:.4f}" for s in systems
                         if figures[s].get("ratio" + suffix) is not None)
        print(f"ratio engine/reference{suffix or ''} (accesses per CPU-s, same process): {line}")
    if check is not None:
        print(f"reference check vs {check['system']} at batch 1: "
              f"{'match' if check['match'] else 'MISMATCH'} (engine {check['engine']}, "
              f"reference {check['reference']})")


def _table1(requests: int) -> dict:
    print(f"\nTable 1 sweep ({TABLE1_SYSTEMS}, {requests} requests, fresh results and "
          "trace cache, one process): ", end="", flush=True)
    table1 = time_table1(requests)
    print(f"{table1['cpu_s']:.1f} CPU s, {table1['wall_s']:.1f} s wall, largest run folder "
          f"{table1['largest_run_mb']:.1f} MB" if table1["status"] == "ok"
          else f"FAILED\n{table1['error']}")
    return table1


def _print_targets(targets: list) -> None:
    print("\ntargets (issue 'Engine speed and memory'):")
    for name, value, want, ok in targets:
        mark = "info" if ok is None else "ok  " if ok else "MISS"
        print(f"  {mark} {name}: {_fmt(value, '.4g')} (target {want})")


def _document(args: argparse.Namespace, figures: dict, check, details: dict, cost,
              table1, targets: list) -> dict:
    return {"label": LABEL, "simulated": True, "synthetic_routing": True,
            "setting": {"experiment": "table1", "requests": args.requests,
                        "repeats": args.repeats, "min_cpu_s": args.min_cpu_s,
                        "max_runs": MAX_RUNS, "timer": "time.process_time, fresh process",
                        # moebench's default "0" (moebench/__init__.py); None: numpy's own
                        "numpy_madvise_hugepage": os.environ.get("NUMPY_MADVISE_HUGEPAGE"),
                        "blas_threads": 1, "cpus": os.cpu_count()},
            "systems": figures, "reference_check": check, "details": details,
            "engine_cost": cost,
            "table1_sweep": table1,
            "targets": [{"name": n, "value": v, "target": w, "met": ok}
                        for n, v, w, ok in targets]}


def main(argv: list[str]) -> int:
    from harness.runner.config import system_names

    ap = _parser()
    args = ap.parse_args(argv)
    if args.requests < 1 or args.repeats < 1 or args.min_cpu_s < 0:
        ap.error("--requests and --repeats must be >= 1, --min-cpu-s >= 0")
    if args.cost_child or args.child:
        print(json.dumps(_as_child(args)))
        return 0
    known = system_names()
    systems = args.systems.split(",") if args.systems else known
    bad = [s for s in systems if s not in known]
    if bad:
        ap.error(f"--systems: unknown {bad}; known: {known}")
    settings = [s for s in SETTINGS if not (s[0] == "_1000_requests" and args.skip_1000)
                and not (s[0] == "_batch32" and args.skip_batch32)]
    print(f"bench-sim: {LABEL}; experiment=table1, {args.requests} requests, median of "
          f">= {args.repeats} runs (more up to {MAX_RUNS} while under {args.min_cpu_s:g} CPU-s), "
          "CPU s (process_time) of a fresh process per system, BLAS 1 thread, "
          f"NUMPY_MADVISE_HUGEPAGE={os.environ.get('NUMPY_MADVISE_HUGEPAGE', 'unset')}")
    details, figures, check = _measure(args, systems, settings)
    _print_ratios(systems, settings, figures, check)
    cost = None if args.skip_cost else _cost(args.cost_requests, args.repeats)
    table1 = None if args.skip_table1 else _table1(args.requests)
    targets = checks(figures, table1)
    _print_targets(targets)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = _document(args, figures, check, details, cost, table1, targets)
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")
    return 0 if all(r["status"] != "failed" for d in details.values() for r in d.values()) \
        else 1


if __name__ == "__main__":
    for _k, _v in BLAS_ENV.items():  # before numpy loads: a child's BLAS starts with one thread
        os.environ.setdefault(_k, _v)
    sys.exit(main(sys.argv[1:]))
