"""results/claims.md and claims.csv from the report's rows (built by analysis/repro/claims.py).

claims.md: a header (SIMULATED, the statistical rule, the seeds found, totals by verdict and
the routing-sensitive count), then one table per paper in inventory order. claims.csv: the
same rows and columns with every estimate split into mean, low, high and n, for machines.
Nothing depends on the time or the machine: the same results give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.repro.inventory import Claim
from analysis.repro.output import fmt
from analysis.repro.stats import Estimate
from analysis.repro.verdict import BAND, ONE_SEED, VERDICTS, ClaimRow, as_estimate

NOT_RUN = "not run"


@dataclass
class Line:
    """One row of the report: the inventory entry and, where measured, its judged ClaimRow."""

    entry: Claim
    row: ClaimRow | None
    verdict: str
    reason: str


COLUMNS = ("claim id", "source", "claim", "paper", "ours (synthetic)", "verdict",
           "ours (real sample)", "real verdict", "routing-sensitive", "baseline headroom",
           "best variant", "oracle", "reason")


def _split_columns(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}_{k}" for k in ("mean", "low", "high", "n"))


CSV_COLUMNS = ("paper", "claim_id", "source", "claim", "kind", "paper_value", "ours",
               *_split_columns("ours"), "verdict", "ours_real", *_split_columns("real"),
               "real_sample", "real_verdict", "routing_sensitive", "baseline_headroom",
               "best_variant", *_split_columns("variant"), *_split_columns("oracle"), "reason")
ONE_SEED_NOTE = "one seed: no intervals, no verdicts beyond direction"
RULE = (
    "Each value of ours is an estimate with its 95 % interval: a paired t-interval over "
    "seeds on synthetic routing, a paired bootstrap over requests on a real sample "
    "(analysis/repro/stats.py). A ratio is *reproduced* when its interval excludes 1 on the "
    f"paper's side and its point lies within a factor {BAND} of the paper's, *direction only* "
    "when just the side agrees, *no effect* when the interval holds 1 and *not reproduced* "
    "when it excludes 1 on the other side; orderings, pairs and locations apply the same "
    "test to their paired differences (analysis/repro/verdict.py).")


def _estimate(value) -> Estimate | None:
    """A ratio's or location's value as an Estimate (a float is one seed's point); None for
    an ordering (names) or a text."""
    if isinstance(value, Estimate):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return as_estimate(value)
    return None


def seeds(line: Line) -> int | None:
    """How many seeds the synthetic value rests on (None: nothing measured)."""
    row = line.row
    if row is None or line.verdict == "not expressible":
        return None
    if row.diffs:
        return min(d.n for d in row.diffs)
    est = _estimate(row.ours)
    return est.n if est is not None else 1


def _value_text(value, diffs) -> str:
    if value is None and diffs:
        return "; ".join(d.text() for d in diffs)  # a pairs claim: its differences
    est = _estimate(value)
    if est is not None:
        return est.text()
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))  # an ordering, best first
    return "" if value is None else str(value)


def _ours(line: Line) -> str:
    n = seeds(line)
    if n is None:
        return ""
    return f"{_value_text(line.row.ours, line.row.diffs)} ({n} seed{'s' if n != 1 else ''})"


def _real(line: Line) -> str:
    row = line.row
    if row is None:
        return ""
    text = _value_text(row.ours_real, row.real_diffs)
    if text and row.real_sample:
        return f"{text} ({row.real_sample})"
    return text or row.real_sample or ""


def _paper(value) -> str:
    if value is None:
        return "qualitative"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return f"{value:g}"


def _variant(row) -> str:
    if row is None or not row.variant_name:
        return ""
    est = _estimate(row.variant)
    return row.variant_name if est is None else f"{row.variant_name}: {est.text()}"


def cells(line: Line) -> dict[str, str]:
    """The markdown row of one Line, by COLUMNS."""
    row, entry = line.row, line.entry
    oracle = _estimate(row.oracle) if row is not None else None
    return dict(zip(COLUMNS, (
        entry.id, entry.source, entry.claim, _paper(entry.value), _ours(line), line.verdict,
        _real(line), row.real_verdict if row is not None else "",
        "yes" if row is not None and row.routing_sensitive else "",
        fmt(row.headroom, "headroom") if row is not None else "", _variant(row),
        oracle.text() if oracle is not None else "", line.reason)))


def _number(x) -> str:
    return "" if x is None else repr(float(x))


def _split(prefix: str, est: Estimate | None) -> dict[str, str]:
    values = (_number(est.mean), _number(est.low), _number(est.high), str(est.n)) if est \
        else ("",) * 4
    return dict(zip(_split_columns(prefix), values))


def csv_record(line: Line) -> dict[str, str]:
    """One row of claims.csv: the markdown cells, estimates split into mean/low/high/n."""
    row, c = line.row, cells(line)
    get = (lambda attr: getattr(row, attr)) if row is not None else (lambda attr: None)
    n = seeds(line)
    ours = _split("ours", _estimate(get("ours")))
    ours["ours_n"] = "" if n is None else str(n)  # orderings and pairs: their differences'
    return {
        "paper": line.entry.paper, "claim_id": c["claim id"], "source": c["source"],
        "claim": c["claim"], "kind": line.entry.kind, "paper_value": c["paper"],
        "ours": c["ours (synthetic)"], **ours, "verdict": line.verdict,
        "ours_real": c["ours (real sample)"], **_split("real", _estimate(get("ours_real"))),
        "real_sample": get("real_sample") or "", "real_verdict": c["real verdict"],
        "routing_sensitive": "true" if c["routing-sensitive"] else "false",
        "baseline_headroom": _number(get("headroom")), "best_variant": get("variant_name") or "",
        **_split("variant", _estimate(get("variant"))),
        **_split("oracle", _estimate(get("oracle"))), "reason": line.reason}


def totals(lines: list[Line]) -> dict[str, int]:
    """{verdict: count}, the rule's verdicts first, then any other in name order."""
    order = [*VERDICTS, *ONE_SEED, NOT_RUN]
    found = [line.verdict for line in lines]
    keys = [v for v in order if v in found] + sorted(set(found) - set(order))
    return {v: found.count(v) for v in keys}


def _seeds_line(lines: list[Line]) -> str:
    ns = sorted({n for n in map(seeds, lines) if n is not None})
    if not ns:
        return "Seeds found: none (no claim measured yet)."
    if len(ns) == 1:
        return f"Seeds found: {ns[0]} per measured claim."
    ones = sum(seeds(line) == 1 for line in lines)
    return (f"Seeds found: {ns[0]} to {ns[-1]} per measured claim"
            + (f" ({ones} claim{'s' if ones != 1 else ''} with one)." if ones else "."))


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def header(lines: list[Line]) -> list[str]:
    sensitive = sum(bool(line.row and line.row.routing_sensitive) for line in lines)
    out = ["# Published claims against the simulator (SIMULATED)", "",
           "Every value of ours is SIMULATED: `ours (synthetic)` on synthetic routing fitted to "
           "real samples, `ours (real sample)` replaying a shared real routing sample (its "
           "size beside it). One row per claim of the inventory (analysis/repro/inventory/, "
           "docs/claims.md).", "", RULE, "", _seeds_line(lines)]
    if any(seeds(line) == 1 for line in lines):
        out += ["", f"**{ONE_SEED_NOTE}.**"]
    counts = ", ".join(f"{v} {n}" for v, n in totals(lines).items())
    out += ["", f"Totals: {counts or 'no claims'}.",
            f"Routing-sensitive claims (synthetic and real-sample verdicts both judged and "
            f"different): {sensitive}."]
    return out


def render(lines: list[Line]) -> tuple[str, str]:
    """(claims.md, claims.csv)."""
    import pandas as pd

    md = header(lines)
    papers = list(dict.fromkeys(line.entry.paper for line in lines))
    for paper in papers:
        mine = [line for line in lines if line.entry.paper == paper]
        table = pd.DataFrame([{k: _md_cell(v) for k, v in cells(line).items()} for line in mine],
                             columns=list(COLUMNS))
        md += ["", f"## {mine[0].entry.title}", "",
               table.to_markdown(index=False, disable_numparse=True)]
    csv_text = pd.DataFrame([csv_record(line) for line in lines], columns=list(CSV_COLUMNS),
                            dtype=str).to_csv(index=False, lineterminator="\n")
    return "\n".join(md) + "\n", csv_text
