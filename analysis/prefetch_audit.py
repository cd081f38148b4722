"""`moebench audit-prefetch`: does prefetching ever make a system slower than itself without it?

Runs every system at the Table 1 setting twice, with `system.prefetch=true` and `false`, on
synthetic routing (several seeds) and on the shared real DeepSeek-V2-Lite sample when it is
present (calibration prompts 1-500, measured 501-1000, 8 teacher-forced decode steps), then
writes results/audit_prefetch/audit.{md,csv}: per system and routing, TPOT mean / p99, decode
hit rate, prefetch churn, precision, recall and prefetches per decode token for both runs,
the TPOT ratio with / without prefetch, and the verdict (prefetch on is at most 1 % slower on
every seed). SIMULATED; synthetic routing labelled as such.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import pandas as pd

from analysis.runs import ReportError, collect, publish
from core.shared_data import shared_file
from harness.runner.config import compose_config, system_names
from harness.runner.results import config_hash
from harness.runner.store import default_run_name
from workloads.importers import main as import_routing

SAMPLE = ("routing_deepseek_v2_lite_sample", "prefill_routing_prompts_0001_1000.jsonl.gz")
TOLERANCE = 0.01  # prefetch on may be at most 1 % slower than off
COLUMNS = {  # column -> metrics path
    "tpot_mean_ms": ("tpot_ms", "mean"), "tpot_p99_ms": ("tpot_ms", "p99"),
    "hit_rate_decode": ("hit_rate_decode",), "prefetch_churn": ("prefetch_churn",),
    "prefetch_precision": ("prefetch_precision",), "prefetch_recall": ("prefetch_recall",),
    "prefetches_per_decode_token": ("prefetches_per_decode_token",),
}


def _metric(result: dict, path: tuple[str, ...]):
    node = result.get("metrics") or {}
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _real_traces(out: Path) -> tuple[Path, Path] | None:
    """Import the shared sample once (calibration 0:500, measured 500:); None when absent."""
    sample = shared_file(*SAMPLE)
    if sample is None:
        return None
    traces = out / "traces"
    splits = {"cal.npz": "0:500", "meas.npz": "500:999"}
    for name, rows in splits.items():
        if not (traces / name).is_file():
            traces.mkdir(parents=True, exist_ok=True)
            if import_routing([str(sample), str(traces / name), "--model", "deepseek_v2_lite",
                               "--decode-tokens", "8", "--requests", rows]) != 0:
                raise ReportError(f"{sample}: import-routing failed (message above)")
    return traces / "cal.npz", traces / "meas.npz"


def _run_all(results_dir: Path, experiment: str, base: list[str], seeds: list[int],
             systems: list[str]) -> None:
    from harness.runner.run import run_config

    for seed in seeds:
        for system in systems:
            for prefetch in ("true", "false"):
                overrides = [*base, f"system={system}", f"system.prefetch={prefetch}",
                             f"seed={seed}", f"experiment_name={experiment}", "progress=false"]
                cfg = compose_config(overrides, results_dir=str(results_dir))
                cfg["run_name"] = default_run_name(
                    [f"system.prefetch={prefetch}", f"seed={seed}"], system, config_hash(cfg))
                r = run_config(cfg)
                print(f"  {experiment} seed {seed} {system} prefetch={prefetch}: {r['status']}",
                      flush=True)


def table(results_dir: Path) -> pd.DataFrame:
    runs = collect(results_dir, axes=["seed", "system.prefetch"], system_names=system_names(),
                   expected_systems=system_names())
    rows = []
    for r in runs.results:
        row = {"system": r["system"]["name"], "seed": r["config"]["seed"],
               "prefetch": bool(r["config"]["system"].get("prefetch", True)),
               "status": r["status"]}
        row.update({c: _metric(r, p) for c, p in COLUMNS.items()})
        rows.append(row)
    df = pd.DataFrame(rows).sort_values(["system", "seed", "prefetch"], ascending=[True, True,
                                                                                  False])
    on = df[df.prefetch].set_index(["system", "seed"])
    off = df[~df.prefetch].set_index(["system", "seed"])
    wide = on.merge(off, left_index=True, right_index=True, suffixes=("_on", "_off"))
    wide["tpot_on_over_off"] = wide["tpot_mean_ms_on"] / wide["tpot_mean_ms_off"]
    # Both runs' latency and decode hit rate; the prefetch metrics of the prefetching run
    keep = ["status_on", "tpot_mean_ms_on", "tpot_mean_ms_off", "tpot_on_over_off",
            "tpot_p99_ms_on", "tpot_p99_ms_off", "hit_rate_decode_on", "hit_rate_decode_off",
            "prefetch_churn_on", "prefetch_precision_on", "prefetch_recall_on",
            "prefetches_per_decode_token_on"]
    return wide[keep].reset_index()


def verdicts(wide: pd.DataFrame) -> pd.DataFrame:
    """Per system: the worst on/off TPOT ratio over seeds and whether it is within 1 %."""
    valid = wide.dropna(subset=["tpot_on_over_off"])
    g = valid.groupby("system")["tpot_on_over_off"]
    out = pd.DataFrame({"worst_on_over_off": g.max(), "seeds": g.size()})
    out["prefetch_never_slower"] = out["worst_on_over_off"] <= 1 + TOLERANCE
    return out.reset_index()


def render(sections: dict[str, pd.DataFrame]) -> tuple[str, str]:
    md = ["# Prefetch audit, SIMULATED", "",
          "Each system at the Table 1 setting (DeepSeek-V2-Lite, RTX A5000, 24 GB/s, batch 1) "
          "with `system.prefetch=true` (_on) and `false` (_off). Verdict: prefetch on is at most "
          f"{TOLERANCE:.0%} slower in TPOT mean on every seed. Metrics: docs/metrics.md.", ""]
    csv_parts = []
    for title, wide in sections.items():
        v = verdicts(wide)
        md += [f"## {title}", "", wide.to_markdown(index=False, floatfmt=".4g"), "",
               v.to_markdown(index=False, floatfmt=".4g"), ""]
        buf = io.StringIO()
        wide.assign(routing=title).to_csv(buf, index=False)
        csv_parts.append(buf.getvalue())
    return "\n".join(md), "".join(csv_parts)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench audit-prefetch", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--requests", type=int, default=290, help="measured and calibration "
                    "requests of the synthetic runs (Table 1: 290)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default="results/audit_prefetch")
    ap.add_argument("--no-real", action="store_true", help="skip the real-routing runs")
    ap.add_argument("--report-only", action="store_true", help="tabulate existing runs")
    ap.add_argument("--systems", help="comma-separated systems to (re)run (default: all); "
                                      "the report always covers every system")
    args = ap.parse_args(argv)
    out = Path(args.out)
    seeds = [int(s) for s in args.seeds.split(",")]
    synth = ["experiment=table1", f"workload.num_requests={args.requests}",
             f"calibration_requests={args.requests}"]
    systems = args.systems.split(",") if args.systems else system_names()
    unknown = sorted(set(systems) - set(system_names()))
    if unknown:
        ap.error(f"--systems: unknown {unknown}; known: {system_names()}")
    sections = {}
    try:
        real = None if args.no_real else _real_traces(out)
        if not args.report_only:
            _run_all(out, "synthetic", synth, seeds, systems)
            if real is not None:
                _run_all(out, "real", ["experiment=table1", f"routing={real[1].resolve()}",
                                       f"calibration_routing={real[0].resolve()}"], [0],
                         systems)
        sections[f"synthetic routing, seeds {args.seeds}"] = table(out / "synthetic")
        if real is not None:
            sections["real DeepSeek-V2-Lite routing (shared sample)"] = table(out / "real")
    except ReportError as exc:
        print(f"moebench audit-prefetch: error: {exc}", file=sys.stderr)
        return 2
    if real is None and not args.no_real:
        print("audit-prefetch: the shared real sample is absent (MOEBENCH_SHARED_DATA); "
              "synthetic only", file=sys.stderr)
    md, text = render(sections)
    publish(out, "audit", md, text)
    return 0
