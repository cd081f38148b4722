"""Recorder: typed columns the engine appends to on its hot path; turned into tables at the end.

Hot path API: `add_access(row)` appends one access, a tuple of ACC_COLS values (expert,
class, transfer id, need ms, start ms, owner request); it is the bound `extend` of a small
list buffer, so an access costs no Python-level call. Once the buffer holds _FLUSH values,
`block()` moves it into one typed array per column (struct of arrays: int32 expert, owner
and transfer id, int8 class, float64 times; 29 bytes an access, no Python object per
access). array.extend of a tuple is ~9x slower than list.extend, while fromlist of a full
buffer is a C loop. Blocks (16 bytes each) and transfers (49 bytes each, ~0.2 per access
under LRU) are kept the same way, iterations in typed arrays: about 40 bytes per access in
all (docs/engine.md, cost model). `stored_tables()` views these arrays without a copy; the
derived columns (a copy's first use among them) are computed by harness/sim/tables.py.

Tables (docs/metrics.md): accesses (one row per (iteration, layer, expert) in the union of
the iteration's tokens), transfers (one row per host-to-device copy), tokens (one row per
generated token, with its iteration's start and end).
"""

from __future__ import annotations

from array import array

import numpy as np

from harness.sim.tables import eager, full_tables

HIT, LATE, MISS, CPU = 0, 1, 2, 3  # CPU: run on the host CPU, no copy (step_tiers.py)
CLASS_NAMES = ("hit", "late", "miss", "cpu")
PREFETCH, DEMAND, PRELOAD = 0, 1, 2
KIND_NAMES = ("prefetch", "demand", "preload")
ACC_COLS = 6  # values per access row: expert, class, transfer id, need ms, start ms, owner request
# Values a list buffer holds before it moves into its typed columns (~0.5 MB of pointers):
# large enough that the move is rare, small enough that its Python objects stay negligible.
_FLUSH = 1 << 16
_NAN = float("nan")  # a transfer's evict ms while it is resident
_DTYPES = {"b": np.int8, "i": np.int32, "q": np.int64, "d": np.float64}


class _Columns:
    """Rows appended flat to `buf` (its bound extend is the hot path), moved into one typed
    array per column by `flush()`; a value of the wrong type or range raises there."""

    def __init__(self, typecodes: str):
        self.cols = [array(code) for code in typecodes]
        self.buf: list = []

    def flush(self) -> None:
        buf, width = self.buf, len(self.cols)
        for j, col in enumerate(self.cols):
            col.fromlist(buf[j::width])
        buf.clear()  # the same list: bound extends stay valid

    def __len__(self) -> int:
        return len(self.cols[0]) + len(self.buf) // len(self.cols)


