"""compute_floor_ms and headroom (docs/metrics.md) recomputed from a run's own files: under a
timing-independent schedule the floor replay runs the same iterations, each shorter by
exactly its stall, so no engine code is needed to check it."""

from __future__ import annotations

import numpy as np
import pytest

from harness.runner.config import compose_config
from harness.runner.parquet_io import read_tables
from harness.runner.run import run_config

TINY = ["workload.num_requests=4", "workload.prompt_len=16", "workload.output_len=4",
        "calibration_requests=2", "progress=false"]
# lru: batch 1, requests 40 ms apart (each request decodes alone: same iterations with or
# without stalls); on_demand: a static batch of 2, all arriving at once; lru_batch2: spread
# arrivals at batch 2, where the batches themselves depend on timing (no identity).
CASES = {
    "lru": ["system=lru", "workload.arrival_ms=40.0"],
    "on_demand": ["system=on_demand", "max_batch=2", "expert_cache_gb=8"],
    "lru_batch2": ["system=lru", "max_batch=2", "expert_cache_gb=8", "workload.arrival_ms=5.0"],
}


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-12)


@pytest.fixture(scope="module", params=sorted(CASES))
def run(request, tmp_path_factory):
    name = request.param
    out = tmp_path_factory.mktemp(f"floor_{name}")
    cfg = compose_config([*CASES[name], *TINY], run_name=name, results_dir=str(out))
    result = run_config(cfg)
    assert result["status"] == "valid", result["reason"]
    run_dir = out / "default" / name

    tables = read_tables(run_dir)
    return {"name": name, "m": result["metrics"], "acc": tables["accesses"],
            "tok": tables["tokens"]}


def test_compute_floor_is_tpot_without_the_stalls(run):
    """compute_floor_ms (docs/metrics.md): the TPOT with every expert resident. Under a
    timing-independent schedule the iterations are the same and each is shorter by exactly its
    stall (sum of start - need over its accesses), so a request's floor TPOT is
    (last token - first token - stall of the iterations in between) / (tokens - 1).
    lru_batch2 (spread arrivals at batch 2) has no such identity: only headroom is checked."""
    m, acc, tok = run["m"], run["acc"], run["tok"]
    tpot = m["tpot_ms"]["mean"]
    assert m["headroom"] == approx(tpot / m["compute_floor_ms"])
    if run["name"] == "lru_batch2":
        return
    stall = {}
    for it, need, start in zip(acc["iteration"].tolist(), acc["need_ms"].tolist(),
                               acc["start_ms"].tolist()):
        stall[it] = stall.get(it, 0.0) + (start - need)
    floors = []
    for r in np.unique(tok["request"]).tolist():
        mine = tok["request"] == r
        its, times = tok["iteration"][mine], tok["time_ms"][mine]
        if len(times) < 2:
            continue
        first, last = int(its.min()), int(its.max())
        between = sum(stall.get(i, 0.0) for i in range(first + 1, last + 1))
        floors.append((float(times.max()) - float(times.min()) - between) / (len(times) - 1))
    assert m["compute_floor_ms"] == approx(float(np.mean(floors)))
    assert m["compute_floor_ms"] <= tpot
