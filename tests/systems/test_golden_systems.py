"""Golden summaries of the named systems: refactors must leave every system's metrics and its
three result tables byte-identical. A change that is meant to alter a result updates the file with
MOEBENCH_WRITE_GOLDEN=1 in the same commit and says why in the commit message.

Settings (small, so the test is quick; each forces evictions and prefetch decisions):
  b1: Table 1 setting, 8 requests of 48 + 8 tokens, batch 1, 4 GiB cache;
  b4: the same at batch 4 with 12 requests;
  tight: batch 1, 2 GiB cache (fewer slots than experts routed in a prefill layer);
  h200: Switch-base-128 on an H200, where every expert fits (no_offload runs);
  b8_online: Poisson arrivals at 4 req/s, batch up to 8, 16 requests (continuous batching:
             requests join and leave mid-run), added before issue "Engine speed and memory".
The named CPU-offload systems (harness/runner/config.py CPU_SYSTEMS, not in system_names())
run every setting with an inline host profile (HOST), the only override they add.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import GOLDEN, with_variants

from harness.runner.assembly import assemble
from harness.runner.config import compose_config, cpu_system_names, system_names
from harness.runner.parquet_io import read_tables
from harness.runner.run import execute
from harness.runner.store import run_dir_of

GOLDEN = GOLDEN / "system_summaries.json"
BASE = ["experiment=table1", "workload.prompt_len=48", "workload.output_len=8",
        "calibration_requests=8", "progress=false"]
SETTINGS = {
    "b1": ["workload.num_requests=8", "expert_cache_gb=4"],
    "b4": ["workload.num_requests=12", "expert_cache_gb=4", "max_batch=4"],
    "tight": ["workload.num_requests=8", "expert_cache_gb=2"],
    "h200": ["workload.num_requests=6", "hardware=h200", "model=switch_base_128"],
    "b8_online": ["workload.num_requests=16", "expert_cache_gb=4", "max_batch=8",
                  "arrivals=poisson", "workload.arrivals.rate_rps=4"],
}
SEED_KNOBS = {"moe_infinity": ["system.eamc_capacity=5"], "fmoe": ["system.store_capacity=12"]}
# The CPU-offload systems (not Table 1 rows) need a host profile: an inline one, theirs only,
# so every other system's settings and goldens stay as they were.
HOST = ("+hardware.host={name:golden,display_name:golden,dram_gb:64,reserve_gb:8,"
        "mem_gbps:80,cpu_tflops:2,cpu_expert_overhead_us:50}")
PER_SYSTEM = {**with_variants(SEED_KNOBS), **{s: [HOST] for s in cpu_system_names()}}


def table_sha(run_dir: Path) -> str:
    """sha256 over the three tables' full columns as the files' reader returns them (values
    and dtypes, not file bytes): the files of schema 1.0 held every column, those of 2.0 hold
    the stored ones, so the unchanged hashes prove the derived columns are recomputed
    exactly."""
    h = hashlib.sha256()
    tables = read_tables(run_dir)
    for name in ("accesses", "tokens", "transfers"):
        for col in sorted(tables[name]):
            h.update(col.encode())
            h.update(np.ascontiguousarray(tables[name][col]).tobytes())
    return h.hexdigest()


def summary(system: str, setting: str, tmp: Path) -> dict:
    cfg = compose_config([*BASE, *SETTINGS[setting], f"system={system}",
                          *PER_SYSTEM.get(system, [])], run_name=f"{system}-{setting}",
                         results_dir=str(tmp))
    result = execute(assemble(cfg)).record()
    run_dir = run_dir_of(cfg)
    metrics = result["metrics"]
    if metrics is not None:  # metrics newer than the golden file;
        # tests/systems/test_oracle_family.py checks them against TPOT and no_offload
        metrics = {k: v for k, v in metrics.items() if k not in ("compute_floor_ms", "headroom")}
    out = {"status": result["status"], "metrics": metrics}
    if result["status"] == "valid":
        out["tables_sha256"] = table_sha(run_dir)
        # engine.core (compiled or python) was added later and never changes a result
        out["engine"] = {"prefetches_dropped": result["engine"]["prefetches_dropped"]}
    return out


# The oracle family needs a schedule that does not depend on timing (core/access.py).
SKIP = {("oracle", "b8_online")}


def all_summaries(tmp: Path) -> dict:
    return {f"{s}/{k}": summary(s, k, tmp) for s in [*system_names(), *cpu_system_names()]
            if s != "composed" for k in SETTINGS if (s, k) not in SKIP}


def test_every_system_matches_its_golden_summary(tmp_path):
    got = all_summaries(tmp_path)
    if os.environ.get("MOEBENCH_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, sort_keys=True, indent=1) + "\n")
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} missing: run with MOEBENCH_WRITE_GOLDEN=1 on a trusted commit")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], f"{name} differs from {GOLDEN.name}"
