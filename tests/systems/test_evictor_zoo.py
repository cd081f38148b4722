"""The evictor zoo against an independent brute-force reference (tests/zoo_reference.py, whose
docstring states its semantics), hand-walked traces per evictor, and every evictor x prefetcher
pair of the composed system.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import numpy as np
import pytest
from helpers import FixedBackend, meta_for, random_trace, tiny_model
from zoo_reference import REF, blocks_of, reference

from core.paths import PROJECT_ROOT
from core.trace import trace_from_routing
from harness.sim.engine import Engine
from harness.sim.recorder import HIT, LATE, MISS
from systems.base import System
from systems.evictors.base import Evictor

MINE = ["fifo", "lfu", "lfu_perfect", "lfru", "least_stale", "lifo_inactive", "evict_after_use"]
OTHERS = ["lru", "lru_per_layer", "belady"]  # written by other helpers: tested once present
EVICTOR_DIR = PROJECT_ROOT / "systems" / "evictors"


def present(names):
    return [n for n in names if (EVICTOR_DIR / f"{n}.py").is_file()]


ALL = MINE + present(OTHERS)


def evictor_class(name: str) -> type:
    """The Evictor subclass named `name` in systems/evictors/<name>.py (import errors fail)."""
    module = importlib.import_module(f"systems.evictors.{name}")
    found = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, Evictor)
             and c.__module__ == module.__name__ and c.name == name]
    assert len(found) == 1, f"systems/evictors/{name}.py defines no single Evictor named {name}"
    return found[0]


# ---- the system that drives an evictor ----------------------------------------------------------
class Forward(System):
    """Forwards the engine's events to one evictor, no prefetch; logs victims and checks that
    choose_victim is pure (same answer twice, the evictor's state unchanged)."""

    name = "forward"

    def __init__(self, evictor: Evictor, check_pure: bool = False):
        super().__init__(prefetch=False)
        self.evictor, self.check_pure, self.victims = evictor, check_pure, []
        self.oracle = bool(evictor.bound)  # belady reads the trace

    def bind(self, ctx):
        super().bind(ctx)
        self.evictor.bind(ctx)

    def on_layer_routed(self, routing, now_ms):
        base = routing.layer * self.ctx.num_experts
        self.evictor.on_access(routing.iteration, routing.layer,
                               [base + e for e in routing.experts], now_ms)

    def choose_victim(self, candidates, incoming, demand, now_ms):
        ev = self.evictor
        if not self.check_pure:
            return ev.choose_victim(candidates, incoming, demand, now_ms)
        before = _state(ev)
        first = ev.choose_victim(candidates, incoming, demand, now_ms)
        again = ev.choose_victim(candidates, incoming, demand, now_ms)
        assert first == again and _state(ev) == before, f"{ev.name}.choose_victim is not pure"
        return first

    def on_load(self, key, demand, now_ms):
        self.evictor.on_insert(key, demand, now_ms)

    def on_evict(self, key, now_ms):
        self.victims.append(key)
        self.evictor.on_evict(key, now_ms)

    def on_step_end(self, iteration, now_ms):
        self.evictor.on_step_end(iteration, now_ms)


def _state(ev) -> bytes:
    return pickle.dumps({k: v for k, v in vars(ev).items() if k != "ctx"})


def system_for(name: str, prefetcher: str = "none") -> System:
    """The composed system of conf/system/composed.yaml with this evictor and prefetcher."""
    from core.targets import build_target
    from harness.runner.config import compose_config

    cfg = compose_config(["system=composed", f"system/evictor={name}",
                          f"system/prefetcher={prefetcher}"])
    return build_target(cfg["system"], "system", System)


def run_engine(model, trace, system, slots: int):
    engine = Engine(model, FixedBackend(), trace, system, capacity_bytes=slots * model.expert_bytes)
    return engine.run().tables()


def hit_miss(tables) -> tuple[int, int]:
    cls = tables["accesses"]["class"]
    return int(np.sum(cls == HIT) + np.sum(cls == LATE)), int(np.sum(cls == MISS))


# ---- exact counts against REF -----------------------------------------------------------------
def synthetic(seed: int):
    from workloads.synthetic import SyntheticConfig, generate_trace

    model = tiny_model(layers=4, experts=8, top_k=2)
    return model, generate_trace(model, SyntheticConfig(num_requests=3, prompt_len=5,
                                                        output_len=6, seed=seed))


TRACES = {
    "synthetic-seed1": lambda: synthetic(1),
    "synthetic-seed7": lambda: synthetic(7),
    "uniform": lambda: (lambda m: (m, random_trace(m, 2, 3, 5, seed=3)))(
        tiny_model(layers=3, experts=6, top_k=2)),
}


@pytest.mark.parametrize("trace_name", sorted(TRACES))
@pytest.mark.parametrize("name", ALL)
def test_counts_equal_the_reference(name, trace_name):
    model, trace = TRACES[trace_name]()
    largest = max(len(keys) for _, _, keys in blocks_of(trace))
    total = model.num_moe_layers * model.num_experts
    seen = set()
    for slots in sorted({largest, largest + 1, largest + 3, (largest + total) // 2, total - 1}):
        want_hits, want_misses, _ = reference(name, trace, slots)
        got = hit_miss(run_engine(model, trace, system_for(name), slots))
        assert got == (want_hits, want_misses), f"{name} at {slots} slots on {trace_name}"
        seen.add(want_hits)
    if name == "evict_after_use":  # no reuse: the cache size does not matter once it fits
        assert len(seen) == 1, seen
    else:  # the sizes matter: a test whose sizes all give one count would prove little
        assert len(seen) > 1, f"{name} on {trace_name}: every size gave {seen}"


def test_reference_rules_differ():
    """REF's rules are not one rule under different names: on one trace and size, the zoo's
    victim sequences are pairwise different."""
    _, trace = synthetic(1)
    largest = max(len(keys) for _, _, keys in blocks_of(trace))
    seqs = {n: tuple(reference(n, trace, largest + 1)[2]) for n in REF}
    names = sorted(seqs)
    same = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if seqs[a] == seqs[b]]
    assert not same, same


# ---- hand-walked traces -------------------------------------------------------------------------
def hand_trace(steps, layers=2, experts=4, top_k=1):
    """One request; steps[s][layer] = the step's tokens' expert ids (prefill: several tokens)."""
    model = tiny_model(layers=layers, experts=experts, top_k=top_k)
    routing = [[[[e] for e in steps[s][layer]] for layer in range(layers)]
               for s in range(len(steps))]
    req = {"id": "a", "prompt_len": len(steps[0][0]), "output_len": len(steps),
           "arrival_ms": 0.0, "routing": routing}
    return model, trace_from_routing(meta_for(model), [req])


def walk(name, steps, slots, layers=2):
    model, trace = hand_trace(steps, layers=layers)
    system = Forward(evictor_class(name)(), check_pure=True)
    tables = run_engine(model, trace, system, slots)
    return system.victims, hit_miss(tables)


# Keys: layer * 4 + expert. Prefill (step 0) has 2 tokens; later steps 1 token per layer.
# Every walk below uses this trace unless it says otherwise:
#   step 0: L0 {0, 1} -> keys 0, 1;  L1 {2, 3} -> keys 6, 7
#   step 1: L0 {0}    -> key 0;      L1 {1}    -> key 5
#   step 2: L0 {2}    -> key 2;      L1 {2}    -> key 6
#   step 3: L0 {0}    -> key 0;      L1 {3}    -> key 7
STEPS = [[[0, 1], [2, 3]], [[0], [1]], [[2], [2]], [[0], [3]]]


def test_walk_fifo():
    # 4 slots. s0 fills 0, 1, 6, 7. s1: 0 hit; 5 evicts the first copy, 0 -> {1, 6, 7, 5}.
    # s2: 2 evicts 1 -> {6, 7, 5, 2}; 6 hit. s3: 0 evicts 6 (oldest); 7 hit.
    assert walk("fifo", STEPS, 4) == ([0, 1, 6], (3, 7))


@pytest.mark.parametrize("name", ["lfu", "lfu_perfect"])
def test_walk_lfu(name):
    # 4 slots; touches in event order. s0: 0, 1, 6, 7 land (count 1 each; touched in that
    # order). s1: 0 hits (count 2); 5 misses: count-1 residents 1, 6, 7: 1 was touched first
    # and goes -> {0, 6, 7, 5}. s2: 2 misses: count-1 residents 6, 7 (s0), 5 (s1): 6 goes.
    # 6 misses (count 1 in-cache, reset by its eviction; 2 for lfu_perfect): count-1
    # residents 7 (s0), 5 (s1), 2 (s2): 7 goes. s3: 0 hits (count 3); 7 misses: count 1:
    # 5 (s1), 2 (s2), 6 (s2, later): 5 goes. Both rules agree on this trace.
    assert walk(name, STEPS, 4) == ([1, 6, 7, 5], (2, 8))


def test_walk_lfu_counts_reset_on_eviction():
    # One layer, 2 slots, one token per step: keys A=0, B=1, C=2 in the order
    # A B A B C A C. s0, s1: A, B land (count 1 each). s2, s3: hits (2 each).
    # s4: C (1) evicts A (count 2 like B, touched first; A's count resets to 0). s5: A is back
    # with count 1: victims B (2) or C (1): C goes (reset). s6: C (count 1) evicts A (1,
    # touched at s5) rather than B (2): A lost its history. (lfu_perfect evicts B here.)
    steps = [[[e]] for e in (0, 1, 0, 1, 2, 0, 2)]
    assert walk("lfu", steps, 2, layers=1) == ([0, 2, 0], (2, 5))


def test_walk_lfu_perfect_counts_survive_eviction():
    # The same order A B A B C A C, 2 slots. s4: C (1) evicts A (count 2 like B, touched
    # first). s5: A is back with count 3: victims B (2) or C (1): C goes. s6: C (count 2)
    # evicts B (2, touched at s3), not A: A keeps its history (3). lfu (in-cache) evicts A.
    steps = [[[e]] for e in (0, 1, 0, 1, 2, 0, 2)]
    assert walk("lfu_perfect", steps, 2, layers=1) == ([0, 2, 1], (2, 5))


def test_walk_lfru():
    # 4 slots; the clock ticks per hit and per landing; score freq / (clock - last + 1).
    # s0: 0 @1, 1 @2, 6 @3, 7 @4 (freq 1). s1: 0 hits @5 (freq 2); 5 misses at clock 5:
    # 1: 1/4, 6: 1/3, 7: 1/2, 0: 2/1 -> 1 goes; 5 lands @6. s2: 2 misses at 6: 0: 2/2,
    # 6: 1/4, 7: 1/3, 5: 1/1 -> 6 goes; 2 lands @7. 6 misses at 7: 0: 2/3, 7: 1/4, 5: 1/2,
    # 2: 1/1 -> 7 goes; 6 lands @8. s3: 0 hits @9 (freq 3); 7 misses at 9: 5: 1/4, 2: 1/3,
    # 6: 1/2, 0: 3/1 -> 5 goes.
    assert walk("lfru", STEPS, 4) == ([1, 6, 7, 5], (2, 8))


def test_walk_lfru_frequency_beats_recency():
    # One layer, 2 slots, keys A=0, B=1, C=2 in the order A A A B C. The clock ticks per
    # hit and landing: A lands @1 (freq 1), hits @2, @3 (freq 3); B lands @4 (freq 1).
    # s4: C misses at clock 4: A scores 3 / (4 - 3 + 1) = 3/2, B 1 / (4 - 4 + 1) = 1: B goes,
    # although A is the least recent (LRU would evict A).
    steps = [[[e]] for e in (0, 0, 0, 1, 2)]
    assert walk("lfru", steps, 2, layers=1) == ([1], (2, 3))
    if "lru" in ALL:
        assert walk("lru", steps, 2, layers=1)[0] == [0]


def test_walk_least_stale():
    # 4 slots. s0 (pass 0) touches 0, 1 (L0) then 6, 7: fresh [0, 1, 6, 7]; at its end all
    # stale in that order. s1: 0 hit -> fresh [0]; 5 misses: first stale is 1 -> evicted.
    # End of s1: stale [6, 7, 0, 5]. s2: 2 misses: 6 is first stale -> evicted (LRU would
    # also pick 6 here); L1 6 misses: stale [7, 0, 5] -> 7 goes. End: stale [0, 5, 2, 6].
    # s3: 0 hits -> fresh; 7 misses: first stale 5 goes.
    assert walk("least_stale", STEPS, 4) == ([1, 6, 7, 5], (2, 8))


def test_walk_least_stale_fresh_tier_last():
    # 3 layers (keys layer * 4 + expert), top-1, expert 0 everywhere, 2 slots: a pass needs
    # more experts than the cache holds. s0: 0, 4 land (fresh [0, 4]); 8 misses, no stale
    # key: the first fresh, 0, goes. End: stale [4, 8]. s1: 0 evicts 4 (first stale), 4
    # evicts 8, and 8 finds stale empty again (fresh [0, 4]): 0 goes.
    steps = [[[0], [0], [0]], [[0], [0], [0]]]
    assert walk("least_stale", steps, 2, layers=3) == ([0, 4, 8, 0], (0, 6))


def test_walk_lifo_inactive():
    # 4 slots. s0 lands 0, 1, 6, 7. s1 (its active set starts empty): 0 hits (active {0});
    # 5 misses: inactive 1, 6, 7: the last landed, 7, goes (LIFO); 5 lands.
    # s2: 2 misses (active {2}): inactive 0, 1, 6, 5: the last landed, 5, goes. 6 hits.
    # s3: 0 hits; 7 misses (active {0, 7}): inactive 1, 6, 2: the last landed, 2, goes.
    assert walk("lifo_inactive", STEPS, 4) == ([7, 5, 2], (3, 7))


def test_walk_lifo_inactive_prefers_inactive():
    # 3 slots, layers 0/1. s0: 0 (L0), 4 (L1) land. s1: L0 {1}: key 1 lands in the free slot;
    # L1 {1}: key 5 misses, full: active in this pass {1}, inactive {0, 4}: the last landed
    # inactive is 4 (not 1, the last landed overall, which this pass already used).
    steps = [[[0], [0]], [[1], [1]]]
    assert walk("lifo_inactive", steps, 3) == ([4], (0, 4))


def test_walk_evict_after_use():
    # 6 slots (2 free after s0): victims are named even with free slots. s0 L0: 0, 1 land
    # (nothing evictable); L1: 6 evicts 0 (used, first landed), 7 evicts 1 -> {6, 7}.
    # s1: 0 evicts 6, 5 evicts 7. s2: 2 evicts 0, 6 evicts 5. s3: 0 evicts 2, 7 evicts 6.
    # Every access misses: no reuse across steps, although the cache never fills.
    assert walk("evict_after_use", STEPS, 6) == ([0, 1, 6, 7, 0, 5, 2, 6], (0, 10))


def test_walk_evict_after_use_keeps_the_step():
    # 4 slots. s0 L0 {0, 1, 2}: keys 0, 1, 2 land (nothing evictable: all in this step).
    # L1 {0} = key 4 evicts the first landed used key, 0 -> {1, 2, 4}. s1 L0 {1}: a hit
    # (1 survived: fewer copies than the largest step were made since it ran). L1 {1} =
    # key 5: the step is {5}; used: 1, 2, 4; the first landed, 1, goes.
    steps = [[[0, 1, 2], [0, 0, 0]], [[1], [1]]]
    assert walk("evict_after_use", steps, 4) == ([0, 1], (1, 5))


@pytest.mark.parametrize("name", MINE)
def test_walks_match_the_reference(name):
    """The hand walks' victim sequences are also REF's (both written from the rule)."""
    model, trace = hand_trace(STEPS)
    _, _, want = reference(name, trace, 4 if name != "evict_after_use" else 6)
    assert walk(name, STEPS, 4 if name != "evict_after_use" else 6)[0] == want


def test_not_full_uses_a_free_slot():
    # Every evictor but evict_after_use waits for a full cache: 8 slots hold the whole trace.
    for name in [n for n in ALL if n != "evict_after_use"]:
        victims, (hits, misses) = walk(name, STEPS, 8)
        assert victims == [] and misses == 6, name


# ---- configuration ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_config_file_builds_the_class(name):
    import yaml

    from core.targets import build_target

    path = PROJECT_ROOT / "conf" / "system" / "evictor" / f"{name}.yaml"
    assert path.is_file(), f"{path} is missing"
    node = yaml.safe_load(path.read_text())
    ev = build_target(node, "evictor", Evictor)
    assert type(ev) is evictor_class(name)


@pytest.mark.parametrize("name", MINE)
def test_zoo_files_are_small(name):
    assert len(Path(EVICTOR_DIR / f"{name}.py").read_text().splitlines()) <= 150


# ---- every evictor x every prefetcher -----------------------------------------------------------
def prefetchers() -> list[str]:
    folder = PROJECT_ROOT / "conf" / "system" / "prefetcher"
    return sorted(p.stem for p in folder.glob("*.yaml"))


def test_every_pair_runs():
    assert prefetchers(), "conf/system/prefetcher/ lists no prefetcher"
    from workloads.synthetic import SyntheticConfig, generate_trace

    model, trace = synthetic(1)
    calib = generate_trace(model, SyntheticConfig(num_requests=3, prompt_len=5, output_len=6,
                                                  seed=1, split="calibration"))
    largest = max(len(keys) for _, _, keys in blocks_of(trace))
    n_access = sum(len(keys) for _, _, keys in blocks_of(trace))
    evictors = sorted(p.stem for p in (PROJECT_ROOT / "conf" / "system" / "evictor").glob(
        "*.yaml"))
    assert set(MINE) <= set(evictors)
    for e in evictors:
        for p in prefetchers():
            system = system_for(e, p)
            engine = Engine(model, FixedBackend(), trace, system,
                            capacity_bytes=(largest + 2) * model.expert_bytes)
            if system.needs_calibration():
                system.warmup(calib)
            hits, misses = hit_miss(engine.run().tables())
            assert hits + misses == n_access, (e, p)


class _AnyFull:
    """A full cache in which every key is evictable (choose_victim's candidates)."""

    full = True

    def __contains__(self, key):
        return True

    def first_of(self, order):
        return next(iter(order))


@pytest.mark.parametrize("name, victim", [("lfu", 1), ("lfu_perfect", 2)])
def test_lfu_prefetched_copy_count(name, victim):
    # One layer of 4 experts. Key 1 is accessed and loaded (count 1), then key 2 lands as a
    # prefetch. lfu: the prefetch counts 1 like libCacheSim's insert and was touched later, so
    # 1 goes. lfu_perfect: a never-accessed key has count 0 and goes first.
    from types import SimpleNamespace

    ev = evictor_class(name)()
    ev.bind(SimpleNamespace(num_layers=1, num_experts=4, trace=None))
    ev.on_access(None, 0, [1], 0.0)
    ev.on_insert(1, True, 0.0)
    ev.on_insert(2, False, 0.0)
    assert ev.choose_victim(_AnyFull(), 3, True, 0.0) == victim
