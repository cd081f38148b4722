"""`system.prefetch=false`: the one switch that turns any system's prefetch off.

With it no system issues a single prefetch copy (counted from the transfers table); systems
that never prefetch (no_offload, on_demand) give byte-identical metrics either way; the
knob is a strict boolean."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from core.specs import SpecError
from harness.runner.assembly import assemble
from harness.runner.config import compose_config, system_names
from harness.runner.run import execute, run_config
from harness.runner.run_types import Result
from harness.sim.recorder import PREFETCH

TINY = ["experiment=table1", "workload.num_requests=3", "workload.prompt_len=16",
        "workload.output_len=5", "calibration_requests=3", "progress=false",
        "expert_cache_gb=4"]


def _run(tmp_path, system: str, prefetch: bool) -> Result:
    name = f"{system}-{prefetch}"
    cfg = compose_config([f"system={system}", f"system.prefetch={prefetch}", *TINY],
                         run_name=name, results_dir=str(tmp_path))
    return execute(assemble(cfg))


@pytest.mark.parametrize("system", system_names())
def test_prefetch_false_issues_no_prefetch(tmp_path, system):
    r = _run(tmp_path, system, False)
    if r.status == "oom":
        return  # no_offload at 4 GiB: nothing ran
    assert r.status == "valid", r.reason
    kinds = pq.read_table(r.run_dir / "transfers.parquet").column("kind").to_pylist()
    assert PREFETCH not in kinds
    assert r.metrics["prefetches_issued"] == 0
    assert r.system["prefetch"] is False


@pytest.mark.parametrize("system", ["lru", "moe_infinity", "fmoe", "diff_moe", "oracle",
                                    "layer_offload"])
def test_prefetching_systems_do_prefetch_when_on(tmp_path, system):
    r = _run(tmp_path, system, True)
    assert r.metrics["prefetches_issued"] > 0 and r.system["prefetch"] is True


def test_systems_without_prefetch_ignore_the_switch(tmp_path):
    on, off = _run(tmp_path, "on_demand", True), _run(tmp_path, "on_demand", False)
    assert on.metrics == off.metrics


@pytest.mark.parametrize("value", ["1", "yes", "0"])
def test_the_switch_is_a_boolean(tmp_path, value):
    cfg = compose_config(["system=lru", f"system.prefetch={value}", *TINY], run_name="x",
                         results_dir=str(tmp_path))
    with pytest.raises(SpecError, match=r"^system\.prefetch: must be true or false"):
        run_config(cfg)
