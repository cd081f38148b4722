"""fmoe_overall and fmoe_online (analysis/repro/experiments/): tables and claims on small
hand-made frames shaped like analysis/repro/frame.run_rows (a `_result` holding config.seed),
expected values worked by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml
from helpers import ROOT

from analysis.repro.experiments import fmoe_online as online
from analysis.repro.experiments import fmoe_overall as overall
from analysis.repro.verdict import judge

INVENTORY = ROOT / "analysis/repro/inventory/fmoe.yaml"

SYSTEMS = {name: {"name": name} for name in (
    "layer_offload", "lru", "moe_infinity", "moe_infinity_hysteresis", "fmoe", "fmoe_admission",
    "oracle")}
SYSTEMS["promoe"] = {"name": "composed", "evictor": {"name": "lfu_perfect"},
                     "prefetcher": {"name": "promoe"}}


def _row(system, dataset, ttft, tpot, hit, head=2.0, seed=0, model="mixtral_8x7b", e2e=None):
    result = {"system": SYSTEMS[system],
              "config": {"workload": {"prompts": {"dataset": dataset}}, "max_batch": 1,
                         "slo_ttft_ms": 2000, "slo_tpot_ms": 200, "seed": seed}}
    return {"run": f"{system}-{dataset}-{seed}", "system": SYSTEMS[system]["name"],
            "status": "valid", "model": model, "hardware": "rtx_3090", "requests": 12,
            "routing": "synthetic", "ttft_mean_ms": ttft, "tpot_mean_ms": tpot, "hit_rate": hit,
            "compute_floor_ms": tpot / head, "headroom": head, "e2e_mean_ms": e2e,
            "_result": result}


def _frame():
    # Two seeds x two datasets. fMoE: TTFT 1000, TPOT 100, hit 0.5 everywhere.
    # lru TPOT (ShareGPT, Arena-Hard): seed 0 200 / 100, seed 1 400 / 100, so fMoE's changes
    # are -0.5, 0 (mean -0.25: ratio 0.75) and -0.75, 0 (ratio 0.625).
    # promoe TPOT 125 in every cell (ratio 0.8 each seed); others as below.
    rows = []
    for seed in (0, 1):
        for data in ("sharegpt", "arena_hard"):
            sg = data == "sharegpt"
            lru_tpot = (200.0 if seed == 0 else 400.0) if sg else 100.0
            rows += [_row("fmoe", data, 1000.0, 100.0, 0.5, 1.5, seed),
                     _row("fmoe_admission", data, 1000.0, 50.0, 0.5, 1.0, seed),
                     _row("oracle", data, 500.0, 25.0, 1.0, 1.0, seed),
                     _row("layer_offload", data, 2000.0, 400.0, 0.25, 8.0, seed),
                     _row("lru", data, 1000.0, lru_tpot, 0.25, 4.0, seed),
                     _row("promoe", data, 1000.0, 125.0, 0.5, 2.0, seed),
                     _row("moe_infinity", data, 1000.0, 100.0, 0.4, 2.0, seed),
                     _row("moe_infinity_hysteresis", data, 900.0, 90.0, 0.45, 2.0, seed)]
    return pd.DataFrame(rows)


def test_table_means_over_seeds_and_geomean_rows():
    tab, header, _ = overall.table(_frame())
    cells = tab[tab["model"] != "all"]
    sg = cells[cells["dataset"] == "ShareGPT"]
    assert list(sg["system"]) == ["layer_offload", "lru", "promoe", "moe_infinity",
                                  "moe_infinity_hysteresis", "fmoe", "fmoe_admission", "oracle"]
    lru = sg.set_index("system").loc["lru"]
    assert lru["seeds"] == 2 and lru["tpot_mean_ms"] == pytest.approx(300.0)  # (200+400)/2
    assert lru["fmoe_tpot_speedup"] == pytest.approx(3.0)
    summary = tab[tab["model"] == "all"].set_index("system")
    assert list(summary.index) == ["layer_offload", "lru", "promoe", "moe_infinity"]
    assert summary.loc["lru", "fmoe_tpot_speedup"] == pytest.approx(math.sqrt(3.0))  # 3, 1
    assert "SIMULATED" in header[0] and "mean over the seeds" in header[2]


def test_ratio_claims_pair_seeds_and_average_changes():
    frame = _frame()
    rows = {r.claim_id: judge(r) for r in overall.claims(overall.table(frame)[0], frame, None)}
    lru = rows["fmoe_overall.v1.tpot_vs_lru"]
    assert lru.paper == pytest.approx(0.39)
    assert lru.ours.mean == pytest.approx(math.sqrt(0.75 * 0.625)) and lru.ours.n == 2
    half = 12.706 * abs(math.log(0.75) - math.log(0.625)) / 2  # t975(1) x sd / sqrt(2)
    assert lru.ours.high == pytest.approx(math.sqrt(0.75 * 0.625) * math.exp(half))
    assert lru.verdict == "no effect"  # the interval holds 1: two seeds, wide
    assert "interval wider than" in lru.reason and lru.averaged.startswith("per seed")
    # fmoe_admission: TPOT 50 -> changes -0.75, -0.5 (seed 0), -0.875, -0.5 (seed 1)
    assert lru.variant_name == "fmoe_admission"
    assert lru.variant.mean == pytest.approx(math.sqrt(0.375 * 0.3125))
    promoe = rows["fmoe_overall.eurosys.tpot_vs_promoe"]
    assert promoe.ours.mean == pytest.approx(0.8) and promoe.ours.low == pytest.approx(0.8)
    assert promoe.verdict == "reproduced"  # 0.8 against 0.73, a zero-width interval below 1
    assert promoe.oracle.mean == pytest.approx(0.2)  # 25 / 125
    assert rows["fmoe_overall.eurosys.tpot_vs_layer_offload"].headroom == pytest.approx(8.0)
    assert rows["fmoe_overall.eurosys.ttft_vs_lru"].headroom is None
    hit = rows["fmoe_overall.v1.hit_vs_layer_offload"]  # v1 claims +147 % against DeepSpeed
    assert (hit.paper, hit.ours.mean, hit.verdict) == (pytest.approx(2.47), pytest.approx(2.0),
                                                        "reproduced")
    assert "fmoe_overall.eurosys.hit_vs_layer_offload" not in rows
    mi = rows["fmoe_overall.eurosys.hit_vs_moe_infinity"]  # the paper rule, not the variant
    assert mi.ours.mean == pytest.approx(1.25) and mi.baseline == "moe_infinity"


def test_headline_averages_baselines_and_both_latencies():
    frame = _frame()
    rows = {r.claim_id: judge(r) for r in overall.claims(overall.table(frame)[0], frame, None)}
    # hit: changes vs lru +1.0, promoe 0, moe_infinity +0.25 in every cell -> 1 + 1.25 / 3
    hit = rows["fmoe_overall.v1.headline_hit"]
    assert hit.ours.mean == pytest.approx(1 + 1.25 / 3) and hit.paper == pytest.approx(1.36)
    assert rows["fmoe_overall.eurosys.headline_hit"].paper == pytest.approx(1.39)
    # latency, seed 0: TTFT changes -0.5 (DeepSpeed, 2 cells) and 0 (6 cells): mean -0.125;
    # TPOT -0.75 x2, lru -0.5 and 0, promoe -0.2 x2, moe_infinity 0 x2: mean -2.4 / 8 = -0.3
    # -> 1 - 0.2125; seed 1: TPOT lru -0.75 -> mean -0.33125 -> 1 - (0.125 + 0.33125) / 2
    lat = rows["fmoe_overall.headline_latency"]
    assert lat.ours.mean == pytest.approx(math.sqrt((1 - 0.2125) * (1 - 0.228125)))
    assert lat.paper == pytest.approx(0.53)


def test_not_expressible_rows_and_inventory_ids():
    frame = _frame()
    rows = [judge(r) for r in overall.claims(overall.table(frame)[0], frame, None)]
    assert len(rows) == 12 + 11 + 3 + 6
    ne = [r for r in rows if r.kind == "not_expressible"]
    assert all(r.verdict == "not expressible" and r.note for r in ne)
    inventory = yaml.safe_load(INVENTORY.read_text())
    ids = [c["id"] for c in inventory["claims"] if c["experiment"] == "fmoe_overall"
           or c["id"].startswith("fmoe_overall.")]
    assert sorted(ids) == sorted(r.claim_id for r in rows)


def test_one_seed_gives_direction_only_labels():
    frame = _frame()
    one = frame[[r["config"]["seed"] == 0 for r in frame["_result"]]]
    rows = {r.claim_id: judge(r) for r in overall.claims(overall.table(one)[0], one, None)}
    assert rows["fmoe_overall.v1.tpot_vs_lru"].verdict == "same direction (one seed)"
    assert rows["fmoe_overall.v1.tpot_vs_lru"].ours.mean == pytest.approx(0.75)


def test_labels_name_variants_and_compositions():
    assert overall.system_label({"system": {"name": "fmoe_admission"}}) == "fmoe_admission"
    promoe = {"name": "composed", "evictor": {"name": "lfu_perfect"},
              "prefetcher": {"name": "promoe"}}
    assert overall.system_label({"system": promoe}) == "promoe"
    other = {"name": "composed", "evictor": {"name": "lru"}, "prefetcher": {"name": "promoe"}}
    assert overall.system_label({"system": other}) == "composed(lru,promoe)"


def test_overrides_name_the_dataset_files_or_fall_back(monkeypatch):
    monkeypatch.setattr(overall, "shared_file", lambda *parts: None)
    monkeypatch.setattr(online, "shared_file", lambda *parts: None)
    assert overall.prompts_override() == "workload.prompts=null"
    assert online.arrival_overrides() == ("arrivals=gamma", "workload.arrivals.kind=null",
                                          "workload.arrivals.cv=1.454")
    fmoe = [s.overrides for s in overall.sweeps() if "system=fmoe,fmoe_admission" in s.overrides]
    assert [o[2] for o in fmoe] == ["system.prefetch_distance=3", "system.prefetch_distance=6",
                                    "system.prefetch_distance=4"]
    assert "oracle" in overall.sweeps()[0].overrides[1]


def test_online_table_and_lowest_latency_pairs():
    def res(system, e2e, seed):
        row = _row(system, None, 500.0, 300.0, 0.2, 3.0, seed, e2e=e2e)
        row["_result"].update({"metrics": {"e2e_ms": {"p50": e2e, "p90": 2 * e2e,
                                                      "p99": 4 * e2e}, "ttft_ms": {}},
                               "trace": {"arrivals": {"process": "gamma", "cv": 1.454,
                                                      "rate_rps": 2.91}}})
        row.update({"tpot_p99_ms": 350.0, "makespan_ms": 9000.0, "goodput_rps": 0.0})
        return row

    # fMoE 10 and 12 s; lru 20, 26 (differences -10, -14); promoe 15, 13 (-5, -1)
    frame = pd.DataFrame([res("fmoe", 10.0, 0), res("fmoe", 12.0, 1), res("lru", 20.0, 0),
                          res("lru", 26.0, 1), res("promoe", 15.0, 0), res("promoe", 13.0, 1)])
    tab, header, _ = online.table(frame)
    assert list(tab["system"]) == ["lru", "promoe", "fmoe"]
    assert tab.set_index("system").loc["lru", "e2e_mean_ms"] == pytest.approx(23.0)
    assert "STAND-IN" in header[2]
    (claim,) = [judge(r) for r in online.claims(tab, frame, None)]
    assert claim.kind == "pairs" and [d.mean for d in claim.diffs] == [-12.0, -3.0]
    assert claim.verdict == "direction only"  # promoe's interval (-3 +- 12.706 x 2) holds 0
    assert "layer_offload" in claim.note and "Mixtral-8x7B only" in claim.note
