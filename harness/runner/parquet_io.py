"""The parquet files of a run (schema 2.0): only stored columns, each in a lossless coding.

Files hold the stored columns of harness/sim/tables.py; `read_tables(run_dir)` is the one
reader: it decodes them and returns the full tables (every column of docs/metrics.md, with
the same values and dtypes as `Recorder.tables()`). Coding of a float64 column (schema
metadata `moebench.codecs`, {column: coding}):

  raw        the values;
  delta      x[i] - x[i-1] (x[-1] = 0); read back as a running sum, in order;
  base:COL   x - COL; read back as COL + stored.

A coding is used only when the write checks that reading it back gives the same bits (a
difference of two close floats is exact, so times in order code exactly); otherwise the
column is stored raw. Differences of times in order repeat (a copy or an expert call takes
a fixed time), so dictionary encoding + zstd keeps a Table 1 run under 10 MB instead of 58.
Rows are written in row groups of ROW_GROUP, coded group by group, so writing holds one group's
arrow copy at a time.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from harness.sim.tables import (
    STORED_ACCESS,
    STORED_TRANSFER,
    TOKEN_COLS,
    eager,
    first_use,
    full_tables,
)

PARQUET_SCHEMA_VERSION = "2.0"
ROW_GROUP = 1 << 20  # rows per row group
# Preferred coding per float column of the stored tables (others are raw).
CODINGS = {
    "accesses": {"start_ms": "delta", "need_ms": "base:start_ms"},
    "transfers": {"proposed_ms": "delta", "issue_ms": "base:proposed_ms",
                  "start_ms": "base:issue_ms", "ready_ms": "base:start_ms"},
    "tokens": {},
}
COLUMNS = {"accesses": STORED_ACCESS, "transfers": STORED_TRANSFER, "tokens": TOKEN_COLS}
_PLAIN = ("evict_ms", "transfer_id")  # too many distinct values for a dictionary


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.int64)


def _code(x: np.ndarray, coding: str, cols: dict, lo: int, hi: int) -> np.ndarray:
    """Rows lo:hi of column x in `coding` (delta takes x[lo-1] as its previous value)."""
    if coding == "delta":
        prev = x[lo - 1] if lo else 0.0
        return np.diff(x[lo:hi], prepend=prev)
    if coding.startswith("base:"):
        return x[lo:hi] - cols[coding[5:]][lo:hi]
    return x[lo:hi]


def _decode(coded: np.ndarray, coding: str, out: dict) -> np.ndarray:
    if coding == "delta":
        return np.cumsum(coded)
    if coding.startswith("base:"):
        return out[coding[5:]] + coded
    return coded


def _codings(name: str, cols: dict) -> dict[str, str]:
    """Each column's coding: the preferred one where reading it back is exact, else raw."""
    got = {}
    for col, coding in CODINGS[name].items():
        x, ok, carry = cols[col], True, 0.0
        for lo in range(0, len(x), ROW_GROUP):
            hi = min(lo + ROW_GROUP, len(x))
            coded = _code(x, coding, cols, lo, hi)
            if coding == "delta":  # the running sum continued from the previous group
                coded[0] += carry
                back = np.cumsum(coded)
                carry = back[-1]
            else:
                back = _decode(coded, coding, {k: v[lo:hi] for k, v in cols.items()})
            if not np.array_equal(_bits(back), _bits(x[lo:hi])):
                ok = False
                break
        got[col] = coding if ok else "raw"
    return got


