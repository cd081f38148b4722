"""table1_q4: Table 1's systems with bf16 and with 4-bit experts side by side, registered like
every experiment; its ranks and Kendall's tau-b worked out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from helpers import ROOT

from analysis.repro.experiments.table1_q4 import (
    SLOTS_16,
    SLOTS_GIB,
    kendall_tau_b,
    rank,
    table,
)
from analysis.repro.registry import EXPERIMENTS, names
from core.specs import hardware_spec_from_dict, model_spec_from_dict
from harness.runner.config import TABLE1_GLOB, compose_config
from harness.sim.memory import plan_memory


def test_registered_beside_table1():
    exp = EXPERIMENTS["table1_q4"]
    assert "table1_q4" in names() and exp.name == "table1_q4"
    assert (ROOT / "conf/experiment/table1_q4.yaml").is_file()
    assert [s.overrides for s in exp.sweeps] == [
        (f"system={TABLE1_GLOB}", "model.expert_bits=16,4"),
        (f"system={TABLE1_GLOB}", "model.expert_bits=4", f"expert_cache_gb={SLOTS_GIB!r}")]
    cfg = compose_config(["experiment=table1_q4"])
    assert (cfg["model"]["expert_bits"], cfg["model"]["dense_bits"]) == (4, 16)
    assert cfg["workload"]["num_requests"] <= compose_config(
        ["experiment=table1"])["workload"]["num_requests"]  # no larger than Table 1
    assert exp.claims(None, None, None) == []  # not a published table: no claims


def test_the_slots_arm_holds_the_bf16_arms_experts():
    cfg = compose_config(["experiment=table1_q4", "model.expert_bits=16"])
    model, hw = model_spec_from_dict(cfg["model"]), hardware_spec_from_dict(cfg["hardware"])
    plan = plan_memory(model, hw, 512 + 32, 1)  # Table 1's context at batch 1
    assert plan.expert_cache_bytes // model.expert_bytes == SLOTS_16 == 1243
    assert SLOTS_GIB * 2**30 == 1243 * 4_325_376  # exact: 41019 / 8192 GiB of 4-bit experts


def test_rank_and_tau_by_hand():
    assert rank({"a": 1.0, "b": 3.0, "c": 3.0, "d": 2.0}) == {"a": 1, "b": 3.5, "c": 3.5,
                                                              "d": 2}
    # float summation noise is no order: 25.585007901659065 and ...15 tie; so do values
    # within 0.1 % of the lowest of their group (100, 100.1), not 100.2 (0.2 % above 100)
    assert rank({"x": 25.585007901659065, "y": 25.58500790165915, "z": 26.0}) == {
        "x": 1.5, "y": 1.5, "z": 3}
    assert rank({"a": 100.0, "b": 100.1, "c": 100.2}) == {"a": 1.5, "b": 1.5, "c": 3}
    assert kendall_tau_b([1, 2, 3], [1, 2, 3]) == 1.0
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == -1.0
    # pairs (0,1) and (0,2) concordant, (1,2) tied in a only: S = 2, n0 = 3, ties 1 and 0:
    # tau-b = 2 / sqrt((3 - 1) * (3 - 0)) = 0.8165
    assert kendall_tau_b([1, 2, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau_b([1], [1]) is None and kendall_tau_b([1, 1], [1, 2]) is None


def _row(system, bits, cache, seed, tpot, status="valid", cache_gib=20):
    return {"run": f"{system}-{bits}-{cache}-{seed}", "system": system, "status": status,
            "seed": seed, "requests": 100, "routing": "synthetic",
            "tpot_mean_ms": tpot if status == "valid" else None, "hit_rate_decode": 0.5,
            "compute_floor_ms": 10.0 + bits,
            "_result": {"config": {"seed": seed, "expert_cache_gb": cache,
                                   "model": {"expert_bits": bits}},
                        "memory": {"expert_cache_bytes": cache_gib * 2**30},
                        "model": {"expert_bytes": 2**30 * bits // 16, "moe_layers": 26,
                                  "experts": 64}}}


def test_table_puts_the_orderings_side_by_side():
    # 16 bits: lru 30 < moe_infinity 40, no_offload oom. 4 bits, same GPU: all three tie at
    # 20. 4 bits, 1243 slots: moe_infinity 24 < lru 26, no_offload oom. Seeds 0 and 1 give
    # the mean -1 and +1.
    seeds = ((0, -1), (1, 1))
    rows = [_row(n, 16, None, s, t + d) for n, t in (("lru", 30), ("moe_infinity", 40))
            for s, d in seeds]
    rows += [_row("no_offload", b, c, s, None, "oom") for b, c in ((16, None), (4, SLOTS_GIB))
             for s in (0, 1)]
    # its cache of 500 GiB holds all 26 * 64 experts of 0.25 GiB (416 GiB)
    rows += [_row(n, 4, None, s, 20.0, cache_gib=500)
             for n in ("lru", "moe_infinity", "no_offload") for s in (0, 1)]
    rows += [_row(n, 4, SLOTS_GIB, s, t + d) for n, t in (("lru", 26), ("moe_infinity", 24))
             for s, d in seeds]
    tab, header, notes = table(pd.DataFrame(rows))
    got = tab.set_index("system")
    assert list(tab["system"]) == ["no_offload", "lru", "moe_infinity"]  # Table 1's order
    assert got.loc["lru", "tpot_16bit_ms"] == 30 and got.loc["lru", "rank_16bit"] == 1
    # two seeds 29, 31: mean 30, sd sqrt(2), t(0.975, 1) = 12.706: half-width 12.706
    assert got.loc["lru", "tpot_16bit_low_ms"] == pytest.approx(30 - 12.706)
    assert list(got["rank_4bit"]) == [2, 2, 2]  # three-way tie: mean rank (1 + 2 + 3) / 3
    assert (got.loc["lru", "rank_4bit_1243"], got.loc["lru", "rank_change_4bit_1243"]) == (
        2, 1)
    assert pd.isna(got.loc["no_offload", "rank_16bit"])
    assert header[-1] == ("Kendall tau-b of the orderings: 4bit against 16bit, over the 2 "
                          "systems valid in both: n/a (every system ties in one of the two); "
                          "4bit_1243 against 16bit, over the 2 systems valid in both: "
                          "-1.000.")
    assert "no_offload (16bit)" in notes[0] and "no_offload (4bit_1243)" in notes[0]
    assert notes[1].startswith("4bit: every system ties (within 0.1%). Its cache holds every "
                               "expert")
