# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twins of harness/sim/cache.py (ExpertCache, Candidates) and the recorder's
columns (harness/sim/recorder.py Recorder): the same contracts, the same errors, the same
values; dense per-key arrays [L * E] instead of dicts and C++ vectors and columns
(fast_column.h) instead of typed arrays. The Python classes stay the reference
(tests/test_fast_core.py runs both)."""

import numpy as np

from harness.sim.cache import CacheError
from harness.sim.recorder import IterationLog, stored_dict
from harness.sim.tables import eager, full_tables

from cpython.buffer cimport PyBuffer_FillInfo
from libc.stdlib cimport free


cdef class FastCache:
    """ExpertCache over dense keys 0..n_keys-1 (mechanism only: harness/sim/cache.py)."""

    def __init__(self, long long capacity_bytes, long long expert_bytes, int n_keys):
        if expert_bytes <= 0:
            raise CacheError(f"expert_bytes must be positive, got {expert_bytes}")
        self.expert_bytes, self.capacity_bytes = expert_bytes, capacity_bytes
        self.capacity_slots = capacity_bytes // expert_bytes
        self.n_keys = n_keys
        self.ready.assign(n_keys, 0.0)
        self.present.assign(n_keys, 0)
        self.busy.assign(n_keys, 0)
        self.transfer_of.assign(n_keys, -1)
        self.count = self.peak_slots = 0

    def __contains__(self, key) -> bool:
        cdef Py_ssize_t k = key
        return 0 <= k < self.n_keys and self.present[k] != 0

    def __len__(self) -> int:
        return self.count

    @property
    def used_bytes(self) -> int:
        return self.count * self.expert_bytes

    @property
    def peak_bytes(self) -> int:
        return self.peak_slots * self.expert_bytes

    @property
    def in_use(self) -> set:
        """The keys the running layer still needs (a copy; the step owns the flags)."""
        return {k for k in range(self.n_keys) if self.busy[k]}

    def is_full(self) -> bool:
        return self.count >= self.capacity_slots

    def evictable(self, key, double now_ms) -> bool:
        return self.evictable_c(key, now_ms)

    def candidates(self, double now_ms) -> Candidates:
        """A view of the keys evictable at `now_ms` (see ExpertCache.candidates)."""
        return Candidates(self, now_ms)

    def ready_ms(self, key) -> float | None:
        """The key's ready ms, None when it is neither resident nor in flight."""
        cdef Py_ssize_t k = key
        return self.ready[k] if 0 <= k < self.n_keys and self.present[k] else None

    cdef int reserve_c(self, Py_ssize_t key, double ready_ms, int tid) except -1:
        if self.present[key]:
            raise CacheError(f"expert key {key} is already resident or in flight")
        if self.count >= self.capacity_slots:
            raise CacheError(f"cache full ({self.capacity_slots} slots) reserving key {key}")
        self.present[key] = 1
        self.ready[key] = ready_ms
        self.transfer_of[key] = tid
        self.count += 1
        if self.count > self.peak_slots:
            self.peak_slots = self.count
        return 0

    def reserve(self, key, double ready_ms, int transfer_id) -> None:
        self.reserve_c(key, ready_ms, transfer_id)

    cdef int evict_c(self, Py_ssize_t key, double now) except -2:
        """Remove a ready key not in use; returns the id of the copy that had loaded it."""
        if not self.evictable_c(key, now):
            state = ("absent" if not (0 <= key < self.n_keys and self.present[key]) else
                     "in use" if self.busy[key] else "in flight")
            raise CacheError(f"cannot evict expert key {key}: {state}")
        self.present[key] = 0
        self.count -= 1
        return self.transfer_of[key]

    def evict(self, key, double now_ms) -> int:
        return self.evict_c(key, now_ms)

    def check_invariants(self) -> None:
        if self.count > self.capacity_slots:
            raise CacheError("more keys than slots")
        if self.count * self.expert_bytes > self.capacity_bytes:
            raise CacheError("used bytes exceed the budget")
        stray = [k for k in range(self.n_keys) if self.busy[k] and not self.present[k]]
        if stray:
            raise CacheError(f"in-use keys not resident: {stray[:5]}")


cdef class Candidates:
    """The evictable keys at one instant (harness/sim/cache.py Candidates): `key in c`,
    `first_of(keys)`, ascending iteration; `now_ms` and `full` set by the copy engine."""

    def __init__(self, FastCache cache, double now_ms):
        self.cache = cache
        self.now_ms = now_ms
        self.full = cache.count >= cache.capacity_slots

    def __contains__(self, key) -> bool:
        cdef Py_ssize_t k
        try:
            k = key
        except (TypeError, OverflowError):
            return False
        return self.cache.evictable_c(k, self.now_ms)

    def first_of(self, keys):
        """The first evictable key of `keys` (a policy's priority order), or None."""
        cdef FastCache cache = self.cache
        cdef double now = self.now_ms
        cdef Py_ssize_t k
        for key in keys:
            k = key
            if cache.evictable_c(k, now):
                return key
        return None

    def __iter__(self):
        cdef FastCache cache = self.cache
        cdef double now = self.now_ms
        return iter([k for k in range(cache.n_keys) if cache.evictable_c(k, now)])

    def __len__(self) -> int:
        cdef FastCache cache = self.cache
        cdef Py_ssize_t k, n = 0
        for k in range(cache.n_keys):
            n += cache.evictable_c(k, self.now_ms)
        return n


