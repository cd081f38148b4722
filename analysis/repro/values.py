"""What a claim reads from an experiment's runs: one value per seed, or per request.

A claim on synthetic routing pairs two systems by seed (each seed resamples the requests);
a claim on a real routing sample pairs them by request (the sample's requests are fixed, so
its interval is a bootstrap over them: analysis/repro/stats.py). Rows are those of
analysis/repro/frame.py; `where` selects rows by column value (e.g. system="lru",
model="mixtral_8x7b").
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from analysis.repro import stats


def run_dir(row: dict) -> Path:
    """The run folder of a frame row (analysis/repro/frame.py): results_dir/experiment/run,
    as the runner wrote it (a relative results_dir is relative to the checkout)."""
    cfg = row["_result"]["config"]
    return Path(cfg["results_dir"]) / str(cfg["experiment_name"]) / str(row["run"])


def request_tpot_ms(path: Path) -> np.ndarray:
    """float64 [requests with >= 2 tokens]: each request's TPOT in ms, in request order:
    (time of its last token - time of its token 0) / (tokens - 1), docs/metrics.md
    `tpot_ms`, from the run's tokens.parquet (written whether or not accesses.parquet is)."""
    import pyarrow.parquet as pq

    tok = pq.read_table(Path(path) / "tokens.parquet",
                        columns=["request", "token_index", "time_ms"]).to_pandas()
    by = tok.groupby("request", sort=True)
    n = by["token_index"].max()
    span = by["time_ms"].max() - by["time_ms"].min()
    keep = n >= 1
    return (span[keep] / n[keep]).to_numpy(np.float64)


def seed_of(row: dict) -> int:
    return int(row["_result"]["config"].get("seed") or 0)


def _rows(runs, where: dict) -> list[dict]:
    out = []
    for r in runs.to_dict("records"):
        if r["status"] == "valid" and all(r.get(k) == v for k, v in where.items()):
            out.append(r)
    return out


def by_seed(runs, column: str, **where) -> dict[int, float]:
    """{seed: value of `column`} over the valid runs matching `where`; two runs of one seed
    is an error naming the selection (the claim would pick one at random)."""
    out: dict[int, float] = {}
    for r in _rows(runs, where):
        seed, value = seed_of(r), r.get(column)
        if seed in out:
            raise ValueError(f"two valid runs of seed {seed} match {where}: a claim needs one")
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            out[seed] = float(value)
    return out


def seed_mean(runs, column: str, **where) -> float | None:
    """The mean over seeds of `column` for the valid runs matching `where`: the point a
    table shows and an ordering sorts by; None without one."""
    got = by_seed(runs, column, **where)
    return math.fsum(got.values()) / len(got) if got else None


def headroom(runs, **where) -> float | None:
    """The claims' `headroom` column, one rule for every experiment: the geometric mean of
    TPOT / compute floor over the valid runs matching `where` (every seed and every cell the
    claim averages over; a ratio, so averaged on the log scale). None without a run."""
    vals = [float(r["headroom"]) for r in _rows(runs, where)
            if r.get("headroom") is not None and r["headroom"] == r["headroom"]
            and r["headroom"] > 0]
    return math.exp(math.fsum(map(math.log, vals)) / len(vals)) if vals else None


def per_request_tpot(runs, **where):
    """float64 [requests]: per-request TPOT (ms) of the one valid run matching `where` (a
    real-sample run), in request order (docs/metrics.md `tpot_ms`)."""
    rows = _rows(runs, where)
    if len(rows) != 1:
        raise ValueError(f"{len(rows)} valid runs match {where}; a real-sample claim needs one")
    given = rows[0].get("request_tpot_ms")  # tests give it in the frame
    if given is not None:
        return np.asarray(given, np.float64)
    return request_tpot_ms(run_dir(rows[0]))


def seed_ratio(runs, num: dict, den: dict, column: str = "tpot_mean_ms") -> stats.Estimate | None:
    """`column` of the runs matching `num` over those matching `den`, paired by seed (e.g.
    the baseline's TPOT over the system's: a speed-up); None when either has no run."""
    a, b = by_seed(runs, column, **num), by_seed(runs, column, **den)
    if not set(a) & set(b):
        return None
    return stats.ratio(a, b)


def seed_difference(runs, a: dict, b: dict, column: str = "tpot_mean_ms"
                    ) -> stats.Estimate | None:
    x, y = by_seed(runs, column, **a), by_seed(runs, column, **b)
    if not set(x) & set(y):
        return None
    return stats.difference(x, y)


def request_ratio(runs, num: dict, den: dict) -> stats.Estimate | None:
    """Mean per-request TPOT of `num` over `den` on the same real-sample requests, with the
    paired request bootstrap; None when either run is missing."""
    try:
        a, b = per_request_tpot(runs, **num), per_request_tpot(runs, **den)
    except ValueError:
        return None
    return stats.bootstrap_ratio(a, b)


def request_difference(runs, a: dict, b: dict) -> stats.Estimate | None:
    try:
        x, y = per_request_tpot(runs, **a), per_request_tpot(runs, **b)
    except ValueError:
        return None
    return stats.bootstrap_difference(x, y)
