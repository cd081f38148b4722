"""A quantized run is labelled LOSSY where it is shown: the run's line, result.json's model
block, the reproduction suite's tables and figures, the sweep tables."""

from __future__ import annotations

import pytest

from analysis.repro import suite
from analysis.sweepstats import sim_label
from harness.runner.config import compose_config
from harness.runner.run import run_config
from moebench.cli import _describe

TINY = ["experiment=table1", "workload.num_requests=2", "workload.prompt_len=16",
        "workload.output_len=3", "calibration_requests=2", "progress=false",
        "trace_cache_dir=null"]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """Two Table 1 systems with 4-bit experts (dense bf16), and one bf16 run elsewhere."""
    tmp = tmp_path_factory.mktemp("lossy")
    out = {}
    for system in ("lru", "moe_infinity"):
        cfg = compose_config([*TINY, f"system={system}", "model.expert_bits=4"],
                             results_dir=str(tmp))
        out[system] = (run_config(cfg), cfg)
    plain = compose_config([*TINY, "system=lru"], results_dir=str(tmp / "plain"))
    return tmp, out, run_config(plain)


def test_run_line_and_result_json(quantized):
    _, runs, plain = quantized
    result, cfg = runs["lru"]
    assert result["status"] == "valid"
    assert _describe(result, "DIR").startswith(
        "[SIMULATED, synthetic routing] [LOSSY: 4-bit experts, 16-bit dense] lru | "
        "deepseek_v2_lite | rtx_a5000 |")
    assert result["model"]["lossy"] is True
    assert (result["model"]["expert_bits"], result["model"]["dense_bits"]) == (4, 16)
    assert result["model"]["expert_bytes"] == 4_325_376  # 3 * 2048 * 1408 params * 4 / 8
    assert _describe(plain, "DIR").startswith("[SIMULATED, synthetic routing] lru |")
    assert plain["model"]["lossy"] is False


def test_sweep_label(quantized):
    _, runs, plain = quantized
    assert sim_label([runs["lru"][0]]) == ("SIMULATED, synthetic routing, LOSSY: 4-bit "
                                           "experts, 16-bit dense")
    assert sim_label([plain]) == "SIMULATED, synthetic routing"


def test_repro_table_title_says_lossy(quantized):
    tmp, _, _ = quantized
    assert suite.report("table1", tmp, allow_partial=True) == 0
    md = (tmp / "table1" / "table1.md").read_text()
    assert md.splitlines()[0] == ("# MoE-Infinity (arXiv 2401.14361) Table 1, SIMULATED "
                                  "[LOSSY: 4-bit experts, 16-bit dense]")
    assert "LOSSY: 4-bit experts" in (tmp / "table1" / "table1.tex").read_text()
