"""The oracle's compiled MIN plan (systems/oracle/kernels/plan.pyx) against the python rule
(systems/oracle/rule.py `belady_plan`) and the brute-force optimum, and the batched access
sequence (core/access.py, vectorised) against a python walk of the static schedule."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import optimal_loads, random_trace, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from core.access import AccessSequence, access_sequence
from core.schedule import static_schedule
from systems.oracle.kernels import load_kernels
from systems.oracle.system import belady_plan_columns

PLAN = load_kernels()  # the compiled plan; None: not built
needs_fast = pytest.mark.skipif(PLAN is None,
                                reason="systems/oracle/kernels not built (no C compiler)")


def _sequence(keys: list[int]) -> AccessSequence:
    n = len(keys)  # one block per access, one iteration per block
    return AccessSequence(np.array(keys, np.int64), np.arange(n), np.arange(n),
                          np.zeros(n, np.int64), ["decode"] * n)


def _both(keys: list[int], capacity: int):
    seq = _sequence(keys)
    fast = belady_plan_columns(seq.keys_array, seq.next_use_array, capacity, PLAN)
    ref = belady_plan_columns(seq.keys_array, seq.next_use_array, capacity)
    return fast, ref


def _equal(a, b) -> bool:
    return a[:3] == b[:3] and np.array_equal(a[3], b[3])


@needs_fast
@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.integers(0, 40), max_size=400), capacity=st.integers(1, 45))
def test_compiled_plan_is_the_reference_plan(keys, capacity):
    fast, ref = _both(keys, capacity)
    assert _equal(fast, ref)


@needs_fast
def test_compiled_plan_survives_heap_rebuilds():
    # 200,000 accesses over 300 keys at 7 slots: the heap (2 * 7 + 64 entries) is rebuilt
    # thousands of times; the plan must still be the reference's.
    keys = np.random.default_rng(5).zipf(1.3, 200_000) % 300
    fast, ref = _both(keys.tolist(), 7)
    assert len(fast[1]) > 50_000 and _equal(fast, ref)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("slots", [1, 2, 3, 4])
def test_plan_loads_are_the_brute_force_optimum(fast, slots):
    keys = [0, 5, 1, 5, 0, 6, 2, 7, 1, 5, 0, 6, 3, 5, 0, 4, 2, 2, 7, 0]
    seq = _sequence(keys)
    pre, load, victim, _ = belady_plan_columns(seq.keys_array, seq.next_use_array, slots,
                                               PLAN if fast else None)
    assert len(pre) + len(load) == optimal_loads(keys, slots)
    assert len(pre) == slots and all(v not in load[i:i + 1] for i, v in enumerate(victim))


def test_capacity_below_one_slot_is_an_error():
    seq = _sequence([1, 2])
    if PLAN is not None:
        with pytest.raises(ValueError, match="capacity"):
            belady_plan_columns(seq.keys_array, seq.next_use_array, 0, PLAN)


@pytest.mark.parametrize("max_batch", [2, 3, 8])
def test_batched_sequence_is_the_schedule_walk(max_batch):
    # Every request at t = 0: each iteration serves the union of its members' experts per
    # layer, layers ascending, ids ascending (docs/metrics.md, the engine's access set).
    model = tiny_model(layers=3, experts=6, top_k=2)
    trace = random_trace(model, 5, 3, 4, seed=11)
    want_keys, want_blocks = [], []
    for it, (_, members) in enumerate(static_schedule(trace.arrival_ms, trace.output_len,
                                                      max_batch)):
        for layer in range(trace.num_layers):
            ids = sorted({int(e) for r, s in members
                          for e in trace.block_rows(r, s, layer).ravel()})
            if ids:
                want_blocks.append((len(want_keys), it, layer))
                want_keys.extend(layer * trace.num_experts + e for e in ids)
    seq = access_sequence(trace, max_batch)
    assert seq.keys == want_keys
    assert list(zip(seq.block_starts, seq.block_iteration.tolist(),
                    seq.block_layer.tolist())) == want_blocks
    nxt = [next((q for q in range(p + 1, len(want_keys)) if want_keys[q] == k), None)
           for p, k in enumerate(want_keys)]
    assert [None if v >= len(want_keys) else v for v in seq.next_use] == nxt
