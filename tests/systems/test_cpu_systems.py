"""The CPU-offload systems' parts: HybriMoE's hybrid miss handler (its greedy on hand-computed
costs) and its Minus Recent Score evictor and prefetcher (victims and proposals on a hand-made
score history)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from core.view import SystemContext
from systems.evictors.mrs import MRSEvictor
from systems.miss_handlers.hybrid import HybridMisses, hybrid_schedule
from systems.prefetchers.mrs import MRSPrefetch


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
