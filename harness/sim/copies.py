"""The copy engine: one host-to-device link, the prefetch queue, loads and preloads.

Demand fetches go ahead of queued prefetches; an in-flight copy is never preempted; a copy
reserves its slot when it is issued (docs/engine.md). Before every load the system names a
victim (`choose_victim`, a pure query); the engine evicts it and then tells the system
(`on_evict`), and after the copy is committed `on_load`. A backend that moves real weights
has `load_expert(key, kind)` / `evict_expert(key)`; the simulator has neither.
"""

from __future__ import annotations

from collections import deque

from harness.sim.cache import CacheError
from harness.sim.recorder import DEMAND, PREFETCH, PRELOAD


class EngineError(RuntimeError):
    """The run cannot proceed (e.g. a system refuses every victim while the cache is full)."""


class CopyEngine:
    def __init__(self, hooks, cache, rec, backend, n_keys: int):
        self.system = hooks.system  # its name and prefetch flag; calls go through `hooks`
        self.hooks, self.cache, self.rec, self.n_keys = hooks, cache, rec, n_keys
        # Queued prefetch keys; set_queue replaces the whole queue, so they share one
        # proposal time (`queue_ms`).
        self.queue: deque[int] = deque()
        self.queue_ms = 0.0
        self.copy_free_ms = 0.0
        self.copy_ms = backend.expert_copy_ms
        # harness/sim/tiers.py HostTier when host DRAM is bounded (None: every expert is in
        # pinned host memory and a copy takes copy_ms from the moment the link is free)
        self.tier = None
        # system.prefetch=false: propose_prefetch is never asked, the queue stays empty
        self.asks = bool(self.system.prefetch)
        self._choose = hooks.choose_victim
        self._on_load = hooks.on_load if hooks.wants_load else None
        self._on_evict = hooks.on_evict if hooks.wants_evict else None
        self._view = cache.candidates(0.0)  # one view, moved to each load's instant
        # Real backends move weights; the simulator has no such hooks (None: no call).
        self._load_fn = getattr(backend, "load_expert", None)
        self._evict_fn = getattr(backend, "evict_expert", None)

    def load(self, key: int, kind: int, proposed: float, issue: float, start: float) -> bool:
        """Ask the system for a victim, evict it, reserve the slot, commit the copy.
        False: no victim while the cache is full (nothing changed)."""
        view, cache = self._view, self.cache
        view.now_ms = issue
        view.full = full = cache.is_full()
        victim = self._choose(view, key, kind == DEMAND, issue)
        if victim is None:
            if full:
                return False
        else:
            self._evict(victim, key, issue)
        start, ready = self._times(key, kind, issue, start)
        cache.reserve(key, ready, self.rec.transfer(key, kind, proposed, issue, start, ready))
        if self._load_fn is not None:
            self._load_fn(key, kind)
        if self._on_load is not None:
            self._on_load(key, kind == DEMAND, issue)
        return True

    def _times(self, key: int, kind: int, issue: float, start: float) -> tuple[float, float]:
        """(start, ready) of the copy of `key` issued at `issue` on a link free at `start`;
        the link is busy until it is ready."""
        if self.tier is None:
            ready = start + self.copy_ms
        else:
            start, ready = self.tier.copy_times(key, issue, start, self.copy_ms, kind == DEMAND)
        self.copy_free_ms = ready
        return start, ready

    def _evict(self, victim: int, incoming: int, now: float) -> None:
        try:
            tid = self.cache.evict(victim, now)
        except CacheError as exc:
            raise EngineError(f"system {self.system.name} chose victim {victim} for {incoming}, "
                              f"which is not evictable ({exc})") from None
        self.rec.evicted(tid, now)
        if self._evict_fn is not None:
            self._evict_fn(victim)
        if self._on_evict is not None:
            self._on_evict(victim, now)

    def demand(self, key: int, now: float) -> bool:
        """A demand fetch issued at `now`, starting when the link is free."""
        start = self.copy_free_ms if self.copy_free_ms > now else now
        return self.load(key, DEMAND, now, now, start)

    def advance(self, t: float) -> None:
        """Start queued prefetches whose start time is <= t, in queue order."""
        q, ready_ms, proposed = self.queue, self.cache.ready_ms, self.queue_ms
        while q:
            start = self.copy_free_ms if self.copy_free_ms > proposed else proposed
            if start > t:
                return
            key = q.popleft()
            if key in ready_ms:
                continue
            if not self.load(key, PREFETCH, proposed, start, start):
                self.rec.prefetch_dropped += 1

    def ask(self, now: float) -> None:
        """Take the system's prefetch proposal (unless prefetch is off): a list replaces the
        queued, not-started prefetches (keys already resident or in flight are skipped);
        None keeps the queue."""
        if not self.asks:
            return
        proposal = self.hooks.propose_prefetch(now)
        if proposal is not None:
            self.set_queue(proposal, now)

    def set_queue(self, proposal, now: float) -> None:
        """Replace the queued prefetches by `proposal` (a list of keys), stamped `now`."""
        if proposal and (min(proposal) < 0 or max(proposal) >= self.n_keys):
            bad = [k for k in proposal if not 0 <= k < self.n_keys][:5]
            raise EngineError(f"system {self.system.name} proposed invalid expert keys "
                              f"{bad} (valid: 0..{self.n_keys - 1})")
        ready_ms = self.cache.ready_ms
        self.queue = deque([k for k in proposal if k not in ready_ms])
        self.queue_ms = now

    def preload(self, keys) -> float:
        """Timed copies back to back from 0 (docs/engine.md, "Preloads"); the last ready ms."""
        last = self.copy_free_ms
        for key in self._preload_keys(list(dict.fromkeys(int(k) for k in keys))):
            start, ready = self._preload_times(key)
            self.cache.reserve(key, ready, self.rec.transfer(key, PRELOAD, 0.0, start, start,
                                                             ready))
            if self._load_fn is not None:
                self._load_fn(key, PRELOAD)
            last = max(last, ready)
        return last

    def _preload_keys(self, keys: list[int]) -> list[int]:
        """The keys to preload, in order (EngineError: more than the cache holds, or one
        that is no expert)."""
        if len(keys) > self.cache.capacity_slots:
            raise EngineError(f"system {self.system.name} preloads {len(keys)} experts; the "
                              f"cache holds {self.cache.capacity_slots}")
        for key in keys:
            if not 0 <= key < self.n_keys:
                raise EngineError(f"system {self.system.name} preloads invalid key {key}")
        return keys

    def _preload_times(self, key: int) -> tuple[float, float]:
        """(start, ready) of the preload of `key`, behind the link's last copy."""
        t = self.copy_free_ms
        if self.tier is None:
            ready = t + self.copy_ms
        else:
            t, ready = self.tier.copy_times(key, t, t, self.copy_ms, False)
        self.copy_free_ms = ready
        return t, ready
