"""diff_moe: slot split, priority updates, tier placement, victims, predictor, invariants.

Every expected value below is worked out by hand in the comments (or counted by a plain loop
over the trace, independent of the system's numpy code).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from helpers import ROOT, FixedBackend, meta_for, random_trace, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from core.targets import build_target
from core.trace import trace_from_routing
from core.view import SystemContext
from harness.runner.config import compose_config
from harness.runner.run import run_config
from harness.sim.cache import ExpertCache
from harness.sim.engine import Engine
from harness.sim.recorder import PRELOAD
from systems.base import System
from systems.diff_moe import HIGH, MEDIUM, DiffMoE, split_slots
from systems.predictor import NextLayerPredictor

CONF = ROOT / "conf" / "system" / "diff_moe.yaml"


def _ctx(layers=2, experts=4, top_k=1, slots=6, batch=1):
    return SystemContext(num_layers=layers, num_experts=experts, top_k=top_k, expert_bytes=1,
                         capacity_slots=slots, capacity_bytes=slots, max_batch=batch,
                         moe_layer_stacks=("decoder",) * layers, trace_fields=())


def _trace(model, per_layer_steps, prompt_len=1):
    """One request; per_layer_steps[layer][step] = top-k ids of every token of that step."""
    L = model.num_moe_layers
    S = len(per_layer_steps[0])
    routing = [[[list(per_layer_steps[layer][s])] * (prompt_len if s == 0 else 1)
                for layer in range(L)] for s in range(S)]
    req = {"id": "r0", "dataset": "test", "task": "t", "prompt_len": prompt_len,
           "output_len": S, "arrival_ms": 0.0, "routing": routing}
    return trace_from_routing(meta_for(model), [req])


# ---- slots ------------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity,layers,experts,reserve,want", [
    # The authors' (HPC+MPC, HPC) pairs on Switch-base's 6 decoder MoE layers, reserve 2:
    (20, 6, 128, 2, (3, 1, 2)),  # (20 - 2) // 6 = 3, round(3 / 3) = 1, 20 - 18 = 2
    (38, 6, 128, 2, (6, 2, 2)),  # 36 // 6 = 6, round(2) = 2
    (85, 6, 128, 2, (13, 4, 7)),  # 83 // 6 = 13, round(4.33) = 4, 85 - 78 = 7
    # Table 1: 1236 slots, 26 layers, reserve 2 * min(64, 1 * 6) = 12:
    (1236, 26, 64, 12, (47, 16, 14)),  # 1224 // 26 = 47, round(15.67) = 16, 1236 - 1222
    (1700, 26, 64, 12, (64, 21, 36)),  # 1688 // 26 = 64 = E: all fit; round(21.33) = 21
    (30, 26, 64, 12, (1, 0, 4)),  # 18 // 26 = 0: reserve shrinks to 1, 29 // 26 = 1
    (20, 26, 64, 12, (0, 0, 20)),  # fewer slots than layers: all low priority
])
def test_split_slots_by_hand(capacity, layers, experts, reserve, want):
    assert split_slots(capacity, layers, experts, reserve) == want


def test_split_slots_rejects_configs_without_a_low_slot():
    with pytest.raises(ValueError, match="no low-priority slot"):
        split_slots(12, 2, 8, 2, per_layer=6)
    with pytest.raises(ValueError, match="high_slots"):
        split_slots(12, 2, 8, 2, per_layer=3, high=4)


@pytest.mark.parametrize("knob", [{"dec_in": -0.1}, {"max_val": float("nan")},
                                  {"low_slots": -1}, {"slots_per_layer": -2}])
def test_bad_knobs_name_the_key(knob):
    with pytest.raises(ValueError, match=next(iter(knob))):
        DiffMoE(**knob)


def test_default_low_reserve_follows_batch():
    # batch 4, top-2, E = 8: reserve 2 * min(8, 4 * 2) = 16; (40 - 16) // 2 = 12, capped at
    # E = 8 per layer; high round(8 / 3) = 3; low 40 - 2 * 8 = 24.
    s = DiffMoE()
    s.bind(_ctx(layers=2, experts=8, top_k=2, slots=40, batch=4))
    assert (s.per_layer, s.high, s.medium, s.low) == (8, 3, 5, 24)
    # batch 1: reserve 2 * 2 = 4; (20 - 4) // 2 = 8 -> (8, 3, 5, 4)
    s.bind(_ctx(layers=2, experts=8, top_k=2, slots=20, batch=1))
    assert (s.per_layer, s.high, s.medium, s.low) == (8, 3, 5, 4)


def test_yaml_defaults_are_the_authors():
    node = yaml.safe_load(CONF.read_text())
    s = build_target(node, "system", System)
    assert isinstance(s, DiffMoE) and s.name == CONF.stem
    # scripts/eval_cache.py:342-349 and fetcher.cc:225-247 at 4d78b3d: no priority floor
    assert (s.max_val, s.threshold, s.dec_in, s.dec_out, s.min_val) == (2.0, 1.0, 0.4, 0.2, None)


# ---- profiling and priorities -----------------------------------------------------------------
# Calibration (top-1, one token per step): layer 0 routes 0 0 1 2, layer 1 routes 3 3 2 1.
# Steps per expert: layer 0 {0: 2, 1: 1, 2: 1}, layer 1 {3: 2, 2: 1, 1: 1}; ties go to the
# lowest id, so with (2 slots, 1 high): HPC = {0} and {3}, MPC = {1} and {1}.
CALIB = [[[0], [0], [1], [2]], [[3], [3], [2], [1]]]


def _bound(**kw):
    model = tiny_model(layers=2, experts=4, top_k=1)
    s = DiffMoE(slots_per_layer=2, high_slots=1, prefetch=False, **kw)
    s.bind(_ctx(slots=6))
    s.warmup(_trace(model, CALIB))
    return s


def test_profiling_places_hot_experts_in_high_and_medium():
    s = _bound()
    assert [s.tier[k] for k in range(8)] == [HIGH, MEDIUM, 0, 0, 0, MEDIUM, 0, HIGH]
    assert sorted(s.initial_residents()) == [0, 1, 5, 7]
    assert s.low == 2  # 6 slots - 2 layers * 2


def test_priority_updates_and_replacement_by_hand():
    s = _bound()  # layer 0: HPC {0}, MPC {1}; decay 0.4 for 0 and 1, 0.2 for 2 and 3
    s.decide(0, [2], [1])
    # 2 routed: 0 + 1 = 1; others decay from 0 to the floor 0. Candidate 2 (1 >= 1) replaces
    # member 1 (0 < 1): MPC = {2}, 1 is demoted.
    assert s.prio[0].tolist() == [0, 0, 1, 0]
    assert s.mpc[0] == {2} and s.tier[1] == 0 and s.tier[2] == MEDIUM
    s.decide(0, [0, 2], [1, 1])
    # 0: 1; 2: min(2, 2) = 2; 1 and 3 stay at the floor. No candidate (0 high, 2 medium).
    assert s.prio[0].tolist() == [1, 0, 2, 0]
    s.decide(0, [1], [1])
    # 1: 1; 0: 1 - 0.4 = 0.6 (high member); 2: 2 - 0.4 = 1.6 >= 1, so 1 does not get in.
    assert s.prio[0].tolist() == pytest.approx([0.6, 1, 1.6, 0])
    assert s.mpc[0] == {2}
    s.decide(0, [1], [1])
    # 1: min(2, 2) = 2; 0: 0.2; 2: 1.2 still >= 1: MPC unchanged.
    assert s.prio[0].tolist() == pytest.approx([0.2, 2, 1.2, 0])
    assert s.mpc[0] == {2}
    s.decide(0, [3], [1])
    # 3: 1; 1: 2 - 0.2 = 1.8 (not a member: dec_out); 2: 0.8 < 1; 0: floor 0. Only a routed
    # expert is a candidate: 3 (1 >= 1) replaces 2, although idle 1 has a higher priority.
    assert s.prio[0].tolist() == pytest.approx([0, 1.8, 0.8, 1])
    assert s.mpc[0] == {3} and s.tier[2] == 0 and s.tier[3] == MEDIUM and s.tier[0] == HIGH
    assert s.mpc[1] == {1} and s.prio[1].tolist() == [0, 0, 0, 0]  # layer 1 untouched


def test_without_floor_a_candidate_below_threshold_stays_out():
    s = _bound(min_val=None)
    s.decide(0, [2], [1])
    # no floor: 0 and 1 (members) -0.4, 3 -0.2; 2 -> 1 replaces member 1 (-0.4 < 1)
    assert s.prio[0].tolist() == pytest.approx([-0.4, -0.4, 1, -0.2])
    assert s.mpc[0] == {2}
    s.decide(0, [3], [1])
    # 3: -0.2 + 1 = 0.8 < 1: not admitted, although member 2 fell to 0.6 < 1
    assert s.prio[0].tolist() == pytest.approx([-0.8, -0.6, 0.6, 0.8])
    assert s.mpc[0] == {2}


def test_priority_is_capped_at_max_val():
    s = _bound(max_val=1.5)
    for _ in range(3):
        s.decide(1, [3], [1])
    assert s.prio[1][3] == 1.5


# ---- victims ----------------------------------------------------------------------------------
def test_low_priority_experts_are_the_only_victims():
    s = _bound()
    s.initial_residents()
    cache = ExpertCache(6, 1)
    for key in (0, 1, 5, 7):  # the preloaded high and medium members
        cache.reserve(key, 0.0, key)
    for key, demand in ((2, True), (3, False)):  # a used cold expert, then a prefetch
        cache.reserve(key, 0.0, key)
        s.on_load(key, demand, 0.0)
    assert list(s.lpc_used) == [2] and list(s.lpc_fresh) == [3]
    # full cache: the used low-priority expert goes first, for a prefetch or a demand fetch
    assert s.choose_victim(cache.candidates(1.0), 4, False, 1.0) == 2
    assert list(s.lpc_used) == [2] and 2 in s.resident  # a pure query
    cache.evict(2, 1.0)
    s.on_evict(2, 1.0)
    assert list(s.lpc_used) == [] and 2 not in s.resident
    cache.reserve(4, 1.0, 4)
    s.on_load(4, False, 1.0)
    # only unused prefetches are left in the LPC: a prefetch is declined, a demand takes the
    # oldest prefetch; members 0, 1, 5, 7 are never named
    assert s.choose_victim(cache.candidates(2.0), 6, False, 2.0) is None
    assert s.choose_victim(cache.candidates(2.0), 6, True, 2.0) == 3


def test_routing_moves_unused_prefetches_to_the_front():
    s = _bound()
    s.initial_residents()
    for key in (2, 3, 6):
        s.on_load(key, key == 2, 0.0)  # 2 demand (used); 3 and 6 prefetched
    assert list(s.lpc_used) == [2] and list(s.lpc_fresh) == [3, 6]
    # layer 0 routes 2 only: 3 was a wrong guess (to the front of the victims), 2 was just
    # used (to the back); 6 (layer 1) stays a fresh prefetch. Then 2 (priority 1) replaces
    # member 1 (priority 0): 2 leaves the LPC, and the demoted 1 goes to its front.
    s.decide(0, [2], [1])
    assert list(s.lpc_used) == [1, 3] and list(s.lpc_fresh) == [6]
    assert s.mpc[0] == {2}


# ---- predictor --------------------------------------------------------------------------------
def test_predictor_learns_a_transition_the_same_expert_baseline_misses():
    # Layer l+1 routes (e + 1) % 4 when layer l routes e (top-1): the learned guess is always
    # right (precision 1) and "same experts as this layer" always wrong (0).
    model = tiny_model(layers=3, experts=4, top_k=1)
    rng = np.random.default_rng(0)
    reqs = []
    for r in range(10):
        first = rng.integers(0, 4, 6)
        routing = [[[[int(e + layer) % 4]] for layer in range(3)] for e in first]
        reqs.append({"id": f"r{r}", "dataset": "test", "task": "t", "prompt_len": 1,
                     "output_len": 6, "arrival_ms": 0.0, "routing": routing})
    calib = trace_from_routing(meta_for(model), reqs)
    s = DiffMoE(slots_per_layer=1, high_slots=1)
    s.bind(_ctx(layers=3, experts=4, slots=6))
    s.warmup(calib)
    rep = s.describe()["predictor"]
    # held out: round(10 * 0.2) = 2 requests x 4 decode steps (s = 2..5) x 2 layer pairs
    assert rep["heldout_requests"] == 2 and rep["pairs"] == 16
    assert rep["precision"] == rep["recall"] == 1.0
    assert rep["same_experts_precision"] == rep["same_experts_recall"] == 0.0
    assert rep["beta"] == 0.0  # recency adds nothing here; ties go to the smaller weight
    # lock-step batches of 2: the union shifts by one too, so still exact; pairs = 1 group x
    # 4 steps x 2 layer pairs. The baseline now hits when the two ids are adjacent ({1, 2} ->
    # {2, 3}), so it is only known to be below 1.
    two = NextLayerPredictor(3, 4, 1, ("decoder",) * 3).fit(calib, batch=2)
    assert two["batch"] == 2 and two["pairs"] == 8
    assert two["precision"] == two["recall"] == 1.0 and two["same_experts_precision"] < 1.0
    # layer 0 routes 1: the best guess for layer 1 is expert 2 (key 4 + 2), proposed unless
    # it is already resident
    assert int(np.argmax(s.pred.scores(0, [1], [1], None))) == 2
    resident = set(s.initial_residents())
    assert s.decide(0, [1], [1]) == ([] if 6 in resident else [6])


def test_prefetch_is_capped_below_the_low_priority_slots():
    model = tiny_model(layers=2, experts=8, top_k=4)
    calib = random_trace(model, 4, 2, 4, seed=1)
    s = DiffMoE(slots_per_layer=1, high_slots=0, low_slots=3)
    s.bind(_ctx(layers=2, experts=8, top_k=4, slots=5))
    s.warmup(calib)
    s.initial_residents()
    assert s.low == 3
    # 4 routed experts at layer 0 -> 4 guesses at layer 1, at most 1 of them resident;
    # the proposal keeps low - 1 = 2 keys, all of layer 1
    out = s.decide(0, [0, 1, 2, 3], [1, 1, 1, 1])
    assert len(out) == 2 and all(8 <= k < 16 for k in out)


# ---- engine: budget, invariants, determinism --------------------------------------------------
def _run(model, trace, calib, slots, batch, **kw):
    s = DiffMoE(**kw)
    eng = Engine(model, FixedBackend(), trace, s, slots * model.expert_bytes, max_batch=batch)
    s.warmup(calib)
    rec = eng.run()
    eng.cache.check_invariants()
    return s, eng, rec.tables(), rec


@pytest.mark.parametrize("slots,batch", [(1, 1), (2, 1), (5, 1), (9, 2), (14, 3), (24, 1),
                                         (24, 4)])
def test_budget_and_engine_invariants(slots, batch):
    model = tiny_model(layers=3, experts=8, top_k=2)
    trace = random_trace(model, 5, 3, 5, seed=slots * 10 + batch)
    calib = random_trace(model, 5, 3, 5, seed=99)
    s, eng, t, rec = _run(model, trace, calib, slots, batch)
    assert rec.peak_cache_bytes <= slots * model.expert_bytes
    assert len(eng.cache) <= slots
    # every routed (iteration, layer, expert) ran once: 5 requests x 5 steps x 3 layers, each
    # with at least one expert
    assert len(t["accesses"]["class"]) >= 5 * 5 * 3
    # high-priority members are preloaded and never evicted (never loaded again)
    tr = t["transfers"]
    high = {k for k, tier in enumerate(s.tier) if tier == HIGH}
    pre = set(tr["key"][tr["kind"] == PRELOAD].tolist())
    assert high <= pre
    for key, ev in zip(tr["key"].tolist(), tr["evict_ms"].tolist()):
        if key in high:
            assert math.isnan(ev), f"high-priority key {key} was evicted"
    assert len(pre) == s.per_layer * model.num_moe_layers


def test_same_inputs_same_run():
    model = tiny_model(layers=3, experts=8, top_k=2)
    trace = random_trace(model, 4, 3, 4, seed=5)
    calib = random_trace(model, 4, 3, 4, seed=6)
    a = _run(model, trace, calib, 12, 2)[2]
    b = _run(model, trace, calib, 12, 2)[2]
    for table in ("accesses", "transfers"):
        for col in a[table]:
            assert np.array_equal(a[table][col], b[table][col], equal_nan=True), (table, col)


def test_run_without_warmup_is_refused():
    model = tiny_model(layers=2, experts=4, top_k=1)
    trace = random_trace(model, 1, 1, 2, seed=0)
    eng = Engine(model, FixedBackend(), trace, DiffMoE(), 6 * model.expert_bytes)
    with pytest.raises(ValueError, match="warmup"):
        eng.run()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), experts=st.integers(3, 8), layers=st.integers(1, 3),
       top_k=st.integers(1, 2), slots=st.integers(1, 20), batch=st.integers(1, 3))
def test_any_budget_keeps_the_engine_invariants(seed, experts, layers, top_k, slots, batch):
    model = tiny_model(layers=layers, experts=experts, top_k=top_k)
    trace = random_trace(model, 3, 2, 4, seed)
    calib = random_trace(model, 3, 2, 4, seed + 1)
    s, eng, t, rec = _run(model, trace, calib, slots, batch)
    assert rec.peak_cache_bytes <= slots * model.expert_bytes
    tr = t["transfers"]
    for key, ev in zip(tr["key"].tolist(), tr["evict_ms"].tolist()):
        assert s.tier[key] != HIGH or math.isnan(ev)


def test_runner_runs_diff_moe_with_a_calibration_split(tmp_path):
    tiny = ["system=diff_moe", "workload.num_requests=2", "workload.prompt_len=8",
            "workload.output_len=4", "calibration_requests=3", "progress=false"]
    r = run_config(compose_config(tiny, run_name="dm", results_dir=str(tmp_path)))
    assert r["status"] == "valid", r["reason"]
    assert r["system"]["name"] == "diff_moe" and r["calibration_trace"]["num_requests"] == 3
    assert r["system"]["predictor"]["heldout_requests"] == 1  # round(3 * 0.2) = 1
    assert r["metrics"]["peak_expert_cache_bytes"] <= r["memory"]["expert_cache_bytes"]
