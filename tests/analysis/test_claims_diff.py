"""moebench claims-diff: verdicts that moved between two claims.csv files (hand-made rows)."""

from __future__ import annotations

import csv

from analysis.repro import claims_diff

HEAD = ["paper", "claim_id", "verdict", "ours", "real_verdict", "ours_real", "reason"]


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEAD)
        w.writerows(rows)
    return path


def test_moved_verdicts_totals_and_one_sided_claims(tmp_path, capsys):
    old = _write(tmp_path / "old.csv", [
        ["p", "a", "reproduced", "1.2 [1.1, 1.3]", "", "", ""],
        ["p", "b", "no effect", "1.0 [0.9, 1.1]", "not reproduced", "0.8", ""],
        ["p", "gone", "not expressible", "", "", "", ""]])
    new = _write(tmp_path / "new.csv", [
        ["p", "a", "reproduced", "1.25 [1.2, 1.3]", "", "", ""],
        ["p", "b", "direction only", "1.5 [1.4, 1.6]", "not reproduced", "0.8", ""],
        ["p", "fresh", "no effect", "1.0", "", "", ""]])
    out = tmp_path / "moved.md"
    assert claims_diff.main([str(old), str(new), "--out", str(out)]) == 0
    text = out.read_text()
    # a's value moved but not its verdict; b's synthetic verdict moved, its real one did not
    assert "1 verdicts moved" in text
    assert "| b | verdict | no effect | direction only | 1.0 [0.9, 1.1] | 1.5 [1.4, 1.6] |" in text
    assert "| a |" not in text
    # totals: reproduced 1 -> 1, no effect 1 -> 1 (b left, fresh came), not expressible 1 -> 0
    assert "| reproduced | 1 | 1 |" in text and "| no effect | 1 | 1 |" in text
    assert "| not expressible | 1 | 0 |" in text and "| direction only | 0 | 1 |" in text
    assert "only in the old report: gone." in text and "only in the new: fresh." in text
    assert text.strip() == capsys.readouterr().out.strip()


def test_a_file_without_the_columns_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("claim_id,verdict\na,reproduced\n")
    good = _write(tmp_path / "good.csv", [["p", "a", "reproduced", "", "", "", ""]])
    assert claims_diff.main([str(bad), str(good)]) == 2
    assert f"{bad}: no column 'ours'" in capsys.readouterr().err
    assert claims_diff.main([str(tmp_path / "absent.csv"), str(good)]) == 2
