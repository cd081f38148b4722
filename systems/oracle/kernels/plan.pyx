# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Belady's MIN plan compiled: the same plan as systems/oracle/system.py's `belady_plan` (the python
reference; tests/systems/test_belady_fast.py asserts equal plans), over int64 arrays.

A binary min-heap of int64 codes (n - next use) * width + key, lazily invalidated as in the
reference (an entry is current while it equals cur[key]); rebuilt from the residents when it
reaches 2 * capacity + 64 entries, so it stays O(capacity) whatever the trace's length. The
victims depend only on the set of current codes, which are unique, so the rebuild and the
order of stale entries cannot change the plan.
"""

import numpy as np

from libc.stdint cimport int64_t


cdef inline void _sift_down(int64_t[::1] h, Py_ssize_t size, Py_ssize_t i) noexcept nogil:
    cdef int64_t x = h[i]
    cdef Py_ssize_t c
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and h[c + 1] < h[c]:
            c += 1
        if h[c] >= x:
            break
        h[i] = h[c]
        i = c
    h[i] = x


cdef inline void _sift_up(int64_t[::1] h, Py_ssize_t i) noexcept nogil:
    cdef int64_t x = h[i]
    cdef Py_ssize_t p
    while i > 0:
        p = (i - 1) >> 1
        if h[p] <= x:
            break
        h[i] = h[p]
        i = p
    h[i] = x


def belady_plan_arrays(const int64_t[::1] keys, const int64_t[::1] next_use,
                       Py_ssize_t capacity):
    """MIN with `capacity` slots. Returns (preload int64 [P], key, victim, victim_last
    int64 [M]): the first `capacity` distinct keys, then one row per load after them (the
    reference's load position is not kept: the oracle reads none)."""
    cdef Py_ssize_t n = keys.shape[0], p, size = 0, m = 0, n_pre = 0, k
    cdef Py_ssize_t resident = 0
    if capacity < 1:
        raise ValueError("belady_plan: capacity must be >= 1 slot")
    cdef int64_t width = (max(np.max(keys), 0) + 1) if n else 1
    cdef int64_t key, victim, code, nu
    cdef int64_t[::1] cur = np.full(width, -1, dtype=np.int64)  # key -> its current code
    cdef int64_t[::1] last = np.zeros(width, dtype=np.int64)  # key -> its last position
    cdef Py_ssize_t heap_cap = 2 * min(<int64_t>capacity, width) + 64
    cdef int64_t[::1] heap = np.empty(heap_cap, dtype=np.int64)
    pre_np = np.empty(min(<int64_t>capacity, width), dtype=np.int64)
    cdef int64_t[::1] pre = pre_np
    # The plan's rows, grown by doubling (loads are usually well below n)
    out_np = np.empty((3, max(n // 4, 16)), dtype=np.int64)
    cdef int64_t[:, ::1] out = out_np
    for p in range(n):
        key = keys[p]
        if cur[key] < 0:
            if resident < capacity:
                pre[n_pre] = key
                n_pre += 1
                resident += 1
            else:
                while True:
                    code = heap[0]
                    size -= 1
                    heap[0] = heap[size]
                    if size > 0:
                        _sift_down(heap, size, 0)
                    victim = code % width
                    if cur[victim] == code:
                        break
                cur[victim] = -1
                if m == out.shape[1]:
                    grown = np.empty((3, 2 * m), dtype=np.int64)
                    grown[:, :m] = out_np
                    out_np = grown
                    out = out_np
                out[0, m] = key
                out[1, m] = victim
                out[2, m] = last[victim]
                m += 1
        nu = next_use[p]
        code = (n - (nu if nu < n else n)) * width + key
        cur[key] = code
        last[key] = p
        if size == heap_cap:  # only stale entries beyond the residents: rebuild (code included)
            size = 0
            for k in range(width):
                if cur[k] >= 0:
                    heap[size] = cur[k]
                    size += 1
            k = size // 2
            while k > 0:
                k -= 1
                _sift_down(heap, size, k)
        else:
            heap[size] = code
            size += 1
            _sift_up(heap, size - 1)
    return (pre_np[:n_pre].copy(), out_np[0, :m].copy(), out_np[1, :m].copy(),
            out_np[2, :m].copy())
