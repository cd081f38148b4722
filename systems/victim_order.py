"""fMoE's eviction order kept between score changes (systems/fmoe.py).

choose_victim takes the resident key lowest in (score, last use, key) that the engine lets it
evict, skipping the others. Rebuilding that order from the [L*E] scores costs a few numpy
passes per question; the engine asks several questions between score changes, and in between
only single keys load or leave. VictimOrder holds the exact lowest few entries of the order
(a prefix: every key outside it ranks after all of it), built once after a change and edited
on each load and eviction.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

DEPTH = 16  # entries built first; deepen() builds 4x as many when all of them were busy
_SORT_IN_PYTHON = 64  # at most this many candidates: python's sort, else lexsort


class VictimOrder:
    """The prefix [(score, last_use, key), ...] ascending of a score vector's order, or None
    (rebuild). Scores are python floats equal to the array's, so comparisons match numpy's."""

    def __init__(self):
        self.entries: list[tuple[float, int, int]] | None = None

    def invalidate(self) -> None:
        self.entries = None

    def get(self, vscore: np.ndarray, penalty: np.ndarray, last_use: np.ndarray):
        """The prefix for score = vscore + penalty [L*E] and `last_use` [L*E], built if
        invalid."""
        if self.entries is None:
            self.entries = lowest_entries(vscore + penalty, last_use, DEPTH)
        return self.entries

    def deepen(self, vscore: np.ndarray, penalty: np.ndarray, last_use: np.ndarray):
        """A longer prefix (4x the kept one), for when every key of it was busy; None if the
        kept one already holds every key."""
        if self.entries is not None and len(self.entries) >= len(vscore):
            return None
        depth = 4 * max(len(self.entries or ()), DEPTH)
        self.entries = lowest_entries(vscore + penalty, last_use, depth)
        return self.entries

    def update(self, key: int, score: float, last_use: int) -> None:
        """`key`'s score changed to `score` (a load, or inf for an eviction)."""
        entries = self.entries
        if entries is None:
            return
        for i, e in enumerate(entries):
            if e[2] == key:
                del entries[i]
                break
        if not entries or entries[-1][0] == math.inf:
            self.entries = None  # the prefix may end among the unordered inf keys
            return
        new = (score, last_use, key)
        if new < entries[-1]:  # inside the prefix; otherwise every key in it ranks first
            bisect.insort(entries, new)


def lowest_entries(score: np.ndarray, last_use: np.ndarray, depth: int):
    """Exact lowest entries of the order (score, last_use, key): at least `depth` (or all),
    every key with a score <= the depth-th lowest score considered, then cut back."""
    n = len(score)
    if n > depth:
        kth = np.partition(score, depth - 1)[depth - 1]
        cand = np.flatnonzero(score <= kth)
    else:
        cand = np.arange(n)
    vals, uses = score[cand], last_use[cand]
    if len(cand) > _SORT_IN_PYTHON:
        order = np.lexsort((cand, uses, vals))[:max(depth, _SORT_IN_PYTHON)]
        cand, vals, uses = cand[order], vals[order], uses[order]
        return list(zip(vals.tolist(), uses.tolist(), cand.tolist()))
    return sorted(zip(vals.tolist(), uses.tolist(), cand.tolist()))
