"""`moebench cdf DIR --metric tpot|ttft|e2e`: per-request latency CDFs of a sweep's runs, one
curve per system (and per value of the other swept keys), from each run's tokens.parquet,
with percentile tables printed like `vllm bench serve`.

Per request (docs/metrics.md): TTFT = token 0's time - arrival, E2E = last token's time -
arrival, TPOT = (last - token 0) / (tokens - 1) for requests of >= 2 tokens. Arrival times
are not in tokens.parquet: they come from the run's own trace (the trace file, or the
synthetic generator rerun from the run's config), checked against the sha256 the run
recorded. Percentiles are numpy's linear interpolation, as in result.json.

When `seed` is swept, the CDF pools the requests of every seed, and the table shows each
statistic (mean, p50, p90, p99) as the mean over seeds ± the 95 % t-interval
(analysis/sweepstats.py). Files (DIR unless --out): cdf_<metric>.{md,csv,png,pdf}, labelled
SIMULATED with the routing source, without timestamps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from analysis.runs import ReportError, RunSet, axis_value, publish
from analysis.sweepstats import (
    CI_NOTE,
    add_run_options,
    collect_runs,
    mean_ci,
    pyplot,
    save_figure,
    sim_label,
)

METRICS = {"tpot": "tpot_ms", "ttft": "ttft_ms", "e2e": "e2e_ms"}
NAMES = {"tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
         "ttft": ("TTFT", "Time to First Token"), "e2e": ("E2EL", "End-to-end Latency")}
STATS = ("mean", "p50", "p90", "p99")


def _arrival_ms(result: dict, run_dir: Path) -> np.ndarray:
    from core.specs import model_spec_from_dict
    from harness.runner.run import load_routing

    cfg = result["config"]
    trace = load_routing(cfg, model_spec_from_dict(cfg["model"], "model"), "measure")
    if trace.content_sha256() != result["trace"]["sha256"]:
        raise ReportError(f"{run_dir}: its trace no longer regenerates (sha256 "
                          f"{trace.content_sha256()[:16]}, the run recorded "
                          f"{result['trace']['sha256'][:16]}): rerun it with this code")
    return np.asarray(trace.arrival_ms, dtype=np.float64)


def request_latency(result: dict, run_dir: Path, metric: str) -> np.ndarray:
    """Per-request values (ms) of one valid run; TPOT drops one-token requests."""
    import pyarrow.parquet as pq

    path = run_dir / "tokens.parquet"
    if not path.is_file():
        raise ReportError(f"{path}: missing (the run wrote no per-token table)")
    try:
        tok = pq.read_table(path, columns=["request", "token_index", "time_ms"]).to_pydict()
    except (OSError, ValueError, KeyError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ReportError(f"{path}: not a readable per-token table ({exc})") from exc
    req, idx = np.asarray(tok["request"], np.int64), np.asarray(tok["token_index"], np.int64)
    t = np.asarray(tok["time_ms"], np.float64)
    n = int(result["trace"]["num_requests"])
    count = np.bincount(req, minlength=n)
    first = np.full(n, np.nan)
    first[req[idx == 0]] = t[idx == 0]
    last = np.full(n, -np.inf)
    np.maximum.at(last, req, t)
    done = count > 0
    if metric == "tpot":
        keep = count > 1
        return (last[keep] - first[keep]) / (count[keep] - 1)
    arrival = _arrival_ms(result, run_dir)
    return (first if metric == "ttft" else last)[done] - arrival[done]


def stats(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {s: None for s in STATS}
    return {"mean": float(np.mean(values)), "p50": float(np.percentile(values, 50)),
            "p90": float(np.percentile(values, 90)), "p99": float(np.percentile(values, 99))}


def series(runs: RunSet, results_dir: Path, metric: str) -> dict[tuple, list]:
    """{(system, (axis, value)...): [(seed, per-request values), ...]} over valid runs."""
    pooled = [a for a in runs.axes if a != "seed"]
    out: dict[tuple, list] = {}
    for r in runs.results:
        if r["status"] != "valid":
            continue
        key = (r["system"].get("name"), *((a, axis_value(r["config"], a)) for a in pooled))
        values = request_latency(r, results_dir / r.folder, metric)
        out.setdefault(key, []).append((r["config"].get("seed"), values))
    return dict(sorted(out.items(), key=lambda kv: _order(kv[0])))


def _order(key: tuple) -> tuple:
    """System, then each axis value: numbers by value (4 before 12), others by their text."""
    system, *axes = key
    return (str(system), *((0, v, "") if isinstance(v, int | float) and not isinstance(v, bool)
                           else (1, 0, repr(v)) for _, v in axes))


def _label(key: tuple) -> str:
    return ", ".join([str(key[0]), *(f"{a}={v}" for a, v in key[1:])])


def vllm_block(title: str, short: str, section: str, n_requests: int, row: dict,
               ci: dict | None) -> str:
    """One `vllm bench serve`-style block: ==== title ====, then Mean/Median/P90/P99 lines."""
    lines = [f"{' ' + title + ' ':=^50}", f"{'Requests:':<40}{n_requests}",
             f"{section:-^50}"]
    for stat, name in zip(STATS, ("Mean", "Median", "P90", "P99")):
        value = row[stat]
        text = "n/a" if value is None else f"{value:.2f}"
        if ci is not None and ci.get(stat) is not None:
            text += f" ± {ci[stat]:.2f}"
        lines.append(f"{f'{name} {short} (ms):':<40}{text}")
    return "\n".join(line.rstrip() for line in lines + ["=" * 50])


def render(runs: RunSet, results_dir: Path, metric: str):
    """(printed blocks, markdown, csv text, curves) for the runs."""
    import pandas as pd

    short, section = NAMES[metric]
    label = sim_label(runs.results)
    curves = series(runs, results_dir, metric)
    blocks, rows = [], []
    for key, members in curves.items():
        per_seed = [stats(v) for _, v in members]
        seeded = len(members) > 1
        agg = {s: mean_ci([p[s] for p in per_seed]) for s in STATS}
        row = {s: agg[s][0] for s in STATS}
        ci = {s: agg[s][1] for s in STATS} if seeded else None
        n_req = sum(len(v) for _, v in members)
        blocks.append(vllm_block(f"{_label(key)} ({label})", short, section, n_req, row, ci))
        rows.append({"system": key[0], **dict(key[1:]), "seeds": len(members),
                     "requests": n_req, **{f"{s}_ms": row[s] for s in STATS},
                     **({f"{s}_ci95_ms": ci[s] for s in STATS} if ci else {})})
    frame = pd.DataFrame(rows)
    head = [f"# {short} per request ({label})", "",
            f"From tokens.parquet of {len(runs.results)} runs (valid: "
            f"{sum(len(m) for m in curves.values())})."]
    if any(len(m) > 1 for m in curves.values()):
        head.append(f"Seeds pooled in the CDF; statistics: the {CI_NOTE}.")
    md = "\n".join(head) + "\n\n" + frame.to_markdown(index=False, floatfmt=".2f") + "\n"
    return "\n\n".join(blocks), md, frame.to_csv(index=False, lineterminator="\n"), curves


def plot(curves: dict, metric: str, title: str):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for key, members in curves.items():
        v = np.sort(np.concatenate([m for _, m in members]))
        if len(v):
            ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=_label(key))
    ax.set_xlabel(f"{NAMES[metric][0]} per request (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench cdf", description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--metric", choices=sorted(METRICS), default="tpot")
    add_run_options(ap)
    args = ap.parse_args(argv)
    results_dir = Path(args.results_dir)
    try:
        runs = collect_runs(args, results_dir)
        text, md, csv_text, curves = render(runs, results_dir, args.metric)
        label = sim_label(runs.results)
        fig = plot(curves, args.metric, f"{NAMES[args.metric][0]} CDF per request\n{label}")
    except (ReportError, ImportError) as exc:
        print(f"moebench cdf: error: {exc}", file=sys.stderr)
        return 2
    print(text)
    out = Path(args.out or results_dir)
    out.mkdir(parents=True, exist_ok=True)
    publish(out, f"cdf_{args.metric}", md, csv_text)
    for path in save_figure(fig, out, f"cdf_{args.metric}"):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
