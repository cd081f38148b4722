"""Belady's MIN, the rule of the oracle family (system.py, belady.py, bypass.py), in plain
python: with `capacity` slots, a miss evicts the resident whose next use is farthest away
(never used again counts as farthest; ties: the lowest key). The oracle's plan is this rule
over the run's access sequence (core/access.py); the compiled plan (kernels/plan.pyx) is
tested against it (tests/systems/test_belady_fast.py)."""

from __future__ import annotations

import heapq


def belady_plan(keys: list[int], next_use: list[int], capacity: int):
    """MIN with `capacity` slots over `keys` (next_use: core.access.AccessSequence.next_use).
    Returns (preload keys, [(pos, key, victim, victim_last_pos)]); ties between keys never used
    again: the lowest key leaves first."""
    n, width = len(keys), max(keys, default=0) + 1
    # One int per heap entry, ordered as (-next use, key): (n - next use) * width + key, a
    # never-used-again key counting as next use n. Lazily invalidated: an entry is current
    # while it equals the key's code in `resident`.
    resident: dict[int, int] = {}  # key -> its current code
    last: dict[int, int] = {}  # key -> its last position so far
    heap: list[int] = []
    preload, plan = [], []
    push, pop = heapq.heappush, heapq.heappop
    for p, key in enumerate(keys):
        if key not in resident:
            if len(resident) < capacity:
                preload.append(key)
            else:
                while True:
                    code = pop(heap)
                    victim = code % width
                    if resident.get(victim) == code:
                        break
                del resident[victim]
                plan.append((p, key, victim, last[victim]))
        nu = next_use[p]
        code = (n - (nu if nu < n else n)) * width + key
        resident[key] = code
        last[key] = p
        push(heap, code)
    return preload, plan
