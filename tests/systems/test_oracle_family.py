"""The oracle family (oracle, belady, belady_bypass, belady_lookahead, the belady evictor),
the shared access sequence, and compute_floor_ms / headroom.

References written here, sharing no code with the systems: the access sequence read off the
trace's rows, a brute-force optimum over every eviction choice, and hand walks of the tiny
committed trace (tests/systems/test_systems.py documents it; keys layer * 4 + expert):
    0 5 1 5 0 6 2 7 1 5 0 6 3 5 0 4
Every step of it routes one expert, so its blocks are single keys.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import DATA, EvictableSet, FixedBackend, optimal_loads, random_trace, tiny_model
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.access import NEVER, access_sequence
from core.knobs import KnobError
from core.trace import read_trace
from harness.runner.config import compose_config, system_names
from harness.runner.run import run_config
from harness.sim.engine import Engine
from systems.oracle.belady import Belady, BeladyLookahead
from systems.oracle.bypass import BeladyBypass
from systems.oracle.system import Oracle

TINY = DATA / "tiny_trace.npz"
SEQUENCE = [0, 5, 1, 5, 0, 6, 2, 7, 1, 5, 0, 6, 3, 5, 0, 4]


def _copies(system, slots, trace=None, model=None) -> int:
    """Every copy the run made (preloads included)."""
    model = model or tiny_model(layers=2, experts=4, top_k=1)
    trace = trace if trace is not None else read_trace(TINY)
    t = Engine(model, FixedBackend(), trace, system, slots * model.expert_bytes).run().tables()
    return len(t["transfers"]["kind"])


def _sequence(trace) -> list[int]:
    """Batch 1, every request at t = 0: requests in index order, steps, layers, ascending ids."""
    out = []
    for r in range(trace.num_requests):
        for s in range(int(trace.output_len[r])):
            for layer in range(trace.num_layers):
                ids = sorted({int(e) for e in trace.block_rows(r, s, layer).ravel()})
                out.extend(layer * trace.num_experts + e for e in ids)
    return out


def test_access_sequence_is_the_engine_order():
    seq = access_sequence(read_trace(TINY), 1)
    assert seq.keys == SEQUENCE
    assert seq.block_starts == list(range(17)) and seq.iteration_starts == list(range(0, 17, 2))
    assert seq.next_use[:4] == [4, 3, 8, 9] and seq.next_use[15] == NEVER
    assert seq.next_at(5, 10) == 13 and seq.next_at(4, 0) == 15 and seq.next_at(2, 7) == NEVER
    assert seq.block_at(3, 1) == 7 and seq.iteration_kinds[:2] == ["prefill", "decode"]


# The brute force over every eviction choice is the reference at every size (cold loads count:
# belady starts empty and only fetches on demand).
@pytest.mark.parametrize("slots", [2, 3, 4, 6])
def test_belady_loads_equal_the_brute_force_optimum(slots):
    assert _copies(Belady(), slots) == optimal_loads(SEQUENCE, slots)
    # the oracle preloads MIN's cold loads: its copies are MIN's too
    assert _copies(Oracle(), slots) == _copies(Oracle(prefetch=False), slots) == \
        optimal_loads(SEQUENCE, slots)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), experts=st.integers(3, 5), layers=st.integers(1, 2),
       top_k=st.integers(1, 2), requests=st.integers(1, 2), output_len=st.integers(1, 4),
       extra=st.integers(1, 4))
@example(seed=303, experts=4, layers=2, top_k=2, requests=2, output_len=4, extra=2)
def test_belady_is_min_on_random_traces(seed, experts, layers, top_k, requests, output_len,
                                        extra):
    # A cache smaller than a step's experts evicts inside the step, where the engine runs
    # residents first (not ascending order); the sequence is its order when the admitted
    # slots (slots - 1 for bypass) hold a step's experts (prompt 2 tokens: <= 2 * top_k).
    slots = 2 * top_k + extra
    model = tiny_model(layers=layers, experts=experts, top_k=top_k)
    trace = random_trace(model, requests, 2, output_len, seed)
    seq = _sequence(trace)
    assert access_sequence(trace, 1).keys == seq
    best = optimal_loads(seq, slots)
    assert _copies(Belady(), slots, trace, model) == best
    # huge window: Belady itself (same ties); small window: never better than MIN
    assert _copies(BeladyLookahead(10**6), slots, trace, model) == best
    assert _copies(BeladyLookahead(1), slots, trace, model) >= best
    # bypass: a demand policy on the same slots, and MIN at one slot less never bypasses.
    # Its admission decides which experts are resident, and the engine runs a step's
    # residents before its misses, so the order it serves can differ from `seq` inside a
    # step (seed 303, 4 experts, 2 layers, top-2, 2 requests of 4 tokens, 6 slots: 10 loads
    # against MIN(seq) = 11, and MIN of the served order is 10): the bounds are MIN over the
    # order the run served.
    t = Engine(model, FixedBackend(), trace, BeladyBypass(),
               slots * model.expert_bytes).run().tables()
    served = (t["accesses"]["layer"].astype(np.int64) * experts
              + t["accesses"]["expert"]).tolist()
    assert sorted(served) == sorted(seq)
    bypass = len(t["transfers"]["kind"])
    assert optimal_loads(served, slots) <= bypass <= optimal_loads(served, slots - 1)


# belady_lookahead k = 1 at 3 slots, by hand (iteration i = step; known: uses before position
# 2 (i + 2); later ones are "never", ties lowest key):
# 0 5 1 load | p5 6: 0,5,1 all past p8 -> evict 0 | p6 2: 1@8 5@9 6 never -> evict 6 |
# p7 7: 2 never -> evict 2 | 1 5 hit | p10 0: 1 never, 5@13, 7 never -> evict 1 |
# p11 6: 0@14 past the window, 7 never -> evict 0 | p12 3: 6, 7 never -> evict 6 | 5 hit |
# p14 0: evict 3 | p15 4: evict 0.  11 loads (MIN: 10).
def test_belady_lookahead_hand_walk():
    assert _copies(BeladyLookahead(1), 3) == 11
    assert optimal_loads(SEQUENCE, 3) == 10


# belady_bypass, by hand (A = admitted, S = scratch; nu = next position):
# 3 slots (A <= 2): 0 5 admit | p2 1 (nu 8 > farthest A 0@4): S=1 | 5 0 hit |
# p5 6 (11 > 10): S=6 | 2, 7, 1 (never): S=2, 7, 1 | 5 0 hit | 6, 3 (never): S=6, 3 | 5 0 hit |
# p15 4: never, A = {5, 0} never too -> admit, evict 0.  10 loads (= MIN(3); MIN(2) = 13).
# 2 slots (A <= 1): 0 | p1 5 (3 < 0@4): admit, evict 0 | p2 1: S=1 | 5 hit | p4 0 (10 > 9):
# S=0 | 6 2 7 1: S | 5 hit | p10 0 (14 > 13): S | 6 3: S | 5 hit | p14 0 never = 5 never:
# admit, evict 5 | p15 4: admit, evict 0.  13 loads (= MIN(2)).
@pytest.mark.parametrize("slots,loads", [(3, 10), (2, 13)])
def test_belady_bypass_hand_walk(slots, loads):
    assert _copies(BeladyBypass(), slots) == loads


def test_bypass_needs_a_scratch_slot():
    with pytest.raises(ValueError, match="bypass needs 2 slots"):
        _copies(BeladyBypass(), 1)


def test_lookahead_knob_is_checked():
    with pytest.raises(KnobError, match=r"^lookahead_iterations: must be an integer >= 1, got 0$"):
        BeladyLookahead(0)
    with pytest.raises(KnobError, match=r"^lookahead_iterations: must be an integer >= 1"):
        BeladyLookahead(1.5)


def _bound(system, slots=3):
    model = tiny_model(layers=2, experts=4, top_k=1)
    return Engine(model, FixedBackend(), read_trace(TINY), system, slots * model.expert_bytes)


def test_choose_victim_is_pure():
    # oracle: its plan advances only when the engine reports the eviction
    engine = _bound(Oracle(prefetch=False))
    oracle = engine.system
    key, victim = oracle.plan_key[0], oracle.plan_victim[0]
    everything = EvictableSet(range(8))
    assert oracle.choose_victim(everything, key, True, 0.0) == victim
    assert oracle.choose_victim(everything, key, True, 0.0) == victim and oracle.next == 0
    oracle.on_evict(victim, 0.0)
    assert oracle.next == 1
    # the belady evictor: same answer twice, state untouched
    system = _bound(Belady()).system
    ev = system.evictor
    for k in (0, 5, 1):
        ev.on_insert(k, True, 0.0)
    state = (dict(ev.nu), list(ev.heap), list(ev.far))
    first = ev.choose_victim(EvictableSet({0, 5, 1}), 6, True, 0.0)
    assert first == ev.choose_victim(EvictableSet({0, 5, 1}), 6, True, 0.0) == 1  # 1 next at 2
    assert (dict(ev.nu), list(ev.heap), list(ev.far)) == state
    assert ev.choose_victim(EvictableSet({0, 5, 1}, full=False), 6, True, 0.0) is None


# ---- through the runner: composed evictor, compute floor -------------------------------------
TINY_RUN = ["experiment=table1", "workload.num_requests=3", "workload.prompt_len=16",
            "workload.output_len=4", "calibration_requests=2", "progress=false"]


def _run(tmp_path, name, *extra):
    return run_config(compose_config([*TINY_RUN, *extra], run_name=name,
                                     results_dir=str(tmp_path)))


def test_belady_evictor_composes_and_is_a_bound(tmp_path):
    a = _run(tmp_path, "a", "system=composed", "system/evictor=belady")
    b = _run(tmp_path, "b", "system=belady")
    assert a["system"]["oracle"] is True and b["system"]["oracle"] is True
    assert a["metrics"] == b["metrics"]  # composed(belady, none) is belady
    c = _run(tmp_path, "c", "system=composed", "system/evictor=belady",
             "system/prefetcher=spec_next_layer")
    assert c["status"] == "valid" and c["metrics"]["prefetches_issued"] > 0


def test_compute_floor_bounds_every_system(tmp_path):
    floors = set()
    for system in [*system_names(), "belady", "belady_bypass", "belady_lookahead"]:
        r = _run(tmp_path, system, f"system={system}", "expert_cache_gb=4")
        if r["status"] == "oom":
            continue
        m = r["metrics"]
        floors.add(m["compute_floor_ms"])
        assert 0 < m["compute_floor_ms"] <= m["tpot_ms"]["mean"], system
        assert m["headroom"] == m["tpot_ms"]["mean"] / m["compute_floor_ms"]
    assert len(floors) == 1  # one trace, model, hardware and batch: one floor


def test_compute_floor_is_no_offloads_tpot_where_it_fits(tmp_path):
    fits = ["hardware=h200", "model=switch_base_128"]
    for batch in (1, 3):  # batch 3: all three requests arrive at once (a static batch)
        no = _run(tmp_path, f"no-{batch}", "system=no_offload", *fits, f"max_batch={batch}")
        lru = _run(tmp_path, f"lru-{batch}", "system=on_demand", *fits, f"max_batch={batch}",
                   "expert_cache_gb=0.05")
        assert no["status"] == "valid" and no["metrics"]["headroom"] == 1.0
        assert no["metrics"]["compute_floor_ms"] == no["metrics"]["tpot_ms"]["mean"]
        assert lru["metrics"]["compute_floor_ms"] == no["metrics"]["tpot_ms"]["mean"]
        assert lru["metrics"]["tpot_ms"]["mean"] > lru["metrics"]["compute_floor_ms"]
        assert np.isclose(lru["metrics"]["headroom"],
                          lru["metrics"]["tpot_ms"]["mean"] / no["metrics"]["tpot_ms"]["mean"])
