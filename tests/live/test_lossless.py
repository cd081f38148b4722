"""Offloading is lossless: for every architecture the offload path supports and every system in
conf/system, a tiny random-weight model (built from a config, no download) generates the same
greedy tokens and logits with a cache of 25% of the experts as plain `model.generate` with
nothing offloaded. Also: no routed-expert weights remain in the model's modules, and the bytes
the TorchBackend copied equal the engine's recorded host-to-device bytes."""

from __future__ import annotations

import copy
import functools
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from core.targets import build_target  # noqa: E402
from harness.live.driver import record, run_live  # noqa: E402
from harness.live.hf_arch import SUPPORTED, tiny_config  # noqa: E402
from harness.live.hf_offload import OFFLOAD_TYPES, routed_param_count  # noqa: E402
from harness.runner.config import compose_config, system_names  # noqa: E402
from harness.sim.metrics import summarize  # noqa: E402
from harness.sim.recorder import PRELOAD  # noqa: E402
from systems.base import System  # noqa: E402

PROMPTS = [[5, 9, 17, 33, 2], [7, 8]]
# scripts/gpu_check.sh sets cuda; the default runs everywhere.
DEVICE = os.environ.get("MOEBENCH_TEST_DEVICE", "cpu")
OUT_LEN = 3
_RECORDED: dict[str, tuple] = {}


def _model(model_type: str):
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    enc_dec = SUPPORTED[model_type].encoder_decoder
    cls = AutoModelForSeq2SeqLM if enc_dec else AutoModelForCausalLM
    return cls.from_config(tiny_config(model_type)).eval().to(DEVICE)


def _reference(model_type: str):
    """Model, reference tokens / logits and the recorded trace (one per architecture)."""
    if model_type not in _RECORDED:
        torch.use_deterministic_algorithms(True, warn_only=DEVICE != "cpu")
        model = _model(model_type)
        _RECORDED[model_type] = (model, *record(model, PROMPTS, OUT_LEN))
    return _RECORDED[model_type]


@functools.cache
def _system_cfg(name: str) -> dict:
    return compose_config([f"system={name}"])["system"]


def _system(name: str):
    return build_target(copy.deepcopy(_system_cfg(name)), "system", System)


@pytest.mark.parametrize("system_name", system_names())
@pytest.mark.parametrize("model_type", OFFLOAD_TYPES)
def test_lossless(model_type, system_name):
    model, ref_tokens, ref_logits, trace = _reference(model_type)
    system = _system(system_name)
    n_experts = trace.num_layers * trace.num_experts
    slots = n_experts // 4  # a cache holding 25% of the routed experts
    if getattr(system, "needs_all_experts", False):
        slots = n_experts
    # History systems warm up on the same routing (losslessness is the point here).
    res = run_live(copy.deepcopy(model), trace, system, slots, PROMPTS, device=DEVICE,
                   calibration=trace)
    assert res.tokens == ref_tokens
    for got, want in zip(res.logits, ref_logits):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()
    # The modules hold no routed-expert weights while offloaded.
    assert routed_param_count([layer.block for layer in res.layers]) == 0
    # Bytes the backend really copied == the engine's recorded host-to-device bytes (the
    # engine's h2d_bytes include preloads; the backend counts them apart).
    tables = res.rec.tables()
    engine_h2d = summarize(tables, trace.arrival_ms, res.backend.expert_bytes)["h2d_bytes"]
    assert res.backend.h2d_bytes + res.backend.preload_bytes == engine_h2d
    kinds = np.asarray(tables["transfers"]["kind"])
    assert res.backend.copies == int((kinds != PRELOAD).sum())
    assert res.backend.preload_bytes == int((kinds == PRELOAD).sum()) * res.backend.expert_bytes
    if slots < n_experts and system_name != "no_offload":
        assert res.backend.h2d_bytes > 0  # something was really offloaded and copied back


def test_unknown_architecture_lists_supported():
    from transformers import LlamaConfig

    from harness.live.hf_arch import UnsupportedArchitecture, arch_of

    with pytest.raises(UnsupportedArchitecture, match="supported: .*mixtral"):
        arch_of(LlamaConfig())


def test_nllb_offload_refused_with_reason():
    from harness.live.hf_arch import UnsupportedArchitecture
    from harness.live.hf_offload import offload

    with pytest.raises(UnsupportedArchitecture, match="expert_0 and expert_1"):
        offload(_model("nllb-moe"))
