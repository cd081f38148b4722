"""Recorder: flat lists the engine appends to on its hot path; turned into tables at the end.

Hot path API: `add_access(row)` appends one access, a tuple of ACC_COLS values (expert,
class, transfer id, need ms, start ms, owner request); it is the buffer's own bound
`extend`, so an access costs no Python-level call. A copy's first use (the first access
it served) is derived from the access rows in `tables()`, not tracked per access.

Tables (docs/metrics.md): accesses (one row per (iteration, layer, expert) in the union of
the iteration's tokens), transfers (one row per host-to-device copy), tokens (one row per
generated token, with its iteration's start and end).
"""

from __future__ import annotations

import numpy as np

HIT, LATE, MISS = 0, 1, 2
CLASS_NAMES = ("hit", "late", "miss")
PREFETCH, DEMAND, PRELOAD = 0, 1, 2
KIND_NAMES = ("prefetch", "demand", "preload")
ACC_COLS = 6  # expert, class, transfer id, need ms, start ms, owner request
_TR_COLS = 6  # key, kind, proposed ms, issue ms, start ms, ready ms


class Recorder:
    def __init__(self, expert_bytes: int):
        self.expert_bytes = expert_bytes
        self._acc: list = []  # flat, ACC_COLS values per access
        self.add_access = self._acc.extend  # one access: a tuple of ACC_COLS values
        self._blocks: list = []  # iteration, layer, end access index
        self._tr: list = []
        self.tr_evict_ms: list[float] = []
        self._iters: list = []  # index, kind, start ms, end ms
        self._members: list = []  # iteration, request, step
        self.prefetch_dropped = 0
        self.peak_cache_bytes = 0

    # ---- hot path ---------------------------------------------------------------------------
    def block(self, iteration: int, layer: int) -> None:
        """Close the current (iteration, layer): its accesses are the rows appended since."""
        self._blocks.extend((iteration, layer, len(self._acc) // ACC_COLS))

    def transfer(self, key: int, kind: int, proposed: float, issue: float, start: float,
                 ready: float) -> int:
        self._tr.extend((key, kind, proposed, issue, start, ready))
        self.tr_evict_ms.append(float("nan"))
        return len(self.tr_evict_ms) - 1

    def evicted(self, tid: int, t: float) -> None:
        self.tr_evict_ms[tid] = t

    def iteration(self, index: int, kind: str, start: float, end: float, members) -> None:
        self._iters.append((index, kind, start, end))
        for r, s in members:
            self._members.extend((index, r, s))

    # ---- tables -------------------------------------------------------------------------------
    @property
    def num_accesses(self) -> int:
        return len(self._acc) // ACC_COLS

    def tables(self) -> dict[str, dict[str, np.ndarray]]:
        """Column arrays for accesses, transfers, iterations and members."""
        acc = np.array(self._acc, dtype=np.float64).reshape(-1, ACC_COLS)
        blocks = np.array(self._blocks, dtype=np.int64).reshape(-1, 3)
        n_acc = len(acc)
        counts = np.diff(np.concatenate([[0], blocks[:, 2]])) if len(blocks) else np.zeros(0)
        tr = np.array(self._tr, dtype=np.float64).reshape(-1, _TR_COLS)
        tid = acc[:, 2].astype(np.int64)
        idx = np.arange(n_acc)
        # First access each copy served (-1: never used): the least access index per copy.
        first_use = np.full(len(tr), n_acc, dtype=np.int64)
        np.minimum.at(first_use, tid, idx)
        first_use[first_use == n_acc] = -1
        used_first = (first_use[tid] == idx) if n_acc else np.zeros(0, bool)
        kind = tr[tid, 1].astype(np.int8) if n_acc else np.zeros(0, np.int8)
        accesses = {
            "iteration": np.repeat(blocks[:, 0], counts),
            "layer": np.repeat(blocks[:, 1], counts).astype(np.int32),
            "expert": acc[:, 0].astype(np.int32),
            "request": acc[:, 5].astype(np.int64),
            "class": acc[:, 1].astype(np.int8),
            "issued_by": kind,
            "transfer_id": tid,
            "issue_ms": tr[tid, 3] if n_acc else np.zeros(0),
            "ready_ms": tr[tid, 5] if n_acc else np.zeros(0),
            "need_ms": acc[:, 3],
            "start_ms": acc[:, 4],
            "stall_ms": acc[:, 4] - acc[:, 3],
            "bytes": np.where(used_first, self.expert_bytes, 0),
        }
        transfers = {
            "transfer_id": np.arange(len(tr), dtype=np.int64),
            "key": tr[:, 0].astype(np.int64),
            "kind": tr[:, 1].astype(np.int8),
            "proposed_ms": tr[:, 2], "issue_ms": tr[:, 3], "start_ms": tr[:, 4],
            "ready_ms": tr[:, 5],
            "first_use_access": first_use,
            "evict_ms": np.array(self.tr_evict_ms, dtype=np.float64),
            "bytes": np.full(len(tr), self.expert_bytes, dtype=np.int64),
        }
        # Iterations are numbered 0.. in order, so the index is the row.
        it_start = np.array([i[2] for i in self._iters], dtype=np.float64)
        it_end = np.array([i[3] for i in self._iters], dtype=np.float64)
        it_prefill = np.array([i[1] == "prefill" for i in self._iters], dtype=bool)
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
