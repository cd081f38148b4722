"""Recorder: typed columns the engine appends to on its hot path; turned into tables at the end.

Hot path API: `add_access(row)` appends one access, a tuple of ACC_COLS values (expert,
class, transfer id, need ms, start ms, owner request); it is the bound `extend` of a small
list buffer, so an access costs no Python-level call. Once the buffer holds _FLUSH values,
`block()` moves it into one typed array per column (struct of arrays: int32 expert and
owner, int8 class, int64 transfer id, float64 times; 29 bytes an access, no Python object
per access). array.extend of a tuple is ~9x slower than list.extend, while fromlist of a
full buffer is a C loop. Blocks and transfers are kept the same way, iterations in typed
arrays: about 44 bytes per access in all (docs/engine.md, cost model). A copy's first use
(the first access it served) is derived from the access rows in `tables()`, not tracked
per access.

Tables (docs/metrics.md): accesses (one row per (iteration, layer, expert) in the union of
the iteration's tokens), transfers (one row per host-to-device copy), tokens (one row per
generated token, with its iteration's start and end).
"""

from __future__ import annotations

from array import array

import numpy as np

HIT, LATE, MISS = 0, 1, 2
CLASS_NAMES = ("hit", "late", "miss")
PREFETCH, DEMAND, PRELOAD = 0, 1, 2
KIND_NAMES = ("prefetch", "demand", "preload")
ACC_COLS = 6  # values per access row: expert, class, transfer id, need ms, start ms, owner request
# Values a list buffer holds before it moves into its typed columns (~0.5 MB of pointers):
# large enough that the move is rare, small enough that its Python objects stay negligible.
_FLUSH = 1 << 16
_NAN = float("nan")  # a transfer's evict ms while it is resident


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

    def np(self, j: int, dtype) -> np.ndarray:
        return np.array(self.cols[j], dtype=dtype)


class Recorder:
    def __init__(self, expert_bytes: int):
        self.expert_bytes = expert_bytes
        # expert, class, transfer id, need ms, start ms, owner request (ACC_COLS)
        self._acc = _Columns("ibqddi")
        self._acc_buf = self._acc.buf
        self.add_access = self._acc_buf.extend  # one access: a tuple of ACC_COLS values
        self._acc_done = 0  # accesses already moved into the columns
        self._blocks = _Columns("qqq")  # iteration, layer, end access index
        self._blocks_buf = self._blocks.buf
        self._tr = _Columns("qbdddd")  # key, kind, proposed, issue, start, ready ms
        self._tr_buf = self._tr.buf
        self.tr_evict_ms = array("d")  # per transfer; NaN while resident
        self._it_ms = array("d")  # start ms, end ms per iteration (numbered 0.. in order)
        self._it_prefill = array("b")
        self._members = array("q")  # iteration, request, step
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
        self._it_ms.append(start)
        self._it_ms.append(end)
        self._it_prefill.append(kind == "prefill")
        m = self._members
        for r, s in members:
            m.append(index)
            m.append(r)
            m.append(s)

    # ---- tables -------------------------------------------------------------------------------
    @property
    def num_accesses(self) -> int:
        return len(self._acc)

    def tables(self) -> dict[str, dict[str, np.ndarray]]:
        """Column arrays for accesses, transfers, iterations and members."""
        self._flush()
        acc, tr_c = self._acc, self._tr
        blocks = [self._blocks.np(j, np.int64) for j in range(3)]
        n_acc, n_tr = len(acc), len(tr_c)
        counts = np.diff(np.concatenate([[0], blocks[2]])) if len(blocks[2]) else np.zeros(0)
        tid = acc.np(2, np.int64)
        need_ms, start_ms = acc.np(3, np.float64), acc.np(4, np.float64)
        tr_kind = tr_c.np(1, np.int8)
        tr_issue_ms, tr_ready_ms = tr_c.np(3, np.float64), tr_c.np(5, np.float64)
        idx = np.arange(n_acc)
        # First access each copy served (-1: never used): the least access index per copy.
        first_use = np.full(n_tr, n_acc, dtype=np.int64)
        np.minimum.at(first_use, tid, idx)
        first_use[first_use == n_acc] = -1
        used_first = (first_use[tid] == idx) if n_acc else np.zeros(0, bool)
        kind = tr_kind[tid] if n_acc else np.zeros(0, np.int8)
        accesses = {
            "iteration": np.repeat(blocks[0], counts),
            "layer": np.repeat(blocks[1], counts).astype(np.int32),
            "expert": acc.np(0, np.int32),
            "request": acc.np(5, np.int64),
            "class": acc.np(1, np.int8),
            "issued_by": kind,
            "transfer_id": tid,
            "issue_ms": tr_issue_ms[tid] if n_acc else np.zeros(0),
            "ready_ms": tr_ready_ms[tid] if n_acc else np.zeros(0),
            "need_ms": need_ms,
            "start_ms": start_ms,
            "stall_ms": start_ms - need_ms,
            "bytes": np.where(used_first, self.expert_bytes, 0),
        }
        transfers = {
            "transfer_id": np.arange(n_tr, dtype=np.int64),
            "key": tr_c.np(0, np.int64),
            "kind": tr_kind,
            "proposed_ms": tr_c.np(2, np.float64), "issue_ms": tr_issue_ms,
            "start_ms": tr_c.np(4, np.float64), "ready_ms": tr_ready_ms,
            "first_use_access": first_use,
            "evict_ms": np.array(self.tr_evict_ms, dtype=np.float64),
            "bytes": np.full(n_tr, self.expert_bytes, dtype=np.int64),
        }
        # Iterations are numbered 0.. in order, so the index is the row.
        it_ms = np.array(self._it_ms, dtype=np.float64).reshape(-1, 2)
        it_start, it_end = it_ms[:, 0].copy(), it_ms[:, 1].copy()
        it_prefill = np.array(self._it_prefill, dtype=np.int8).astype(bool)
        accesses["iteration_start_ms"] = it_start[accesses["iteration"]]
        accesses["prefill"] = it_prefill[accesses["iteration"]]
        mem = np.array(self._members, dtype=np.int64).reshape(-1, 3)
        # Each access's request step: look (iteration, request) up among the members.
        width = int(mem[:, 1].max()) + 1 if len(mem) else 1
        mem_key = mem[:, 0] * width + mem[:, 1]
        order = np.argsort(mem_key, kind="stable")
        pos = np.searchsorted(mem_key[order], accesses["iteration"] * width + accesses["request"])
        accesses["step"] = mem[order[pos], 2].astype(np.int32) if n_acc else np.zeros(0, np.int32)
        tokens = {
            "request": mem[:, 1], "token_index": mem[:, 2], "iteration": mem[:, 0],
            "time_ms": it_end[mem[:, 0]], "iteration_start_ms": it_start[mem[:, 0]],
            "prefill": it_prefill[mem[:, 0]],
        }
        return {"accesses": accesses, "transfers": transfers, "tokens": tokens}