class Recorder:
    def __init__(self, expert_bytes: int):
        self.expert_bytes = expert_bytes
        # expert, class, transfer id, need ms, start ms, owner request (ACC_COLS)
        self._acc = _Columns("ibiddi")
        self._acc_buf = self._acc.buf
        self.add_access = self._acc_buf.extend  # one access: a tuple of ACC_COLS values
        self._acc_done = 0  # accesses already moved into the columns
        self._blocks = _Columns("iiq")  # iteration, layer, end access index
        self._blocks_buf = self._blocks.buf
        self._tr = _Columns("qbdddd")  # key, kind, proposed, issue, start, ready ms
        self._tr_buf = self._tr.buf
        self.tr_evict_ms = array("d")  # per transfer; NaN while resident
        self.iterations = IterationLog()
        self.prefetch_dropped = 0
        self.peak_cache_bytes = 0

    # ---- hot path ---------------------------------------------------------------------------
    def block(self, iteration: int, layer: int) -> None:
        """Close the current (iteration, layer): its accesses are the rows appended since."""
        buf = self._acc_buf  # locals and plain len: this runs once per block
        if len(buf) >= _FLUSH:
            self._flush()
        self._blocks_buf.extend((iteration, layer, self._acc_done + len(buf) // ACC_COLS))

    def _flush(self) -> None:
        self._acc.flush()
        self._acc_done = len(self._acc)
        self._blocks.flush()
        self._tr.flush()

    def transfer(self, key: int, kind: int, proposed: float, issue: float, start: float,
                 ready: float) -> int:
        buf = self._tr_buf
        buf.extend((key, kind, proposed, issue, start, ready))
        if len(buf) >= _FLUSH:
            self._tr.flush()
        evict = self.tr_evict_ms
        evict.append(_NAN)
        return len(evict) - 1

    def evicted(self, tid: int, t: float) -> None:
        self.tr_evict_ms[tid] = t

    def iteration(self, index: int, kind: str, start: float, end: float, members) -> None:
        self.iterations.add(index, kind, start, end, members)

    # ---- tables -------------------------------------------------------------------------------
    @property
    def num_accesses(self) -> int:
        return len(self._acc)

    def stored_tables(self) -> dict:
        """The stored columns (harness/sim/tables.py) as numpy views of the typed arrays (no
        copy of an access column), tokens and `expert_bytes`."""
        self._flush()
        acc, tr_c = self._acc, self._tr
        return stored_dict([_view(self._blocks, j) for j in range(3)],
                           [_view(acc, j) for j in range(ACC_COLS)],
                           [_view(tr_c, j) for j in range(6)]
                           + [np.frombuffer(self.tr_evict_ms, dtype=np.float64)],
                           self.iterations, self.expert_bytes)

    def tables(self) -> dict[str, dict[str, np.ndarray]]:
        """Every column of accesses, transfers and tokens (docs/metrics.md), computed now."""
        return eager(full_tables(self.stored_tables()))


class IterationLog:
    """Iterations (numbered 0.. in order: start and end ms, prefill flag) and their token
    members (iteration, request, step); shared by this recorder and the compiled one."""

    def __init__(self):
        self.it_ms = array("d")
        self.it_prefill = array("b")
        self.members = array("q")

    def add(self, index: int, kind: str, start: float, end: float, members) -> None:
        self.it_ms.append(start)
        self.it_ms.append(end)
        self.it_prefill.append(kind == "prefill")
        m = self.members
        for r, s in members:
            m.append(index)
            m.append(r)
            m.append(s)

    def tokens(self) -> dict:
        it_ms = np.array(self.it_ms, dtype=np.float64).reshape(-1, 2)
        it_prefill = np.array(self.it_prefill, dtype=np.int8).astype(bool)
        mem = np.array(self.members, dtype=np.int64).reshape(-1, 3)  # iteration, request, step
        return {
            "request": mem[:, 1].copy(), "token_index": mem[:, 2].copy(),
            "iteration": mem[:, 0].copy(), "time_ms": it_ms[mem[:, 0], 1],
            "iteration_start_ms": it_ms[mem[:, 0], 0], "prefill": it_prefill[mem[:, 0]],
        }


def stored_dict(blocks: list, acc: list, tr: list, iterations: IterationLog,
                expert_bytes: int) -> dict:
    """The stored tables from column arrays: blocks [iteration int32, layer int32, end access
    index int64] per block, accesses in ACC_COLS order, transfers (key, kind, proposed,
    issue, start, ready, evict ms)."""
    counts = np.diff(blocks[2], prepend=0)  # [n_blocks] accesses per block
    accesses = {
        "iteration": np.repeat(blocks[0], counts), "layer": np.repeat(blocks[1], counts),
        "expert": acc[0], "request": acc[5], "class": acc[1], "transfer_id": acc[2],
        "need_ms": acc[3], "start_ms": acc[4],
    }
    transfers = dict(zip(("key", "kind", "proposed_ms", "issue_ms", "start_ms", "ready_ms",
                          "evict_ms"), tr))
    return {"accesses": accesses, "transfers": transfers, "tokens": iterations.tokens(),
            "expert_bytes": expert_bytes}


def _view(cols: _Columns, j: int) -> np.ndarray:
    """Column j as a numpy view of its typed array (same itemsize, no copy; the array stays
    exported, so it cannot grow while the view lives: call once the run is over)."""
    col = cols.cols[j]
    dtype = _DTYPES[col.typecode]
    return np.frombuffer(col, dtype=dtype) if len(col) else np.zeros(0, dtype)
