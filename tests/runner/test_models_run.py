"""Every model config runs end to end on the simulator (tiny synthetic workload)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ROOT

from core.specs import model_spec_from_dict
from harness.runner.assembly import assemble
from harness.runner.config import compose_config
from harness.runner.parquet_io import read_tables
from harness.runner.run import execute

MODELS = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
TINY = ["workload.num_requests=2", "workload.prompt_len=8", "workload.output_len=3",
        "progress=false", "hardware=h200"]


@pytest.mark.parametrize("model", MODELS)
def test_model_runs_and_touches_only_the_right_layers(model, tmp_path):
    cfg = compose_config([f"model={model}", "system=layer_offload", *TINY], run_name=model,
                         results_dir=str(tmp_path))
    result = execute(assemble(cfg))
    assert result.status == "valid", result.reason
    spec = model_spec_from_dict(cfg["model"])
    acc = read_tables(result.run_dir)["accesses"]
    layers, prefill = np.array(acc["layer"]), np.array(acc["prefill"])
    stacks = np.array(spec.moe_layer_stacks)
    # Encoder MoE layers run only in the prefill (the encoder sees the prompt once); every
    # MoE layer is visited in the prefill.
    assert not np.any((stacks[layers] == "encoder") & ~prefill)
    assert set(layers[prefill].tolist()) == set(range(spec.num_moe_layers))
    # 2 requests x 3 tokens; decode iterations visit only decoder layers, top_k experts each.
    n_dec = int(np.sum(stacks == "decoder"))
    assert int(np.sum(~prefill)) == 2 * 2 * n_dec * spec.top_k
