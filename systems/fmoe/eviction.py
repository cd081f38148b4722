"""fMoE's eviction scores (systems/fmoe/system.py): per key, the latest predicted probability p, the
access count freq, the last use and the protection penalty, and the victim order over
(p * freq + penalty where resident, else inf; last use; key) (systems/fmoe/victim_order.py).

Per-key state is python lists: the hooks touch a few keys at a time (a layer's routed
experts, a prediction's keys, a load), where a list index costs a fraction of a numpy
scalar access, and a prediction's block of E keys is a list slice. Python floats are IEEE
doubles, so p * freq + penalty has the bits numpy's float64 arrays gave. Changes are
recorded and the victim order is edited once, when a victim is next asked for (`flush`);
numpy arrays are built only to rebuild the order (rare). Where built (kernels/fast.pyx), the
per-key loops (a use, a protection, the flush's edit, the order's update) run compiled over
these same lists, with the same double operations.
"""

from __future__ import annotations

import math

import numpy as np

from systems.fmoe.victim_order import VictimOrder

# Added to the p * freq (<= 1 * iterations) of protected keys: a prefetch never evicts them,
# a demand fetch only as a last resort.
PROTECTED_TIER = 1e12


class EvictionScores:
    def __init__(self, num_layers: int, num_experts: int, fast=None):
        n, self.E = num_layers * num_experts, num_experts
        self.p = [1.0 / num_experts] * n  # latest predicted probability; 1/E before any
        self.freq = [0.0] * n  # accesses since the run began
        self.last_use = [0] * n  # the clock (MoE layer visits) at each key's last access
        self.resident = [False] * n
        self.penalty = [0.0] * n  # PROTECTED_TIER on protected keys
        self.protect_cnt = [0] * n  # usable predictions naming each key (batch > 1)
        self.visits = [0] * num_layers  # iterations that ran each layer
        self.victims = VictimOrder()  # the lowest of (score, last_use, key)
        # Changed since the last flush: keys whose entry only rose (a use, a protection),
        # keys changed either way, layers whose p changed.
        self.raised: set[int] = set()
        self.moved: set[int] = set()
        self.layers: set[int] = set()
        # The compiled loops (fast: kernels/fast.pyx), over these same lists; None: python.
        self.kernel = None if fast is None else fast.ScoreKernel(self)
        self.victims.fast = fast

    def vscore(self) -> np.ndarray:
        """p * freq where resident, else inf [L*E]."""
        return np.where(self.resident, np.array(self.p) * np.array(self.freq), np.inf)

    # ---- changes -------------------------------------------------------------------------
    def route(self, layer: int, experts: list[int], clock: int) -> None:
        """The layer ran the (distinct) experts at `clock`: a use each (entries rise)."""
        if self.kernel is not None:
            self.kernel.route(layer, experts, clock, self.raised)
            return
        lo, freq, last_use = layer * self.E, self.freq, self.last_use
        for e in experts:
            freq[lo + e] += 1.0
            last_use[lo + e] = clock
            self.raised.add(lo + e)
        self.visits[layer] += 1

    def set_p(self, layer: int, rows: list[list[float]], first: bool) -> None:
        """The layer's p [E]: the max of its rows, and of its current p unless `first`
        (numpy's maximum, which takes the second operand on ties; many rows: numpy's)."""
        if self.kernel is not None:
            self.kernel.set_p(layer, rows, first)
            self.layers.add(layer)
            return
        lo = layer * self.E
        rows = rows if first else [self.p[lo:lo + self.E], *rows]
        if len(rows) > 2:
            block = np.maximum.reduce(np.array(rows), axis=0).tolist()
        else:
            block = rows[0]
            for row in rows[1:]:
                block = [a if a > b else b for a, b in zip(block, row)]
        self.p[lo:lo + self.E] = block
        self.layers.add(layer)

    def protect(self, dropped: list[int], added: list[int], counted: bool) -> None:
        """Keys of predictions no longer usable lose protection, those of new ones gain it;
        `counted` (several requests): a key stays protected while any prediction names it."""
        if self.kernel is not None:
            self.kernel.protect(dropped, added, counted, PROTECTED_TIER, self.raised,
                                self.moved)
            return
        if counted:
            for k in dropped:
                self.protect_cnt[k] -= 1
            for k in added:
                self.protect_cnt[k] += 1
            for k in dropped + added:
                self._set_penalty(k, PROTECTED_TIER if self.protect_cnt[k] > 0 else 0.0)
            return
        for k in dropped:
            self._set_penalty(k, 0.0)
        for k in added:
            self._set_penalty(k, PROTECTED_TIER)

    def _set_penalty(self, key: int, value: float) -> None:
        old = self.penalty[key]
        if value != old:
            self.penalty[key] = value
            (self.raised if value > old else self.moved).add(key)

    def changed(self, keys) -> None:
        """`keys` changed p, freq or last use by other means (tests)."""
        self.moved.update(int(k) for k in keys)

    def load(self, key: int) -> None:
        self.resident[key] = True
        self.victims.update(key, self.p[key] * self.freq[key] + self.penalty[key],
                            self.last_use[key])

    def evict(self, key: int) -> None:
        self.resident[key] = False
        self.victims.update(key, math.inf, self.last_use[key])

    # ---- the order -----------------------------------------------------------------------
    def victim(self, candidates, demand: bool) -> int | None:
        """The first key of the order that `candidates` holds; None when the order reaches a
        non-resident key, a protected one for a prefetch (not `demand`), or its end."""
        if self.raised or self.moved or self.layers:  # order(), inline: asked very often
            self.flush()
        entries = self.victims.entries or self.victims.get(self._arrays)
        while True:
            if self.kernel is not None:
                k = self.victims.fast.first_victim(entries, candidates, demand, PROTECTED_TIER)
                if k != -2:
                    return None if k == -1 else k
            else:
                for low, _, k in entries:
                    if low == math.inf or (not demand and low >= PROTECTED_TIER):
                        return None
                    if k in candidates:
                        return k
            entries = self.order(deeper=True)  # every key of the kept prefix is busy
            if entries is None:
                return None  # every key busy
    def order(self, deeper: bool = False):
        """The victim order's kept prefix [(score, last_use, key)], edited for the changes;
        `deeper`: a longer one (None when the kept one holds every key)."""
        if self.raised or self.moved or self.layers:
            self.flush()
        if deeper:
            return self.victims.deepen(self._arrays)
        return self.victims.entries or self.victims.get(self._arrays)

    def _arrays(self):
        """(score [L*E], last_use [L*E]) as numpy arrays, for a rebuild."""
        return self.vscore() + np.array(self.penalty), np.array(self.last_use, np.int64)

    def flush(self) -> None:
        """Edit the victim order for the recorded changes: a changed key leaves the prefix
        and re-enters if it ranks before the last kept entry; a raised key outside the
        prefix stays outside (it only moved back), so only those inside are looked at.
        The scores are computed inline (a layer's block in one pass over list slices)."""
        raised, moved, layers = self.raised, self.moved, self.layers
        if not (raised or moved or layers):
            return
        self.raised, self.moved, self.layers = set(), set(), set()
        entries, E = self.victims.entries, self.E
        if entries is None:
            return
        if self.kernel is not None:
            self.victims.entries = self.kernel.flush(entries, raised, moved, layers,
                                                     self.victims.keep)
            return
        gone = moved.union(*(range(layer * E, (layer + 1) * E) for layer in layers))
        kept, back = [], []
        for e in entries:
            if e[2] in gone:
                continue
            if e[2] in raised:
                back.append(e[2])
            else:
                kept.append(e)
        if not kept:
            self.victims.entries = None
            return
        thr = kept[-1][0]  # only entries scored at most this can rank before the last kept
        p, freq, resident, penalty, last_use = (self.p, self.freq, self.resident, self.penalty,
                                                self.last_use)
        new = []
        for k in back + [k for k in moved if k // E not in layers]:
            s = (p[k] * freq[k] if resident[k] else math.inf) + penalty[k]
            if s <= thr:
                new.append((s, last_use[k], k))
        for layer in layers:
            lo, hi = layer * E, (layer + 1) * E
            for k, pk, fk, rk, ek in zip(range(lo, hi), p[lo:hi], freq[lo:hi],
                                         resident[lo:hi], penalty[lo:hi]):
                s = pk * fk + ek if rk else math.inf
                if s <= thr:
                    new.append((s, last_use[k], k))
        self.victims.reenter(kept, new)
