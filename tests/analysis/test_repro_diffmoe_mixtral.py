"""The diffmoe_batch and mixtral_offloading_ablation experiments' tables and claims on small
hand-made frames (shaped like analysis/repro/frame.run_rows output, seeds in each run's
`_result` config), and their claim inventories. Expected values are worked out by hand from
the numbers below and the paper's (paper_numbers.md A3, A4); t_{0.975, 1} = 12.706."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml
from helpers import ROOT

from analysis.repro.experiments import diffmoe_batch as dm
from analysis.repro.experiments import mixtral_offloading_ablation as mo
from analysis.repro.verdict import ONE_SEED, judge

INVENTORY = ROOT / "analysis" / "repro" / "inventory"
LN2 = math.log(2.0)


def _dm_row(system, batch, seed, tok_s, hit=None, head=None, floor=None, status="valid"):
    ok = status == "valid"
    return {"run": f"{system}_{batch}_{seed}", "system": system, "status": status,
            "reason": None, "routing": "synthetic", "model": "switch_base_128",
            "hardware": "h200", "requests": max(16, batch), "max_batch": batch,
            "tokens_per_s": tok_s if ok else None, "hit_rate_decode": hit if ok else None,
            "headroom": head if ok else None, "compute_floor_ms": floor if ok else None,
            "_result": {"config": {"seed": seed}}}


def _dm_frame(seeds=(0, 1)):
    # tokens/s per seed. Seed 0: diff_moe 150 / 480 / 310 at batch 1 / 16 / 128, on_demand
    # 75 / 120 / oom (factors 2, 4), moe_infinity 100 / 300 / 200 (1.5, 1.6, 1.55).
    # Seed 1: diff_moe 155 / 310 / 310, on_demand 155 / 155 / oom (1, 2), moe_infinity
    # 100 / 200 / 200 (1.55 each). The oracle runs at twice diff_moe's tokens/s everywhere.
    # moe_infinity's decode hit rate: 0.9 / 0.5 (seed 0), 0.8 / 0.2 (seed 1) at batch 1 / 16;
    # the compute floor 2.0 ms at batch 1, 3.0 / 3.2 ms at 16; on_demand's headroom 2 / 8.
    tok = {0: {"diff_moe": (150, 480, 310), "on_demand": (75, 120, None),
               "moe_infinity": (100, 300, 200)},
           1: {"diff_moe": (155, 310, 310), "on_demand": (155, 155, None),
               "moe_infinity": (100, 200, 200)}}
    hits, floors = {0: (0.9, 0.5, 0.4), 1: (0.8, 0.2, 0.4)}, {0: 3.0, 1: 3.2}
    rows = []
    for seed in seeds:
        for i, b in enumerate((1, 16, 128)):
            floor = 2.0 if b == 1 else floors[seed]
            for sys in ("diff_moe", "on_demand", "moe_infinity"):
                v = tok[seed][sys][i]
                rows.append(_dm_row(sys, b, seed, v, hit=hits[seed][i], floor=floor,
                                    head={1: 2.0, 16: 8.0}.get(b),
                                    status="valid" if v else "oom"))
            rows.append(_dm_row("oracle", b, seed, 2 * tok[seed]["diff_moe"][i], floor=floor))
    return pd.DataFrame(rows)


def _dm_claims(frame):
    return {r.claim_id: judge(r) for r in dm.claims(dm.table(frame)[0], frame, None)}


def test_diffmoe_table_means_and_paired_factors():
    tab, header, _ = dm.table(_dm_frame())
    assert list(tab["batch"]) == [1, 16, 128] and (tab["seeds"] == 2).all()
    row = tab.set_index("batch")
    assert row.loc[1, "diff_moe_tok_s"] == pytest.approx(152.5)
    # geometric mean of the per-seed factors: sqrt(4 * 2) at batch 16
    assert row.loc[16, "vs_on_demand_ratio"] == pytest.approx(math.sqrt(8.0))
    assert row.loc[1, "vs_moe_infinity_ratio"] == pytest.approx(math.sqrt(1.5 * 1.55))
    assert row.loc[1, "moe_infinity_miss_rate"] == pytest.approx(0.15)
    assert row.loc[16, "moe_infinity_miss_rate"] == pytest.approx(0.65)
    assert row.loc[16, "oracle_tok_s"] == pytest.approx(790.0)
    assert pd.isna(row.loc[128, "vs_on_demand_ratio"])  # the baseline ran out of memory
    assert "SIMULATED" in header[0]


def test_diffmoe_throughput_is_the_average_over_batches_paired_by_seed():
    rows = _dm_claims(_dm_frame())
    od = rows["diffmoe_batch.throughput_vs_on_demand"]
    # batch 128 left out (on_demand oom). Per seed: sqrt(2 * 4) and sqrt(1 * 2), logs 1.5 ln 2
    # and 0.5 ln 2: mean ln 2 -> 2.0; standard error ln 2 / 2, half-width 12.706 ln 2 / 2
    assert od.ours.mean == pytest.approx(2.0)
    assert od.ours.low == pytest.approx(2.0 ** (1 - 6.353))
    assert od.ours.high == pytest.approx(2.0 ** (1 + 6.353))
    assert od.verdict == "no effect" and "switch_base_128 batch 128" in od.note
    assert od.headroom == pytest.approx(4.0)  # sqrt(2 * 8)
    assert od.oracle.mean == pytest.approx(4.0)  # twice diff_moe's factor in every cell
    assert od.variant is None and od.variant_name is None  # diff_moe has no named variant
    assert "geometric mean" in od.averaged
    mi = rows["diffmoe_batch.throughput_vs_moe_infinity"]
    # three cells: seed 0 (1.5 * 1.6 * 1.55)^(1/3), seed 1 1.55; 1.2 % apart -> tight interval
    s0 = (1.5 * 1.6 * 1.55) ** (1 / 3)
    assert mi.ours.mean == pytest.approx(math.sqrt(s0 * 1.55))
    assert mi.ours.n == 2 and mi.verdict == "reproduced"


def test_diffmoe_motivation_rows():
    rows = _dm_claims(_dm_frame())
    growth = rows["diffmoe_batch.miss_growth"]
    # miss 0.1 -> 0.5 and 0.2 -> 0.8: factors 5 and 4, geometric mean sqrt(20); logs 1.609
    # and 1.386, half-width 12.706 * 0.1116 = 1.418: [1.08, 18.5], above 1, outside 9.96 / 1.25
    assert growth.paper == pytest.approx(9.962, abs=1e-3)
    assert growth.ours.mean == pytest.approx(math.sqrt(20.0))
    assert growth.ours.low == pytest.approx(1.083, abs=1e-3)
    assert growth.verdict == "direction only"
    assert "15.00 % at batch 1" in growth.note and "6.67x" in growth.note
    comp = rows["diffmoe_batch.compute_growth"]
    # 3.0 / 2.0 and 3.2 / 2.0: sqrt(1.5 * 1.6) = 1.549; logs 0.4055 and 0.4700, standard
    # error 0.0323, half-width 0.4100: low exp(0.4377 - 0.4100) = 1.0281, within 1.55 / 1.25
    assert comp.ours.mean == pytest.approx(math.sqrt(2.4))
    assert comp.ours.low == pytest.approx(1.0281, abs=1e-4) and comp.verdict == "reproduced"
    for key in ("throughput_vs_pregated", "comm_growth", "comm_share", "global_locality"):
        row = rows[f"diffmoe_batch.{key}"]
        assert row.verdict == "not expressible" and row.reason == row.note and row.note
    assert "issue 28" in rows["diffmoe_batch.comm_growth"].reason


def test_diffmoe_hit_rate_pairs_at_batch_64():
    frame = pd.DataFrame([_dm_row("diff_moe", 64, 0, 400.0, hit=0.30),
                          _dm_row("diff_moe", 64, 1, 400.0, hit=0.28),
                          _dm_row("moe_infinity", 64, 0, 300.0, hit=0.01),
                          _dm_row("moe_infinity", 64, 1, 300.0, hit=0.0)])
    row = _dm_claims(frame)["diffmoe_batch.hit_rate_bs64"]
    # -0.29 and -0.28: mean -0.285, half-width 12.706 * 0.005 = 0.0635, below 0
    (d,) = row.diffs
    assert d.mean == pytest.approx(-0.285) and d.high == pytest.approx(-0.285 + 0.06353)
    assert row.verdict == "reproduced" and "diff_moe 29.0 %" in row.ours


def test_diffmoe_one_seed_says_only_the_direction():
    rows = _dm_claims(_dm_frame(seeds=(0,)))
    od = rows["diffmoe_batch.throughput_vs_on_demand"]
    assert od.ours.mean == pytest.approx(math.sqrt(8.0)) and not od.ours.judged
    assert od.verdict == ONE_SEED[0]


def test_diffmoe_sweeps_pin_five_percent_caches_and_run_the_oracle():
    assert dm.CACHE_GIB == {"switch_base_128": 1.35, "switch_large_128": 4.8}
    # 1.35 GiB holds 76 of Switch-base's 1,536 fp32 experts (18,874,368 B each)
    assert int(1.35 * 2**30) // 18874368 == 76
    assert len(dm.EXPERIMENT.sweeps) == 4
    assert all("system=diff_moe,diff_moe_floor_recency,on_demand,moe_infinity,"
               "moe_infinity_hysteresis,oracle"
               in s.overrides
               for s in dm.EXPERIMENT.sweeps)


EV = {"lru_per_layer": "systems.evictors.lru_per_layer.LRUPerLayer",
      "evict_after_use": "systems.evictors.evict_after_use.EvictAfterUse"}
PF = {"spec_next_layer": "systems.prefetchers.spec_next_layer.SpecNextLayer",
      "none": "systems.prefetchers.none.NoPrefetch"}
PAIRS = {mo.FULL: ("lru_per_layer", "spec_next_layer"), mo.NO_PRELOAD: ("lru_per_layer", "none"),
         mo.NO_LRU: ("evict_after_use", "none"), mo.EXTRA: ("evict_after_use", "spec_next_layer")}


def _mo_row(dev, bits, cfg, seed, tok_s, head=2.0):
    ev, pf = PAIRS[cfg]
    return {"run": f"{dev}{bits}{ev}{pf}{seed}", "system": "composed", "status": "valid",
            "reason": None, "routing": "synthetic", "model": "mixtral_8x7b", "hardware": dev,
            "requests": 6, "model.expert_bits": bits, "system.evictor._target_": EV[ev],
            "system.prefetcher._target_": PF[pf], "tokens_per_s": tok_s,
            "hit_rate_decode": 0.5, "headroom": head, "h2d_gb_per_token": 1.0,
            "_result": {"config": {"seed": seed}}}


def _mo_frame():
    # A100 2-bit, seeds 0 / 1: full 10 / 10.4, no preload 8 / 8, no LRU 10 / 1.35 and
    # 10.4 / 1.35, the fourth pair 4 / 4. T4 3-bit: full 2 / 2, no preload 4 / 4.4, no LRU 1 / 1.
    a100, t4 = ("a100_80g_sxm", 2), ("t4", 3)
    rows = []
    for seed, full in ((0, 10.0), (1, 10.4)):
        rows += [_mo_row(*a100, mo.FULL, seed, full), _mo_row(*a100, mo.NO_PRELOAD, seed, 8.0),
                 _mo_row(*a100, mo.NO_LRU, seed, full / 1.35, head=6.0),
                 _mo_row(*a100, mo.EXTRA, seed, 4.0)]
        rows += [_mo_row(*t4, mo.FULL, seed, 2.0), _mo_row(*t4, mo.NO_LRU, seed, 1.0),
                 _mo_row(*t4, mo.NO_PRELOAD, seed, 4.0 + 0.4 * seed)]
    return pd.DataFrame(rows)


def test_mixtral_table_maps_pairs_to_configs_and_factors():
    tab = mo.table(_mo_frame())[0]
    a100 = tab[(tab["device"] == "a100_80g_sxm") & (tab["bits"] == 2)].set_index("config")
    assert list(a100.index) == [mo.FULL, mo.NO_PRELOAD, mo.NO_LRU, mo.EXTRA, mo.NAIVE]
    assert a100.loc[mo.FULL, "tok_s"] == pytest.approx(10.2) and a100.loc[mo.FULL, "seeds"] == 2
    # per seed 1.25 and 1.3: geometric mean sqrt(1.625)
    assert a100.loc[mo.NO_PRELOAD, "full_over_config_ratio"] == pytest.approx(math.sqrt(1.625))
    assert a100.loc[mo.NO_LRU, "full_over_config_ratio"] == pytest.approx(1.35)
    assert a100.loc[mo.EXTRA, "full_over_config_ratio"] == pytest.approx(math.sqrt(2.5 * 2.6))
    # the paper's: 3.061 / 2.918; naive: the paper's only
    assert a100.loc[mo.NO_PRELOAD, "paper_full_over_config_ratio"] == pytest.approx(1.04901,
                                                                                      abs=1e-5)
    assert a100.loc[mo.NAIVE, "paper_tok_s"] == 1.392 and pd.isna(a100.loc[mo.NAIVE, "tok_s"])
    assert (tab[tab["device"] == "rtx_3060"]["k"] == 2).all()


def test_mixtral_claims_paired_by_seed():
    frame = _mo_frame()
    rows = {r.claim_id: judge(r) for r in mo.claims(mo.table(frame)[0], frame, None)}
    assert len(rows) == 4 * 2 * 3 + 2
    pre = rows["mixtral_offloading_ablation.full_vs_no_preload.a100_80g_sxm.2bit"]
    # logs ln 1.25 and ln 1.3, half-width 12.706 * 0.0196 = 0.249: [0.99, 1.63] holds 1
    assert pre.ours.mean == pytest.approx(math.sqrt(1.625)) and pre.verdict == "no effect"
    lru = rows["mixtral_offloading_ablation.full_vs_no_lru.a100_80g_sxm.2bit"]
    # 1.35 in both seeds (a zero-width interval) against 3.061 / 2.265 = 1.351; headroom 6
    assert (lru.ours.mean, lru.headroom, lru.verdict) == (pytest.approx(1.35), 6.0, "reproduced")
    order = rows["mixtral_offloading_ablation.ordering.a100_80g_sxm.2bit"]
    # no preload - full: -2, -2.4 -> [-4.74, 0.34]; no LRU - no preload: -0.593, -0.296
    assert order.ours == [mo.FULL, mo.NO_PRELOAD, mo.NO_LRU]
    assert order.diffs[0].mean == pytest.approx(-2.2)
    assert order.diffs[0].high == pytest.approx(-2.2 + 12.706 * 0.2)
    assert order.diffs[1].mean == pytest.approx((10 / 1.35 + 10.4 / 1.35) / 2 - 8.0)
    assert order.verdict == "direction only"  # our best is full, one interval holds 0
    t4 = rows["mixtral_offloading_ablation.ordering.t4.3bit"]
    # no preload - full 2, 2.4 -> holds 0; no LRU - no preload -3, -3.4 -> below 0; our best
    # is no preload
    assert t4.ours == [mo.NO_PRELOAD, mo.FULL, mo.NO_LRU] and t4.verdict == "no effect"
    # 0.5 and 0.4545: [0.26, 0.87], the other side of 1 from the paper's 1.603 / 1.365
    assert rows["mixtral_offloading_ablation.full_vs_no_preload.t4.3bit"].verdict == \
        "not reproduced"
    missing = rows["mixtral_offloading_ablation.ordering.rtx_3060.2bit"]
    assert missing.ours is None and missing.verdict == "not expressible"
    naive = rows["mixtral_offloading_ablation.full_vs_naive.3bit"]
    assert naive.verdict == "not expressible" and "1.791" in naive.reason
    assert naive.paper == [1.246, 0.914, 1.791, 0.580]


def test_mixtral_settings_fall_back_to_the_recorded_config():
    # one width only: the frame has no model.expert_bits column, the run's config has it
    frame = _mo_frame().drop(columns=["model.expert_bits"]).iloc[:4].copy()
    frame["_result"] = [{"config": {"seed": 0, "model": {"expert_bits": 2}}}] * 4
    tab = mo.table(frame)[0]
    cell = tab[(tab["device"] == "a100_80g_sxm") & (tab["bits"] == 2)].set_index("config")
    assert cell.loc[mo.NO_LRU, "tok_s"] == pytest.approx(10 / 1.35)


def test_mixtral_caches_hold_k_experts_per_layer():
    assert mo.cache_gib("a100_80g_sxm", 2) == 5.25 and mo.cache_gib("t4", 3) == 7.875
    assert mo.cache_gib("rtx_3060", 2) == 2.625 and mo.cache_gib("rtx_3060", 3) == 3.9375
    assert len(mo.EXPERIMENT.sweeps) == 4


@pytest.mark.parametrize("name, exp, frame", [("diff_moe", dm, _dm_frame),
                                              ("mixtral_offloading", mo, _mo_frame)])
def test_inventory_lists_every_emitted_claim(name, exp, frame):
    inv = yaml.safe_load((INVENTORY / f"{name}.yaml").read_text())
    runs = frame()
    emitted = {r.claim_id: r for r in exp.claims(exp.table(runs)[0], runs, None)}
    rows = {r["id"]: r for r in inv["claims"]}
    assert len(rows) == len(inv["claims"]) and set(rows) == set(emitted)
    for cid, row in rows.items():
        claim = emitted[cid]
        assert row["kind"] == claim.kind, cid
        # measured: names the experiment; not expressible: the reason, as the module gives it
        assert (row["experiment"] is None) == (claim.kind == "not_expressible"), cid
        assert row["not_expressible"] == (claim.note if claim.kind == "not_expressible"
                                          else None), cid
        if claim.kind == "ratio":
            assert row["value"] == pytest.approx(claim.paper, rel=1e-3), cid
        elif claim.kind == "ordering":
            assert row["value"] == claim.paper and row["rule"], cid
        assert row["numbers"] or claim.kind == "not_expressible", cid


def test_figures_build():
    for exp, frame in ((dm, _dm_frame()), (mo, _mo_frame())):
        tab = exp.table(frame)[0]
        fig = exp.figure(tab, frame)
        assert "SIMULATED" in " ".join(t.get_text() for t in fig.texts)
