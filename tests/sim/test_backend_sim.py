"""SimBackend cost model and memory sizing, against numbers worked out by hand."""

from __future__ import annotations

import pytest
from helpers import tiny_model

from core.specs import GIB, SpecError, hardware_spec_from_dict
from harness.sim.backend_sim import SimBackend
from harness.sim.memory import plan_memory

HW = {"name": "round", "display_name": "round numbers", "gpu_mem_gb": 1.0, "hbm_gbps": 1000,
      "peak_tflops": 100, "h2d_gbps": 25, "h2d_latency_us": 10, "layer_overhead_us": 100,
      "expert_overhead_us": 50, "iteration_overhead_us": 500, "runtime_reserve_gb": 0.25}


def test_durations_by_hand():
    # tiny model: hidden 64, expert FFN 128, 2 matrices, 4 experts, 16-bit weights.
    # expert params = 2 * 64 * 128 = 16384 -> 32768 bytes. HBM 1e9 B/ms, peak 1e11 FLOP/ms,
    # link 2.5e7 B/ms.
    model = tiny_model(layers=2, experts=4, top_k=1)
    be = SimBackend(model, hardware_spec_from_dict(HW))
    assert model.expert_bytes == 32768
    # copy: 10 us latency + 32768 / 2.5e7 ms
    assert be.transfer_ms(32768) == pytest.approx(0.01 + 32768 / 2.5e7)
    assert be.expert_copy_ms == pytest.approx(0.01131072)
    # expert, 1 token: memory-bound 32768 / 1e9 ms + 50 us overhead
    assert be.expert_ms(1) == pytest.approx(3.2768e-5 + 0.05)
    # expert, 10000 tokens: compute-bound 2 * 16384 * 10000 / 1e11 ms + overhead
    assert be.expert_ms(10000) == pytest.approx(3.2768e-3 + 0.05)
    # dense MoE layer: attention 4096 + router 64 * 4 = 4352 params. 1 token reading 10 KV
    # entries of 128 elements: bytes 4352*2 + 10*128*2 = 11264 -> 1.1264e-5 ms (memory-bound).
    layer = model.layers[0]
    assert layer.dense_params == 4352
    assert be.dense_ms(layer, 1, 10, 10) == pytest.approx(1.1264e-5 + 0.1)
    # LM head: 100 x 64 x 2 bytes = 12800 -> 1.28e-5 ms, plus 500 us per iteration
    assert be.iteration_ms(1) == pytest.approx(1.28e-5 + 0.5)


def test_memory_plan_by_hand():
    model = tiny_model(layers=2, experts=4, top_k=1)
    hw = hardware_spec_from_dict(HW)
    # dense: 2 layers * 4352 + tied embeddings 100 * 64 = 15104 params = 30208 bytes.
    # KV: 2 layers * 128 elements * 2 bytes = 512 bytes per token; 100 tokens x batch 4.
    plan = plan_memory(model, hw, max_context_tokens=100, max_batch=4)
    assert plan.dense_bytes == 30208
    assert plan.kv_bytes == 512 * 100 * 4
    assert plan.available_bytes == GIB - 30208 - 204800 - GIB // 4
    assert plan.expert_cache_bytes == plan.available_bytes
    assert plan_memory(model, hw, 100, 4, expert_cache_gb=0.5).expert_cache_bytes == GIB // 2
    with pytest.raises(SpecError, match="expert_cache_gb"):
        plan_memory(model, hw, 100, 4, expert_cache_gb=0.75)
