"""The zoo's names mean what the caching literature means: one key stream replayed through the
zoo's lru, fifo, lfu and belady (the real engine, one key per MoE layer step) and through
libCacheSim's LRU, FIFO, LFU and Belady (the `libcachesim` package, pyproject's `test` extra)
gives the same miss counts, pinned below as MISSES.

Stream: one layer of K experts, one request of N steps, one token each routed to one expert
(top-1): every layer step accesses one key, so the step-atomic rule (no key of the running
layer step is evicted) never bites and the engine is a plain demand-fetch cache of `slots`
objects of size 1. Keys are Zipf-ish (seeded). The one documented difference, a step with
several keys, is the hand-made case at the end.

libCacheSim's LFU is in-cache (an evicted object's count starts again) with ties going to the
least recently touched object of the lowest count: the zoo's `lfu` has both (its docstring);
`lfu_perfect` (counts kept across evictions) is shown to differ.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FixedBackend, meta_for, tiny_model
from test_evictor_zoo import Forward, evictor_class, hand_trace, hit_miss

from core.trace import trace_from_routing
from harness.sim.engine import Engine

K, N, SEED = 48, 3000, 29  # experts (keys), requests (steps), the stream's seed
SIZES = (4, 8, 16, 32)  # cache sizes in objects (expert slots)
POLICIES = {"lru": "LRU", "fifo": "FIFO", "lfu": "LFU", "belady": "Belady"}  # zoo -> libCacheSim
# libCacheSim 0.3.5's misses on the stream (test_libcachesim_gives_the_pinned_counts checks
# them against the package; test_zoo_gives_the_pinned_counts the zoo against them)
MISSES = {
    "lru": {4: 2362, 8: 1862, 16: 1232, 32: 467},
    "fifo": {4: 2413, 8: 1973, 16: 1390, 32: 582},
    "lfu": {4: 1992, 8: 1430, 16: 980, 32: 422},
    "belady": {4: 1683, 8: 1147, 16: 637, 32: 206},
}
# lfu_perfect on the same stream: 1887, 1417, 906, 397 (fewer: a returning key keeps its count)


def stream(seed: int = SEED, n: int = N, keys: int = K, a: float = 0.9) -> list[int]:
    """n keys in 0..keys-1, key of popularity rank r drawn with weight 1 / r^a (ranks shuffled)."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, keys + 1) ** a
    perm = rng.permutation(keys)
    return perm[rng.choice(keys, size=n, p=w / w.sum())].tolist()


def zoo_counts(name: str, keys: list[int], slots: int, experts: int = K) -> tuple[int, int]:
    """(hits, misses) of the zoo's evictor `name` on the engine, one key per layer step."""
    model, trace = hand_trace([[[k]] for k in keys], layers=1, experts=experts)
    system = Forward(evictor_class(name)())
    engine = Engine(model, FixedBackend(), trace, system,
                    capacity_bytes=slots * model.expert_bytes)
    return hit_miss(engine.run().tables())


def lcs_counts(lcs, policy: str, keys: list[int], slots: int) -> tuple[int, int]:
    """(hits, misses) of libCacheSim's `policy` on the flat key sequence (object size 1).
    Belady reads each request's next access time (request index; INT64_MAX: never)."""
    cache = getattr(lcs, policy)(slots)
    nxt, last = [0] * len(keys), {}
    for i in range(len(keys) - 1, -1, -1):
        nxt[i] = last.get(keys[i], np.iinfo(np.int64).max)
        last[keys[i]] = i
    hits = 0
    for i, k in enumerate(keys):
        # obj_id k + 1: ids start at 1 (0 is the request type's default id)
        req = lcs.Request(obj_size=1, obj_id=k + 1, clock_time=i,
                          next_access_vtime=nxt[i] if policy == "Belady" else -2)
        hits += bool(cache.get(req))
    return hits, len(keys) - hits


@pytest.fixture(scope="module")
def keys() -> list[int]:
    return stream()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_zoo_gives_the_pinned_counts(name, keys):
    got = {slots: zoo_counts(name, keys, slots)[1] for slots in SIZES}
    assert got == MISSES[name]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_libcachesim_gives_the_pinned_counts(name, keys):
    lcs = pytest.importorskip("libcachesim", reason="libCacheSim's Python package (pyproject "
                              "extra `test`, installed by `make test`) is not installed")
    got = {slots: lcs_counts(lcs, POLICIES[name], keys, slots)[1] for slots in SIZES}
    assert got == MISSES[name]


def test_the_sizes_and_rules_differ(keys):
    """The comparison proves something: every size gives another count, Belady is the lowest,
    and lfu_perfect (counts kept across evictions) is not libCacheSim's LFU."""
    for name in POLICIES:
        assert len(set(MISSES[name].values())) == len(SIZES), name
    for slots in SIZES:
        assert MISSES["belady"][slots] < min(MISSES[n][slots] for n in POLICIES if n != "belady")
    perfect = {slots: zoo_counts("lfu_perfect", keys, slots)[1] for slots in SIZES}
    assert perfect != MISSES["lfu"]


# ---- the documented difference: the step-atomic rule ---------------------------------------
def two_requests():
    """One layer of 4 experts, top-1, batch 1. Request a: prefill {0}, decode {1}. Request b:
    a 2-token prefill {0, 2} (one layer step with two keys), decode {1}, decode {0}. Flat, in
    the engine's order (a step's keys ascending): 0 1 0 2 1 0."""
    model = tiny_model(layers=1, experts=4, top_k=1)
    reqs = [{"id": "a", "prompt_len": 1, "output_len": 2, "arrival_ms": 0.0,
             "routing": [[[[0]]], [[[1]]]]},
            {"id": "b", "prompt_len": 2, "output_len": 3, "arrival_ms": 0.0,
             "routing": [[[[0], [2]]], [[[1]]], [[[0]]]]}]
    return model, trace_from_routing(meta_for(model), reqs)


def test_step_atomic_rule_is_the_one_difference():
    # FIFO, 2 slots. libCacheSim on 0 1 0 2 1 0: 0 miss, 1 miss [0, 1]; 0 hit; 2 misses and
    # evicts the oldest, 0 -> [1, 2]; 1 hit; 0 misses, evicts 1: 4 misses, 2 hits.
    # The zoo: 0, 1 miss. Step {0, 2}: 0 hits; 2 misses, but 0 belongs to the running step
    # (step-atomic: not evictable), so 1 goes -> [0, 2]. Step {1}: misses, evicts 0 (oldest)
    # -> [2, 1]. Step {0}: misses, evicts 2: 5 misses, 1 hit.
    # LRU and LFU agree on this trace (the step's hit key is the most recent / most counted);
    # belady waits for 0 to run and then evicts it (systems/evictors/belady.py): MIN's 4.
    model, trace = two_requests()
    flat = [0, 1, 0, 2, 1, 0]
    want = {"fifo": (1, 5), "lru": (1, 5), "lfu": (2, 4), "belady": (2, 4)}
    for name, counts in want.items():
        system = Forward(evictor_class(name)())
        engine = Engine(model, FixedBackend(), trace, system,
                        capacity_bytes=2 * model.expert_bytes)
        assert hit_miss(engine.run().tables()) == counts, name
    lcs = pytest.importorskip("libcachesim", reason="libCacheSim's Python package is not "
                              "installed (pyproject extra `test`)")
    libcachesim = {name: lcs_counts(lcs, POLICIES[name], flat, 2) for name in want}
    assert libcachesim == {**want, "fifo": (2, 4)}  # FIFO: the one count that differs
