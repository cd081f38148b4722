# The compiled engine's state (fast_state.pyx): the expert cache and the recorder's columns.
# Declared here so that fast_step.pyx reaches their C fields without a Python call.
from libcpp.vector cimport vector


cdef extern from "fast_column.h":
    # a recorder column: std::vector's interface on memory release() hands over (malloc'd)
    cdef cppclass Column[T]:
        void reserve(size_t) except +
        void push_back(T) except +
        size_t size()
        T& operator[](size_t)
        T* release()


cdef class FastCache:
    cdef readonly long long expert_bytes, capacity_bytes
    cdef readonly int capacity_slots, n_keys
    cdef readonly int count, peak_slots
    cdef vector[double] ready        # [n_keys] ms its copy finishes (resident or in flight)
    cdef vector[char] present        # [n_keys] 1: resident or in flight
    cdef vector[char] busy           # [n_keys] 1: the running layer still needs it (in use)
    cdef vector[int] transfer_of     # [n_keys] id of the copy that brought it in

    cdef inline bint evictable_c(self, Py_ssize_t key, double now) noexcept:
        return (0 <= key < self.n_keys and self.present[key] and self.ready[key] <= now
                and not self.busy[key])
    cdef int reserve_c(self, Py_ssize_t key, double ready_ms, int tid) except -1
    cdef int evict_c(self, Py_ssize_t key, double now) except -2


cdef class Candidates:
    cdef FastCache cache
    cdef public double now_ms
    cdef public bint full


cdef class FastRecorder:
    cdef readonly long long expert_bytes
    cdef public long long prefetch_dropped, peak_cache_bytes
    # accesses [n_acc]: expert, class, transfer id, need ms, start ms, owner request
    cdef Column[int] a_expert, a_tid, a_owner
    cdef Column[signed char] a_class
    cdef Column[double] a_need, a_start
    # blocks [n_blocks]: iteration, layer, end access index
    cdef Column[int] b_iteration, b_layer
    cdef Column[long long] b_end
    # transfers [n_tr]: key, kind, proposed / issue / start / ready / evict ms
    cdef Column[long long] t_key
    cdef Column[signed char] t_kind
    cdef Column[double] t_proposed, t_issue, t_start, t_ready, t_evict
    cdef object iterations           # harness.sim.recorder.IterationLog
    cdef object stored               # the stored tables once built (the columns handed over)

    cdef inline int access_c(self, int expert, signed char cls, int tid, double need,
                             double start, int owner) except -1:
        self.a_expert.push_back(expert)
        self.a_class.push_back(cls)
        self.a_tid.push_back(tid)
        self.a_need.push_back(need)
        self.a_start.push_back(start)
        self.a_owner.push_back(owner)
        return 0
    cdef int transfer_c(self, long long key, signed char kind, double proposed, double issue,
                        double start, double ready) except -1
    cdef int block_c(self, int iteration, int layer) except -1