def write_table(name: str, cols: dict, path: Path, run_id: str, request_ids: list[str] | None,
                expert_bytes: int, extra: tuple[str, ...] = ()) -> None:
    """Write stored table `name` ({column: array}, plus the `extra` columns, raw) to `path`
    in row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = COLUMNS[name] + extra
    codings = _codings(name, cols)
    n = len(cols[names[0]])
    meta = {b"moebench.schema": name.encode(),
            b"moebench.schema_version": PARQUET_SCHEMA_VERSION.encode(),
            b"moebench.codecs": json.dumps(codings, sort_keys=True).encode(),
            b"moebench.expert_bytes": str(int(expert_bytes)).encode()}

    def group(lo: int, hi: int):
        arrays = {"run_id": pa.repeat(pa.scalar(run_id, pa.string()), hi - lo)}
        if request_ids is not None and "request" in cols:
            # The trace's request id for each row, dictionary-encoded (a few bytes per row).
            arrays["request_id"] = pa.DictionaryArray.from_arrays(
                pa.array(cols["request"][lo:hi], type=pa.int32()),
                pa.array(request_ids, pa.string()))
        for col in names:
            arrays[col] = pa.array(_code(cols[col], codings.get(col, "raw"), cols, lo, hi))
        return pa.table(arrays).replace_schema_metadata(meta)

    first = group(0, min(n, ROW_GROUP))
    plain = [c for c in _PLAIN if c in names]
    with pq.ParquetWriter(path, first.schema, compression="zstd",
                          use_dictionary=[c for c in first.column_names if c not in plain],
                          column_encoding={c: "PLAIN" if c == "evict_ms" else
                                           "DELTA_BINARY_PACKED" for c in plain}) as writer:
        writer.write_table(first, row_group_size=ROW_GROUP)
        del first
        for lo in range(ROW_GROUP, n, ROW_GROUP):
            writer.write_table(group(lo, min(n, lo + ROW_GROUP)), row_group_size=ROW_GROUP)


def write_tables(run_dir: Path, stored: dict, run_id: str, request_ids: list[str] | None,
                 save_rows: bool = True) -> None:
    """The run's three files (accesses.parquet only with `save_rows`; without it,
    transfers.parquet keeps `first_use_access`, which is derived from the accesses)."""
    eb = stored["expert_bytes"]
    tr = stored["transfers"]
    if not save_rows:
        tr = {**tr, "first_use_access": first_use(stored["accesses"]["transfer_id"],
                                                  len(tr["kind"]))}
    # The small files first: once accesses.parquet appears, the others are complete
    # (tests/runner/test_store.py watches for it to kill a writer inside the write).
    write_table("tokens", stored["tokens"], run_dir / "tokens.parquet", run_id, request_ids, eb)
    write_table("transfers", tr, run_dir / "transfers.parquet", run_id, None, eb,
                () if save_rows else ("first_use_access",))
    if save_rows:
        write_table("accesses", stored["accesses"], run_dir / "accesses.parquet", run_id,
                    request_ids, eb)


def _read(path: Path) -> tuple[dict, int]:
    """One file's stored columns, decoded, and its expert_bytes."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    codings = json.loads(meta.get(b"moebench.codecs", b"{}"))
    names = [c for c in table.column_names if c not in ("run_id", "request_id")]
    cols: dict = {}
    while len(cols) < len(names):  # a base column is decoded before those coded against it
        for col in names:
            coding = codings.get(col, "raw")
            if col not in cols and not (coding.startswith("base:") and coding[5:] not in cols):
                cols[col] = _decode(table.column(col).to_numpy(), coding, cols)
    return {c: cols[c] for c in names}, int(meta[b"moebench.expert_bytes"])


def read_stored(run_dir: Path) -> dict:
    """The stored tables of a run folder, decoded (harness/sim/tables.py). Without
    accesses.parquet (`save_rows: false`) the accesses table has no rows."""
    run_dir = Path(run_dir)
    out: dict = {}
    for name in ("transfers", "tokens"):
        out[name], out["expert_bytes"] = _read(run_dir / f"{name}.parquet")
    path = run_dir / "accesses.parquet"
    out["accesses"] = _read(path)[0] if path.exists() else {
        c: np.zeros(0, np.float64 if c.endswith("_ms") else np.int8 if c == "class" else
                    np.int32) for c in STORED_ACCESS}
    return out


def read_tables(run_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every column of the three tables of a run folder (docs/metrics.md), as numpy arrays
    with the dtypes of `Recorder.tables()`."""
    return eager(full_tables(read_stored(run_dir)))
