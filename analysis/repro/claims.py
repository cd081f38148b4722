"""The claims report: results/claims.md and claims.csv, one row per inventory entry.

The inventory (analysis/repro/inventory.py, docs/claims.md) lists every published claim;
each experiment's `claims` (analysis/repro/spec.py) turns its results into ClaimRows, whose
verdict and reason come from analysis/repro/verdict.py. A row of the report is

  measured         the experiment's ClaimRow with the entry's id, judged
  not run          the entry's experiment has no results (or none that make one table)
  not expressible  the inventory gives the reason no experiment can measure it

An experiment that emits an id the inventory does not list, or lists under another
experiment, is an error: the inventory and the experiments must say the same thing.
analysis/repro/claims_table.py defines the rows (Line) and renders them.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from analysis.repro.claims_table import NOT_RUN, Line, render
from analysis.repro.inventory import Claim, InventoryError, load
from analysis.repro.layout import experiment_frame
from analysis.repro.real import real_size
from analysis.repro.registry import EXPERIMENTS
from analysis.repro.verdict import ClaimRow, judge
from analysis.runs import ReportError
from core.atomic import write_text

# The inventory's value is the paper's number as written (rounded); the experiment computes
# it from the paper's table. More than 5 % apart is a different convention or a typo.
VALUE_TOLERANCE = 1.05


def measured(name: str, results: Path) -> list[ClaimRow] | str:
    """The experiment's ClaimRows from results/<name>/ (judged by build), or why there are
    none: the text of a "not run" row."""
    exp = EXPERIMENTS[name]
    try:
        runs = experiment_frame(name, results, allow_partial=True)
    except ReportError as exc:
        if not (Path(results) / name).is_dir():
            return f"make reproduce-{name} has not run: no results in {Path(results) / name}"
        return f"the runs in {Path(results) / name} do not make one table: {exc}"
    real = None
    if exp.real_model is not None and (Path(results) / f"{name}_real").is_dir():
        try:
            real = experiment_frame(name, results, real=True, allow_partial=True)
        except ReportError:
            real = None  # a broken real folder leaves the synthetic verdicts standing
    rows = exp.claims(exp.table(runs)[0], runs, real)
    for row in rows:
        # the sample is named beside a real-routing value only (a claim about another
        # model of the same experiment has none)
        if exp.real_model is not None and row.real_sample is None:
            row.real_sample = (real_size(exp.real_model) if row.ours_real is not None
                               else "sample absent or not run" if real is None else None)
    return rows


def _disagreement(entry: Claim, row: ClaimRow) -> str | None:
    """How the experiment's row contradicts its inventory entry (None: it does not). An
    experiment may report a claim as not expressible in its setting whatever its kind."""
    if row.kind == "not_expressible":
        return None
    if row.kind != entry.kind:
        return f"kind {row.kind!r}, the inventory says {entry.kind!r}"
    if entry.kind in ("ratio", "location") and row.paper is not None:
        paper = float(row.paper)
        if paper <= 0 or abs(math.log(paper / entry.value)) > math.log(VALUE_TOLERANCE):
            return (f"the paper's value {paper:.4g}, the inventory says {entry.value:g} "
                    f"(more than {VALUE_TOLERANCE - 1:.0%} apart)")
    # the inventory may name an ordering's systems as the paper does (DeepSpeed) and the
    # experiment as the simulator does (layer_offload): only the count must agree
    if entry.kind == "ordering" and len(row.paper or []) != len(entry.value):
        return (f"the paper's ordering {row.paper} has {len(row.paper or [])} systems, the "
                f"inventory's {entry.value} {len(entry.value)}")
    return None


def _rows_by_id(inventory: list[Claim], found: dict) -> dict[str, ClaimRow]:
    entries = {c.id: c for c in inventory}
    rows, errors = {}, []
    for name, emitted in found.items():
        for row in emitted if isinstance(emitted, list) else []:
            entry = entries.get(row.claim_id)
            if entry is None:
                errors.append(f"experiment {name} emits claim {row.claim_id!r}, which no "
                              "inventory file lists (analysis/repro/inventory/)")
            elif entry.experiment is None and row.kind == "not_expressible":
                continue  # the experiment agrees with the inventory: its reason stands
            elif entry.experiment != name:
                errors.append(f"experiment {name} emits claim {row.claim_id!r}, which the "
                              f"inventory ({entry.paper}.yaml) gives to "
                              f"{entry.experiment or 'no experiment'}")
            elif row.claim_id in rows:
                errors.append(f"experiment {name} emits claim {row.claim_id!r} twice")
            elif (why := _disagreement(entry, row)) is not None:
                errors.append(f"experiment {name}, claim {row.claim_id!r}: {why}")
            else:
                rows[row.claim_id] = judge(row)
    if errors:
        raise InventoryError("the experiments and the claims inventory disagree:\n  "
                             + "\n  ".join(errors))
    return rows


def build(inventory: list[Claim], found: dict[str, list[ClaimRow] | str]) -> list[Line]:
    """One Line per inventory entry, in inventory order. `found`: {experiment: its
    ClaimRows, or the reason it has none} for the experiments looked at (`measured`)."""
    rows = _rows_by_id(inventory, found)
    out = []
    for entry in inventory:
        if entry.experiment is None:
            out.append(Line(entry, None, "not expressible", entry.not_expressible))
        elif entry.id in rows:
            row = rows[entry.id]
            out.append(Line(entry, row, row.verdict, row.reason))
        elif isinstance(found.get(entry.experiment), str):
            out.append(Line(entry, None, NOT_RUN, found[entry.experiment]))
        elif entry.experiment in found:
            out.append(Line(entry, None, NOT_RUN, f"{entry.experiment} ran, but its claims "
                            "hold no row with this id (partial results?)"))
        else:
            out.append(Line(entry, None, NOT_RUN, f"{entry.experiment} was not looked at"))
    return out


def claim_lines(results: Path, inventory: list[Claim] | None = None) -> list[Line]:
    """The report's rows from a results folder. Every registered experiment is read, those
    the inventory does not name too: an id they emit must be listed."""
    inventory = load() if inventory is None else inventory
    wanted = {c.experiment for c in inventory} - {None}
    found = {}
    for name in EXPERIMENTS:
        if name in wanted or (Path(results) / name).is_dir():
            found[name] = measured(name, Path(results))
    return build(inventory, found)


def write_claims(results: Path) -> int:
    try:
        lines = claim_lines(Path(results))
    except InventoryError as exc:
        print(f"moebench claims: error: {exc}", file=sys.stderr)
        return 2
    md, csv_text = render(lines)
    write_text(Path(results) / "claims.md", md)
    write_text(Path(results) / "claims.csv", csv_text)
    print(md)
    print(f"wrote {Path(results) / 'claims.md'} and {Path(results) / 'claims.csv'}")
    return 0
