/* One recorder column of the compiled engine (harness/sim/fast_state.pyx): a growable array
 * like std::vector<T>, but on malloc'd memory that release() hands over, so the stored tables
 * wrap the recorded values without copying them. A copy of a 1,000-request trace's columns
 * (about 190 MB) into fresh numpy arrays faulted every page in again: 0.1 us of system CPU
 * per access, most of what a fast system spent beyond its run at 1,000 requests. */
#ifndef FAST_COLUMN_H
#define FAST_COLUMN_H

#include <cstdlib>
#include <new>

template <typename T>
class Column {
  public:
    Column() : buf_(nullptr), n_(0), cap_(0) {}
    ~Column() { std::free(buf_); }
    Column(const Column&) = delete;
    Column& operator=(const Column&) = delete;

    void reserve(size_t cap) {
        if (cap > cap_)
            grow(cap);
    }
    void push_back(T x) {
        if (n_ == cap_)
            grow(cap_ ? 2 * cap_ : 1024);
        buf_[n_++] = x;
    }
    size_t size() const { return n_; }
    T& operator[](size_t i) { return buf_[i]; }

    /* The values (malloc'd, n_ of them, to be freed with free(); NULL when empty), shrunk to
       their size (glibc shrinks a large block in place); the column is empty afterwards. */
    T* release() {
        T* out = nullptr;
        if (n_) {
            out = static_cast<T*>(std::realloc(buf_, n_ * sizeof(T)));
            if (!out)
                out = buf_;  /* shrinking failed: the larger block still holds the values */
        } else {
            std::free(buf_);
        }
        buf_ = nullptr;
        n_ = cap_ = 0;
        return out;
    }

  private:
    void grow(size_t cap) {
        T* p = static_cast<T*>(std::realloc(buf_, cap * sizeof(T)));
        if (!p)
            throw std::bad_alloc();
        buf_ = p;
        cap_ = cap;
    }
    T* buf_;
    size_t n_, cap_;
};

#endif
