"""`moebench claims-diff OLD.csv NEW.csv [--out FILE.md]`: which verdicts moved between two
claims reports (results/claims.csv of two code versions, e.g. before and after a routing
refit or a system's rule change).

Rows are matched by `claim_id`. The report gives the verdict totals of both files (synthetic
and real-sample columns), then every claim whose synthetic or real verdict differs, with both
values of ours, then the claims found in one file only. A claim absent from a file is
"absent" there. Markdown on stdout (and in FILE with --out); exit 2 on a missing file or a
file without the report's columns (the message names the file and the column).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

COLUMNS = ("claim_id", "verdict", "ours", "real_verdict", "ours_real")


def _read(path: Path):
    import pandas as pd

    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} (is it a claims.csv?)")
    if frame["claim_id"].duplicated().any():
        dup = frame.loc[frame["claim_id"].duplicated(), "claim_id"].iloc[0]
        raise ValueError(f"{path}: claim_id {dup!r} appears twice")
    return frame.set_index("claim_id")


def _totals(old, new, column: str) -> list[str]:
    counts = {name: f[column].replace("", "(none)").value_counts() for name, f in
              (("old", old), ("new", new))}
    labels = sorted(set(counts["old"].index) | set(counts["new"].index))
    lines = [f"| {column} | old | new |", "| --- | --- | --- |"]
    lines += [f"| {v} | {int(counts['old'].get(v, 0))} | {int(counts['new'].get(v, 0))} |"
              for v in labels]
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def diff(old, new) -> dict:
    """{"moved": [(claim_id, column, old verdict, new verdict, old ours, new ours)],
    "only_old": [...], "only_new": [...]} for two claims frames indexed by claim_id."""
    both = [c for c in new.index if c in old.index]
    moved = []
    for cid in both:
        for verdict, ours in (("verdict", "ours"), ("real_verdict", "ours_real")):
            a, b = old.at[cid, verdict], new.at[cid, verdict]
            if a != b:
                moved.append((cid, verdict, a, b, old.at[cid, ours], new.at[cid, ours]))
    return {"moved": moved, "only_old": [c for c in old.index if c not in new.index],
            "only_new": [c for c in new.index if c not in old.index]}


def render(old_path: Path, new_path: Path, old, new) -> str:
    d = diff(old, new)
    out = [f"# Claims moved: {old_path} -> {new_path}", "",
           f"{len(old)} claims in the old report, {len(new)} in the new; {len(d['moved'])} "
           "verdicts moved (synthetic `verdict` and real-sample `real_verdict` counted apart).",
           "", *_totals(old, new, "verdict"), "", *_totals(old, new, "real_verdict"), ""]
    if d["moved"]:
        out += ["| claim | column | old verdict | new verdict | old ours | new ours |",
                "| --- | --- | --- | --- | --- | --- |"]
        out += [f"| {cid} | {col} | {a or '(none)'} | {b or '(none)'} | {_cell(oa)} | "
                f"{_cell(ob)} |" for cid, col, a, b, oa, ob in d["moved"]]
        out.append("")
    for key, what in (("only_old", "only in the old report"), ("only_new", "only in the new")):
        if d[key]:
            out += [f"Claims {what}: {', '.join(d[key])}.", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="moebench claims-diff", description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path, help="the earlier claims.csv")
    ap.add_argument("new", type=Path, help="the later claims.csv")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args(argv)
    try:
        text = render(args.old, args.new, _read(args.old), _read(args.new))
    except (OSError, ValueError) as exc:
        print(f"moebench claims-diff: error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        from core.atomic import write_text

        write_text(args.out, text + "\n")
    print(text)
    return 0
