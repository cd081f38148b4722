"""DeepSpeed ZeRO-Inference reference row. The smoke test needs the optional extra
`[deepspeed]` (never installed by `make test`) and skips with a reason without it."""

from __future__ import annotations

import importlib.util
import json

import pytest

from harness.live.deepspeed_ref import CPU_NOTE, SYSTEM_NAME, zero_inference_config

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def test_config_is_zero3_with_parameter_offload_to_cpu():
    cfg = zero_inference_config("bfloat16", pin_memory=True)
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]
    assert not zero_inference_config("float32", False)["bf16"]["enabled"]


@pytest.mark.skipif(HAS_DEEPSPEED, reason="deepspeed is installed: the missing-extra path "
                                          "cannot be exercised")
def test_without_the_extra_it_says_how_to_install(capsys):
    from harness.live.deepspeed_ref import main

    assert main(["model=tiny:mixtral", "embed=false"]) == 2
    err = capsys.readouterr().err
    assert "deepspeed is not installed" in err and "moe-offload-bench[deepspeed]" in err


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="optional extra [deepspeed] not installed "
                                              "(pip install 'moe-offload-bench[deepspeed]'; "
                                              "meant for GPU machines)")
def test_smoke_tiny_model_under_zero_inference(tmp_path):
    pytest.importorskip("transformers", reason="needs the [torch] extra")
    import torch

    from harness.live.deepspeed_ref import main

    assert main(["model=tiny:mixtral", "num_prompts=2", "output_len=3", "embed=false",
                 f"out={tmp_path}"]) == 0
    row = json.loads((tmp_path / "result.json").read_text())
    assert row["system"] == {"name": SYSTEM_NAME, "external_reference": True}
    assert row["measured"] is True and row["simulated"] is False
    assert row["status"] == "valid"
    assert row["metrics"]["tpot_ms"]["count"] == 2 * (3 - 1)  # 2 decode steps per request
    assert row["metrics"]["tpot_ms"]["mean"] > 0
    assert row["offload"]["offload_param"] == "cpu"
    if not torch.cuda.is_available():
        assert row["note"] == CPU_NOTE
