# The C helpers of moe_infinity's compiled kernels (fast.h), declared once for fast.pyx and
# rows.pyx (systems/moe_infinity/kernels); pointers are into one
# table row ([L*E] planes, acc [L*E + L]). Declarations only: nothing to import at run time.

cdef extern from "fast.h":
    void mi_blend(const double* p, const double* own, const double* mix, double* out,
                  Py_ssize_t lo, Py_ssize_t hi) noexcept nogil
    void mi_axpy(double* y, double a, const double* x, Py_ssize_t n) noexcept nogil
    int mi_insert(double* val, Py_ssize_t* idx, int n, int m, double v,
                  Py_ssize_t i) noexcept nogil
    int mi_top_scaled(const double* dots, const double* scale, Py_ssize_t n, int m,
                      double* val, Py_ssize_t* idx) noexcept nogil
    void mi_own_block(const double* eam, double* own, double* own_var, double* var,
                      const double* keep2, const double* pvar, double inv, double w2,
                      Py_ssize_t lo, Py_ssize_t hi) noexcept nogil
    void mi_predicted(const double* acc, double* share, double* pvar, const double* keep2,
                      const double* own_var, double* var, const double* own,
                      const double* mix, double* blend, Py_ssize_t L, Py_ssize_t E) noexcept nogil
    void mi_sum_rows(double* acc, const double* const* add, int nadd,
                     const double* const* sub, int nsub, int fresh, Py_ssize_t n) noexcept nogil
    void mi_max_rows(double* out, const double* const* rows, int nrows,
                     Py_ssize_t n) noexcept nogil

cdef enum:
    MAX_TOP = 8  # the longest ranking kept in C (ARGMAX_TOP and the usual max_proposal)

cdef enum:  # planes of RequestTable.parts
    SHARE = 0
    PVAR = 1
    KEEP2 = 2
    OWN_VAR = 3
    VAR = 4
