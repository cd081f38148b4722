"""`moebench audit-prefetch` on a tiny setting: every system runs with and without prefetch,
the on/off ratio is the two runs' TPOT means divided (read back from their result.json), and
the verdict is the worst ratio over seeds against the 1 % tolerance."""

from __future__ import annotations

import json

import pandas as pd

from analysis.prefetch_audit import main, verdicts
from harness.runner.config import system_names


def test_audit_runs_every_system_both_ways(tmp_path):
    out = tmp_path / "audit"
    assert main(["--requests", "3", "--seeds", "0", "--no-real", "--out", str(out)]) == 0
    runs = [json.loads(p.read_text()) for p in (out / "synthetic").glob("*/result.json")]
    assert sorted({(r["system"]["name"], r["config"]["system"]["prefetch"]) for r in runs}) == \
        sorted((s, p) for s in system_names() for p in (True, False))
    csv = pd.read_csv(out / "audit.csv")
    lru = {r["config"]["system"]["prefetch"]: r["metrics"]["tpot_ms"]["mean"] for r in runs
           if r["system"]["name"] == "lru"}
    row = csv[csv.system == "lru"].iloc[0]
    assert abs(row.tpot_on_over_off - lru[True] / lru[False]) < 1e-12
    assert "prefetch_never_slower" in (out / "audit.md").read_text()


def test_verdict_is_the_worst_seed_against_one_percent():
    wide = pd.DataFrame({"system": ["a", "a", "b", "b"], "seed": [0, 1, 0, 1],
                         "tpot_on_over_off": [0.95, 1.009, 1.0, 1.02]})
    v = verdicts(wide).set_index("system")
    assert v.loc["a", "worst_on_over_off"] == 1.009 and bool(v.loc["a", "prefetch_never_slower"])
    assert not bool(v.loc["b", "prefetch_never_slower"]) and v.loc["b", "seeds"] == 2
