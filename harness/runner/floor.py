"""compute_floor_ms: the TPOT (mean) of a run's trace with every expert resident and no stall.

One no_offload replay through the engine on a cache that holds every expert: its preload is
timed before serving, so no access waits, and every iteration costs exactly its dense and
expert compute (docs/metrics.md, `compute_floor_ms`). With a timing-independent schedule
(max_batch = 1 or every request arriving at once) every system runs the same iterations
with stalls >= 0 on top, so the floor is an exact lower bound on its TPOT; it equals
no_offload's TPOT where no_offload fits. Memoised per (trace, model, hardware, batch, GPUs) in
the `memo` the caller owns (harness/runner/assembly.py, RunMemo.floors).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from harness.sim.backend_sim import SimBackend
from harness.sim.engine import Engine
from harness.sim.gpus import Gpus
from harness.sim.metrics import request_latencies
from systems.no_offload import NoOffload


def compute_floor_ms(model, hw, trace, max_batch: int,
                     memo: dict[tuple, float | None] | None = None,
                     gpus: Gpus | None = None) -> float | None:
    """Mean TPOT (ms, simulated) with every expert resident; None when no request has two
    tokens (no TPOT), like metrics tpot_ms.mean. `memo`: floors computed before (kept).
    `gpus` (harness/sim/gpus.py, a fresh placement): several GPUs, each holding every expert
    its placement lets it hold, the all-to-all paid as in the run (docs/gpus.md)."""
    memo = {} if memo is None else memo
    several = gpus is not None and gpus.active()
    # The specs are dataclasses: their repr lists every field the cost model reads.
    key = (trace.content_sha256(), repr(model), repr(hw), int(max_batch),
           gpus.floor_key() if several else None)
    if key not in memo:
        if several:
            gpus = replace(gpus, make_system=NoOffload)
        engine = Engine(model, SimBackend(model, hw), trace, NoOffload(),
                        model.total_expert_bytes, max_batch, gpus=gpus if several else None)
        tokens = engine.run().stored_tables()["tokens"]  # only tokens: no access columns
        tpot = request_latencies(tokens, trace.arrival_ms)["tpot_ms"]
        tpot = tpot[~np.isnan(tpot)]
        memo[key] = float(np.mean(tpot)) if len(tpot) else None
    return memo[key]


def headroom(tpot_mean_ms: float | None, floor_ms: float | None) -> float | None:
    """TPOT mean / compute floor (>= 1 under a timing-independent schedule); None without
    either."""
    if tpot_mean_ms is None or not floor_ms:
        return None
    return tpot_mean_ms / floor_ms
