"""The claims report (analysis/repro/claims.py, claims_table.py) on a hand-made inventory and
hand-made ClaimRows: a row for every inventory entry, in order, with "not run" and "not
expressible" rows, errors for ids the inventory does not list, the header's one-seed note and
routing-sensitive count, and the CSV's split estimates."""

from __future__ import annotations

import pytest

from analysis.repro import claims
from analysis.repro.claims import build, write_claims
from analysis.repro.claims_table import COLUMNS, ONE_SEED_NOTE, render
from analysis.repro.inventory import InventoryError, load
from analysis.repro.stats import Estimate
from analysis.repro.verdict import ClaimRow

MOE = """\
paper: "Paper M"
claims:
  - {id: a.speedup, source: "Table 1", claim: "M is 2x faster than B", kind: ratio,
     value: 2.0, from: "paper_numbers.md A1", numbers: [], experiment: exp_a}
  - {id: a.order, source: "Table 1", claim: "x before y before z", kind: ordering,
     value: [x, y, z], from: "paper_numbers.md A1", experiment: exp_a}
  - {id: b.speedup, source: "Fig. 3", claim: "3x faster", kind: ratio, value: 3.0,
     from: "paper_numbers.md A1", experiment: exp_b}
  - {id: a.gpus, source: "Fig. 7", claim: "needs 8 GPUs without offloading",
     kind: not_expressible, from: "paper_numbers.md A1",
     not_expressible: "the simulator models one GPU"}
"""
FMOE = """\
paper: "Paper F"
claims:
  - {id: f.lowest, source: "Fig. 11", claim: "F lowest at every size", kind: pairs,
     rule: "F minus each other system, at every size, below 0", from: "brief",
     experiment: exp_a}
"""
SAMPLE = "100 prompts (a shared sample)"


def t(mean, low, high, n=5):
    return Estimate(mean, low, high, n, "t")


@pytest.fixture
def inventory(tmp_path):
    (tmp_path / "moe_infinity.yaml").write_text(MOE)
    (tmp_path / "fmoe.yaml").write_text(FMOE)
    return load(tmp_path, experiments={"exp_a", "exp_b"})


def rows(one_seed: bool = False) -> list[ClaimRow]:
    """exp_a's rows: the speed-up reproduced on synthetic routing and not on the real sample
    (routing-sensitive), the ordering and the pairs reproduced."""
    speed = ClaimRow("a.speedup", "exp_a", "Table 1", "faster", "ratio", paper=2.0,
                     ours=2.1 if one_seed else t(2.1, 1.9, 2.3),
                     ours_real=Estimate(0.8, 0.7, 0.9, 100, "bootstrap"), real_sample=SAMPLE,
                     headroom=3.456, variant_name="m_big", variant=t(2.5, 2.2, 2.8),
                     oracle=t(4.0, 3.5, 4.5))
    order = ClaimRow("a.order", "exp_a", "Table 1", "order", "ordering", paper=["x", "y", "z"],
                     ours=["x", "y", "z"], diffs=[t(-1.0, -1.5, -0.5), t(-2.0, -3.0, -1.0)])
    pairs = ClaimRow("f.lowest", "exp_a", "Fig. 11", "lowest", "pairs",
                     diffs=[t(-0.3, -0.5, -0.1), t(-0.2, -0.4, -0.05)])
    return [speed, order, pairs]


NOT_RUN_B = "make reproduce-exp_b has not run: no results in results/exp_b"


def table_rows(md: str) -> dict[str, list[str]]:
    """{claim id: its cells} from the markdown tables (cells stripped)."""
    out = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith(("| claim id", "|:")):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0]] = cells
    return out


