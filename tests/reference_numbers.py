"""The numbers of ../shared/reference/paper_numbers.md that the claims inventory must account
for (tests/analysis/test_claims_inventory.py), found by one fixed rule:

1. Sections: only "## A1." to "## A4." and "## A2-v1." (the papers); a section ends at the
   next "## " heading. Sections B, C and D (configs, hardware, traces) are inputs, not claims.
2. Labels: [R] and [S] and their qualified forms ([R, text], [R, from text], [R-secondary])
   mark numbers as read in a source or in a brief; [C] and [G] (computed, estimate) do not.
3. Scope: a label in a section's heading (A2-v1 [S], A4 [R]) covers the whole section. A label
   on a line covers that line and runs on over the unlabelled lines below it - the table rows
   and bullet items under a labelled line ("Table 1 [R] ...:" then "| DeepSpeed | 513 |"),
   and the prose that continues it ("Also in the text: BrainStorm averages 934 ms") - until
   the next labelled line or the section's end. A [C]/[G] line stops the run. Lines above a
   section's first label (its "Source:" line) are not covered.
4. Numbers: every decimal literal of a covered line (18,874,368 is one number, .478 is 0.478,
   the sign is dropped: "-46 %" is 46), except
   - in the heading line itself (it names the paper: arXiv ids, years, table numbers);
   - digits glued to a letter before them or to a letter and a hyphen: names, not values
     (A5000, V2, bs16, PCIe4.0, Qwen1.5, Mixtral-8x7B, top-1, NLLB-MoE-54B) - except a
     dataset name of MoE-Infinity's Table 2 (BigBench, Flan, MMLU) glued to its K-means
     group count ("BigBench10/Flan15"): the conversion lost the space, the count is a value;
   - references to a table, figure, section or appendix ("Table 1", "Fig. 14b");
   - identifiers removed first: arXiv ids, DOIs, commit hashes, file names.
   A number followed by K is matched both as written and times 1000 (1K: 1 or 1000).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from analysis.repro.inventory import same_number

_HEADING = re.compile(r"^## (A[1-4](?:-v1)?)\.")
_READ = re.compile(r"\[[RS](?:[-, ][^\]]*)?\]")
_NOT_READ = re.compile(r"\[[CG](?:[-, ][^\]]*)?\]")
_IDENTIFIERS = re.compile(
    r"arXiv \d{4}\.\d{4,5}(?:v\d+)?|\bdoi \S+|\bcommit [0-9a-f]{7,40}\b"
    r"|\S+\.(?:txt|md|py|jsonl|json|gz)\b"
    r"|\b(?:Tables?|Fig\.?|Figure|Sec\.?|Section|Appendix)\s*\d+[a-z]?\b")
_GROUP_COUNT = re.compile(r"\b(BigBench|Flan|MMLU)(\d+)\b")  # "BigBench10" -> "BigBench 10"
_NUMBER = re.compile(r"(?<![A-Za-z0-9_])(?<![A-Za-z]-)(?<!\d\.)"
                     r"(\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:\.\d+)?|\.\d+)(K?)")


@dataclass(frozen=True)
class Number:
    section: str  # A1, A2, A2-v1, A3, A4
    lineno: int
    line: str
    written: str  # as in the file
    values: tuple[float, ...]  # what may stand for it in `numbers` (1K: 1 and 1000)


def numbers_in(line: str) -> list[tuple[str, tuple[float, ...]]]:
    """(as written, values) of every number of one line, by rule 4."""
    out = []
    for m in _NUMBER.finditer(_GROUP_COUNT.sub(r"\1 \2", _IDENTIFIERS.sub(" ", line))):
        value = float(m.group(1).replace(",", ""))
        out.append((m.group(0), (value, value * 1000) if m.group(2) else (value,)))
    return out


def read_numbers(text: str) -> list[Number]:
    """Every number that rules 1-3 cover, in file order."""
    out, section, whole, run = [], None, False, False
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            m = _HEADING.match(line)
            section = m.group(1) if m else None
            whole, run = bool(m and _READ.search(line)), False
            continue
        if section is None:
            continue
        if _READ.search(line):
            run = True
        elif _NOT_READ.search(line):
            run = False
        if (whole or run) and not (_NOT_READ.search(line) and not _READ.search(line)):
            out += [Number(section, lineno, line, w, v) for w, v in numbers_in(line)]
    return out


def _claimed(n: Number, claims) -> bool:
    return any(n.section in c.sections and any(same_number(v, x) for v in n.values
                                               for x in c.numbers) for c in claims)


def unmapped(numbers: list[Number], claims, exclusions) -> list[Number]:
    """The numbers that no claim's `numbers` (in a section its `from` names) and no
    excluded.yaml entry (on that line) account for."""
    return [n for n in numbers if not _claimed(n, claims)
            and not any(e.covers(n.section, n.line, v) for e in exclusions for v in n.values)]


def stale_exclusions(numbers: list[Number], exclusions) -> list[str]:
    """excluded.yaml entries that find no covered line, or list a number none of their
    lines holds: a typo, or a line the reference file no longer has."""
    out = []
    for e in exclusions:
        lines = [n for n in numbers if n.section == e.section and re.search(e.line, n.line)]
        if not lines:
            out.append(f"{e.section} {e.line!r}: finds no line with a read number")
        for x in e.numbers or ():
            if not any(same_number(v, x) for n in lines for v in n.values):
                out.append(f"{e.section} {e.line!r}: lists {x:g}, which its lines do not hold")
    return out


def unknown_claim_numbers(numbers: list[Number], claims) -> list[str]:
    """Inventory `numbers` that no read line of the sections their `from` names holds."""
    out = []
    for c in claims:
        found = [v for n in numbers if n.section in c.sections for v in n.values]
        out += [f"{c.paper}.yaml {c.id!r}: {x:g} is not a read number of "
                f"{'/'.join(c.sections)}" for x in c.numbers
                if not any(same_number(v, x) for v in found)]
    return out
