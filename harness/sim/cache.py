"""ExpertCache: mechanism only (byte budget, residency, in-flight copies, in-use keys). No policy.

An expert is identified by an int key = moe_layer * num_experts + expert_id, so ascending
keys order by (layer, expert id) and ties break by the lowest id. A copy reserves its slot
when it is issued; the slot holds the key until it is evicted. A key is *ready* once its
copy has finished (ready_ms <= now); before that it is *in flight* and cannot be evicted.
Keys the running layer still needs (`in_use`, owned by the engine) cannot be evicted either.
"""

from __future__ import annotations


class CacheError(RuntimeError):
    """A cache invariant was violated (a bug in the engine or a system)."""


class ExpertCache:
    def __init__(self, capacity_bytes: int, expert_bytes: int):
        if expert_bytes <= 0:
            raise CacheError(f"expert_bytes must be positive, got {expert_bytes}")
        self.expert_bytes = int(expert_bytes)
        self.capacity_bytes = int(capacity_bytes)
        self.capacity_slots = self.capacity_bytes // self.expert_bytes
        self.ready_ms: dict[int, float] = {}  # key -> time its copy finishes (resident/in flight)
        self.transfer_of: dict[int, int] = {}  # key -> id of the copy that brought it in
        self.in_use: set[int] = set()  # keys the running layer still needs (engine-owned)
        self.peak_slots = 0

    # ---- queries --------------------------------------------------------------------------
    def __contains__(self, key: int) -> bool:
        return key in self.ready_ms

    def __len__(self) -> int:
        return len(self.ready_ms)

    @property
    def used_bytes(self) -> int:
        return len(self.ready_ms) * self.expert_bytes

    @property
    def peak_bytes(self) -> int:
        return self.peak_slots * self.expert_bytes

    def is_full(self) -> bool:
        return len(self.ready_ms) >= self.capacity_slots

    def evictable(self, key: int, now_ms: float) -> bool:
        t = self.ready_ms.get(key)
        return t is not None and t <= now_ms and key not in self.in_use

    def candidates(self, now_ms: float) -> Candidates:
        """A view of the keys evictable at `now_ms` (the copy engine keeps one and sets its
        `now_ms` and `full` before each load, so a system must not keep it past the call it
        was given in)."""
        return Candidates(self, now_ms)

    # ---- mutations --------------------------------------------------------------------------
    def reserve(self, key: int, ready_ms: float, transfer_id: int) -> None:
        if key in self.ready_ms:
            raise CacheError(f"expert key {key} is already resident or in flight")
        if len(self.ready_ms) >= self.capacity_slots:
            raise CacheError(f"cache full ({self.capacity_slots} slots) reserving key {key}")
        self.ready_ms[key] = ready_ms
        self.transfer_of[key] = transfer_id
        if len(self.ready_ms) > self.peak_slots:
            self.peak_slots = len(self.ready_ms)

    def evict(self, key: int, now_ms: float) -> int:
        """Remove a ready key not in use; returns the id of the copy that had loaded it."""
        if not self.evictable(key, now_ms):
            state = ("absent" if key not in self.ready_ms else
                     "in use" if key in self.in_use else "in flight")
            raise CacheError(f"cannot evict expert key {key}: {state}")
        del self.ready_ms[key]
        return self.transfer_of.pop(key)

    def check_invariants(self) -> None:
        if len(self.ready_ms) > self.capacity_slots:
            raise CacheError("more keys than slots")
        if self.used_bytes > self.capacity_bytes:
            raise CacheError("used bytes exceed the budget")
        if set(self.ready_ms) != set(self.transfer_of):
            raise CacheError("residency and transfer maps disagree")
        stray = [k for k in self.in_use if k not in self.ready_ms]
        if stray:
            raise CacheError(f"in-use keys not resident: {stray[:5]}")


class Candidates:
    """The evictable keys at one instant: `key in c` tests, iteration is ascending by key.

    Systems receive this view in choose_victim; membership is O(1), iteration O(n log n),
    so a policy with its own order (e.g. LRU) should walk its order and test membership.
    """

    __slots__ = ("_cache", "now_ms", "full")

    def __init__(self, cache: ExpertCache, now_ms: float):
        self._cache = cache
        # The instant, and True when no slot is free (a load must name a victim). The copy
        # engine keeps one view and sets both before each load.
        self.now_ms = now_ms
        self.full = cache.is_full()

    def __contains__(self, key: int) -> bool:
        cache = self._cache
        t = cache.ready_ms.get(key)
        return t is not None and t <= self.now_ms and key not in cache.in_use

    def first_of(self, keys) -> int | None:
        """The first evictable key of `keys` (a policy's priority order), or None."""
        cache, now = self._cache, self.now_ms
        ready_ms, in_use = cache.ready_ms, cache.in_use
        for key in keys:
            # the set test first: a prefill layer's own keys are mostly in use
            if key not in in_use:
                t = ready_ms.get(key)
                if t is not None and t <= now:
                    return key
        return None

    def __iter__(self):
        cache, now = self._cache, self.now_ms
        return iter(sorted(k for k in cache.ready_ms if cache.evictable(k, now)))

    def __len__(self) -> int:
        return sum(1 for _ in self)