cdef class FastRecorder:
    """Recorder's columns in C++ (fast_column.h; harness/sim/recorder.py has the row layout);
    the stored tables are the same arrays, values and dtypes."""

    def __init__(self, long long expert_bytes):
        self.expert_bytes = expert_bytes
        self.prefetch_dropped = 0
        self.peak_cache_bytes = 0
        self.iterations = IterationLog()
        self.stored = None

    def reserve(self, Py_ssize_t accesses, Py_ssize_t blocks) -> None:
        """Room for this many accesses and blocks (an upper bound: the trace's block unions)
        and as many transfers (each access demand-fetches at most once; prefetches beyond
        that regrow): no regrowth copies, whose old and new buffers would both count in
        the peak, and pages never written are never resident."""
        self.a_expert.reserve(accesses)
        self.a_class.reserve(accesses)
        self.a_tid.reserve(accesses)
        self.a_need.reserve(accesses)
        self.a_start.reserve(accesses)
        self.a_owner.reserve(accesses)
        self.b_iteration.reserve(blocks)
        self.b_layer.reserve(blocks)
        self.b_end.reserve(blocks)
        self.t_key.reserve(accesses)
        self.t_kind.reserve(accesses)
        self.t_proposed.reserve(accesses)
        self.t_issue.reserve(accesses)
        self.t_start.reserve(accesses)
        self.t_ready.reserve(accesses)
        self.t_evict.reserve(accesses)

    cdef int transfer_c(self, long long key, signed char kind, double proposed, double issue,
                        double start, double ready) except -1:
        self.t_key.push_back(key)
        self.t_kind.push_back(kind)
        self.t_proposed.push_back(proposed)
        self.t_issue.push_back(issue)
        self.t_start.push_back(start)
        self.t_ready.push_back(ready)
        self.t_evict.push_back(float("nan"))  # resident until evicted
        return self.t_key.size() - 1

    cdef int block_c(self, int iteration, int layer) except -1:
        self.b_iteration.push_back(iteration)
        self.b_layer.push_back(layer)
        self.b_end.push_back(self.a_expert.size())
        return 0

    # ---- the Recorder interface ---------------------------------------------------------------
    def add_access(self, row) -> None:
        e, cls, tid, need, start, owner = row
        self.access_c(e, cls, tid, need, start, owner)

    def block(self, int iteration, int layer) -> None:
        self.block_c(iteration, layer)

    def transfer(self, long long key, signed char kind, double proposed, double issue,
                 double start, double ready) -> int:
        return self.transfer_c(key, kind, proposed, issue, start, ready)

    def evicted(self, int tid, double t) -> None:
        self.t_evict[tid] = t

    def iteration(self, index: int, kind: str, start: float, end: float, members) -> None:
        self.iterations.add(index, kind, start, end, members)

    @property
    def num_accesses(self) -> int:
        return self.a_expert.size() if self.stored is None else len(
            self.stored["accesses"]["expert"])

    def stored_tables(self) -> dict:
        """The stored columns (harness/sim/tables.py): numpy arrays over the columns' own
        memory, handed over (no copy, no page faulted in again); later calls return the same
        tables."""
        if self.stored is None:
            i4, i8, i1, f8 = np.int32, np.int64, np.int8, np.float64
            blocks = [_take(self.b_iteration, i4), _take(self.b_layer, i4),
                      _take(self.b_end, i8)]
            acc = [_take(self.a_expert, i4), _take(self.a_class, i1), _take(self.a_tid, i4),
                   _take(self.a_need, f8), _take(self.a_start, f8), _take(self.a_owner, i4)]
            tr = [_take(self.t_key, i8), _take(self.t_kind, i1), _take(self.t_proposed, f8),
                  _take(self.t_issue, f8), _take(self.t_start, f8), _take(self.t_ready, f8),
                  _take(self.t_evict, f8)]
            self.stored = stored_dict(blocks, acc, tr, self.iterations, self.expert_bytes)
        return self.stored

    def tables(self) -> dict:
        """Every column of accesses, transfers and tokens (docs/metrics.md), computed now."""
        return eager(full_tables(self.stored_tables()))


ctypedef fused Value:
    double
    int
    long long
    signed char


cdef class _Owned:
    """A block of malloc'd memory exposed as a writable buffer and freed with the last
    array viewing it (np.frombuffer keeps this object alive)."""
    cdef void* p
    cdef Py_ssize_t nbytes

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.p, self.nbytes, 0, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __dealloc__(self):
        free(self.p)


cdef object _take(Column[Value]& v, dtype):
    """A numpy array of `dtype` (the column's C type) over the column's values, which it now
    owns; the column is left empty."""
    cdef Py_ssize_t n = v.size()
    cdef _Owned owned
    if n == 0:
        v.release()
        return np.empty(0, dtype)
    owned = _Owned.__new__(_Owned)
    owned.nbytes = n * sizeof(Value)
    owned.p = v.release()
    return np.frombuffer(owned, dtype)
