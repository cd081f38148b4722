"""`moebench bench-memory`: the runner's memory estimate (harness/runner/footprint.py) against
the measured peak RSS of the same run, SIMULATED on synthetic routing.

Per setting, the estimate is computed here from the config alone; the run itself goes through
`run_config` in a fresh child process (its own interpreter, no trace cache, one BLAS thread),
which reports its peak RSS (VmHWM: ru_maxrss on Linux, harness/bench/process.py). A setting
passes when estimate / measured is within 1 +- TOLERANCE. The first row, a 1-request run,
shows what footprint.BASE_BYTES stands for.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from harness.bench.process import run_child

TOLERANCE = 0.30
BASE = ("1 request (the base)", ("workload.num_requests=1", "workload.prompt_len=1",
                                 "workload.output_len=1", "calibration_requests=1"))
# The Table 1 setting; a system with a calibration split; a larger trace (docs/engine.md)
SETTINGS = (("Table 1, lru", ("experiment=table1", "system=lru")),
            ("Table 1, moe_infinity (calibration split)",
             ("experiment=table1", "system=moe_infinity")),
            ("1,000 requests, lru", ("experiment=table1", "system=lru",
                                     "workload.num_requests=1000")))
_FIXED = ("progress=false", "trace_cache_dir=null")


def estimate_bytes(overrides) -> dict:
    """The runner's estimate of the run `moebench <overrides>` (nothing generated)."""
    from core.specs import model_spec_from_dict
    from core.targets import build_target
    from harness.runner.config import compose_config
    from harness.runner.footprint import estimate
    from systems.base import System

    cfg = compose_config([*_FIXED, *overrides])
    model = model_spec_from_dict(cfg["model"], "model")
    fp = estimate(cfg, model, build_target(cfg["system"], "system", System))
    return {"bytes": fp.total_bytes, "phase": fp.phase, "parts": fp.parts}


def measure_peak(overrides) -> dict:
    """Run `moebench <overrides>` through run_config in a fresh child; its peak RSS in bytes
    and the run's status and accesses."""
    with tempfile.TemporaryDirectory() as results:
        p = run_child("harness.bench.memory", ["--child", results, *overrides])
    if p.returncode != 0:
        raise RuntimeError(f"bench-memory child {overrides} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _child(results: str, overrides: list[str]) -> int:
    from harness.bench.process import peak_rss_mb
    from harness.runner.config import compose_config
    from harness.runner.run import run_config

    cfg = compose_config([*_FIXED, *overrides], run_name="bench_memory", results_dir=results)
    result = run_config(cfg)
    print(json.dumps({"peak_bytes": int(peak_rss_mb() * 2**20), "status": result["status"],
                      "accesses": (result["metrics"] or {}).get("accesses")}))
    return 0


def compare(label: str, overrides) -> dict:
    """One setting: estimate, measured peak, their ratio and whether it is within tolerance."""
    est, got = estimate_bytes(overrides), measure_peak(overrides)
    ratio = est["bytes"] / got["peak_bytes"]
    return {"setting": label, "overrides": list(overrides), "estimate_bytes": est["bytes"],
            "phase": est["phase"], "parts": est["parts"], "peak_bytes": got["peak_bytes"],
            "status": got["status"], "accesses": got["accesses"], "ratio": ratio,
            "within": abs(ratio - 1) <= TOLERANCE}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench bench-memory", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--config", action="append", default=[], metavar="OVERRIDES",
                    help="another setting: space-separated overrides, e.g. "
                         "'experiment=table1 system=fmoe max_batch=32' (repeatable)")
    ap.add_argument("--json", help="write the rows here as JSON")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args.child:
        return _child(args.child, rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    from harness.runner.footprint import size_text

    settings = [BASE, *SETTINGS, *((c, tuple(c.split())) for c in args.config)]
    print(f"bench-memory: SIMULATED, synthetic routing; estimate (harness/runner/footprint.py) "
          f"vs peak RSS of a fresh child per setting; within +-{TOLERANCE:.0%}")
    print("| setting | estimate | measured peak | estimate / peak | within | peak phase |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = []
    for label, overrides in settings:
        row = compare(label, overrides)
        rows.append(row)
        print(f"| {label} | {size_text(row['estimate_bytes'])} | {size_text(row['peak_bytes'])} "
              f"| {row['ratio']:.2f} | {'yes' if row['within'] else 'NO'} | {row['phase']} |",
              flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"simulated": True, "tolerance": TOLERANCE, "rows": rows}, fh, indent=1)
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
