"""`moebench compare DIR --x KEY --y METRIC [--by system]`: one metric of a sweep against one
swept key, as a tidy CSV, a markdown table and a line or bar plot (PNG + PDF).

The runs come from analysis/runs.py `collect` (it refuses mixed traces and config differences
outside the swept keys). METRIC is a dotted key of result.json's `metrics` (`hit_rate`,
`tpot_ms.p99`; a latency block such as `tpot_ms` reads its `mean`). Rows that are not valid
(oom, failed) keep their status and have no value.

Files, in DIR unless --out: compare_<x>_<y>.csv (tidy: one row per run, every swept key a
column), compare_<x>_<y>.md (one row per point: --by, the other swept keys, x, the value),
compare_<x>_<y>.png and .pdf. When `seed` is swept (and is neither --x nor --by) each point
aggregates its seeds: mean ± 95 % t-interval (analysis/sweepstats.py). A numeric x draws
lines (error bars over seeds), any other x grouped bars. Outputs are labelled SIMULATED with
the routing source and hold no timestamp: a rerun writes the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.runs import ReportError, RunRecord, RunSet, axis_value, publish
from analysis.sweepstats import (
    CI_NOTE,
    add_run_options,
    collect_runs,
    mean_ci,
    pyplot,
    save_figure,
    sim_label,
)


def metric_value(result: RunRecord, metric: str):
    """The metric of a valid run (a latency block gives its mean); None for other runs."""
    if result.get("status") != "valid":
        return None
    node = result.get("metrics") or {}
    for part in metric.removeprefix("metrics.").split("."):
        if not isinstance(node, dict) or part not in node:
            raise ReportError(f"--y {metric}: no such metric in {result.folder}/result.json; "
                              f"metrics: {', '.join(sorted(result.get('metrics') or {}))}")
        node = node[part]
    if isinstance(node, dict):
        node = node.get("mean")
    if isinstance(node, bool) or not isinstance(node, int | float | None):
        raise ReportError(f"--y {metric}: not a number ({node!r}); pick a numeric metric")
    return node


def tidy(runs: RunSet, metric: str):
    """pandas DataFrame: one row per run (run, system, every axis, status, the metric)."""
    import pandas as pd

    rows = []
    for r in runs.results:
        row = {"run": r.folder, "system": r["system"].get("name")}
        row.update({a: axis_value(r["config"], a) for a in runs.axes})
        row.update({"status": r["status"], metric: metric_value(r, metric)})
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.sort_values([c for c in ("system", *runs.axes) if c in frame]).reset_index(
        drop=True)


def points(frame, x: str, by: str, axes: list[str], metric: str):
    """One row per point (by, the other axes, x): mean, 95 % half-width, n (seeds pooled when
    `seed` is an axis other than x and by). Sorted by the keys (x numerically when numeric)."""
    import pandas as pd

    pooled = "seed" in axes and "seed" not in (x, by)
    keys = [by] + [a for a in axes if a not in (x, by) and not (pooled and a == "seed")] + [x]
    out = []
    for key, group in frame.groupby(keys, sort=True, dropna=False):
        mean, half, n = mean_ci(group[metric].tolist())
        out.append({**dict(zip(keys, key)), metric: mean, "ci95": half, "n": n,
                    "status": ",".join(sorted(set(group["status"])))})
    return pd.DataFrame(out), keys, pooled


def _numeric(values) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def plot(table, keys: list[str], metric: str, title: str, kind: str):
    """Line plot (numeric x, kind auto/line) or grouped bars; series = the keys but x."""
    plt = pyplot()
    x, series_keys = keys[-1], keys[:-1]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    groups = list(table.groupby(series_keys, sort=True, dropna=False))
    xs = sorted(set(table[x]), key=lambda v: (str(type(v)), v))
    line = kind == "line" or (kind == "auto" and _numeric(xs))
    width = 0.8 / max(len(groups), 1)
    for i, (key, g) in enumerate(groups):
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k}={v}" if k != "system" else str(v)
                          for k, v in zip(series_keys, key))
        g = g.set_index(x).reindex(xs)
        y = g[metric].astype(float)
        err = g["ci95"].astype(float).fillna(0.0) if g["ci95"].notna().any() else None
        if line:
            ax.errorbar(xs, y, yerr=err, marker="o", capsize=3, label=label)
        else:
            pos = [j + (i - (len(groups) - 1) / 2) * width for j in range(len(xs))]
            ax.bar(pos, y, width, yerr=err, capsize=3, label=label)
    if not line:
        ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def render(runs: RunSet, x: str, metric: str, by: str = "system") -> tuple[str, str, object]:
    """(markdown, tidy CSV text, figure) for the runs."""
    for key, flag in ((x, "--x"), (by, "--by")):
        if key != "system" and key not in runs.axes:
            raise ReportError(f"{flag} {key}: not a swept key of these runs (swept: "
                              f"{', '.join(['system', *runs.axes])}); pass --axes to add one")
    if x == by:
        raise ReportError(f"--x and --by are both {x}")
    frame = tidy(runs, metric)
    table, keys, pooled = points(frame, x, by, runs.axes, metric)
    label = sim_label(runs.results)
    shas = sorted({(r.get("trace") or {}).get("sha256", "")[:16] for r in runs.results} - {""})
    head = [f"# {metric} by {x} ({label})", "",
            f"{len(runs.results)} runs; trace sha256 {', '.join(shas) or 'none'}."]
    if pooled:
        head.append(f"Each point pools its n seeds: {CI_NOTE}.")
    head += [f"- {n}" for n in runs.notes] + [f"- missing: {m}" for m in runs.missing]
    shown = table.rename(columns={metric: f"{metric} (mean)" if pooled else metric,
                                  "ci95": "± 95% CI"})
    if not pooled:
        shown = shown.drop(columns=["± 95% CI", "n"])
    md = "\n".join(head) + "\n\n" + shown.to_markdown(index=False, floatfmt=".4g") + "\n"
    csv_text = frame.to_csv(index=False, lineterminator="\n")
    title = f"{metric} by {x}\n{label}" + ("; mean ± 95% t-interval over seeds" if pooled else "")
    return md, csv_text, (table, keys, title)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench compare", description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--x", required=True, help="swept key on the x axis (or system)")
    ap.add_argument("--y", required=True, help="metric: a dotted key of result.json metrics")
    ap.add_argument("--by", default="system", help="one series per value (default system)")
    ap.add_argument("--kind", choices=("auto", "line", "bar"), default="auto")
    add_run_options(ap)
    args = ap.parse_args(argv)
    try:
        runs = collect_runs(args, Path(args.results_dir))
        md, csv_text, (table, keys, title) = render(runs, args.x, args.y, args.by)
        fig = plot(table, keys, args.y, title, args.kind)
    except (ReportError, ImportError) as exc:
        print(f"moebench compare: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"compare_{args.x}_{args.y}".replace("/", "_")
    publish(out, stem, md, csv_text)
    for path in save_figure(fig, out, stem):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
