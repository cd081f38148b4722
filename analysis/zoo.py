"""The policy zoo matrix: every evictor x every prefetcher of the composed system at the Table 1
setting (`make reproduce-zoo`), SIMULATED.

Reads results/zoo/<run>/result.json (analysis/runs.py checks that the runs belong in one table:
they may differ only in system.evictor and system.prefetcher) and writes zoo.md and zoo.csv
there: rows evictors, columns prefetchers, cells TPOT mean (ms) and decode hit rate. An
evictor that reads the future (Evictor.bound, e.g. belady) is a bound, marked in its row.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analysis.runs import ReportError, collect, publish
from analysis.table1 import FACTS
from core.precision import results_label

AXES = ["system.evictor", "system.prefetcher"]
EVICTOR_ORDER = ["fifo", "lru", "lru_per_layer", "lfu", "lfru", "least_stale", "lifo_inactive",
                 "evict_after_use", "belady"]
PREFETCHER_ORDER = ["none", "spec_next_layer", "predictor", "frequency", "fmoe_maps", "eamc"]


def _rank(order: list[str]):
    return lambda names: [(order.index(n) if n in order else len(order), n) for n in names]


def frame(results: list[dict]) -> pd.DataFrame:
    """One row per run: evictor, prefetcher, bound, status, tpot_mean_ms, hit_rate_decode."""
    rows = []
    for r in results:
        system, m = r["system"], r.get("metrics") or {}
        valid = r["status"] == "valid"
        rows.append({
            "evictor": system["evictor"]["name"], "prefetcher": system["prefetcher"]["name"],
            "bound": bool(system.get("oracle")), "status": r["status"],
            "tpot_mean_ms": m["tpot_ms"]["mean"] if valid else None,
            "hit_rate_decode": m["hit_rate_decode"] if valid else None,
        })
    return pd.DataFrame(rows)


def matrix(df: pd.DataFrame, value: str) -> pd.DataFrame:
    """evictor x prefetcher of one value, in the zoo's order (a missing pair: NaN)."""
    wide = df.pivot(index="evictor", columns="prefetcher", values=value)
    wide = wide.reindex(index=sorted(wide.index, key=lambda n: _rank(EVICTOR_ORDER)([n])[0]),
                        columns=sorted(wide.columns,
                                       key=lambda n: _rank(PREFETCHER_ORDER)([n])[0]))
    wide.columns.name = None
    return wide


def _cell(tpot, hit, status) -> str:
    if status != "valid":
        return str(status)
    return f"{tpot:.2f} ms / {hit:.4f}"


def render(results: list[dict]) -> tuple[str, str]:
    df = frame(results)
    tpot, hit = matrix(df, "tpot_mean_ms"), matrix(df, "hit_rate_decode")
    status = matrix(df, "status")
    bound = set(df.loc[df["bound"], "evictor"])
    cells = pd.DataFrame(
        [[_cell(tpot.at[e, p], hit.at[e, p], status.at[e, p])
          if isinstance(status.at[e, p], str) else "(no run)" for p in tpot.columns]
         for e in tpot.index],
        index=[f"{e} (bound)" if e in bound else e for e in tpot.index], columns=tpot.columns)
    cells.index.name = "evictor \\ prefetcher"
    first, lossy = results[0], results_label(results)  # core/precision.py
    lines = [
        "# Policy zoo: evictor x prefetcher (composed system), SIMULATED"
        + (f" [{lossy}]" if lossy else ""), "",
        f"Routing: {FACTS['routing'](first)}; trace sha256 {FACTS['trace_sha256'](first)}.",
        f"Setting: Table 1 (conf/experiment/table1.yaml): model {FACTS['model'](first)} on "
        f"{FACTS['hardware'](first)}, host-to-device {FACTS['h2d_gbps'](first)} GB/s, batch "
        f"{FACTS['batch'](first)}, requests {FACTS['requests'](first)}, expert cache "
        f"{FACTS['expert_cache_gib'](first)} GiB.",
        "Cells: TPOT mean (ms per decoded token, simulated) / decode hit rate (expert accesses "
        "of decode iterations). `(bound)`: the evictor reads the future. Definitions: "
        "docs/metrics.md.", "",
        cells.to_markdown(), "",
    ]
    csv = pd.concat({"tpot_mean_ms": tpot, "hit_rate_decode": hit, "status": status}, axis=1)
    csv.columns = [f"{p}.{v}" for v, p in csv.columns]
    csv.index.name = "evictor"
    csv.insert(0, "bound", [e in bound for e in csv.index])
    return "\n".join(lines), csv.to_csv(float_format="%.6g", lineterminator="\n")


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="moebench zoo",
                                 description="Write zoo.md and zoo.csv from finished zoo runs.")
    ap.add_argument("results_dir", nargs="?", default="results/zoo")
    ap.add_argument("--allow-partial", action="store_true",
                    help="tabulate a matrix with missing pairs (shown as '(no run)')")
    args = ap.parse_args(argv)
    results_dir = Path(args.results_dir)
    try:
        runs = collect(results_dir, axes=AXES, allow_partial=args.allow_partial)
    except ReportError as exc:
        print(f"moebench zoo: error: {exc}", file=sys.stderr)
        return 2
    if any(r["system"].get("name") != "composed" for r in runs.results):
        print(f"moebench zoo: error: {results_dir}: every run must be system=composed",
              file=sys.stderr)
        return 2
    md, text = render(runs.results)
    publish(results_dir, "zoo", md, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
