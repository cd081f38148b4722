"""The CPU-offload systems (ktransformers, fiddler, hybrimoe) and their parts (systems/placement.py,
the hybrid miss handler, the mrs evictor and prefetcher): hand-walked cases on hand-made
traces and costs, and end-to-end runs through moebench with an inline host profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import ROOT, FixedBackend, meta_for, tiny_model

from core.tier_specs import host_spec_from_dict
from core.trace import trace_from_routing
from core.view import SystemContext
from harness.sim.engine import Engine
from harness.sim.recorder import CPU, DEMAND, HIT, MISS, PRELOAD
from harness.sim.tiers import Tiers
from systems.evictors.mrs import MRSEvictor
from systems.fiddler import Fiddler
from systems.hybrimoe import HybriMoE
from systems.ktransformers import KTransformers
from systems.miss_handlers.hybrid import HybridMisses, hybrid_schedule
from systems.placement import frequency_keys, front_loading_keys, uniform_keys
from systems.prefetchers.mrs import MRSPrefetch

HOST = {"name": "t", "display_name": "t", "dram_gb": 64, "reserve_gb": 8, "mem_gbps": 80,
        "cpu_tflops": 2, "cpu_expert_overhead_us": 50}
HOST_OVERRIDE = "+hardware.host={" + ",".join(f"{k}:{v}" for k, v in HOST.items()) + "}"


# ---- hand traces through the engine -------------------------------------------------------------
class CpuBackend(FixedBackend):
    """FixedBackend (expert 1 ms, copy 2 ms) with a CPU: `cpu_ms_per_token` per routed token."""

    def __init__(self, cpu_ms_per_token=1.0):
        super().__init__()
        self.cpu_ms_per_token = cpu_ms_per_token

    def cpu_expert_ms(self, n_tokens):
        return self.cpu_ms_per_token * n_tokens


def hand(steps, layers=2, experts=4):
    """One request, top-1; steps[s][layer] = the step's tokens' experts (prefill: several)."""
    model = tiny_model(layers=layers, experts=experts, top_k=1)
    routing = [[[[e] for e in steps[s][layer]] for layer in range(layers)]
               for s in range(len(steps))]
    req = {"id": "a", "prompt_len": len(steps[0][0]), "output_len": len(steps),
           "arrival_ms": 0.0, "routing": routing}
    return model, trace_from_routing(meta_for(model), [req])


def run(system, model, trace, slots, calibration=None, backend=None):
    tiers = Tiers(host_spec_from_dict(HOST), None, None, 24.0)
    engine = Engine(model, backend or CpuBackend(), trace, system,
                    capacity_bytes=slots * model.expert_bytes, tiers=tiers)
    if calibration is not None:
        system.warmup(calibration)
    return engine.run().tables()


# Calibration: L0 tokens 1 1 2 | 1 | 2 -> e1: 3, e2: 2; L1 tokens 3 3 0 | 3 | 3 -> e3: 4, e0: 1.
# Keys (layer * 4 + id): 7 (4 tokens), 1 (3), 2 (2), 4 (1): the 3 most counted are 1, 2, 7.
CALIBRATION = [[[1, 1, 2], [3, 3, 0]], [[1], [3]], [[2], [3]]]
# Measured: s0 L0 {0, 1} L1 {2, 3}; s1 L0 {2} L1 {1}; s2 L0 {1} L1 {3}.
MEASURED = [[[0, 1], [3, 2]], [[2], [1]], [[1], [3]]]


def test_ktransformers_keeps_its_placement_and_runs_every_miss_on_the_cpu():
    model, trace = hand(MEASURED)
    _, calib = hand(CALIBRATION)
    system = KTransformers()
    t = run(system, model, trace, slots=3, calibration=calib)
    assert system.placed == {1, 2, 7}
    tr = t["transfers"]
    assert list(tr["kind"]) == [PRELOAD] * 3 and sorted(tr["key"]) == [1, 2, 7]  # no other copy
    acc = t["accesses"]
    got = sorted(zip(acc["expert"].tolist(), acc["class"].tolist()))
    # s0: 0 cpu, 1 hit, (L1) 2 -> key 6 cpu, 3 -> key 7 hit; s1: 2 hit, (L1) 1 -> key 5 cpu;
    # s2: 1 hit, 3 hit.
    assert sorted(got) == sorted([(0, CPU), (1, HIT), (2, CPU), (3, HIT), (2, HIT), (1, CPU),
                                  (1, HIT), (3, HIT)])
    assert set(acc["transfer_id"][acc["class"] == CPU].tolist()) == {-1}


def test_fiddler_copies_a_heavy_miss_into_its_one_scratch_slot():
    # 4 slots: 3 placed (keys 1, 2, 7) + the scratch slot. Costs: GPU 1 ms, copy 2 ms, CPU 1 ms
    # a token: a missed expert with 4 tokens goes to the GPU (4 > 2 + 1), with 1 token to the
    # CPU (1 < 3). s0 L0: expert 0 has 4 tokens -> copied (key 0); L1: expert 2 has 4 tokens
    # -> copied (key 6), evicting key 0, the scratch expert; expert 0 (key 4, 1 token) -> CPU.
    # s1: L0 {0}: key 0 was evicted, 1 token -> CPU; L1 {3}: key 7 placed, a hit.
    model, trace = hand([[[0, 0, 0, 0, 1], [2, 2, 2, 2, 0]], [[0], [3]]])
    _, calib = hand(CALIBRATION)
    system = Fiddler()
    t = run(system, model, trace, slots=4, calibration=calib)
    assert system.placed == {1, 2, 7}
    tr = t["transfers"]
    assert list(tr["kind"]) == [PRELOAD] * 3 + [DEMAND] * 2
    assert tr["key"].tolist()[3:] == [0, 6]
    evicted = tr["key"][~np.isnan(tr["evict_ms"])].tolist()
    assert evicted == [0]  # only the scratch slot's expert ever leaves
    acc = t["accesses"]
    assert int(np.sum(acc["class"] == MISS)) == 2 and int(np.sum(acc["class"] == CPU)) == 2


def test_placement_strategies():
    counts = np.array([[0, 3, 2, 0], [1, 0, 0, 4]])
    assert frequency_keys(counts, 3) == [1, 2, 7]
    assert frequency_keys(np.zeros((2, 4), int), 3) == [0, 1, 2]  # ties: the lowest key
    # kt_utils.py: n // L per layer, the first n % L layers one more, the lowest ids
    assert uniform_keys(2, 4, 5) == [0, 1, 2, 4, 5]
    assert front_loading_keys(2, 4, 5) == [0, 1, 2, 3, 4]


def test_static_placement_needs_its_warmup_and_checks_its_knob():
    system = KTransformers()
    system.bind(ctx(slots=3))
    with pytest.raises(ValueError, match="needs warmup"):
        system.initial_residents()
    assert KTransformers(placement="uniform").needs_calibration() is False
    with pytest.raises(ValueError, match="^placement: must be one of frequency, uniform"):
        KTransformers(placement="hot")


# ---- the hybrid miss handler --------------------------------------------------------------------
def costs(cpu_free=10.0, link_free=11.0):
    """Layer start 10 ms; GPU 1 ms an expert, CPU 1 ms a token, a copy 2 ms."""
    return SimpleNamespace(cpu_ms=lambda t: 1.0 * t, gpu_ms=lambda t: 1.0, copy_ms=2.0,
                           now_ms=10.0, cpu_free_ms=cpu_free, link_free_ms=link_free,
                           in_host=lambda key: True)


def test_hybrid_schedule_by_hand():
    # On the GPU: expert 0 (3 tokens); missed: 1 (1 token), 2 (4), 3 (1). The list: 0, then
    # the missed by tokens: 2, 1, 3. Queues from the layer start: GPU 0, CPU 0, link 1 (busy
    # until 11 ms).
    # 1. head 0: GPU 0+1 = 1; tail 3: CPU 0+1 = 1; 1 <= 1 -> GPU takes 0 (GPU 1).
    # 2. head 2: its copy lands at 1+2 = 3, the GPU waits 2: 1+2+1 = 4; tail 3: 0+1 = 1 ->
    #    CPU takes 3 (CPU 1).
    # 3. head 2: 4; tail 1: 1+1 = 2 -> CPU takes 1 (CPU 2).
    # 4. head = tail = 2: GPU 4; CPU 2+4 = 6 -> GPU takes 2. CPU: {1, 3}.
    assert hybrid_schedule([(0, 3)], [(1, 1), (2, 4), (3, 1)], costs()) == {1, 3}
    # The CPU busy until 15 ms (CPU queue 5):
    # 1. head 0: 1 <= 5+1 -> GPU (1). 2. head 2: lands 3, 1+2+1 = 4 <= 6 -> GPU (4, link 3).
    # 3. head 1: lands 3+2 = 5, waits 1: 4+1+1 = 6; tail 3: 5+1 = 6; 6 <= 6 -> GPU (6, link 5).
    # 4. head = tail = 3: lands 7, 6+1+1 = 8 > 5+1 = 6 -> CPU takes 3. CPU: {3}, where the
    # per-expert rule (cost_based) would also send 1 there.
    assert hybrid_schedule([(0, 3)], [(1, 1), (2, 4), (3, 1)], costs(cpu_free=15.0)) == {3}


def test_hybrid_handler_reads_the_layer_and_decode_only():
    # GPU 1 ms a token, CPU 2 ms a token, a copy 2 ms; every queue free at the layer start.
    # Routed: expert 0 (6 tokens, on the GPU), missed 1 (1 token) and 2 (2 tokens).
    # With the layer seen, the list is 0, 2, 1:
    # 1. head 0: GPU 6; tail 1: CPU 2 -> CPU takes 1 (CPU 2).
    # 2. head 0: 6 <= tail 2: 2+4 = 6 -> GPU takes 0 (GPU 6).
    # 3. head = tail = 2: lands at 2, GPU 6+2 = 8 > CPU 6 -> CPU takes 2. CPU: {1, 2}.
    # Without it (another layer's routing), the list is 2, 1:
    # 1. head 2: lands at 2, GPU 2+2 = 4; tail 1: 2 -> CPU takes 1 (CPU 2).
    # 2. head = tail = 2: 4 <= 2+4 -> GPU takes 2. CPU: {1}.
    c = SimpleNamespace(cpu_ms=lambda t: 2.0 * t, gpu_ms=lambda t: 1.0 * t, copy_ms=2.0,
                        now_ms=10.0, cpu_free_ms=10.0, link_free_ms=10.0, in_host=None)
    routing = SimpleNamespace(layer=1, experts=[0, 1, 2], counts=[6, 1, 2],
                              iteration=SimpleNamespace(kind="prefill"))
    missing = [(1, 1), (2, 2)]
    handler = HybridMisses()
    handler.on_layer_routed(routing, 10.0)
    assert handler.choose_cpu(1, missing, c) == {1, 2}
    assert handler.choose_cpu(0, missing, c) == {1}  # no routing of layer 0 seen
    release = HybridMisses(decode_only=True)
    release.on_layer_routed(routing, 10.0)
    assert release.choose_cpu(1, missing, c) == set()  # a prefill: all to the GPU
    routing.iteration.kind = "decode"
    release.on_layer_routed(routing, 10.0)
    assert release.choose_cpu(1, missing, c) == {1, 2}


# ---- the mrs evictor and prefetcher -------------------------------------------------------------
def ctx(layers=2, experts=4, top_k=1, slots=4, fields=("probs",)):
    return SystemContext(num_layers=layers, num_experts=experts, top_k=top_k, expert_bytes=1,
                         capacity_slots=slots, capacity_bytes=slots, max_batch=1,
                         moe_layer_stacks=("decoder",) * layers, trace_fields=fields)


def routed(layer, probs, experts=(0,), counts=(1,)):
    rows = np.asarray([probs], np.float16)
    return SimpleNamespace(layer=layer, experts=list(experts), counts=list(counts),
                           iteration=SimpleNamespace(members=((0, 1),)),
                           probs_rows=lambda requests: rows)


class Evictable:
    def __init__(self, keys):
        self.keys, self.full = set(keys), True

    def first_of(self, keys):
        return next((k for k in keys if k in self.keys), None)


def test_mrs_victim_on_a_hand_made_score_history():
    ev = MRSEvictor()  # alpha 0.5, top_p 2 * top_k = 2
    ev.bind(ctx())
    # L0 s = (.5, .25, .25, 0): top 2 = experts 0, 1 (ties: lowest id): S0 .25, S1 .125.
    ev.on_layer_routed(routed(0, [0.5, 0.25, 0.25, 0.0]), 0.0)
    # L0 s = (0, .25, .75, 0): top 2 = 2, 1: S0 .125 (decayed), S1 .125 + .0625 = .1875,
    # S2 .375, S3 0.
    ev.on_layer_routed(routed(0, [0.0, 0.25, 0.75, 0.0]), 0.0)
    # L1 s = (0, 0, .5, .5): top 2 = 2, 3: S6 .25, S7 .25; S4 = S5 = 0.
    ev.on_layer_routed(routed(1, [0.0, 0.0, 0.5, 0.5]), 0.0)
    assert ev.scores.score.tolist() == [0.125, 0.1875, 0.375, 0.0, 0.0, 0.0, 0.25, 0.25]
    for key in (0, 1, 2, 6, 7):
        ev.on_insert(key, True, 0.0)
    assert ev.choose_victim(Evictable({0, 1, 2, 6, 7}), 3, True, 0.0) == 0  # lowest S
    assert ev.choose_victim(Evictable({1, 2, 6, 7}), 3, True, 0.0) == 1
    assert ev.choose_victim(Evictable({2, 6, 7}), 3, True, 0.0) == 6  # .25 tie: lowest key
    ev.on_insert(4, True, 0.0)
    ev.on_insert(3, True, 0.0)
    assert ev.choose_victim(Evictable({0, 3, 4}), 5, True, 0.0) == 3  # S 0 twice: lowest key
    ev.on_evict(3, 0.0)
    assert ev.choose_victim(Evictable({0, 3, 4}), 5, True, 0.0) == 4
    assert ev.choose_victim(SimpleNamespace(full=False), 5, True, 0.0) is None


def test_mrs_without_probs_uses_the_routed_shares():
    ev = MRSEvictor()
    ev.bind(ctx(fields=()))
    # tokens 3 on expert 1, 1 on expert 2: shares .75, .25 -> S5 .375, S6 .125
    ev.on_layer_routed(routed(1, [0] * 4, experts=(1, 2), counts=(3, 1)), 0.0)
    assert ev.scores.score.tolist() == [0.0] * 5 + [0.375, 0.125, 0.0]


def test_mrs_keys_alone_give_equal_shares_and_the_routing_replaces_them():
    # As a host evictor (keys only): L1 keys 5, 6 -> s = .5 each -> S5 = S6 = .25.
    host = MRSEvictor()
    host.bind(ctx())
    host.on_access(None, 1, [5, 6], 0.0)
    assert host.scores.score.tolist() == [0.0] * 5 + [0.25, 0.25, 0.0]
    # In a composed system on_access comes first, then the routing: the provisional update
    # is undone, so the scores are the routing's alone (S5 .125, S7 .375).
    both, alone = MRSEvictor(), MRSEvictor()
    for ev in (both, alone):
        ev.bind(ctx())
    both.on_access(None, 1, [5, 7], 0.0)
    for ev in (both, alone):
        ev.on_layer_routed(routed(1, [0.0, 0.25, 0.0, 0.75]), 0.0)
    assert both.scores.score.tolist() == alone.scores.score.tolist() == [0.0] * 5 + [
        0.125, 0.0, 0.375]


def test_mrs_prefetch_proposes_the_next_layers_top_scores():
    pf = MRSPrefetch(max_proposal=2)
    pf.bind(ctx())
    pf.on_layer_routed(routed(1, [0.0, 0.25, 0.0, 0.75]), 0.0)  # S5 .125, S7 .375
    assert pf.propose(0.0) is None  # after the last layer: nothing
    pf.on_layer_routed(routed(0, [1.0, 0.0, 0.0, 0.0]), 0.0)
    assert pf.propose(0.0) == [7, 5]  # layer 1, highest S first
    off = MRSPrefetch(max_proposal=0)
    off.bind(ctx())
    off.on_layer_routed(routed(0, [1.0, 0.0, 0.0, 0.0]), 0.0)
    assert off.propose(0.0) is None


def test_hybrimoe_is_composed_of_its_three_parts():
    system = HybriMoE(prefetch_size=3)
    assert (system.evictor.name, system.prefetcher.name, system.miss_handler.name) == (
        "mrs", "mrs", "hybrid")
    assert system.uses_fields == ("probs",)
    with pytest.raises(ValueError, match="^prefetch_size: must be an integer >= 0"):
        HybriMoE(prefetch_size=-1)


# ---- end to end through moebench ----------------------------------------------------------------
TINY = ["workload.num_requests=3", "workload.prompt_len=24", "workload.output_len=4",
        "calibration_requests=4", "progress=false", "trace_cache_dir=null",
        "expert_cache_gb=4"]


def moebench(args, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "moebench.cli", f"results_dir={tmp_path}",
                           *TINY, *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)


@pytest.mark.parametrize("system", ["ktransformers", "fiddler", "hybrimoe"])
def test_named_cpu_system_runs_through_moebench(tmp_path, system):
    p = moebench([f"system={system}", HOST_OVERRIDE], tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"[SIMULATED, synthetic routing] {system} |" in p.stdout and ": valid," in p.stdout
    (result,) = tmp_path.glob("default/*/result.json")
    r = json.loads(result.read_text())
    assert r["status"] == "valid" and r["system"]["name"] == system
    assert r["metrics"]["cpu_runs"] > 0 and r["engine"]["core"] == "python"


def test_named_cpu_system_without_a_host_is_refused(tmp_path):
    p = moebench(["system=ktransformers"], tmp_path)
    assert p.returncode == 2 and "hardware.host" in p.stderr
    assert not list(tmp_path.glob("default/*/result.json"))


def test_cpu_systems_are_the_named_systems_that_run_experts_on_the_cpu():
    """CPU_SYSTEMS (not Table 1 rows, a host in the goldens) lists exactly the named systems
    whose miss handler runs experts on the CPU."""
    from core.targets import build_target
    from harness.runner.config import NOT_IN_TABLE1, compose_config, cpu_system_names
    from systems.base import System

    def on_cpu(name):
        system = build_target(compose_config([f"system={name}"])["system"], "system", System)
        return system.miss_handler is not None and system.miss_handler.runs_on_cpu

    names = sorted(p.stem for p in (ROOT / "conf" / "system").glob("*.yaml"))
    assert [n for n in names if n != "composed" and on_cpu(n)] == cpu_system_names()
    assert set(cpu_system_names()) <= set(NOT_IN_TABLE1)
