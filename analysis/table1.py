"""Table 1 (MoE-Infinity): TPOT, GPU idle, hit rate and traffic per system, paper beside ours.

Reads results/table1/<system>/result.json and writes table1.md and table1.csv there.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

from analysis.paper_numbers import MOE_INFINITY_TABLE1, TABLE1_FOOTNOTES
from harness.record import DEGENERATE_NOTE, RANDOM_SOURCE

COLUMNS = ["system", "status", "tpot_mean_ms", "tpot_p99_ms", "gpu_idle_ms_per_token",
           "hit_rate", "h2d_gb_per_token", "paper_tpot_mean_ms", "paper_tpot_tail_ms",
           "paper_gpu_idle_ms"]
ORDER = ["no_offload", "layer_offload", "on_demand", "lru", "moe_infinity", "fmoe", "diff_moe",
         "oracle"]


def load_results(results_dir: Path) -> list[dict]:
    out = []
    for path in sorted(Path(results_dir).glob("*/result.json")):
        out.append(json.loads(path.read_text()))
    if not out:
        raise FileNotFoundError(f"no */result.json under {results_dir}: run the sweep first")
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(out, key=lambda r: (rank.get(r["system"]["name"], len(ORDER)),
                                      r["system"]["name"]))


def row(result: dict) -> dict:
    name, m = result["system"]["name"], result.get("metrics") or {}
    paper = MOE_INFINITY_TABLE1.get(name, {})
    valid = result["status"] == "valid"
    return {
        "system": name + (" (oracle bound)" if result["system"].get("oracle") else ""),
        "status": result["status"],
        "tpot_mean_ms": m["tpot_ms"]["mean"] if valid else None,
        "tpot_p99_ms": m["tpot_ms"]["p99"] if valid else None,
        "gpu_idle_ms_per_token": m["decode_stall_ms_per_token"] if valid else None,
        "hit_rate": m["hit_rate"] if valid else None,
        "h2d_gb_per_token": m["h2d_gb_per_token"] if valid else None,
        "paper_tpot_mean_ms": paper.get("tpot_mean_ms"),
        "paper_tpot_tail_ms": paper.get("tpot_tail_ms"),
        "paper_gpu_idle_ms": paper.get("gpu_idle_ms"),
    }


def _fmt(value, column: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        # Milliseconds to 0.01 ms; rates and GB per token to 4 decimals.
        return f"{value:.2f}" if column.endswith("_ms") or "_ms_" in column else f"{value:.4f}"
    return str(value)


def header(results: list[dict]) -> list[str]:
    first = results[0]
    cfg, trace = first["config"], first["trace"]
    routing = ("SYNTHETIC routing (seeded generator, workloads/synthetic.py)" if trace["synthetic"]
               else f"routing from {trace['source']} ({trace['routing_source']})")
    cache_gib = first["memory"]["expert_cache_bytes"] / 2**30
    bits = cfg["model"]["expert_bits"]
    # Routing recorded from a random-weight model (harness/record.py) is degenerate.
    degenerate = ([f"**WARNING: {DEGENERATE_NOTE}.**", ""]
                  if trace["routing_source"].startswith(RANDOM_SOURCE) else [])
    return [
        "# Table 1 (MoE-Infinity setting), SIMULATED",
        "",
        *degenerate,
        f"Routing: {routing}; trace sha256 {trace['sha256'][:16]}.",
        f"Model {first['model']['name']} ({bits:g}-bit experts, "
        f"{first['model']['expert_bytes']} B each) on {first['hardware']} with host-to-device "
        f"{cfg['hardware']['h2d_gbps']} GB/s; batch {cfg['max_batch']}, "
        f"{trace['num_requests']} requests, mean prompt {trace['prompt_len_mean']:g} tokens, "
        f"mean output {trace['output_len_mean']:g} tokens; expert cache {cache_gib:.2f} GiB.",
        "TPOT and GPU idle are per decoded token (ms); hit rate over expert accesses; "
        "h2d in GB (1e9 B) per generated token. Definitions: docs/metrics.md.",
    ]


def render(results: list[dict]) -> tuple[str, str]:
    rows = [row(r) for r in results]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _fmt(v, k) for k, v in r.items()})
    md = header(results) + ["", "| " + " | ".join(COLUMNS) + " |",
                            "|" + "---|" * len(COLUMNS)]
    md += ["| " + " | ".join(_fmt(r[c], c) for c in COLUMNS) + " |" for r in rows]
    md += [""] + [f"{i + 1}. {note}" for i, note in enumerate(TABLE1_FOOTNOTES)]
    failed = [r for r in results if r["status"] == "failed"]
    md += [f"- {r['system']['name']} failed: {r['reason']}" for r in failed]
    return "\n".join(md) + "\n", buf.getvalue()


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="moebench table1",
                                 description="Write table1.md and table1.csv from finished runs.")
    ap.add_argument("results_dir", nargs="?", default="results/table1")
    results_dir = Path(ap.parse_args(argv).results_dir)
    try:
        results = load_results(results_dir)
    except FileNotFoundError as exc:
        print(f"moebench table1: error: {exc}", file=sys.stderr)
        return 2
    md, text = render(results)
    (results_dir / "table1.md").write_text(md)
    (results_dir / "table1.csv").write_text(text)
    print(md)
    print(f"wrote {results_dir / 'table1.md'} and {results_dir / 'table1.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
