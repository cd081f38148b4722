"""Table 1 (MoE-Infinity): TPOT, GPU idle, decode hit rate and traffic per system, paper beside.

Reads results/table1/<run>/result.json (analysis/runs.py checks that the runs belong in one
table) and writes table1.md and table1.csv there. Swept keys become columns after `bound`;
facts that differ between rows are columns, not header lines.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

from analysis.paper_numbers import MOE_INFINITY_TABLE1, TABLE1_FOOTNOTES
from analysis.runs import ReportError, RunSet, axis_value, collect, flatten, publish
from harness.live.record import DEGENERATE_NOTE, RANDOM_SOURCE
from harness.runner.results import NON_SEMANTIC_KEYS

METRICS = ["status", "tpot_mean_ms", "tpot_p99_ms", "compute_floor_ms", "headroom",
           "gpu_idle_ms_per_token", "hit_rate_decode", "h2d_gb_per_token", "paper_tpot_mean_ms",
           "paper_tpot_tail_ms", "paper_gpu_idle_ms"]
ORDER = ["no_offload", "layer_offload", "on_demand", "lru", "moe_infinity", "fmoe", "diff_moe",
         "oracle", "belady", "belady_bypass", "belady_lookahead"]
# Keys that name the routing source, shown in the header instead of as a setting difference
ROUTING_KEYS = ("routing", "calibration_routing")


def _routing(result: dict) -> str:
    trace = result["trace"]
    return ("SYNTHETIC routing (seeded generator, workloads/synthetic.py)" if trace["synthetic"]
            else f"routing from {trace['source']} ({trace['routing_source']})")


# Header facts: label -> value of one row. Equal in every row: a header line; else a column.
FACTS = {
    "routing": _routing,
    "trace_sha256": lambda r: r["trace"]["sha256"][:16],
    "model": lambda r: (f"{r['model']['name']} ({r['config']['model']['expert_bits']:g}-bit "
                        f"experts, {r['model']['expert_bytes']} B each)"),
    "hardware": lambda r: r["hardware"],
    "h2d_gbps": lambda r: r["config"]["hardware"]["h2d_gbps"],
    "batch": lambda r: r["config"]["max_batch"],
    "requests": lambda r: r["trace"]["num_requests"],
    "expert_cache_gib": lambda r: round(r["memory"]["expert_cache_bytes"] / 2**30, 2),
}


def row(result: dict, axes: list[str], varying: list[str]) -> dict:
    name, m = result["system"]["name"], result.get("metrics") or {}
    paper = MOE_INFINITY_TABLE1.get(name, {})
    valid = result["status"] == "valid"
    out = {"system": name, "bound": "true" if result["system"].get("oracle") else "false"}
    out.update({a: axis_value(result['config'], a) for a in axes})
    out.update({f: FACTS[f](result) for f in varying})
    out.update({
        "status": result["status"],
        "tpot_mean_ms": m["tpot_ms"]["mean"] if valid else None,
        "tpot_p99_ms": m["tpot_ms"]["p99"] if valid else None,
        "compute_floor_ms": m.get("compute_floor_ms") if valid else None,
        "headroom": m.get("headroom") if valid else None,
        "gpu_idle_ms_per_token": m["decode_stall_ms_per_token"] if valid else None,
        "hit_rate_decode": m["hit_rate_decode"] if valid else None,
        "h2d_gb_per_token": m["h2d_gb_per_token"] if valid else None,
        "paper_tpot_mean_ms": paper.get("tpot_mean_ms"),
        "paper_tpot_tail_ms": paper.get("tpot_tail_ms"),
        "paper_gpu_idle_ms": paper.get("gpu_idle_ms"),
    })
    return out


def _fmt(value, column: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        # Milliseconds to 0.01 ms, GiB and headroom (a ratio) to 0.01; rates and GB per token
        # to 4 decimals.
        two = column.endswith(("_ms", "_gib")) or "_ms_" in column or column == "headroom"
        return f"{value:.2f}" if two else f"{value:.4f}"
    return str(value)


def paper_setting_differences(result: dict, axes: list[str]) -> list[str]:
    """Where a row's setting differs from conf/experiment/table1.yaml (the paper's), besides
    the routing source (a header line) and the axes (columns)."""
    from harness.runner.config import compose_config

    paper = compose_config(["experiment=table1", f"system={result['system']['name']}"])
    skip = (*NON_SEMANTIC_KEYS, *ROUTING_KEYS, "system", *axes)
    ours, ref = flatten(result["config"]), flatten(paper)
    return [f"{k} = {ours.get(k)!r} (paper setting {ref.get(k)!r})"
            for k in sorted(set(ours) | set(ref))
            if not any(k == s or k.startswith(f"{s}.") for s in skip) and ours.get(k) != ref.get(k)]


def header(runs: RunSet, varying: list[str]) -> list[str]:
    first = runs.results[0]

    def say(fact: str, unit: str = "") -> str:
        return "varies (a column)" if fact in varying else f"{FACTS[fact](first)}{unit}"

    degenerate = ([f"**WARNING: {DEGENERATE_NOTE}.**", ""]
                  if first["trace"]["routing_source"].startswith(RANDOM_SOURCE) else [])
    diffs = paper_setting_differences(first, runs.axes)
    lines = [
        "# Table 1 (MoE-Infinity setting), SIMULATED", "", *degenerate,
        f"Routing: {say('routing')}; trace sha256 {say('trace_sha256')}.",
        f"Model {say('model')} on {say('hardware')} with host-to-device "
        f"{say('h2d_gbps', ' GB/s')}; batch {say('batch')}; requests {say('requests')}; "
        f"expert cache {say('expert_cache_gib', ' GiB')}.",
        "TPOT and GPU idle are per decoded token (ms); compute floor: the TPOT with every "
        "expert resident and no stall (an exact lower bound at batch 1 or a static batch), "
        "headroom = TPOT / compute floor; hit rate over the expert accesses of "
        "decode iterations (prefill excluded, like TPOT); "
        "h2d in GB (1e9 B) per generated token; `bound`: true for a bound that reads the "
        "future (oracle), not a system. Definitions: docs/metrics.md.",
    ]
    if runs.axes:
        lines.append(f"Swept (columns): {', '.join(runs.axes)}.")
    if diffs:
        lines.append("Setting differs from the paper's (conf/experiment/table1.yaml): "
                     + "; ".join(diffs) + ".")
    if runs.missing:
        lines.append(f"**PARTIAL (--allow-partial): no run for {', '.join(runs.missing)}.**")
    return lines + [f"- {note}" for note in runs.notes]


def render(runs: RunSet) -> tuple[str, str]:
    varying = [f for f in FACTS if len({repr(FACTS[f](r)) for r in runs.results}) > 1]
    rank = {name: i for i, name in enumerate(ORDER)}
    results = sorted(runs.results, key=lambda r: (
        rank.get(r["system"]["name"], len(ORDER)), r["system"]["name"],
        *(repr(axis_value(r['config'], a)) for a in runs.axes)))
    columns = ["system", "bound", *runs.axes, *varying, *METRICS]
    rows = [row(r, runs.axes, varying) for r in results]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _fmt(v, k) for k, v in r.items()})
    md = header(runs, varying) + ["", "| " + " | ".join(columns) + " |",
                                  "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(_fmt(r[c], c) for c in columns) + " |" for r in rows]
    md += [""] + [f"{i + 1}. {note}" for i, note in enumerate(TABLE1_FOOTNOTES)]
    md += [f"- {r['system']['name']} ({r['_folder']}) failed: {r['reason']}"
           for r in results if r["status"] == "failed"]
    return "\n".join(md) + "\n", buf.getvalue()


def main(argv: list[str]) -> int:
    import argparse

    from harness.runner.config import system_names

    ap = argparse.ArgumentParser(prog="moebench table1",
                                 description="Write table1.md and table1.csv from finished runs.")
    ap.add_argument("results_dir", nargs="?", default="results/table1")
    ap.add_argument("--axes", help="comma-separated config keys that may differ between rows "
                                   "(default: the keys multirun.yaml records as swept)")
    ap.add_argument("--allow-mixed", action="store_true",
                    help="tabulate rows that differ in other keys or traces (noted in the table)")
    ap.add_argument("--allow-partial", action="store_true",
                    help="tabulate a sweep with missing systems or values (noted in the table)")
    args = ap.parse_args(argv)
    results_dir = Path(args.results_dir)
    try:
        runs = collect(results_dir, axes=args.axes.split(",") if args.axes else None,
                       allow_mixed=args.allow_mixed, allow_partial=args.allow_partial,
                       expected_systems=system_names(), system_names=system_names())
    except ReportError as exc:
        print(f"moebench table1: error: {exc}", file=sys.stderr)
        return 2
    md, text = render(runs)
    publish(results_dir, "table1", md, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
