"""The reproduction suite as a whole (analysis/repro/): every experiment has a config that
composes with each of its sweeps, a make target and a docs entry; a report and the claims
rebuilt from the same results are byte-identical."""

from __future__ import annotations

import re

import pytest
from helpers import ROOT

from analysis.repro import suite
from analysis.repro.registry import EXPERIMENTS, names
from harness.runner.config import compose_config
from harness.runner.run import run_config
from harness.runner.runconfig import check_run_config


def _first_values(overrides) -> list[str]:
    """One job of a sweep: the first value of each `key=a,b,c` (commas inside brackets or
    parentheses, as in glob(...) or [1,2], do not split)."""
    out = []
    for item in overrides:
        key, _, value = item.partition("=")
        depth, cut = 0, len(value)
        for i, ch in enumerate(value):
            depth += ch in "([{"
            depth -= ch in ")]}"
            if ch == "," and depth == 0:
                cut = i
                break
        first = value[:cut]
        if first.startswith("glob("):
            continue  # a system glob: the experiment's default system stands in
        out.append(f"{key}={first}")
    return out


@pytest.mark.parametrize("name", names())
def test_every_experiment_composes_and_is_documented(name, tmp_path):
    exp = EXPERIMENTS[name]
    assert (ROOT / "conf" / "experiment" / f"{name}.yaml").is_file()
    assert exp.sweeps, f"{name}: no sweep"
    for sweep in exp.sweeps:
        if sweep.real:
            assert exp.real_model in ("deepseek_v2_lite", "mixtral_8x7b")
            continue
        cfg = compose_config([f"experiment={name}", *_first_values(sweep.overrides)],
                             results_dir=str(tmp_path))
        check_run_config(cfg)  # every key and value a run would check, nothing run
    docs = (ROOT / "docs" / "reproduction.md").read_text()
    assert f"make reproduce-{name}" in docs, f"docs/reproduction.md does not list {name}"


def test_makefile_runs_every_experiment():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^reproduce-%:", makefile, re.M)
    assert "$(MOEBENCH) reproduce all" in makefile and "$(MOEBENCH) figures" in makefile


def _inventory_of(rows) -> list:
    """An inventory listing what table1 emitted, and one claim of an experiment not run: the
    claims step then depends on table1's code only, not on the inventory files' contents
    (tests/analysis/test_claims_report.py tests the report against an inventory)."""
    from analysis.repro.inventory import Claim

    def entry(cid, kind, value, exp):
        return Claim(paper="moe_infinity", title="MoE-Infinity", id=cid, source="Table 1",
                     claim=cid, kind=kind, value=value, rule=None, origin="test",
                     numbers=(), experiment=exp, not_expressible=None)

    return [*(entry(r.claim_id, r.kind, r.paper, "table1") for r in rows),
            entry("fmoe_overall.x", "ratio", 2.0, "fmoe_overall")]


def test_reports_and_claims_rebuild_byte_identical(tmp_path, monkeypatch):
    """Two table1 runs at a tiny size, then the report and the claims twice: same bytes."""
    from analysis.repro import claims as claims_report

    for system in ("lru", "moe_infinity"):
        cfg = compose_config(["experiment=table1", f"system={system}",
                              "workload.num_requests=2", "workload.prompt_len=16",
                              "workload.output_len=3", "calibration_requests=2",
                              "progress=false", "trace_cache_dir=null"],
                             results_dir=str(tmp_path))
        assert run_config(cfg)["status"] == "valid"
    outputs = [tmp_path / "table1" / f"table1.{ext}" for ext in ("md", "tex", "csv", "png",
                                                                "pdf")]
    outputs += [tmp_path / "claims.md", tmp_path / "claims.csv"]
    emitted = claims_report.measured("table1", tmp_path)
    monkeypatch.setattr(claims_report, "load", lambda: _inventory_of(emitted))
    seen = []
    for _ in range(2):
        assert suite.report("table1", tmp_path) == 2  # six systems never ran
        assert suite.report("table1", tmp_path, allow_partial=True) == 0
        assert suite.claims(tmp_path) == 0
        seen.append([p.read_bytes() for p in outputs])
    assert seen[0] == seen[1]
    text = outputs[0].read_text()
    assert "SIMULATED" in text and "SYNTHETIC routing" in text and "PARTIAL" in text
    # both runs are seed 0's: the table says it cannot judge beyond direction
    assert "Seed 0 only: one seed: no intervals, no verdicts beyond direction." in text
    claims = outputs[5].read_text()
    assert [r.claim_id for r in emitted if r.claim_id not in claims] == []
    assert "| fmoe_overall.x " in claims and "not run" in claims  # others not run here
