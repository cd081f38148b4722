"""TorchBackend slots and copies, hf_arch shapes, and replayed routing (CPU, tiny models)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from harness.live.backend_torch import DEMAND, PREFETCH, PRELOAD, TorchBackend  # noqa: E402
from harness.live.hf_arch import SUPPORTED, moe_blocks, scaled_config, tiny_config  # noqa: E402
from harness.sim import recorder  # noqa: E402


def _host(n: int) -> dict[int, list]:
    # Expert k: a [3, 4] and a [5] float32 tensor filled with k and -k: 17 * 4 = 68 bytes.
    return {k: [torch.full((3, 4), float(k)), torch.full((5,), -float(k))] for k in range(n)}


def test_slots_are_real_copies_and_bytes_are_counted():
    assert (PREFETCH, DEMAND, PRELOAD) == (recorder.PREFETCH, recorder.DEMAND, recorder.PRELOAD)
    host = _host(4)
    be = TorchBackend(host, num_slots=2, copy_ms=0.5)
    assert be.expert_bytes == (12 + 5) * 4 and be.expert_copy_ms == 0.5
    be.load_expert(3, PRELOAD)
    be.load_expert(1, DEMAND)
    w, wait_ms = be.weights(1)
    assert wait_ms >= 0.0
    assert torch.equal(w[0], torch.full((3, 4), 1.0)) and torch.equal(w[1], torch.full((5,), -1.0))
    assert w[0].data_ptr() != host[1][0].data_ptr()  # a separate tensor, not a view
    host[1][0].fill_(7.0)
    assert torch.equal(be.weights(1)[0][0], torch.full((3, 4), 1.0))  # the bytes were copied
    assert (be.h2d_bytes, be.preload_bytes, be.copies) == (68, 68, 1)
    with pytest.raises(RuntimeError, match="no free device slot"):
        be.load_expert(2, 0)
    with pytest.raises(RuntimeError, match="already resident"):
        be.load_expert(1, 0)
    be.evict_expert(3)
    be.load_expert(2, 1)
    assert torch.equal(be.weights(2)[0][1], torch.full((5,), -2.0))
    assert be.h2d_bytes == 136


def test_mismatched_expert_shapes_rejected():
    host = _host(2)
    host[1] = [torch.zeros(2, 2), torch.zeros(5)]
    with pytest.raises(ValueError, match="expert 1 differs"):
        TorchBackend(host, num_slots=1, copy_ms=0.0)


# MoE layers of each tiny config, counted by hand from tiny_config's overrides.
TINY_MOE_LAYERS = {"mixtral": 3, "qwen2_moe": 2, "qwen3_moe": 2, "phimoe": 3, "olmoe": 3,
                   "deepseek_v2": 2, "deepseek_v3": 2, "switch_transformers": 2, "nllb-moe": 2}


@pytest.mark.parametrize("model_type", sorted(SUPPORTED))
def test_tiny_models_blocks_and_routes(model_type):
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    enc_dec = SUPPORTED[model_type].encoder_decoder
    cls = AutoModelForSeq2SeqLM if enc_dec else AutoModelForCausalLM
    model = cls.from_config(tiny_config(model_type)).eval()
    blocks = moe_blocks(model)
    assert len(blocks) == TINY_MOE_LAYERS[model_type]
    assert [b.moe_index for b in blocks] == list(range(len(blocks)))
    if enc_dec:
        assert [b.stack for b in blocks] == ["encoder", "decoder"]
    seen = []
    for b in blocks:
        b.router.register_forward_hook(lambda m, i, o, b=b: seen.append(b.route(o)))
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        if enc_dec:
            model(input_ids=ids, decoder_input_ids=torch.tensor([[0]]))
        else:
            model(input_ids=ids)
    ids, w, probs = seen[0]
    b = blocks[0]
    assert ids.shape == (4, b.top_k) and w.shape == (4, b.top_k) and probs.shape == (4, 8)
    assert int(ids.min()) >= 0 and int(ids.max()) < b.num_experts
    for row in ids.tolist():
        assert len(set(row)) == len(row)  # distinct experts per token


def test_scaled_config_matches_spec():
    from core.specs import model_spec_from_dict
    from harness.runner.config import compose_config

    spec = model_spec_from_dict(compose_config(["model=deepseek_v2_lite"])["model"])
    cfg = scaled_config(spec, num_moe_layers=2)
    # Hand values from conf/model/deepseek_v2_lite.yaml: dense layer 0, then 2 MoE layers.
    assert (cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts) == (2048, 1408, 64)
    assert (cfg.num_experts_per_tok, cfg.num_hidden_layers, cfg.first_k_dense_replace) == (6, 3, 1)
    assert cfg.intermediate_size == 10944 and cfg.n_shared_experts == 2
    full = scaled_config(spec)
    assert full.num_hidden_layers == 27
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    blocks = moe_blocks(model)
    assert len(blocks) == 2
    per_expert = sum(p[0].numel() for p in blocks[0].experts.parameters())
    assert per_expert == 3 * 2048 * 1408 == spec.expert_params


def test_replay_forces_routing():
    """Replayed routing: the experts run are the trace's, not the router's."""
    from transformers import AutoModelForCausalLM

    from harness.live.driver import record, run_live
    from systems.on_demand import OnDemand

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("mixtral")).eval()
    prompts = [[5, 9, 17, 33]]
    _, ref_logits, trace = record(model, prompts, 3)
    forced = copy.deepcopy(trace)
    # Hand routing: every token to experts 6 and 7 (the router's own choice differs).
    forced.topk = np.tile(np.array([[6, 7]], dtype=forced.topk.dtype), (len(trace.topk), 1))
    assert not np.array_equal(np.sort(trace.topk, 1), forced.topk)
    res = run_live(copy.deepcopy(model), forced, OnDemand(), 6, prompts, replay=True)
    acc = res.rec.tables()["accesses"]
    seen = sorted(set(acc["expert"].tolist()))
    assert seen == [6, 7]
    assert not torch.allclose(res.logits[0], ref_logits[0])  # outputs are meaningless now


def test_validate_runs_end_to_end_on_cpu(tmp_path):
    """Mechanics only on CPU: the same trace through SimBackend and TorchBackend."""
    import json

    from core.paths import CONF_DIR
    from harness.live.validate import main

    rc = main(["--hardware", str(CONF_DIR / "hardware" / "rtx_a5000.yaml"), "--num-moe-layers", "1",
               "--scale", "0.0625", "--vocab-size", "512", "--cache-fraction", "0.25",
               "--requests", "1", "--prompt-len", "8", "--output-len", "3",
               "--out", str(tmp_path)])
    assert rc == 0
    out = json.loads((tmp_path / "validate.json").read_text())
    assert "SIMULATED" in out["label"] and "SYNTHETIC" in out["label"]
    assert out["total_experts"] == 64 and out["cache_slots"] == 16  # 25% of 1 layer x 64
    assert out["h2d_bytes_real"] > 0  # a 25% cache under prefill routing must copy
    assert out["tpot_ms_real_mean"] > 0 and out["tpot_ms_sim_mean"] > 0
    assert out["tpot_mape_pct"] is not None
