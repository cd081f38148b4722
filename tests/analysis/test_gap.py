"""Gap to Belady loads (analysis/gap.py, docs/metrics.md "Gap to Belady"): hand-walked terms on
the tiny committed trace (sequence 0 5 1 5 0 6 2 7 1 5 0 6 3 5 0 4, see
tests/systems/test_systems.py), and the key-level replay checked against the engine's
demand-only runs."""

from __future__ import annotations

import pytest
from helpers import DATA, FixedBackend, random_trace, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.gap import context, decompose, main, replay
from core.access import access_sequence
from core.trace import read_trace
from harness.sim.engine import Engine
from systems.evictors.belady import BeladyEvictor
from systems.evictors.lru import LRUEvictor
from systems.evictors.lru_per_layer import LRUPerLayer
from systems.lru import LRU
from systems.on_demand import OnDemand
from systems.oracle.belady import Belady
from systems.oracle.bypass import BeladyBypass, Bypass

TINY = DATA / "tiny_trace.npz"


def _copies(system, slots, trace, model) -> int:
    t = Engine(model, FixedBackend(), trace, system, slots * model.expert_bytes).run().tables()
    return len(t["transfers"]["kind"])


# Hand walks (on_demand = global LRU; A = admitted slots, S = scratch; nu = next position):
# 3 slots: LRU hits only 5@3 and 0@4 -> 14 loads; MIN 10 (tests/systems/test_oracle_family.py).
#   LRU + Belady admission (A <= 2): 0 5 admit; 1 (nu 8 > 0@4) S; 6 (11 > 10) S; 2 7 1 6 3
#   never: S; 4 never, A = {5, 0} never: admit, LRU evicts 5 -> 10 loads.
# 4 slots: LRU 12 loads (4 hits), MIN 9.
#   LRU + Belady admission (A <= 3): 0 5 1 admit; 6 (11 > 0@10) S; 2 7 S; 1 5 0 hit;
#   6 never = 1 never: admit, evict 1 (LRU); 3: admit, evict 5; 5: admit, evict 0;
#   0: admit, evict 6; 4: admit, evict 3 -> 11 loads.
@pytest.mark.parametrize("slots,cells", [
    (3, {"system_loads": 14, "belady": 10, "system_demand": 14, "belady_victims": 10,
         "belady_admission": 10, "gap": 4, "prefetch_engine": 0, "victims": 4, "admission": 4,
         "residual": -4}),
    (4, {"system_loads": 12, "belady": 9, "system_demand": 12, "belady_victims": 9,
         "belady_admission": 11, "gap": 3, "prefetch_engine": 0, "victims": 3, "admission": 1,
         "residual": -1}),
])
def test_hand_trace_terms(slots, cells):
    trace, model = read_trace(TINY), tiny_model(layers=2, experts=4, top_k=1)
    system_loads = _copies(OnDemand(), slots, trace, model)
    got = decompose(access_sequence(trace, 1), context(trace, slots, 1), system_loads,
                    LRUEvictor)
    assert got == cells


def test_belady_bypass_gap_has_no_victim_term():
    trace, model = read_trace(TINY), tiny_model(layers=2, experts=4, top_k=1)
    got = decompose(access_sequence(trace, 1), context(trace, 4, 1),
                    _copies(BeladyBypass(), 4, trace, model), BeladyEvictor, bypass=True)
    # belady_bypass at 4 slots: its replay is its run; both cells use Belady victims
    assert got["prefetch_engine"] == 0 and got["victims"] == 0
    assert got["system_demand"] == got["belady_victims"] == got["system_loads"]
    assert got["gap"] == got["system_loads"] - 9 >= 0  # MIN(4) = 9


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), experts=st.integers(3, 6), layers=st.integers(1, 3),
       top_k=st.integers(1, 2), slots=st.integers(2, 9))
def test_replay_is_the_engines_demand_only_run(seed, experts, layers, top_k, slots):
    """Multi-expert steps, caches smaller than a step (deferred fetches): the replay counts
    the loads the engine makes with prefetch off."""
    model = tiny_model(layers=layers, experts=experts, top_k=top_k)
    trace = random_trace(model, 2, 3, 4, seed)
    seq, ctx = access_sequence(trace, 1), context(trace, slots, 1)
    assert replay(seq, ctx, LRUEvictor()) == _copies(OnDemand(), slots, trace, model)
    assert replay(seq, ctx, BeladyEvictor()) == _copies(Belady(), slots, trace, model)
    assert replay(seq, ctx, Bypass(BeladyEvictor())) == _copies(BeladyBypass(), slots, trace,
                                                                 model)
    if slots >= layers:
        assert replay(seq, ctx, LRUPerLayer()) == _copies(LRU(prefetch=False), slots, trace,
                                                          model)


def test_terms_add_up_for_a_prefetching_system():
    model = tiny_model(layers=3, experts=6, top_k=2)
    trace = random_trace(model, 2, 3, 6, seed=5, with_spec=True)
    loads = _copies(LRU(), 9, trace, model)
    got = decompose(access_sequence(trace, 1), context(trace, 9, 1), loads, LRUPerLayer)
    assert got["prefetch_engine"] == loads - replay(access_sequence(trace, 1),
                                                    context(trace, 9, 1), LRUPerLayer())
    assert got["gap"] == sum(got[t] for t in ("prefetch_engine", "victims", "admission",
                                              "residual"))
    assert got["belady"] <= got["system_demand"]


TINY_RUN = ["experiment=table1", "workload.num_requests=2", "workload.prompt_len=16",
            "workload.output_len=4", "calibration_requests=2", "progress=false"]


def test_cli_prints_the_table(capsys):
    assert main([*TINY_RUN, "system=composed", "system/evictor=lfu"]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED" in out and "| residual |" in out and "| belady_admission |" in out
    assert main([*TINY_RUN, "system=fmoe"]) == 1  # a joint design: no separable evictor
    assert "no separable evictor" in capsys.readouterr().err


def test_cli_refuses_a_system_that_runs_misses_on_the_cpu(capsys):
    # its loads are fewer than Belady's by design: nothing to decompose
    assert main([*TINY_RUN, "system=composed", "system/miss_handler=cost_based",
                 "hardware/host=ddr5_dual_channel"]) == 1
    assert "run on the host CPU instead of loading" in capsys.readouterr().err


def test_cli_refuses_a_run_over_several_gpus(capsys):
    # one cache per GPU: a one-cache replay would decompose something the run did not do
    assert main([*TINY_RUN, "system=composed", "system/evictor=lfu", "placement=shard_expert",
                 "hardware/peer=pcie4_p2p", "hardware.num_gpus=2"]) == 1
    assert "one cache per GPU" in capsys.readouterr().err
