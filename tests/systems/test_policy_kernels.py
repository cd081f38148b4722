"""The config's `policy_kernels` (auto | python, systems/base.py): the python rules give the
compiled kernels' results byte for byte for every system that has kernels (moe_infinity, fmoe,
the oracle's plan, and a composed system whose prefetcher drives MoE-Infinity's code),
result.json records the choice beside engine.core, and a bad value is refused naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import tiny_model
from test_golden_systems import table_sha

from core.knobs import KnobError
from core.specs import SpecError
from harness.runner.assembly import assemble
from harness.runner.config import compose_config
from harness.runner.results import NON_SEMANTIC_KEYS, config_hash
from harness.runner.run import execute, run_config
from systems.composed import Composed
from systems.evictors.lru import LRUEvictor
from systems.fmoe.system import FMoE
from systems.moe_infinity.kernels import PYTHON
from systems.moe_infinity.system import MoEInfinity
from systems.oracle.system import Oracle
from systems.prefetchers.eamc import EAMCPrefetch

BASE = ["experiment=table1", "workload.prompt_len=40", "workload.output_len=6",
        "calibration_requests=8", "workload.num_requests=8", "expert_cache_gb=3",
        "progress=false"]


def _run(tmp_path: Path, system: list[str], kernels: str) -> tuple[dict, str, dict]:
    cfg = compose_config(BASE + system + [f"policy_kernels={kernels}"],
                         run_name=f"k-{kernels}", results_dir=str(tmp_path))
    result = execute(assemble(cfg))
    assert result.status == "valid"
    stored = json.loads((result.run_dir / "result.json").read_text())
    return result.metrics, table_sha(result.run_dir), stored


@pytest.mark.parametrize("system", [
    ["system=moe_infinity"], ["system=moe_infinity", "max_batch=4"], ["system=fmoe"],
    ["system=fmoe", "max_batch=4"], ["system=oracle"],
    ["system=composed", "system/prefetcher=eamc"],
], ids=lambda s: "-".join(x.split("=")[1] for x in s))
def test_python_rules_give_the_kernels_bytes(system, tmp_path):
    auto = _run(tmp_path, system, "auto")
    python = _run(tmp_path, system, "python")
    assert json.dumps(auto[0], sort_keys=True) == json.dumps(python[0], sort_keys=True)
    assert auto[1] == python[1]  # the three result tables
    for (_, _, stored), kernels in ((auto, "auto"), (python, "python")):
        assert stored["engine"]["policy_kernels"] == kernels
        assert stored["config"]["policy_kernels"] == kernels
    assert auto[2]["config_sha256"] == python[2]["config_sha256"]  # not a semantic key


def test_policy_kernels_is_not_in_the_config_hash():
    cfg = compose_config(BASE)
    assert "policy_kernels" in NON_SEMANTIC_KEYS and cfg["policy_kernels"] == "auto"
    assert config_hash(cfg) == config_hash({**cfg, "policy_kernels": "python"})


def test_a_bad_value_is_refused_naming_the_key(tmp_path):
    cfg = compose_config(BASE + ["system=moe_infinity", "policy_kernels=compiled"],
                         results_dir=str(tmp_path))
    with pytest.raises(SpecError, match="^policy_kernels: must be one of auto, python, got "
                                        "'compiled'"):
        run_config(cfg)
    assert not any(tmp_path.iterdir())  # refused before a run folder exists
    with pytest.raises(KnobError, match="^policy_kernels: must be one of"):
        MoEInfinity().use_policy_kernels("fast")


def test_python_builds_no_kernels():
    """python: every system (and a composed system's joint prefetcher) binds without its
    compiled kernels."""
    from core.view import SystemContext

    model = tiny_model(layers=3, experts=4, top_k=1)
    ctx = SystemContext(num_layers=model.num_moe_layers, num_experts=model.num_experts,
                        top_k=1, expert_bytes=1, capacity_slots=6, capacity_bytes=6,
                        max_batch=1, moe_layer_stacks=("decoder",) * 3,
                        trace_fields=("probs",))
    mi, fm = MoEInfinity().use_policy_kernels("python"), FMoE().use_policy_kernels("python")
    composed = Composed(evictor=LRUEvictor(), prefetcher=EAMCPrefetch())
    composed.use_policy_kernels("python")
    for system in (mi, fm, composed):
        system.bind(ctx)
    assert mi.kernels == PYTHON and mi.table.kernel is None
    assert fm.kernels is None and fm.store.fast is None and fm.scores.kernel is None
    assert composed.prefetcher.joint.kernels == PYTHON
    assert Oracle().use_policy_kernels("python").policy_kernels == "python"
