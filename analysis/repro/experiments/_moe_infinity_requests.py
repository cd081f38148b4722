"""Per-request latency of a run and "requests to recover", for workload_shift.

Per-request TPOT (ms): (time of the request's last token - time of its token 0) / (tokens - 1),
the definition of docs/metrics.md `tpot_ms`, read from the run's tokens.parquet (written
whether or not accesses.parquet is), in request (serving) order.

Requests to recover, for a stream x_0 .. x_{n-1} of per-request TPOTs served one at a time
(batch 1) after the EAM collection lost its relevant history:
  steady state S = mean of the second half, x_{n//2} .. x_{n-1}; sd their standard deviation;
  m_i = mean of the window x_i .. x_{i+WINDOW-1};
  band = 2 * sd / sqrt(WINDOW) (two standard errors of a window mean in steady state);
  R = the least i with m_i <= S + band: the requests served before a window that is back
  within the band (0: the first window already is). None when no window is.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

WINDOW = 5  # requests per rolling window


def run_dir(row: dict) -> Path:
    """The run folder of a frame row (analysis/repro/frame.py): results_dir/experiment/run,
    as the runner wrote it (a relative results_dir is relative to the checkout)."""
    cfg = row["_result"]["config"]
    return Path(cfg["results_dir"]) / str(cfg["experiment_name"]) / str(row["run"])


def request_tpot_ms(path: Path) -> np.ndarray:
    """float64 [requests with >= 2 tokens]: each request's TPOT in ms, in request order."""
    import pyarrow.parquet as pq

    tok = pq.read_table(Path(path) / "tokens.parquet",
                        columns=["request", "token_index", "time_ms"]).to_pandas()
    by = tok.groupby("request", sort=True)
    n = by["token_index"].max()
    span = by["time_ms"].max() - by["time_ms"].min()
    keep = n >= 1
    return (span[keep] / n[keep]).to_numpy(np.float64)


def recovery(x) -> dict:
    """{"requests", "steady_ms", "band_ms", "first_window_excess"} for one stream (above)."""
    x = np.asarray(x, np.float64)
    if len(x) < 2 * WINDOW:
        raise ValueError(f"a stream of {len(x)} requests; recovery needs >= {2 * WINDOW}")
    tail = x[len(x) // 2:]
    steady, sd = float(tail.mean()), float(tail.std(ddof=1))
    band = 2 * sd / math.sqrt(WINDOW)
    means = np.convolve(x, np.ones(WINDOW) / WINDOW, mode="valid")  # m_0 .. m_{n-WINDOW}
    back = np.flatnonzero(means <= steady + band)
    return {"requests": int(back[0]) if back.size else None, "steady_ms": steady,
            "band_ms": band, "first_window_excess": float(means[0] / steady - 1)}
