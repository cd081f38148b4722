"""The claims report: results/claims.md and claims.csv, one row per published claim.

Each experiment's `claims` (analysis/repro/spec.py) turns its results into ClaimRows; the
verdict and its reason come from analysis/repro/verdict.py. Columns: the claim and its
source, the paper's value, ours on synthetic routing, ours on a real routing sample where
one exists (and its size), the baseline's headroom in our setting (its TPOT / compute
floor: how much faster a perfect policy could be), the verdict and its reason. An
experiment that has not been run yet gives one row saying so.
"""

from __future__ import annotations

from pathlib import Path

from analysis.repro.layout import experiment_frame
from analysis.repro.output import fmt
from analysis.repro.real import real_size
from analysis.repro.registry import EXPERIMENTS
from analysis.repro.verdict import BAND, VERDICTS, ClaimRow, judge
from analysis.runs import ReportError
from core.atomic import write_text

COLUMNS = ("claim_id", "source", "claim", "paper", "ours_synthetic", "ours_real",
           "real_sample", "baseline_headroom", "verdict", "reason")


def _value(v) -> str:
    if isinstance(v, list | tuple):
        return ", ".join(map(str, v))  # an ordering, best first
    return fmt(v, "ratio") if isinstance(v, float) else fmt(v)


def experiment_claims(name: str, results: Path) -> list[ClaimRow]:
    exp = EXPERIMENTS[name]
    try:
        runs = experiment_frame(name, results, allow_partial=True)
    except ReportError as exc:
        missing = not (results / name).is_dir()
        row = ClaimRow(f"{name}", name, exp.mirrors, f"make reproduce-{name} not run yet"
                       if missing else f"results/{name} cannot be judged", "not_expressible",
                       note="no results yet" if missing else str(exc))
        row.verdict, row.reason = "not run", f"no results in {results / name}" if missing \
            else f"its runs do not make one table: {exc}"
        return [row]
    real = None
    if exp.real_model is not None and (results / f"{name}_real").is_dir():
        try:
            real = experiment_frame(name, results, real=True, allow_partial=True)
        except ReportError:
            real = None
    table = exp.table(runs)[0]
    rows = exp.claims(table, runs, real)
    for row in rows:
        # the sample is named beside a real-routing value only (a claim about another
        # model of the same experiment has none)
        if exp.real_model is not None and row.real_sample is None:
            row.real_sample = (real_size(exp.real_model) if row.ours_real is not None
                               else "sample absent or not run" if real is None else None)
        judge(row)
    return rows


def render(rows: list[ClaimRow]) -> tuple[str, str]:
    import pandas as pd

    table = pd.DataFrame([{
        "claim_id": r.claim_id, "source": r.source, "claim": r.claim, "paper": _value(r.paper),
        "ours_synthetic": _value(r.ours), "ours_real": _value(r.ours_real),
        "real_sample": r.real_sample or "", "baseline_headroom": fmt(r.headroom, "headroom"),
        "verdict": r.verdict, "reason": r.reason} for r in rows], columns=list(COLUMNS))
    counts = {v: sum(r.verdict == v for r in rows) for v in (*VERDICTS, "not run")}
    md = ["# Published claims against the simulator (SIMULATED)", "",
          "Every number of ours is simulated; `ours_synthetic` runs on synthetic routing "
          "fitted to real samples, `ours_real` replays a real routing sample where one "
          "exists (its size beside it). Values are factors (x, the paper's claim as a ratio "
          "to its baseline), orderings (best first) or locations on a sweep; "
          "`baseline_headroom` is the baseline's TPOT / compute floor in our setting, the most "
          "a perfect policy could gain. Verdicts (analysis/repro/verdict.py, fixed before any "
          f"run): reproduced = within a factor {BAND} on ratios or the same ordering; "
          "direction only; not reproduced; not expressible.", "",
          "Totals: " + ", ".join(f"{v} {n}" for v, n in counts.items() if n) + ".", "",
          table.to_markdown(index=False, disable_numparse=True), ""]
    return "\n".join(md), table.to_csv(index=False, lineterminator="\n")


def write_claims(results: Path) -> int:
    rows = [row for name in EXPERIMENTS for row in experiment_claims(name, Path(results))]
    md, csv_text = render(rows)
    write_text(Path(results) / "claims.md", md)
    write_text(Path(results) / "claims.csv", csv_text)
    print(md)
    print(f"wrote {Path(results) / 'claims.md'} and {Path(results) / 'claims.csv'}")
    return 0
