"""belady_bypass: a bound, not a system. Belady's MIN victims plus Belady's admission: an
expert whose next use is later than every admitted resident's is not admitted; it runs from
a scratch slot. Demand fetches only; flagged `oracle: true`.

Memory accounting: the scratch slot is one of the cache's slots (the memory plan's budget,
nothing extra). Admitted residents get capacity - 1 slots; the bypassed expert stays in the
scratch slot (and serves hits) until the next bypass replaces it. An admitted expert evicts
an admitted resident, so the cache never holds more than its capacity and the engine needs
no change. Hence MIN(capacity) <= loads <= MIN(capacity - 1): the scratch slot is a slot MIN
could have used, and MIN at capacity - 1 is bypass that never bypasses. Both MINs are over the
access sequence's order (core/access.py: ascending ids within a step), which the victims read;
the engine serves a step's residents before its misses, and MIN over that served order can
be lower (tiny model, 5 experts, 2 layers, top-2, two 2-token requests, random_trace seed
7434, 7 slots: 12 loads = MIN(sequence, 6), MIN(served, 6) = 11).

Rules (key-level; `Bypass` wraps any evictor, analysis/gap.py uses it the same way):
  - admitted slots free: admit;
  - else bypass when next use(incoming) > next use of the farthest admitted resident (ties:
    admit); the scratch occupant, if any, is the victim (None while it still has to run);
  - else admit: the wrapped evictor names an admitted victim. When it answers None (its
    victim is pinned until it runs) and the scratch slot is free, the engine uses the free
    slot, so the expert runs from scratch (bypassed).
Needs capacity >= 2 and a timing-independent schedule.
"""

from __future__ import annotations

from dataclasses import replace

from systems.composed import Composed
from systems.evictors.base import Evictor
from systems.evictors.belady import BeladyEvictor
from systems.prefetchers.none import NoPrefetch


class _Admitted:
    """The engine's candidates seen by the wrapped evictor: admitted keys only, always full."""

    __slots__ = ("_c", "_keys")
    full = True

    def __init__(self, candidates, keys: set[int]):
        self._c, self._keys = candidates, keys

    def __contains__(self, key: int) -> bool:
        return key in self._keys and key in self._c

    def first_of(self, keys) -> int | None:
        for key in keys:
            if key in self:
                return key
        return None

    def __iter__(self):
        return (k for k in self._c if k in self._keys)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Bypass(Evictor):
    """Belady's admission around `victims` (an evictor over the admitted slots)."""

    name = "bypass"
    bound = True

    def __init__(self, victims: Evictor):
        self.victims = victims
        self.uses_fields = victims.uses_fields

    def bind(self, ctx):
        super().bind(ctx)
        if ctx.capacity_slots < 2:
            raise ValueError(f"bypass needs 2 slots (one admitted + the scratch slot); the "
                             f"cache holds {ctx.capacity_slots}")
        self.slots = ctx.capacity_slots - 1  # admitted residents; one slot is scratch
        inner = replace(ctx, capacity_slots=self.slots,
                        capacity_bytes=self.slots * ctx.expert_bytes)
        self.victims.bind(inner)
        v = self.victims
        plain = isinstance(v, BeladyEvictor) and v.lookahead_iterations is None
        self.future = self.victims if plain else BeladyEvictor()  # next uses of the admitted
        if not plain:
            self.future.bind(inner)
        self.admitted: set[int] = set()
        self.scratch: int | None = None

    def _parts(self):
        return (self.victims,) if self.future is self.victims else (self.victims, self.future)

    def on_access(self, iteration, layer, keys, now_ms):
        for part in self._parts():
            part.on_access(iteration, layer, keys, now_ms)

    def bypasses(self, incoming: int) -> bool:
        """Pure: is `incoming` later than every admitted resident (admitted slots full)?"""
        far = next(self.future.order(incoming), None)
        return far is None or self.future.next_use(incoming) > far[1]

    def choose_victim(self, candidates, incoming, demand, now_ms):
        if len(self.admitted) < self.slots:
            return None  # a free slot (admitted + scratch < capacity)
        if self.bypasses(incoming):
            s = self.scratch
            return s if s is not None and s in candidates else None
        return self.victims.choose_victim(_Admitted(candidates, self.admitted), incoming,
                                          demand, now_ms)

    def on_insert(self, key, demand, now_ms):
        if len(self.admitted) < self.slots:
            self.admitted.add(key)
            for part in self._parts():
                part.on_insert(key, demand, now_ms)
        else:
            self.scratch = key

    def on_evict(self, key, now_ms):
        if key == self.scratch:
            self.scratch = None
            return
        self.admitted.discard(key)
        for part in self._parts():
            part.on_evict(key, now_ms)

    def on_step_end(self, iteration, now_ms):
        for part in self._parts():
            part.on_step_end(iteration, now_ms)

    def describe(self):
        return {"name": self.name, "victims": self.victims.describe()}


class BeladyBypass(Composed):
    name = "belady_bypass"
    label = "Belady MIN victims + bypass from a scratch slot, demand only (bound)"

    def __init__(self, prefetch: bool = True):  # prefetch: accepted, nothing to prefetch
        super().__init__(evictor=Bypass(BeladyEvictor()), prefetcher=NoPrefetch(),
                         prefetch=prefetch)