def test_every_inventory_entry_is_a_row_in_inventory_order(inventory):
    lines = build(inventory, {"exp_a": rows(), "exp_b": NOT_RUN_B})
    assert [(x.entry.id, x.verdict) for x in lines] == [
        ("a.speedup", "reproduced"), ("a.order", "reproduced"), ("b.speedup", "not run"),
        ("a.gpus", "not expressible"), ("f.lowest", "reproduced")]
    assert lines[2].reason == NOT_RUN_B
    assert lines[3].reason == "the simulator models one GPU"
    md, _ = render(lines)
    # grouped by paper, in the order of PAPERS (moe_infinity before fmoe)
    assert md.index("## Paper M") < md.index("a.gpus") < md.index("## Paper F") < md.index(
        "f.lowest")
    cells = table_rows(md)
    assert list(cells) == ["a.speedup", "a.order", "b.speedup", "a.gpus", "f.lowest"]
    speed = dict(zip(COLUMNS, cells["a.speedup"]))
    assert speed == {
        "claim id": "a.speedup", "source": "Table 1", "claim": "M is 2x faster than B",
        "paper": "2", "ours (synthetic)": "2.1 [1.9, 2.3] (5 seeds)", "verdict": "reproduced",
        "ours (real sample)": f"0.8 [0.7, 0.9] ({SAMPLE})", "real verdict": "not reproduced",
        "routing-sensitive": "yes", "baseline headroom": "3.46",
        "best variant": "m_big: 2.5 [2.2, 2.8]", "oracle": "4 [3.5, 4.5]",
        "reason": speed["reason"]}
    assert speed["reason"].startswith("ours 2.1 [1.9, 2.3] against the paper's 2")
    gpus = dict(zip(COLUMNS, cells["a.gpus"]))
    assert (gpus["verdict"], gpus["reason"]) == ("not expressible",
                                                 "the simulator models one GPU")
    assert dict(zip(COLUMNS, cells["b.speedup"]))["verdict"] == "not run"
    assert dict(zip(COLUMNS, cells["f.lowest"]))["paper"] == "qualitative"
    assert "Totals: reproduced 3, not expressible 1, not run 1." in md
    assert "Routing-sensitive claims (synthetic and real-sample verdicts both judged and " \
           "different): 1." in md
    assert "Seeds found: 5 per measured claim." in md and ONE_SEED_NOTE not in md
    assert "SIMULATED" in md and "analysis/repro/verdict.py" in md


def test_one_seed_says_so_in_the_header(inventory):
    md, _ = render(build(inventory, {"exp_a": rows(one_seed=True), "exp_b": NOT_RUN_B}))
    assert f"**{ONE_SEED_NOTE}.**" in md
    assert "Seeds found: 1 to 5 per measured claim (1 claim with one)." in md
    speed = dict(zip(COLUMNS, table_rows(md)["a.speedup"]))
    assert (speed["ours (synthetic)"], speed["verdict"]) == ("2.1 (1 seed)",
                                                             "same direction (one seed)")
    # a one-seed synthetic verdict is not judged, so no claim is routing-sensitive
    assert "different): 0." in md


def test_csv_splits_estimates_and_rebuilds_byte_identical(inventory):
    found = {"exp_a": rows(), "exp_b": NOT_RUN_B}
    md, csv_text = render(build(inventory, found))
    again = render(build(inventory, {"exp_a": rows(), "exp_b": NOT_RUN_B}))
    assert (md, csv_text) == again
    import csv
    import io

    reader = csv.DictReader(io.StringIO(csv_text))
    assert reader.fieldnames == [
        "paper", "claim_id", "source", "claim", "kind", "paper_value", "ours", "ours_mean",
        "ours_low", "ours_high", "ours_n", "verdict", "ours_real", "real_mean", "real_low",
        "real_high", "real_n", "real_sample", "real_verdict", "routing_sensitive",
        "baseline_headroom", "best_variant", "variant_mean", "variant_low", "variant_high",
        "variant_n", "oracle_mean", "oracle_low", "oracle_high", "oracle_n", "reason"]
    records = {r["claim_id"]: r for r in reader}
    assert list(records) == ["a.speedup", "a.order", "b.speedup", "a.gpus", "f.lowest"]
    speed = records["a.speedup"]
    assert {k: speed[k] for k in ("paper", "kind", "ours_mean", "ours_low", "ours_high",
                                  "ours_n", "real_mean", "real_n", "real_sample",
                                  "routing_sensitive", "best_variant", "variant_mean",
                                  "oracle_high")} == {
        "paper": "moe_infinity", "kind": "ratio", "ours_mean": "2.1", "ours_low": "1.9",
        "ours_high": "2.3", "ours_n": "5", "real_mean": "0.8", "real_n": "100",
        "real_sample": SAMPLE, "routing_sensitive": "true", "best_variant": "m_big",
        "variant_mean": "2.5", "oracle_high": "4.5"}
    # an ordering has no single estimate; its n is its differences'
    assert (records["a.order"]["ours_mean"], records["a.order"]["ours_n"]) == ("", "5")
    assert records["b.speedup"]["verdict"] == "not run" and records["b.speedup"]["ours_n"] == ""


