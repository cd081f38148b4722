"""Table 1 (MoE-Infinity): the rows and header of its report, and `moebench table1 [DIR]`.

There is one Table 1 report, the reproduction suite's (analysis/repro/experiments/table1.py,
written by analysis/repro/suite.py): `moebench report table1`, `make reproduce-table1` and
`moebench table1 DIR` all go through it, with the same refuse-to-mix and completeness rules
(analysis/runs.py) and the same files, <DIR>/table1.{md,tex,csv,png,pdf}. This module holds
what is particular to Table 1: a row per run with the paper's values beside it, the facts
that become header lines (or columns where runs differ), and where the setting differs from
the paper's (conf/experiment/table1.yaml).
"""

from __future__ import annotations

import sys

from analysis.paper_numbers import MOE_INFINITY_TABLE1
from analysis.runs import axis_value, flatten
from harness.live.record import DEGENERATE_NOTE, RANDOM_SOURCE
from harness.runner.results import NON_SEMANTIC_KEYS

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


def varying_facts(results: list[dict]) -> list[str]:
    return [f for f in FACTS if len({repr(FACTS[f](r)) for r in results}) > 1]


def sort_key(result: dict, axes: list[str]) -> tuple:
    rank = {name: i for i, name in enumerate(ORDER)}
    name = result["system"]["name"]
    return (rank.get(name, len(ORDER)), name,
            *(repr(axis_value(result["config"], a)) for a in axes))


def row(result: dict, axes: list[str], varying: list[str]) -> dict:
    """One run: the system, the axes and varying facts, ours beside the paper's."""
    name, m = result["system"]["name"], result.get("metrics") or {}
    paper = MOE_INFINITY_TABLE1.get(name, {})
    valid = result["status"] == "valid"
    ours, paper_tpot = (m["tpot_ms"]["mean"] if valid else None), paper.get("tpot_mean_ms")
    out = {"system": name, "bound": bool(result["system"].get("oracle")),
           "paper_system": paper.get("paper_system", "")}
    out.update({a: axis_value(result["config"], a) for a in axes})
    out.update({f: FACTS[f](result) for f in varying})
    out.update({
        "status": result["status"],
        "tpot_mean_ms": ours, "paper_tpot_mean_ms": paper_tpot,
        "tpot_ratio": ours / paper_tpot if ours is not None and paper_tpot else None,
        "tpot_p99_ms": m["tpot_ms"]["p99"] if valid else None,
        "paper_tpot_tail_ms": paper.get("tpot_tail_ms"),
        "compute_floor_ms": m.get("compute_floor_ms") if valid else None,
        "headroom": m.get("headroom") if valid else None,
        "gpu_idle_ms_per_token": m["decode_stall_ms_per_token"] if valid else None,
        "paper_gpu_idle_ms": paper.get("gpu_idle_ms"),
        "hit_rate_decode": m["hit_rate_decode"] if valid else None,
        "h2d_gb_per_token": m["h2d_gb_per_token"] if valid else None,
    })
    return out


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


def header(results: list[dict], axes: list[str], missing: list[str], notes: list[str],
           title: str) -> list[str]:
    """The lines above the table: the setting (or 'a column' where rows differ), the
    definitions, where the setting is not the paper's, and what is partial or mixed."""
    first, varying = results[0], varying_facts(results)

    def say(fact: str, unit: str = "") -> str:
        return "varies (a column)" if fact in varying else f"{FACTS[fact](first)}{unit}"

    degenerate = ([f"**WARNING: {DEGENERATE_NOTE}.**", ""]
                  if first["trace"]["routing_source"].startswith(RANDOM_SOURCE) else [])
    diffs = paper_setting_differences(first, axes)
    lines = [
        f"# {title}, SIMULATED", "", *degenerate,
        f"Routing: {say('routing')}; trace sha256 {say('trace_sha256')}.",
        f"Model {say('model')} on {say('hardware')} with host-to-device "
        f"{say('h2d_gbps', ' GB/s')}; batch {say('batch')}; requests {say('requests')}; "
        f"expert cache {say('expert_cache_gib', ' GiB')}.",
        "TPOT and GPU idle are per decoded token (ms); compute floor: the TPOT with every "
        "expert resident and no stall (an exact lower bound at batch 1 or a static batch), "
        "headroom = TPOT / compute floor; tpot_ratio = ours / paper (absolute milliseconds "
        "are not comparable: compare orderings and ratios); hit rate over the expert accesses "
        "of decode iterations (prefill excluded, like TPOT); h2d in GB (1e9 B) per generated "
        "token; `bound`: true for a bound that reads the future (oracle), not a system. "
        "Definitions: docs/metrics.md.",
    ]
    if axes:
        lines.append(f"Swept (columns): {', '.join(axes)}.")
    if diffs:
        lines.append("Setting differs from the paper's (conf/experiment/table1.yaml): "
                     + "; ".join(diffs) + ".")
    if missing:
        lines.append(f"**PARTIAL: no run for {', '.join(missing)}.**")
    return lines + [f"- {note}" for note in notes]


def main(argv: list[str]) -> int:
    """`moebench table1 [DIR]`: the suite's Table 1 report of one results folder."""
    import argparse

    from analysis.repro.suite import report_folder

    ap = argparse.ArgumentParser(
        prog="moebench table1",
        description="Write DIR/table1.{md,tex,csv,png,pdf} from finished runs (the same "
                    "report as `moebench report table1`).")
    ap.add_argument("results_dir", nargs="?", default="results/table1")
    ap.add_argument("--axes", help="comma-separated config keys that may differ between rows "
                                   "(default: the keys multirun.yaml records as swept)")
    ap.add_argument("--allow-mixed", action="store_true",
                    help="tabulate rows that differ in other keys or traces (noted in the table)")
    ap.add_argument("--allow-partial", action="store_true",
                    help="tabulate a sweep with missing systems or values (noted in the table)")
    args = ap.parse_args(argv)
    return report_folder("table1", args.results_dir,
                         axes=args.axes.split(",") if args.axes else None,
                         allow_mixed=args.allow_mixed, allow_partial=args.allow_partial)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
