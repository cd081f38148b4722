"""fMoE's eviction order kept between score changes (systems/fmoe/system.py, eviction.py).

choose_victim takes the resident key lowest in (score, last use, key) that the engine lets it
evict, skipping the others. Rebuilding that order from the [L*E] scores costs a few numpy
passes; the engine asks several questions per MoE layer, and scores change by a few keys (a
layer's routed experts, a load, an eviction, a protection) or one layer's block (a new
prediction's probabilities). VictimOrder holds the exact lowest entries of the order (a
prefix: every key outside it ranks after all of it), built once and edited on each change:

- a changed key leaves the prefix; the rest is still the exact lowest of the unchanged keys;
- it re-enters iff its new entry ranks before the last kept one (else it ranks after all).

So edits only shrink the prefix (and cut it back to KEEP entries); it is rebuilt when empty,
or deeper when every key in it was busy. `update` runs compiled when its owner sets `fast`
(kernels/): the same edit.
"""

from __future__ import annotations

import bisect

import numpy as np

DEPTH = 32  # entries built first; deepen() builds 4x as many when all of them were busy
KEEP = 48  # edits cut a longer prefix back to this (each edit scans the kept entries), unless
# it was deepened: a cache whose lowest keys are mostly busy needs the longer one each time
_SORT_IN_PYTHON = 64  # at most this many candidates: python's sort, else lexsort


class VictimOrder:
    """The prefix [(score, last_use, key), ...] ascending of a score vector's order, or None
    (rebuild). Scores are python floats equal to the array's, so comparisons match numpy's.
    `arrays`: a callable giving (score [n], last_use [n]) numpy arrays, for a rebuild."""

    def __init__(self):
        self.entries: list[tuple[float, int, int]] | None = None
        self.keep = KEEP  # edits cut the prefix back to this; a deepened one keeps its length
        self.fast = None  # kernels/fast.pyx when the owner runs compiled: update() there

    def invalidate(self) -> None:
        self.entries = None

    def get(self, arrays):
        """The prefix, built if invalid."""
        if self.entries is None:
            self.entries, self.keep = lowest_entries(*arrays(), DEPTH), KEEP
        return self.entries

    def deepen(self, arrays):
        """A longer prefix (4x the kept one), for when every key of it was busy; None if the
        kept one already holds every key."""
        score, last_use = arrays()
        if self.entries is not None and len(self.entries) >= len(score):
            return None
        depth = 4 * max(len(self.entries or ()), DEPTH)
        self.entries = lowest_entries(score, last_use, depth)
        self.keep = max(KEEP, len(self.entries))
        return self.entries

    def update(self, key: int, score: float, last_use: int) -> None:
        """`key`'s entry changed to (score, last_use) (a load, or inf for an eviction)."""
        entries = self.entries
        if entries is None:
            return
        if self.fast is not None:
            if not self.fast.order_update(entries, key, score, last_use, self.keep):
                self.entries = None
            return
        for i, e in enumerate(entries):
            if e[2] == key:
                del entries[i]
                break
        if self._ends(entries):
            return
        new = (score, last_use, key)
        if new < entries[-1]:  # inside the prefix; otherwise every key in it ranks first
            bisect.insort(entries, new)
            del entries[self.keep:]

    def reenter(self, kept: list, new: list) -> None:
        """The prefix is now `kept` (the old one less every changed key, not empty); each
        changed key's new entry of `new` re-enters iff it ranks before the last kept one."""
        self.entries, last = kept, kept[-1]
        for e in new:
            if e < last:
                bisect.insort(kept, e)
        del kept[self.keep:]  # a shorter prefix is still exact

    def _ends(self, entries: list) -> bool:
        """True (and the prefix dropped) when it is empty. (Entries of inf, non-resident,
        keys are edited like the others: their last uses are reported too.)"""
        if not entries:
            self.entries = None
            return True
        return False


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
