"""Result tables: the stored columns and the derived ones (docs/metrics.md, "Parquet tables").

A run's facts are its *stored* columns, one per recorded value (the recorder's typed arrays,
viewed without a copy; the parquet files hold exactly these). Every other column of the
three tables is a join or a difference of stored ones, computed here and nowhere else, so
`Recorder.tables()`, the metrics of a run and the files' reader (harness/runner/
parquet_io.py) all see the same values and dtypes:

  stored accesses [n_acc]: iteration, layer, expert, request (int32), class (int8),
    transfer_id (int32), need_ms, start_ms (float64)
  stored transfers [n_tr]: key (int64), kind (int8), proposed_ms, issue_ms, start_ms,
    ready_ms, evict_ms (float64)
  tokens [n_tokens]: stored whole (request, token_index, iteration int64; time_ms,
    iteration_start_ms float64; prefill bool)

`full_tables(stored)` gives lazy mappings: a derived column is computed on first use and
kept, so a run's summary builds only the columns it reads (a stall and a phase flag, 9 bytes
an access) instead of the full 105 bytes an access.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# Column order of the full tables (the order of the 1.0 files).
ACCESS_COLS = ("iteration", "layer", "expert", "request", "class", "issued_by", "transfer_id",
               "issue_ms", "ready_ms", "need_ms", "start_ms", "stall_ms", "bytes",
               "iteration_start_ms", "prefill", "step")
TRANSFER_COLS = ("transfer_id", "key", "kind", "proposed_ms", "issue_ms", "start_ms",
                 "ready_ms", "first_use_access", "evict_ms", "bytes")
STORED_ACCESS = ("iteration", "layer", "expert", "request", "class", "transfer_id", "need_ms",
                 "start_ms")
STORED_TRANSFER = ("key", "kind", "proposed_ms", "issue_ms", "start_ms", "ready_ms",
                   "evict_ms")
TOKEN_COLS = ("request", "token_index", "iteration", "time_ms", "iteration_start_ms",
              "prefill")
# Full-table dtype of each stored access column that is narrower in storage.
_WIDEN = {"iteration": np.int64, "request": np.int64, "transfer_id": np.int64}
# Accesses per step of the first-use scan: bounds its index array to 8 MB.
_CHUNK = 1 << 20


class _Lazy(Mapping):
    """Columns of one table: stored ones as given, derived ones computed on first use."""

    def __init__(self, names: tuple[str, ...], stored: dict, derive):
        self._names, self._cols, self._derive = names, dict(stored), derive

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cols:
            if name not in self._names:
                raise KeyError(name)
            self._cols[name] = self._derive(name)
        return self._cols[name]

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def first_use(tid: np.ndarray, n_tr: int) -> np.ndarray:
    """[n_tr] int64: the least access index per transfer (-1: never used)."""
    n_acc = len(tid)
    out = np.full(n_tr, n_acc, dtype=np.int64)
    for lo in range(0, n_acc, _CHUNK):
        hi = min(lo + _CHUNK, n_acc)
        part, at = tid[lo:hi], np.arange(lo, hi)
        if len(part) and part.min() < 0:  # CPU-run accesses have no transfer (-1)
            part, at = part[part >= 0], at[part >= 0]
        np.minimum.at(out, part, at)
    out[out == n_acc] = -1
    return out


def iteration_table(tokens: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration (numbered 0.., each with a token): start ms, float64, and prefill, bool."""
    it = tokens["iteration"]
    n = int(it.max()) + 1 if len(it) else 0
    start, prefill = np.zeros(n), np.zeros(n, dtype=bool)
    start[it], prefill[it] = tokens["iteration_start_ms"], tokens["prefill"]
    return start, prefill


def _steps(tokens: dict, iteration: np.ndarray, request: np.ndarray) -> np.ndarray:
    """Each access's request step, int32: (iteration, request) looked up among the tokens."""
    if not len(iteration):
        return np.zeros(0, np.int32)
    t_it, t_req = tokens["iteration"], tokens["request"]
    width = int(t_req.max()) + 1 if len(t_req) else 1
    key = t_it * width + t_req
    order = np.argsort(key, kind="stable")
    pos = np.searchsorted(key[order], iteration.astype(np.int64) * width + request)
    return tokens["token_index"][order[pos]].astype(np.int32)


class _Derive:
    """The derived columns of one run's tables, from its stored columns."""

    def __init__(self, stored: dict):
        self.acc, self.tr, self.tok = stored["accesses"], stored["transfers"], stored["tokens"]
        self.expert_bytes = int(stored["expert_bytes"])
        self.n_acc, self.n_tr = len(self.acc["class"]), len(self.tr["kind"])
        self._first_use = self._iterations = None

    def first_use(self) -> np.ndarray:
        if self._first_use is None:
            self._first_use = first_use(self.acc["transfer_id"], self.n_tr)
        return self._first_use

    def iterations(self) -> tuple[np.ndarray, np.ndarray]:
        if self._iterations is None:
            self._iterations = iteration_table(self.tok)
        return self._iterations

    def transfer_col(self, name: str) -> np.ndarray:
        if name == "transfer_id":
            return np.arange(self.n_tr, dtype=np.int64)
        if name == "first_use_access":
            return self.first_use()
        return np.full(self.n_tr, self.expert_bytes, dtype=np.int64)  # bytes

    def access_col(self, name: str) -> np.ndarray:
        acc, tid = self.acc, self.acc["transfer_id"]
        if name in _WIDEN:
            return acc[name].astype(_WIDEN[name])
        if name in ("issued_by", "issue_ms", "ready_ms"):
            src = self.tr["kind" if name == "issued_by" else name]
            if not self.n_acc:
                return np.zeros(0, src.dtype)
            if tid.min() >= 0:
                return src[tid]
            # CPU-run accesses have no transfer (-1): kind -1, NaN times
            out = np.full(self.n_acc, -1 if name == "issued_by" else np.nan, src.dtype)
            copied = tid >= 0
            out[copied] = src[tid[copied]]
            return out
        if name == "stall_ms":
            return acc["start_ms"] - acc["need_ms"]
        if name == "bytes":
            used = np.zeros(self.n_acc, bool)  # the copy's first use (CPU runs: none)
            copied = tid >= 0
            used[copied] = self.first_use()[tid[copied]] == np.flatnonzero(copied)
            return np.where(used, self.expert_bytes, 0)
        if name == "step":
            return _steps(self.tok, acc["iteration"], acc["request"])
        start, prefill = self.iterations()
        return (start if name == "iteration_start_ms" else prefill)[acc["iteration"]]


def full_tables(stored: dict) -> dict[str, Mapping]:
    """{accesses, transfers, tokens}: lazy full tables over `stored` ({accesses, transfers,
    tokens} of stored columns and `expert_bytes`); formulas in docs/metrics.md."""
    d = _Derive(stored)
    accesses = {k: v for k, v in d.acc.items() if k not in _WIDEN}
    # transfers may hold first_use_access too (stored where accesses.parquet is not)
    return {"accesses": _Lazy(ACCESS_COLS, accesses, d.access_col),
            "transfers": _Lazy(TRANSFER_COLS, dict(d.tr), d.transfer_col),
            "tokens": dict(d.tok)}


def eager(tables: dict[str, Mapping]) -> dict[str, dict[str, np.ndarray]]:
    """Every column of every table computed, as plain dicts in the file column order."""
    return {name: {col: table[col] for col in table} for name, table in tables.items()}
