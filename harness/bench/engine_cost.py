"""The engine's own cost model, measured: CPU microseconds per block, per access and per load.

`moebench bench-sim` runs this in a fresh child (BLAS one thread). It times `on_demand` (the
policy with the least work of its own: a miss evicts the least recently used evictable
expert, nothing is prefetched) at the Table 1 setting over settings that move the three
counts apart: batch 1, 4 and 16 (more accesses per block) and three expert-cache budgets
(more loads per access as the budget shrinks). Each setting's CPU seconds (Engine
construction, `engine.run()`, `stored_tables()`) are the median of `repeats`; a least-squares
fit of

    cpu_s = fixed_ms * 1e-3 + (blocks * block_us + accesses * access_us + loads * load_us) * 1e-6

over the settings gives the costs (fixed: per run, the same trace in every setting: the
index, the scheduler's and the tables' set-up), with the fit's largest relative residual so a
reader sees how well the linear model holds. Both engine cores are measured when the
compiled one is built. The figures are SIMULATED-engine timings on synthetic routing.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

# (max_batch, expert_cache_gb); null: Table 1's budget (everything the GPU has left)
SETTINGS = ((1, None), (1, 12.0), (1, 6.0), (4, None), (4, 8.0), (16, None), (16, 12.0))
COUNTS = ("blocks", "accesses", "loads")
UNITS = ("block_us", "access_us", "load_us")


def measure(requests: int, repeats: int) -> dict:
    """Per engine core: the settings' counts and CPU seconds, and the fitted costs."""
    from harness.runner.assembly import assemble
    from harness.runner.config import compose_config
    from harness.sim.cores import compiled_available

    cfg = compose_config(["experiment=table1", "system=on_demand", "progress=false",
                          f"workload.num_requests={requests}", "trace_cache_dir=null"])
    run = assemble(cfg)  # on_demand reads no per-token field: the trace holds none
    out = {"system": "on_demand", "requests": requests, "repeats": repeats, "cores": {}}
    for core in ("compiled", "python") if compiled_available() else ("python",):
        rows = [_setting(run, batch, cache_gb, core, repeats) for batch, cache_gb in SETTINGS]
        out["cores"][core] = {"settings": rows, **fit(rows)}
    return out


def _setting(run, batch: int, cache_gb: float | None, core: str, repeats: int) -> dict:
    """One setting's counts and median CPU seconds over `repeats` engine runs."""
    from dataclasses import replace

    from core.blocks import BlockIndex
    from harness.runner.assembly import build_engine, build_system, memory_plan

    run = replace(run, plan=memory_plan(run.model, run.hw, run.trace, batch, cache_gb),
                  engine=replace(run.engine, max_batch=batch, core=core))
    times, counts = [], None
    for _ in range(repeats):
        system = build_system(run.cfg)
        BlockIndex.forget(run.trace)  # every run builds its index
        t0 = time.process_time()
        tables = build_engine(run, system).run().stored_tables()
        times.append(time.process_time() - t0)
        counts = {"blocks": int(np.count_nonzero(np.diff(
                      tables["accesses"]["iteration"], prepend=-1)
                      | np.diff(tables["accesses"]["layer"], prepend=-1))),
                  "accesses": len(tables["accesses"]["expert"]),
                  "loads": len(tables["transfers"]["key"])}
        tables = None
    return {"max_batch": batch, "expert_cache_gb": cache_gb, **counts,
            "cpu_s": statistics.median(times)}


def fit(rows: list[dict]) -> dict:
    """Least squares cpu_s ~ fixed + counts @ costs; the fixed cost in milliseconds, the
    others in microseconds, and the largest |residual| / cpu_s."""
    a = np.array([[1.0] + [r[c] for c in COUNTS] for r in rows], dtype=np.float64)
    y = np.array([r["cpu_s"] for r in rows], dtype=np.float64)
    costs, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = np.abs(a @ costs - y) / y
    # a negative term: the settings did not move the counts apart enough for this core
    # (blocks and accesses both follow the batch); its costs are then not to be read alone
    return {"fixed_ms": float(costs[0] * 1e3)} | {
        u: float(v * 1e6) for u, v in zip(UNITS, costs[1:])} | {
        "max_relative_residual": float(resid.max()), "separable": bool((costs >= 0).all())}
