# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of harness/sim/copies.py (CopyEngine): one host-to-device link, the
prefetch queue, loads, evictions and preloads, with the same events in the same order and
the same errors. The queue holds int keys; a system's hooks get python ints."""

from harness.sim.cache import CacheError
from harness.sim.copies import EngineError

from harness.sim.fast_state cimport Candidates, FastCache, FastRecorder

DEF PREFETCH = 0
DEF DEMAND = 1
DEF PRELOAD = 2


cdef class FastCopyEngine:
    def __init__(self, hooks, FastCache cache, FastRecorder rec, backend, int n_keys):
        self.system = hooks.system  # its name and prefetch flag; calls go through `hooks`
        self.hooks, self.cache, self.rec, self.n_keys = hooks, cache, rec, n_keys
        self.queue_ms = 0.0
        self.copy_free_ms = 0.0
        self.copy_ms = backend.expert_copy_ms
        self.asks = bool(self.system.prefetch)
        self._choose = hooks.choose_victim
        self._on_load = hooks.on_load if hooks.wants_load else None
        self._on_evict = hooks.on_evict if hooks.wants_evict else None
        self._propose = hooks.propose_prefetch
        self.view = cache.candidates(0.0)  # one view, moved to each load's instant
        if getattr(backend, "load_expert", None) is not None or getattr(
                backend, "evict_expert", None) is not None:
            raise EngineError("the compiled engine core runs the simulator only; a backend "
                              "that moves weights needs engine core 'python'")

    @property
    def queue(self) -> list:
        """The queued prefetch keys, in order (a copy)."""
        return [self.q[i] for i in range(self.q_head, self.q.size())]

    cdef bint load_c(self, Py_ssize_t key, int kind, double proposed, double issue,
                     double start) except -1:
        """Ask the system for a victim, evict it, reserve the slot, commit the copy.
        False: no victim while the cache is full (nothing changed)."""
        cdef Candidates view = self.view
        cdef FastCache cache = self.cache
        cdef bint full = cache.count >= cache.capacity_slots
        cdef double ready
        view.now_ms = issue
        view.full = full
        victim = self._choose(view, key, kind == DEMAND, issue)
        if victim is None:
            if full:
                return False
        else:
            self._evict(victim, key, issue)
        ready = start + self.copy_ms
        cache.reserve_c(key, ready, self.rec.transfer_c(key, kind, proposed, issue, start,
                                                        ready))
        self.copy_free_ms = ready
        if self._on_load is not None:
            self._on_load(key, kind == DEMAND, issue)
        return True

    cdef int _evict(self, victim, Py_ssize_t incoming, double now) except -1:
        cdef int tid
        cdef Py_ssize_t k
        try:
            k = victim
            tid = self.cache.evict_c(k, now)
        except (CacheError, TypeError, OverflowError) as exc:
            raise EngineError(f"system {self.system.name} chose victim {victim} for "
                              f"{incoming}, which is not evictable ({exc})") from None
        self.rec.t_evict[tid] = now
        if self._on_evict is not None:
            self._on_evict(victim, now)
        return 0

    cdef bint demand_c(self, Py_ssize_t key, double now) except -1:
        """A demand fetch issued at `now`, starting when the link is free."""
        cdef double start = self.copy_free_ms if self.copy_free_ms > now else now
        return self.load_c(key, DEMAND, now, now, start)

    cdef int advance_c(self, double t) except -1:
        """Start queued prefetches whose start time is <= t, in queue order."""
        cdef double start, proposed = self.queue_ms
        cdef Py_ssize_t key
        cdef FastCache cache = self.cache
        while self.q_head < self.q.size():
            start = self.copy_free_ms if self.copy_free_ms > proposed else proposed
            if start > t:
                return 0
            key = self.q[self.q_head]
            self.q_head += 1
            if cache.present[key]:
                continue
            if not self.load_c(key, PREFETCH, proposed, start, start):
                self.rec.prefetch_dropped += 1
        return 0

    def advance(self, double t) -> None:
        self.advance_c(t)

    def demand(self, key, double now) -> bool:
        return self.demand_c(key, now)

    def ask(self, double now) -> None:
        """Take the system's prefetch proposal (unless prefetch is off): a list replaces the
        queued, not-started prefetches; None keeps the queue."""
        if not self.asks:
            return
        proposal = self._propose(now)
        if proposal is not None:
            self.set_queue(proposal, now)

    def set_queue(self, proposal, double now) -> None:
        """Replace the queued prefetches by `proposal` (a list of keys), stamped `now`."""
        cdef Py_ssize_t k
        cdef FastCache cache = self.cache
        if proposal and (min(proposal) < 0 or max(proposal) >= self.n_keys):
            bad = [k for k in proposal if not 0 <= k < self.n_keys][:5]
            raise EngineError(f"system {self.system.name} proposed invalid expert keys "
                              f"{bad} (valid: 0..{self.n_keys - 1})")
        self.q.clear()
        self.q_head = 0
        for key in proposal:
            k = key
            if not cache.present[k]:
                self.q.push_back(k)
        self.queue_ms = now

    def preload(self, keys) -> float:
        """Timed copies back to back from 0 (docs/engine.md, "Preloads"); the last ready ms."""
        cdef double t, ready
        cdef Py_ssize_t k
        keys = list(dict.fromkeys(int(k) for k in keys))
        if len(keys) > self.cache.capacity_slots:
            raise EngineError(f"system {self.system.name} preloads {len(keys)} experts; the "
                              f"cache holds {self.cache.capacity_slots}")
        for key in keys:
            if not 0 <= key < self.n_keys:
                raise EngineError(f"system {self.system.name} preloads invalid key {key}")
            k = key
            t = self.copy_free_ms
            self.copy_free_ms = ready = t + self.copy_ms
            self.cache.reserve_c(k, ready, self.rec.transfer_c(k, PRELOAD, 0.0, t, t, ready))
        return self.copy_free_ms
