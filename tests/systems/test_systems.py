"""Golden hit/miss counts for each baseline on a tiny committed trace, and the oracle bound.

The committed trace (tests/data/tiny_trace.npz): 2 MoE layers, 4 experts, top-1, one
request with 8 steps of one token each. Its routing, checked below, is
    layer 0: 0 1 0 2 1 0 3 0
    layer 1: 1 1 2 3 1 2 1 0
so the engine's access sequence in (iteration, layer) order, as keys layer * 4 + expert, is
    0 5 1 5 0 6 2 7 1 5 0 6 3 5 0 4.
Expected counts were worked out by hand (LRU walks written in the comments) or by the
brute-force optimum `optimal_loads` (tests/helpers.py) below.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import DATA, FixedBackend, optimal_loads, random_trace, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from core.knobs import KnobError
from core.trace import read_trace
from core.view import SystemContext
from harness.sim.engine import Engine
from harness.sim.recorder import HIT, LATE, MISS, PRELOAD
from systems.diff_moe import DiffMoE
from systems.fmoe.system import FMoE
from systems.layer_offload import LayerOffload
from systems.lru import LRU
from systems.moe_infinity.system import MoEInfinity
from systems.no_offload import NoOffload
from systems.on_demand import OnDemand
from systems.oracle.system import Oracle
from systems.predictor import NextLayerPredictor

TINY = DATA / "tiny_trace.npz"
SEQUENCE = [0, 5, 1, 5, 0, 6, 2, 7, 1, 5, 0, 6, 3, 5, 0, 4]


def _run(system, slots, trace=None, model=None):
    model = model or tiny_model(layers=2, experts=4, top_k=1)
    trace = trace if trace is not None else read_trace(TINY)
    rec = Engine(model, FixedBackend(), trace, system, slots * model.expert_bytes).run()
    t = rec.tables()
    cls = t["accesses"]["class"]
    loads = int(np.sum(t["transfers"]["kind"] != PRELOAD))
    return {"hits": int(np.sum(cls == HIT)), "late": int(np.sum(cls == LATE)),
            "misses": int(np.sum(cls == MISS)), "loads": loads}


def test_committed_trace_is_the_documented_one():
    tr = read_trace(TINY)
    assert tr.content_sha256() == (
        "dac10ce075a6f2d71991c6ca526132330e69ae3a42ad74dccc15fc15bb5423c7")
    keys = [layer * 4 + int(tr.block_rows(0, s, layer)[0, 0])
            for s in range(8) for layer in range(2)]
    assert keys == SEQUENCE


# on_demand = one global LRU over all experts. Hand walks (LRU order oldest -> newest):
# 2 slots: only the 4th access (5) hits.                                   -> 1 hit
# 3 slots: 5 (4th) and 0 (5th) hit; then 6 2 7 1 5 0 6 3 5 0 4 all miss.  -> 2 hits
# 4 slots: 5, 0 hit; 6 fills; the rest miss until 5 (14th) and 0 (15th).  -> 4 hits
# 6 slots: hits at 5 0 (4th, 5th), 1 5 0 6 (9th-12th), 5 0 (14th, 15th).  -> 8 hits
@pytest.mark.parametrize("slots,hits", [(2, 1), (3, 2), (4, 4), (6, 8)])
def test_on_demand_golden(slots, hits):
    got = _run(OnDemand(), slots)
    assert got == {"hits": hits, "late": 0, "misses": 16 - hits, "loads": 16 - hits}


# lru without speculation = an independent LRU of s slots per layer (cache = 2 s slots).
# layer 0 (0 1 0 2 1 0 3 0): s=1 no hit; s=2 hits at the 3rd and 8th; s=3 at 3rd 5th 6th 8th.
# layer 1 (1 1 2 3 1 2 1 0): s=1 hit at the 2nd; s=2 at 2nd and 7th; s=3 at 2nd 5th 6th 7th.
@pytest.mark.parametrize("per_layer,hits", [(1, 1), (2, 4), (3, 8)])
def test_lru_golden_without_speculation(per_layer, hits):
    got = _run(LRU(prefetch=False), 2 * per_layer)
    assert got == {"hits": hits, "late": 0, "misses": 16 - hits, "loads": 16 - hits}


def test_lru_speculative_prefetch_turns_misses_into_prefetch_hits():
    # With perfect next-layer guesses every layer-1 access is prefetched during layer 0,
    # so layer 1 never misses; layer 0 behaves as plain LRU.
    model = tiny_model(layers=2, experts=4, top_k=1)
    trace = random_trace(model, 1, 1, 8, seed=3, with_spec=True)
    spec = _run(LRU(), 4, trace, model)
    plain = _run(LRU(prefetch=False), 4, trace, model)
    layer1_misses = _layer_misses(LRU(), 4, trace, model, layer=1)
    assert layer1_misses == 0
    assert spec["misses"] < plain["misses"]


def _layer_misses(system, slots, trace, model, layer):
    t = Engine(model, FixedBackend(), trace, system, slots * model.expert_bytes).run().tables()
    acc = t["accesses"]
    return int(np.sum((acc["layer"] == layer) & (acc["class"] == MISS)))


def test_layer_offload_golden():
    # 16 slots >= (2 layers + 2 buffer layers) * 4: both layers resident, preloaded: no loads.
    assert _run(LayerOffload(), 16) == {"hits": 16, "late": 0, "misses": 0, "loads": 0}
    # 12 slots: (12 - 8) // 4 = 1 resident layer (layer 0); layer 1 streams whole. At t=1
    # layer 0's routing queues keys 4..7: key 4 copies 1..3, key 5 starts at 3 (ready 5), so
    # the first layer-1 access (expert 1, needed at 3) is a late prefetch; the 4 streamed
    # experts then stay (4 + 4 <= 12): 15 hits, 1 late, 4 loads, all whole-layer.
    assert _run(LayerOffload(), 12) == {"hits": 15, "late": 1, "misses": 0, "loads": 4}


def test_no_offload_everything_resident():
    assert _run(NoOffload(), 8) == {"hits": 16, "late": 0, "misses": 0, "loads": 0}


@pytest.mark.parametrize("slots", [2, 3, 4, 6])
def test_oracle_loads_equal_brute_force_optimum(slots):
    # The oracle preloads the first `slots` distinct keys (MIN's cold loads), so its counted
    # loads are the optimum minus those.
    distinct_first = min(slots, len(set(SEQUENCE)))
    assert _run(Oracle(), slots)["loads"] == optimal_loads(SEQUENCE, slots) - distinct_first


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), experts=st.integers(3, 6), layers=st.integers(1, 3),
       top_k=st.integers(1, 2), extra=st.integers(0, 6), output_len=st.integers(1, 6))
def test_oracle_moves_no_more_bytes_than_any_system(seed, experts, layers, top_k, extra,
                                                    output_len):
    model = tiny_model(layers=layers, experts=experts, top_k=top_k)
    trace = random_trace(model, 2, 2, output_len, seed, with_spec=True)
    # At least one layer's union of a step (prompt of 2 tokens: <= 2 * top_k experts).
    slots = max(2 * top_k, layers) + extra
    oracle = _run(Oracle(), slots, trace, model)["loads"]
    for system in (OnDemand(), LRU(), LRU(prefetch=False), LayerOffload()):
        assert oracle <= _run(system, slots, trace, model)["loads"], system.name


# ---- knobs: every constructor argument checked, the key first in the message -----------------
def _ctx(layers=3, experts=4, slots=6):
    return SystemContext(num_layers=layers, num_experts=experts, top_k=2, expert_bytes=1,
                         capacity_slots=slots, capacity_bytes=slots, max_batch=1,
                         moe_layer_stacks=("decoder",) * layers, trace_fields=())


NAN, INF = float("nan"), float("inf")
# (system class, constructor kwargs, the whole message, written by hand)
BAD_KNOBS = [
    (LRU, {"slots_per_layer": 0}, "slots_per_layer: must be an integer >= 1 or null (auto), got 0"),
    (LRU, {"slots_per_layer": -4},
     "slots_per_layer: must be an integer >= 1 or null (auto), got -4"),
    (LRU, {"slots_per_layer": 2.7},
     "slots_per_layer: must be an integer >= 1 or null (auto), got 2.7"),
    (LRU, {"slots_per_layer": True},
     "slots_per_layer: must be an integer >= 1 or null (auto), got True"),
    (LRU, {"prefetch": 1}, "prefetch: must be true or false, got 1"),
    (OnDemand, {"prefetch": "yes"}, "prefetch: must be true or false, got 'yes'"),
    (LayerOffload, {"stream_buffer_layers": 0},
     "stream_buffer_layers: must be an integer >= 1, got 0"),
    (LayerOffload, {"stream_buffer_layers": 1.5},
     "stream_buffer_layers: must be an integer >= 1, got 1.5"),
    (Oracle, {"lookahead": 0}, "lookahead: must be an integer >= 1, got 0"),
    (Oracle, {"lookahead": "64"}, "lookahead: must be an integer >= 1, got '64'"),
    (MoEInfinity, {"eamc_capacity": 0},
     "eamc_capacity: must be an integer in [1, 100000], got 0"),
    (MoEInfinity, {"eamc_capacity": 10**6},
     "eamc_capacity: must be an integer in [1, 100000], got 1000000"),
    (MoEInfinity, {"max_proposal": 0}, "max_proposal: must be an integer >= 1, got 0"),
    (MoEInfinity, {"own_weight": 1.5},
     "own_weight: must be a finite number in [0.0, 1.0], got 1.5"),
    (MoEInfinity, {"own_weight": NAN},
     "own_weight: must be a finite number in [0.0, 1.0], got nan"),
    (MoEInfinity, {"learn_online": "no"}, "learn_online: must be true or false, got 'no'"),
    (FMoE, {"prefetch_distance": 0}, "prefetch_distance: must be an integer >= 1, got 0"),
    (FMoE, {"store_capacity": 0}, "store_capacity: must be an integer in [1, 100000], got 0"),
    (FMoE, {"match_us_per_map": -1.0},
     "match_us_per_map: must be a finite number >= 0.0, got -1.0"),
    (FMoE, {"match_us_per_map": INF},
     "match_us_per_map: must be a finite number >= 0.0, got inf"),
    (FMoE, {"online_update": 0}, "online_update: must be true or false, got 0"),
    (FMoE, {"semantic_same_kind": None}, "semantic_same_kind: must be true or false, got None"),
    (FMoE, {"protect_prefetched": "true"},
     "protect_prefetched: must be true or false, got 'true'"),
    (DiffMoE, {"slots_per_layer": 0},
     "slots_per_layer: must be an integer >= 1 or null (auto), got 0"),
    (DiffMoE, {"high_slots": -1},
     "high_slots: must be an integer >= 0 or null (round(slots_per_layer / 3)), got -1"),
    (DiffMoE, {"low_slots": 0},
     "low_slots: must be an integer >= 1 or null (2 * min(E, max_batch * top_k)), got 0"),
    (DiffMoE, {"max_val": -1.0}, "max_val: must be a finite number >= 0.0, got -1.0"),
    (DiffMoE, {"threshold": NAN}, "threshold: must be a finite number, got nan"),
    (DiffMoE, {"dec_in": INF}, "dec_in: must be a finite number >= 0.0, got inf"),
    (DiffMoE, {"dec_out": "0.2"}, "dec_out: must be a finite number >= 0.0, got '0.2'"),
    (DiffMoE, {"min_val": 3.0}, "min_val: must be a finite number <= 2.0 or null (no floor), "
                                "got 3.0 (the floor cannot be above max_val)"),
    (DiffMoE, {"prefetch": 1}, "prefetch: must be true or false, got 1"),
    (DiffMoE, {"recency_grid": []},
     "recency_grid: must be a non-empty list of finite numbers in [0.0, 1.0], got []"),
    (DiffMoE, {"recency_grid": [0.0, 1.5]},
     "recency_grid: must be a non-empty list of finite numbers in [0.0, 1.0], got [0.0, 1.5]"),
    (DiffMoE, {"recency_grid": "0.5"},
     "recency_grid: must be a non-empty list of finite numbers in [0.0, 1.0], got '0.5'"),
    (DiffMoE, {"holdout_fraction": 1.0},
     "holdout_fraction: must be a finite number in (0.0, 1.0), got 1.0"),
    (DiffMoE, {"train_prefill_stride": 0},
     "train_prefill_stride: must be an integer >= 1, got 0"),
    (DiffMoE, {"smoothing": 0.0}, "smoothing: must be a finite number > 0.0, got 0.0"),
]


@pytest.mark.parametrize("cls, kwargs, message", BAD_KNOBS,
                         ids=[f"{c.name}-{next(iter(k))}={k[next(iter(k))]!r}"
                              for c, k, _ in BAD_KNOBS])
def test_bad_knob_is_refused_in_init_naming_it(cls, kwargs, message):
    with pytest.raises(KnobError) as err:
        cls(**kwargs)
    assert str(err.value) == message


# Ranges that depend on the model or the budget are checked in bind (3 layers, 4 experts,
# 6 slots); the message is written by hand.
BAD_BIND = [
    (LRU, {"slots_per_layer": 100000}, "slots_per_layer: must be an integer in [1, 4] or null "
     "(auto), got 100000 (the model has 4 experts per layer)"),
    (LRU, {"slots_per_layer": 5}, "slots_per_layer: must be an integer in [1, 4] or null "
     "(auto), got 5 (the model has 4 experts per layer)"),
    (DiffMoE, {"slots_per_layer": 5}, "slots_per_layer: must be an integer in [1, 4] or null "
     "(auto), got 5 (the model has 4 experts per layer)"),
    (DiffMoE, {"low_slots": 7}, "low_slots: must be an integer in [1, 6] or null "
     "(2 * min(E, max_batch * top_k)), got 7 (the cache holds 6 experts)"),
    (DiffMoE, {"slots_per_layer": 1, "high_slots": 2}, "high_slots: must be an integer in "
     "[0, 1], got 2 (1 slots per layer)"),
    (DiffMoE, {"slots_per_layer": 2}, "slots_per_layer: 2 slots per layer x 3 layers leaves no "
     "low-priority slot in a cache of 6 experts"),
]


@pytest.mark.parametrize("cls, kwargs, message", BAD_BIND)
def test_context_dependent_knob_is_refused_in_bind(cls, kwargs, message):
    system = cls(**kwargs)  # statically fine
    with pytest.raises(KnobError) as err:
        system.bind(_ctx())
    assert str(err.value) == message


def test_knob_checks_keep_valid_values():
    lru = LRU(slots_per_layer=4, prefetch=False)
    lru.bind(_ctx())
    assert lru.evictor.slots_per_layer == 4 and lru.prefetch is False
    auto = LRU()
    auto.bind(_ctx(slots=30))  # auto: floor(30 / 3) = 10, at most a layer's 4 experts
    assert auto.evictor.slots_per_layer == 4 and auto.prefetcher.max_proposal == 4
    assert isinstance(KnobError("x"), ValueError)  # callers catching ValueError still do
    with pytest.raises(KnobError, match=r"^holdout_fraction: must be a finite number in "
                                        r"\(0\.0, 1\.0\), got 0$"):
        NextLayerPredictor(3, 4, 2, ("decoder",) * 3, holdout_fraction=0)


# ---- choose_victim is a pure query ------------------------------------------------------------

PURE_TINY = ["experiment=table1", "workload.num_requests=3", "workload.prompt_len=16",
             "workload.output_len=5", "calibration_requests=3", "progress=false",
             "expert_cache_gb=2", "system.prefetch=true"]
PURE_EXTRA = {"moe_infinity": ["system.eamc_capacity=5"], "fmoe": ["system.store_capacity=8"]}


@pytest.mark.parametrize("name, cls", [("on_demand", OnDemand), ("lru", LRU),
                                       ("layer_offload", LayerOffload), ("diff_moe", DiffMoE),
                                       ("fmoe", FMoE), ("moe_infinity", MoEInfinity)])
def test_choose_victim_asked_twice_gives_the_same_run(tmp_path, monkeypatch, name, cls):
    """The engine may ask and not act: a system asked twice before every load must answer the
    same both times and run exactly as when asked once (state changes belong in on_evict)."""
    from harness.runner.assembly import assemble
    from harness.runner.config import compose_config
    from harness.runner.run import execute

    def run(tag):
        cfg = compose_config([f"system={name}", *PURE_TINY, *PURE_EXTRA.get(name, [])],
                             run_name=f"{name}-{tag}", results_dir=str(tmp_path))
        return execute(assemble(cfg))

    once = run("once")
    original = cls.choose_victim

    def twice(self, candidates, incoming, demand, now_ms):
        first = original(self, candidates, incoming, demand, now_ms)
        assert original(self, candidates, incoming, demand, now_ms) == first
        return first

    monkeypatch.setattr(cls, "choose_victim", twice)
    again = run("twice")
    assert once.status == again.status == "valid"
    import pyarrow.parquet as pq

    evict_ms = pq.read_table(once.run_dir / "transfers.parquet").column("evict_ms")
    assert np.count_nonzero(~np.isnan(evict_ms.to_numpy())) > 0  # victims were asked for
    assert again.metrics == once.metrics
