"""Per-request latency of a run and "requests to recover", for workload_shift.

Per-request TPOT (ms): analysis/repro/values.py, `request_tpot_ms`.

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

import numpy as np

WINDOW = 5  # requests per rolling window


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
