"""The MoE-Infinity experiments' tables and claims on small hand-made frames (shaped like
analysis/repro/frame.run_rows), with the expected values worked out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from analysis.repro.experiments import (
    eamc_capacity,
    long_context,
    moe_infinity_models,
    workload_shift,
)
from analysis.repro.experiments._moe_infinity_requests import recovery
from analysis.repro.registry import EXPERIMENTS
from analysis.repro.verdict import judge
from core.paths import PROJECT_ROOT

GIB = 2**30


def _row(**kw) -> dict:
    row = {"run": "r", "system": "moe_infinity", "status": "valid", "reason": None,
           "routing": "synthetic", "model": "deepseek_v2_lite", "hardware": "rtx_a5000",
           "expert_cache_gib": 10.0, "requests": 20, "tpot_mean_ms": None,
           "compute_floor_ms": 10.0, "headroom": None, "hit_rate_decode": 0.5,
           "decode_stall_ms_per_token": 1.0, "h2d_gb_per_token": 0.1,
           "_result": {"config": {}, "memory": {}}}
    row.update(kw)
    return row


def _claims(exp, runs, real=None):
    tab = exp.table(runs)[0]
    return {c.claim_id: judge(c) for c in exp.claims(tab, runs, real)}, tab


def test_registered():
    for name in ("moe_infinity_models", "eamc_capacity", "workload_shift", "long_context"):
        assert EXPERIMENTS[name].name == name
        assert (PROJECT_ROOT / "conf" / "experiment" / f"{name}.yaml").is_file()


def test_long_context_config_needs_no_kv_override():
    text = (PROJECT_ROOT / "conf/experiment/long_context.yaml").read_text()
    cfg = yaml.safe_load(text)
    assert "kv_elems_per_token_per_layer" not in (cfg.get("model") or {})


def test_models_speedups_and_claims():
    def run(model, system, tpot, headroom):
        return _row(model=model, system=system, tpot_mean_ms=tpot, headroom=headroom)

    runs = pd.DataFrame([run("mixtral_8x7b", "moe_infinity", 100.0, 2.0),
                         run("mixtral_8x7b", "layer_offload", 250.0, 5.0),
                         run("mixtral_8x7b", "lru", 150.0, 3.0),
                         run("deepseek_v2_lite", "moe_infinity", 20.0, 1.2),
                         run("deepseek_v2_lite", "layer_offload", 40.0, 2.0),
                         run("deepseek_v2_lite", "lru", 30.0, 1.5)])
    real = pd.DataFrame([run("mixtral_8x7b", "moe_infinity", 50.0, 1.0),
                         run("mixtral_8x7b", "layer_offload", 150.0, 3.0),
                         run("mixtral_8x7b", "lru", 60.0, 1.2)])
    rows, tab = _claims(moe_infinity_models.EXPERIMENT, runs, real)
    ds = tab[(tab["model"] == "mixtral_8x7b") & (tab["paper_system"] == "DeepSpeed")].iloc[0]
    assert ds["system"] == "layer_offload" and ds["speedup_ours"] == pytest.approx(2.5)
    assert ds["speedup_paper"] == pytest.approx(2486 / 735)
    assert ds["tpot_ratio"] == pytest.approx(250 / 2486)
    ollama = tab[(tab["model"] == "mixtral_8x7b") & (tab["paper_system"] == "Ollama")].iloc[0]
    assert ollama["system"] == "(none)" and ollama["speedup_paper"] == pytest.approx(903 / 735)
    c = rows["moe_infinity_models.speedup_vs_layer_offload.mixtral_8x7b"]
    # paper 3.38x, ours 2.5x: 3.38 / 2.5 = 1.35 > 1.25, the same side of 1
    assert (c.paper, c.ours, c.ours_real, c.headroom) == (pytest.approx(2486 / 735), 2.5, 3.0,
                                                          5.0)
    assert c.verdict == "direction only"
    lru = rows["moe_infinity_models.speedup_vs_lru.mixtral_8x7b"]
    assert lru.paper == pytest.approx(1752 / 735) and lru.ours == pytest.approx(1.5)
    assert lru.ours_real == pytest.approx(1.2) and lru.headroom == 3.0
    dsk = rows["moe_infinity_models.speedup_vs_layer_offload.deepseek_v2_lite"]
    # paper 4.75x against a headroom of 2.0: no policy reaches it here
    assert dsk.ours == pytest.approx(2.0) and "a perfect policy is at most 2.00x" in dsk.reason
    assert "moe_infinity_models.speedup_vs_lru.deepseek_v2_lite" not in rows  # README: X
    assert rows["moe_infinity_models.speedup_vs_layer_offload.nllb_moe_54b"].verdict == \
        "not expressible"  # not run in this frame: no number of ours


def _cap_runs(tpots: dict) -> pd.DataFrame:
    return pd.DataFrame([_row(**{"system.eamc_capacity": cap, "tpot_mean_ms": t,
                                 "_result": {"config": {"calibration_requests": 300}}})
                         for cap, t in tpots.items()])


def test_eamc_capacity_location():
    tpots = {1: 30.0, 3: 29.0, 10: 26.0, 30: 25.1, 120: 25.0, 300: 25.05, 1000: 25.2}
    rows, tab = _claims(eamc_capacity.EXPERIMENT, _cap_runs(tpots))
    at = tab.set_index("eamc_capacity")
    assert at.loc[120, "eams_offered"] == 320
    assert at.loc[120, "capacity_share"] == pytest.approx(120 / 320)
    assert at.loc[1000, "capacity_share"] == pytest.approx(1.0)
    assert at.loc[1, "tpot_vs_lowest_ratio"] == pytest.approx(30 / 25)
    assert bool(at.loc[30, "within_1pct_of_lowest"]) and not at.loc[10, "within_1pct_of_lowest"]
    c = rows["eamc_capacity.lowest"]
    assert (c.ours, c.falls, c.verdict) == (120.0, True, "reproduced")
    # lowest at 1000: a factor 8.3 from 120, but the curve falls from 1 to 120
    tpots[1000] = 24.9
    c = _claims(eamc_capacity.EXPERIMENT, _cap_runs(tpots))[0]["eamc_capacity.lowest"]
    assert (c.ours, c.falls, c.verdict) == (1000.0, True, "direction only")


def _ctx_row(ctx, floor, tpot, cache_gib, kv_gib, avail_gib, elems=576):
    res = {"config": {"model": {"kv_elems_per_token_per_layer": elems}},
           "memory": {"kv_bytes": kv_gib * GIB, "available_bytes": avail_gib * GIB}}
    return _row(**{"workload.prompt_len": ctx, "compute_floor_ms": floor, "tpot_mean_ms": tpot,
                   "headroom": tpot / floor if tpot and floor else None,
                   "expert_cache_gib": cache_gib, "_result": res})


def test_long_context_table_and_claims():
    runs = pd.DataFrame([_ctx_row(2**17, 25.0, 37.5, 16.0, 4.0, 16.0),
                         _ctx_row(2**12, 20.0, 24.0, 19.9, 0.125, 19.9),
                         _ctx_row(2**16, 22.0, 30.0, 18.0, 2.0, 18.0)])
    rows, tab = _claims(long_context.EXPERIMENT, runs)
    assert list(tab["context_tokens"]) == [2**12, 2**16, 2**17]
    last = tab.iloc[-1]
    assert last["paper_expert_buffer_gb"] == 1.0 and last["paper_on_demand_ms"] == 137
    # the HF layout: KV 4 GiB * 5120 / 576 = 35.56 GiB, so 16 + 4 - 35.56 = -15.56 GiB
    assert last["other_layout_expert_cache_gib"] == pytest.approx(20 - 4 * 5120 / 576)
    grow = rows["long_context.compute_growth"]
    assert grow.paper == pytest.approx(3.2) and grow.ours == pytest.approx(1.25)
    assert grow.verdict == "direction only"
    buf = rows["long_context.expert_buffer_halves"]
    assert buf.paper == pytest.approx(2.0) and buf.ours == pytest.approx(18 / 16)
    pen = rows["long_context.on_demand_penalty"]
    # paper (160 + 137) / 160 = 1.856; ours 37.5 / 25 = 1.5: 1.856 / 1.5 = 1.24 <= 1.25
    assert pen.paper == pytest.approx(297 / 160) and pen.ours == pytest.approx(1.5)
    assert pen.verdict == "reproduced"


def test_long_context_oom_row_has_no_cache():
    # the HF layout (5120 values): 2^17 leaves -13.7 GiB, an oom run with no metrics
    oom = _ctx_row(2**17, None, None, 0.0, 33.8, -13.7, elems=5120)
    oom["status"] = "oom"
    runs = pd.DataFrame([_ctx_row(2**16, 22.0, 30.0, 3.17, 16.9, 3.17, elems=5120), oom])
    rows, tab = _claims(long_context.EXPERIMENT, runs)
    assert pd.isna(tab.iloc[-1]["expert_cache_gib"])
    # the MLA layout would leave -13.7 + 33.8 - 33.8 * 576 / 5120 = 16.3 GiB
    assert tab.iloc[-1]["other_layout_expert_cache_gib"] == pytest.approx(
        -13.7 + 33.8 - 33.8 * 576 / 5120)
    for cid in ("long_context.expert_buffer_halves", "long_context.on_demand_penalty"):
        assert rows[cid].verdict == "not expressible" and "2^17 run is oom" in rows[cid].reason
    assert rows["long_context.compute_growth"].reason == "no run at 2^12"


def test_recovery_by_hand():
    # tail (requests 5..9) all 10 ms: S = 10, band 0; windows 11.2, 10.6, 10.2, 10.0 -> R = 3
    r = recovery([13, 12, 11, 10, 10, 10, 10, 10, 10, 10])
    assert r["requests"] == 3 and r["steady_ms"] == pytest.approx(10.0)
    assert r["first_window_excess"] == pytest.approx(0.12)
    # alternating 10/12: tail 12,10,12,10,12 -> S 11.2, sd sqrt(1.2), band 2 sd / sqrt(5)
    r = recovery([10, 12] * 5)
    assert r["band_ms"] == pytest.approx(2 * math.sqrt(1.2) / math.sqrt(5))
    assert r["requests"] == 0
    with pytest.raises(ValueError):
        recovery([10] * 9)


def _shift_row(model, seed, history, after, tpots, learn=True):
    cfg = {"seed": seed, "system": {"learn_online": learn},
           "workload": {"calibration_tasks": history, "task_order": [after]}}
    return _row(model=model, request_tpot_ms=tpots, _result={"config": cfg, "memory": {}})


def test_workload_shift_table_and_claims():
    ramp, flat = [13, 12, 11, 10, 10, 10, 10, 10, 10, 10], [10.0] * 10
    runs = pd.DataFrame([_shift_row("mixtral_8x7b", 1, "mmlu", "mmlu", flat),
                         _shift_row("mixtral_8x7b", 0, "mmlu", "mmlu", ramp),
                         _shift_row("mixtral_8x7b", 0, "bigbench", "mmlu", flat),
                         _shift_row("mixtral_8x7b", 0, "mmlu", "mmlu", [11.0] * 10, False),
                         _shift_row("nllb_moe_54b", 0, "mmlu", "flan", flat)])  # no workload
    rows, tab = _claims(workload_shift.EXPERIMENT, runs)
    at = tab.set_index(["model", "workload"])
    mix = at.loc[("mixtral_8x7b", "MMLU tasks")]
    assert (mix["streams"], mix["recover_min"], mix["recover_max"]) == (2, 0, 3)
    assert mix["recover_mean"] == pytest.approx(1.5) and mix["paper_recover"] == "0-9-49"
    assert mix["first_window_excess_share"] == pytest.approx(0.06)  # (0.12 + 0) / 2
    assert mix["first_request_excess_share"] == pytest.approx(0.15)  # (13 / 10 - 1 + 0) / 2
    assert mix["tpot_mean_ms"] == pytest.approx((10.6 + 10.0) / 2)
    assert (mix["history"], mix["after_shift"]) == ("mmlu", "mmlu")
    assert at.loc[("mixtral_8x7b", "BIG-bench -> MMLU"), "streams"] == 1
    assert at.loc[("mixtral_8x7b", "MMLU -> BIG-bench"), "paper_recover"] == "0-27-42"
    ref = at.loc[("mixtral_8x7b", workload_shift.REFERENCE)]
    assert ref["streams"] == 1 and ref["paper_recover"] == ""
    assert at.loc[("arctic", "MMLU tasks"), "streams"] == 0
    assert at.loc[("nllb_moe_54b", "MMLU tasks"), "streams"] == 0  # the flan run is no row
    assert (("arctic", workload_shift.REFERENCE)) not in at.index
    assert len(rows) == 12
    c = rows["workload_shift.mixtral_8x7b.mmlu_tasks"]
    # paper 1 + 9 = 10, ours 1 + 1.5 = 2.5: a factor 4 apart, both above 1
    assert (c.paper, c.ours, c.verdict) == (10.0, 2.5, "direction only")
    # paired with the reference's seed 0 (11 ms): the ramp (mean 10.6) and the flat BIG-bench
    # -> MMLU stream (10); seed 1 has no reference
    assert mix["vs_reference_share"] == pytest.approx(10.6 / 11 - 1)
    bm = at.loc[("mixtral_8x7b", "BIG-bench -> MMLU"), "vs_reference_share"]
    assert bm == pytest.approx(10 / 11 - 1)
    assert pd.isna(at.loc[("mixtral_8x7b", "MMLU -> BIG-bench"), "vs_reference_share"])
    assert "2 stream(s) of 10 requests" in c.note
    assert f"TPOT is {(10.6 / 11 + 10 / 11) / 2 - 1:+.1%} against" in c.note  # -6.4%
    flat_row = rows["workload_shift.mixtral_8x7b.bigbench_to_mmlu"]
    assert flat_row.ours == 1.0 and flat_row.verdict == "not reproduced"  # no change
    gone = rows["workload_shift.arctic.mmlu_to_bigbench"]
    assert gone.ours is None and gone.verdict == "not expressible"
    assert rows["workload_shift.nllb_moe_54b.mmlu_tasks"].paper == 15.0