@pytest.mark.parametrize("emitted, words", [
    ([ClaimRow("a.unknown", "exp_a", "", "", "ratio", paper=2.0, ours=2.0)],
     ["experiment exp_a emits claim 'a.unknown'", "no inventory file lists"]),
    ([ClaimRow("b.speedup", "exp_a", "", "", "ratio", paper=3.0, ours=3.0)],
     ["experiment exp_a emits claim 'b.speedup'", "gives to exp_b"]),
    ([ClaimRow("a.speedup", "exp_a", "", "", "ratio", paper=4.0, ours=3.0)],
     ["claim 'a.speedup'", "the paper's value 4, the inventory says 2"]),
    ([ClaimRow("a.order", "exp_a", "", "", "ordering", paper=["y", "x"], ours=["x"])],
     ["claim 'a.order'", "has 2 systems, the inventory's ['x', 'y', 'z'] 3"]),
    ([ClaimRow("a.speedup", "exp_a", "", "", "location", paper=2.0, ours=2.0)],
     ["claim 'a.speedup'", "kind 'location', the inventory says 'ratio'"]),
    ([ClaimRow("a.speedup", "exp_a", "", "", "ratio", paper=2.0, ours=2.0)] * 2,
     ["emits claim 'a.speedup' twice"]),
])
def test_an_experiment_contradicting_the_inventory_is_an_error(inventory, emitted, words):
    with pytest.raises(InventoryError) as err:
        build(inventory, {"exp_a": emitted, "exp_b": NOT_RUN_B})
    for w in words:
        assert w in str(err.value)


def test_a_rounded_inventory_value_and_a_not_expressible_row_are_accepted(inventory):
    emitted = [ClaimRow("a.speedup", "exp_a", "", "", "ratio", paper=2.04, ours=t(2, 1.8, 2.2)),
               ClaimRow("a.order", "exp_a", "", "", "not_expressible", note="no z here")]
    lines = build(inventory, {"exp_a": emitted, "exp_b": NOT_RUN_B})
    assert [x.verdict for x in lines[:2]] == ["reproduced", "not expressible"]
    assert lines[1].reason == "no z here"
    # exp_a ran but did not emit f.lowest: shown as not run, with why
    assert lines[4].verdict == "not run" and "hold no row with this id" in lines[4].reason


def test_write_claims_reads_the_results_folder(tmp_path, monkeypatch, inventory, capsys):
    """Through the command's path: a registered experiment without results is "not run"; an
    experiment emitting an unknown id makes the command fail, naming it."""
    from analysis.repro.inventory import Claim

    entry = inventory[0]
    fields = {**entry.__dict__, "id": "table1.x", "experiment": "table1"}
    tiny = [Claim(**fields), inventory[3]]
    monkeypatch.setattr(claims, "load", lambda: tiny)
    assert write_claims(tmp_path) == 0
    md = (tmp_path / "claims.md").read_text()
    cells = table_rows(md)
    assert list(cells) == ["table1.x", "a.gpus"]
    row = dict(zip(COLUMNS, cells["table1.x"]))
    assert row["verdict"] == "not run" and "make reproduce-table1 has not run" in row["reason"]
    assert (tmp_path / "claims.csv").read_text().startswith("paper,claim_id,source,claim,")

    fake = [ClaimRow("table1.surprise", "table1", "", "", "ratio", paper=2.0, ours=2.0)]
    monkeypatch.setattr(claims, "measured", lambda name, results: fake)
    capsys.readouterr()
    assert write_claims(tmp_path) == 2
    err = capsys.readouterr().err
    assert "experiment table1 emits claim 'table1.surprise'" in err


def test_an_empty_inventory_gives_the_header_and_columns():
    md, csv_text = render(build([], {}))
    assert "Totals: no claims." in md and "Seeds found: none (no claim measured yet)." in md
    assert csv_text.startswith("paper,claim_id,source,") and csv_text.count("\n") == 1
