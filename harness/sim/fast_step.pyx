# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of harness/sim/step.py (LayerStep with the SimExecutor's cost model
inlined): the same run order, classes, times, hooks and errors (docs/engine.md, "One MoE
layer"). Per-layer scratch is C++ vectors of size E; the routing a system sees is the same
LayerRouting of python lists."""

from libc.math cimport isnan
from libcpp.vector cimport vector

from harness.sim.copies import EngineError

from harness.sim.fast_copies cimport FastCopyEngine
from harness.sim.fast_state cimport FastCache, FastRecorder

DEF HIT = 0
DEF LATE = 1
DEF MISS = 2


cdef class FastLayerStep:
    cdef object view, system, _routed, _propose, expert_ms
    cdef FastCopyEngine copies
    cdef FastCache cache
    cdef FastRecorder rec
    cdef int E, L
    cdef const long long[::1] step_off, bounds  # [R + 1] first step; [n_blocks + 1] rows
    cdef const unsigned short[::1] ids          # [rows] expert ids of every block's union
    cdef const int[::1] cnts                    # [rows] tokens routed to each
    cdef vector[double] dur                     # tokens -> expert ms (NaN: not asked yet)
    # per-layer scratch, [E] each: the union (ids, tokens, first member request), the run
    # order (ids, tokens, issued a demand fetch), in-flight and missing experts, deferred
    cdef vector[int] u_e, u_c, u_o, o_e, o_c, o_m, l_e, l_c, m_e, m_c, d_e, d_c
    cdef vector[double] l_t
    cdef vector[long long] acc                  # [E] tokens per id while merging members
    cdef vector[int] first                      # [E] first member request per id (-1: none)

    def __init__(self, index, view, hooks, FastCopyEngine copies, FastCache cache,
                 FastRecorder rec, backend, int num_experts):
        self.view, self.system = view, hooks.system
        self._routed, self._propose = hooks.on_layer_routed, hooks.propose_prefetch
        self.copies, self.cache, self.rec = copies, cache, rec
        self.expert_ms = backend.expert_ms
        self.E, self.L = num_experts, index.L
        self.step_off, self.bounds = index.step_off_array, index.bounds_array
        self.ids, self.cnts = index.ids_array, index.cnts_array
        self.u_e.resize(num_experts); self.u_c.resize(num_experts)
        self.u_o.resize(num_experts); self.o_e.resize(num_experts)
        self.o_c.resize(num_experts); self.o_m.resize(num_experts)
        self.l_e.resize(num_experts); self.l_c.resize(num_experts)
        self.l_t.resize(num_experts); self.m_e.resize(num_experts)
        self.m_c.resize(num_experts); self.d_e.resize(num_experts)
        self.d_c.resize(num_experts)
        self.acc.assign(num_experts, 0)
        self.first.assign(num_experts, -1)

    cdef inline double duration(self, int count) except? -1.0:
        """Expert ms for `count` tokens, asked of the cost model once per count."""
        if count >= <int>self.dur.size():
            self.dur.resize(count + 1, float("nan"))
        if isnan(self.dur[count]):
            self.dur[count] = self.expert_ms(count)
        return self.dur[count]

    cdef int _union(self, members, int layer) except -1:
        """Several members: the union of their blocks at `layer` into u_e / u_c / u_o (first
        member request per id, members in order); returns its size."""
        cdef int e, r, s, n = 0
        cdef long long b, i
        for r, s in members:
            b = (self.step_off[r] + s) * self.L + layer
            for i in range(self.bounds[b], self.bounds[b + 1]):
                e = self.ids[i]
                self.acc[e] += self.cnts[i]
                if self.first[e] < 0:
                    self.first[e] = r
        for e in range(self.E):
            if self.acc[e]:
                self.u_e[n], self.u_c[n], self.u_o[n] = e, self.acc[e], self.first[e]
                n += 1
                self.acc[e], self.first[e] = 0, -1
        return n

    def run(self, info, int layer, members, double now) -> float:
        """Run MoE layer `layer` of iteration `info` from `now`; returns when compute is free."""
        cdef FastCopyEngine copies = self.copies
        cdef int n, i, r, s
        cdef long long b, b0
        cdef bint batch = len(members) > 1
        if copies.queued() and copies.copy_free_ms <= now:
            copies.advance_c(now)
        if not batch:
            r, s = members[0]
            b = (self.step_off[r] + s) * self.L + layer
            b0, n = self.bounds[b], self.bounds[b + 1] - self.bounds[b]
            for i in range(n):
                self.u_e[i], self.u_c[i], self.u_o[i] = self.ids[b0 + i], self.cnts[b0 + i], r
            blocks = {r: b}
        else:
            blocks = {r: (self.step_off[r] + s) * self.L + layer for r, s in members}
            n = self._union(members, layer)
        if n == 0:
            return now
        experts = [self.u_e[i] for i in range(n)]
        counts = [self.u_c[i] for i in range(n)]
        self._routed(self.view.reveal(info, layer, experts, counts, blocks), now)
        if copies.asks:
            proposal = self._propose(now)
            if proposal is not None:
                copies.set_queue(proposal, now)
        now = self._layer(n, layer, now)
        self.rec.block_c(info.index, layer)
        return now

    cdef double _layer(self, int n, int layer, double now) except? -1.0:
        """Split the union, stage the copies and run every expert (step.py's run body)."""
        cdef FastCache cache = self.cache
        cdef int i, e, key, n_ord = 0, n_late = 0, n_miss = 0, base = layer * self.E
        for i in range(n):
            e = self.u_e[i]
            key = base + e
            if not cache.present[key]:
                self.m_e[n_miss], self.m_c[n_miss] = i, self.u_c[i]
                n_miss += 1
            elif cache.ready[key] <= now:
                self.o_e[n_ord], self.o_c[n_ord], self.o_m[n_ord] = i, self.u_c[i], 0
                n_ord += 1
            else:
                self.l_e[n_late], self.l_c[n_late], self.l_t[n_late] = i, self.u_c[i], \
                    cache.ready[key]
                n_late += 1
        if n_miss == 0 and n_late == 0 and not self.copies.queued():
            return self._run_ready(n, base, now)
        return self._staged(n_ord, n_late, n_miss, base, layer, now)

    cdef double _run_ready(self, int n, int base, double now) except? -1.0:
        """Every expert ready and nothing queued: back to back, every access a hit."""
        cdef int i
        cdef FastRecorder rec = self.rec
        for i in range(n):
            rec.access_c(self.u_e[i], HIT, self.cache.transfer_of[base + self.u_e[i]], now,
                         now, self.u_o[i])
            now += self.duration(self.u_c[i])
        return now

    cdef double _staged(self, int n_ord, int n_late, int n_miss, int base, int layer,
                        double now) except? -1.0:
        """Mark the layer's experts in use (ready ones, then in-flight ones by ready time),
        issue demand fetches in ascending id until one is refused (the rest deferred), start
        the queued prefetches behind them, then run."""
        cdef FastCache cache = self.cache
        cdef int i, j, n_def = 0
        for i in range(n_ord):
            cache.busy[base + self.u_e[self.o_e[i]]] = 1
        self._sort_late(n_late)
        for i in range(n_late):
            j = self.l_e[i]
            self.o_e[n_ord], self.o_c[n_ord], self.o_m[n_ord] = j, self.l_c[i], 0
            n_ord += 1
            cache.busy[base + self.u_e[j]] = 1
        for i in range(n_miss):
            j = self.m_e[i]
            if n_def == 0 and self.copies.demand_c(base + self.u_e[j], now):
                cache.busy[base + self.u_e[j]] = 1
                self.o_e[n_ord], self.o_c[n_ord], self.o_m[n_ord] = j, self.m_c[i], 1
                n_ord += 1
            else:
                self.d_e[n_def], self.d_c[n_def] = j, self.m_c[i]
                n_def += 1
        if self.copies.queued():
            self.copies.advance_c(now)
        return self._run(n_ord, n_def, base, layer, now)

    cdef void _sort_late(self, int n_late) noexcept:
        """In-flight experts by (ready ms, id): insertion sort, the lists are short."""
        cdef int i, j, e, c
        cdef double t
        for i in range(1, n_late):
            t, e, c = self.l_t[i], self.l_e[i], self.l_c[i]
            j = i - 1
            while j >= 0 and (self.l_t[j] > t or (self.l_t[j] == t and self.l_e[j] > e)):
                self.l_t[j + 1], self.l_e[j + 1], self.l_c[j + 1] = \
                    self.l_t[j], self.l_e[j], self.l_c[j]
                j -= 1
            self.l_t[j + 1], self.l_e[j + 1], self.l_c[j + 1] = t, e, c

    cdef double _run(self, int n_ord, int n_def, int base, int layer,
                     double now) except? -1.0:
        """One access per expert in run order, which grows as deferred fetches are issued;
        o_e holds union positions, d_e[d_head:n_def] the deferred ones."""
        cdef FastCache cache = self.cache
        cdef FastCopyEngine copies = self.copies
        cdef int i = 0, j, key, d_head = 0, cls
        cdef double ready, start
        while i < n_ord or d_head < n_def:
            if i == n_ord:
                copies.ask(now)
                copies.advance_c(now)
                j = self._retry(&n_ord, &d_head, n_def, base, now)
                if j == 0:
                    raise EngineError(
                        f"system {self.system.name}: no victim for a demand fetch at layer "
                        f"{layer} while the cache is full ({cache.capacity_slots} slots)")
                continue
            j = self.o_e[i]
            key = base + self.u_e[j]
            ready = cache.ready[key]
            cls = MISS if self.o_m[i] else (LATE if ready > now else HIT)
            start = ready if ready > now else now
            self.rec.access_c(self.u_e[j], cls, cache.transfer_of[key], now, start,
                              self.u_o[j])
            now = start + self.duration(self.o_c[i])
            i += 1
            if copies.queued() and copies.copy_free_ms <= now:
                copies.advance_c(now)
            cache.busy[key] = 0
            if d_head < n_def:
                self._retry(&n_ord, &d_head, n_def, base, now)
        return now

    cdef int _retry(self, int* n_ord, int* d_head, int n_def, int base,
                    double now) except -1:
        """Issue deferred demand fetches in order while room allows; 1 if any progressed."""
        cdef FastCache cache = self.cache
        cdef int j, key, miss, progressed = 0
        while d_head[0] < n_def:
            j = self.d_e[d_head[0]]
            key = base + self.u_e[j]
            if cache.present[key]:  # a queued prefetch brought it in meanwhile
                miss = 0
            elif self.copies.demand_c(key, now):
                miss = 1
            else:
                break
            self.o_e[n_ord[0]], self.o_c[n_ord[0]], self.o_m[n_ord[0]] = \
                j, self.d_c[d_head[0]], miss
            n_ord[0] += 1
            d_head[0] += 1
            cache.busy[key] = 1
            progressed = 1
        return progressed
