"""Per-request prompt and output lengths of the synthetic generator (`workload.lengths`).

`fixed` (the SyntheticConfig default, and Table 1's setting: MoE-Infinity fixed prompt 512,
decode 32): every request has prompt_len and output_len. `fitted`: each request draws both
from the empirical distribution of `length_source` (workloads/length_tables.py, fitted by
workloads/length_fit.py on real length data: Azure LLM inference traces, ShareGPT), scaled
so that its mean is prompt_len and output_len.

The distribution is the piecewise-linear quantile function through the table's knots (lengths
/ mean at the probabilities P_GRID: every percentile, then finer steps in the top 1%, where
the long requests are), rescaled so that its mean is exactly 1. A draw: u uniform in (0, 1),
x = that function at u, length = rint(mean * x) clipped to [1, MAX_REQUEST_TOKENS]. Prompt and
output are drawn independently (rank correlation in the data: 0.07 Azure conv, -0.02 Azure
code, 0.17 ShareGPT) from the named streams `lengths/<split>/prompt` and `.../output`, so the
calibration split gets other lengths and a longer run begins with the same ones. Rounding and
the clip at 1 move the mean by well under a token for means >= 8.

Portable: uniform draws and elementwise +, -, *, /, rint and comparisons only
(core.numerics); the table's mean is math.fsum's correctly rounded sum.
"""

from __future__ import annotations

import math

import numpy as np

from core.numerics import uniform
from core.rng import stream
from workloads.arrivals import MAX_REQUEST_TOKENS
from workloads.length_tables import GRID_N, LENGTH_TABLES

LENGTH_MODES = ("fixed", "fitted")
P_GRID = tuple(n / 10000 for n in GRID_N)  # knot probabilities


def _scaled_knots(quantiles: tuple, mean: float) -> np.ndarray:
    """float64 knots of the quantile function with mean `mean` (trapezoids on P_GRID)."""
    q = [float(v) for v in quantiles]
    m = math.fsum((P_GRID[i + 1] - P_GRID[i]) * (q[i] + q[i + 1]) / 2
                  for i in range(len(q) - 1))
    return np.array(q, np.float64) * (float(mean) / m)


def draw(quantiles: tuple, mean: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """int64 [n]: lengths with the table's shape and the given mean."""
    knots = _scaled_knots(quantiles, mean)
    grid = np.array(P_GRID, np.float64)
    u = uniform(rng, (n,))
    i = np.clip(np.searchsorted(grid, u, side="right") - 1, 0, len(grid) - 2)
    frac = (u - grid[i]) / (grid[i + 1] - grid[i])
    x = knots[i] + frac * (knots[i + 1] - knots[i])
    return np.clip(np.rint(x), 1, MAX_REQUEST_TOKENS).astype(np.int64)


def request_lengths(cfg, n: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(prompt_len int64 [n], output_len int64 [n], where they come from) for SyntheticConfig
    `cfg` without replayed lengths."""
    if cfg.lengths == "fixed":
        return (np.full(n, int(cfg.prompt_len), np.int64),
                np.full(n, int(cfg.output_len), np.int64), "config")
    table = LENGTH_TABLES[cfg.length_source]
    prompt = draw(table["prompt"]["quantiles"], cfg.prompt_len, n,
                  stream(int(cfg.seed), f"lengths/{cfg.split}/prompt"))
    output = draw(table["output"]["quantiles"], cfg.output_len, n,
                  stream(int(cfg.seed), f"lengths/{cfg.split}/output"))
    return prompt, output, f"fitted:{cfg.length_source}"
