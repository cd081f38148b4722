# The compiled copy engine (fast_copies.pyx), declared for fast_step.pyx.
from libcpp.vector cimport vector

from harness.sim.fast_state cimport Candidates, FastCache, FastRecorder


cdef class FastCopyEngine:
    cdef object system, hooks, _choose, _on_load, _on_evict, _propose
    cdef FastCache cache
    cdef FastRecorder rec
    cdef Candidates view
    cdef public double copy_free_ms, queue_ms
    cdef readonly double copy_ms
    cdef readonly int n_keys
    cdef readonly bint asks
    cdef vector[int] q            # queued prefetch keys; q[q_head:] are still queued
    cdef size_t q_head

    cdef inline bint queued(self) noexcept:
        return self.q_head < self.q.size()
    cdef bint load_c(self, Py_ssize_t key, int kind, double proposed, double issue,
                     double start) except -1
    cdef int _evict(self, victim, Py_ssize_t incoming, double now) except -1
    cdef bint demand_c(self, Py_ssize_t key, double now) except -1
    cdef int advance_c(self, double t) except -1
