"""Where the routed experts live in Hugging Face MoE models (transformers 5.x), and how to
build small or spec-shaped random-weight models of each architecture without a download.

Stable API (used by the live offload path and by the recorder / calibrator):

- `SUPPORTED: dict[str, ArchInfo]`, keyed by HF `config.model_type`.
- `arch_of(model_or_config) -> ArchInfo`: raises `UnsupportedArchitecture` listing SUPPORTED.
- `tiny_config(model_type, **overrides)`: a few-layer, small-hidden config (random weights,
  at least one dense layer or shared expert where the architecture has them).
- `scaled_config(spec, num_moe_layers=None, vocab_size=None)`: an HF config with the spec's
  own per-layer shapes (hidden size, expert FFN size, expert count, top-k, shared and dense
  FFN sizes). Scaling rule: only depth and vocabulary may shrink. `num_moe_layers` keeps the
  first n MoE layers (and the dense layers in front of them, in the same pattern); for
  encoder-decoder models it keeps n per stack. Attention shapes come from the real model's
  config (`_ATTN` below), so one layer costs what it costs in the full model.
- `moe_blocks(model) -> list[MoEBlock]`: per MoE layer, in trace layer order (encoder
  layers first): moe_index, stack, the block, its router and experts modules, num_experts,
  top_k and `route(router_output) -> (topk_ids [T,k] int64, topk_weights [T,k] float32,
  probs [T,E] float32)`.

Two styles: "stacked" experts (one module holding [E, ...] weight tensors, decorated with
`use_experts_implementation`, so an experts implementation can be registered) and "modules"
(one nn.Module per expert: SwitchTransformers, NLLB-MoE).

`probs` are the router's per-expert scores: softmax of the logits, except DeepSeek-V3
(sigmoid scores, as its router ranks them). Dropped tokens (Switch / NLLB capacity) keep
their ids with weight 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


class UnsupportedArchitecture(ValueError):
    """The model's type has no entry in SUPPORTED."""


@dataclass(frozen=True)
class ArchInfo:
    model_type: str
    style: str  # "stacked" | "modules"
    encoder_decoder: bool
    block_class: str  # class name of the MoE block module
    router_attr: str  # attribute of the block holding the router
    experts_attr: str = "experts"
    probs_fn: str = "softmax"  # how router logits become probs
    tiny: dict = field(default_factory=dict, repr=False)


_DEC_TINY = dict(vocab_size=128, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=128, num_hidden_layers=3, num_experts_per_tok=2,
                 bos_token_id=None, eos_token_id=None, pad_token_id=None)

SUPPORTED: dict[str, ArchInfo] = {a.model_type: a for a in [
    ArchInfo("mixtral", "stacked", False, "MixtralSparseMoeBlock", "gate", tiny=dict(
        _DEC_TINY, intermediate_size=48, num_local_experts=8)),
    ArchInfo("qwen2_moe", "stacked", False, "Qwen2MoeSparseMoeBlock", "gate", tiny=dict(
        _DEC_TINY, intermediate_size=64, moe_intermediate_size=24, num_experts=8,
        shared_expert_intermediate_size=48, mlp_only_layers=[0])),
    ArchInfo("qwen3_moe", "stacked", False, "Qwen3MoeSparseMoeBlock", "gate", tiny=dict(
        _DEC_TINY, intermediate_size=64, moe_intermediate_size=24, num_experts=8,
        head_dim=8, mlp_only_layers=[0])),
    ArchInfo("phimoe", "stacked", False, "PhimoeSparseMoeBlock", "router", tiny=dict(
        _DEC_TINY, intermediate_size=48, num_local_experts=8)),
    ArchInfo("olmoe", "stacked", False, "OlmoeSparseMoeBlock", "gate", tiny=dict(
        _DEC_TINY, intermediate_size=48, num_experts=8)),
    ArchInfo("deepseek_v2", "stacked", False, "DeepseekV2Moe", "gate", tiny=dict(
        _DEC_TINY, intermediate_size=64, moe_intermediate_size=24, n_routed_experts=8,
        n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, head_dim=8, num_key_value_heads=4,
        topk_method="greedy")),
    ArchInfo("deepseek_v3", "stacked", False, "DeepseekV3MoE", "gate", probs_fn="sigmoid",
             tiny=dict(_DEC_TINY, intermediate_size=64, moe_intermediate_size=24,
                       n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1,
                       kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8,
                       v_head_dim=8, head_dim=8, num_key_value_heads=4, n_group=2,
                       topk_group=1, norm_topk_prob=True)),
    ArchInfo("switch_transformers", "modules", True, "SwitchTransformersSparseMLP", "router",
             tiny=dict(vocab_size=128, d_model=32, d_ff=48, d_kv=8, num_heads=4, num_layers=2,
                       num_decoder_layers=2, num_experts=8, expert_capacity=64,
                       encoder_sparse_step=2, decoder_sparse_step=2, decoder_start_token_id=0,
                       pad_token_id=0, eos_token_id=None)),
    ArchInfo("nllb-moe", "modules", True, "NllbMoeSparseMLP", "router", tiny=dict(
        vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=48,
        decoder_ffn_dim=48, encoder_attention_heads=4, decoder_attention_heads=4,
        num_experts=8, expert_capacity=64, encoder_sparse_step=2, decoder_sparse_step=2,
        max_position_embeddings=128, pad_token_id=1, bos_token_id=0, eos_token_id=None,
        decoder_start_token_id=2)),
]}

# ModelSpec name (conf/model/*.yaml) -> HF model_type.
MODEL_TYPE_OF_SPEC = {
    "mixtral_8x7b": "mixtral", "qwen15_moe_a27b": "qwen2_moe", "qwen3_30b_a3b": "qwen3_moe",
    "phi35_moe": "phimoe", "olmoe_1b_7b": "olmoe", "deepseek_v2_lite": "deepseek_v2",
    "deepseek_v3": "deepseek_v3", "switch_base_128": "switch_transformers",
    "switch_large_128": "switch_transformers", "nllb_moe_54b": "nllb-moe",
}

# Attention and misc. fields of the real checkpoints' config.json (sources: the conf/model
# yaml comments and ../shared/reference/model_configs_sources.md).
_ATTN: dict[str, dict[str, Any]] = {
    "mixtral_8x7b": dict(num_attention_heads=32, num_key_value_heads=8),
    "qwen15_moe_a27b": dict(num_attention_heads=16, num_key_value_heads=16),
    "qwen3_30b_a3b": dict(num_attention_heads=32, num_key_value_heads=4, head_dim=128),
    "phi35_moe": dict(num_attention_heads=32, num_key_value_heads=8),
    "olmoe_1b_7b": dict(num_attention_heads=16, num_key_value_heads=16),
    "deepseek_v2_lite": dict(num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512,
                             q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
                             v_head_dim=128, head_dim=64, topk_method="greedy"),
    "deepseek_v3": dict(num_attention_heads=128, num_key_value_heads=128, kv_lora_rank=512,
                        q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64,
                        v_head_dim=128, head_dim=64, n_group=8, topk_group=4,
                        norm_topk_prob=True, routed_scaling_factor=2.5),
    "switch_base_128": dict(d_kv=64, num_heads=12),
    "switch_large_128": dict(d_kv=64, num_heads=16),
    "nllb_moe_54b": dict(encoder_attention_heads=16, decoder_attention_heads=16),
}


def supported_list() -> str:
    return ", ".join(sorted(SUPPORTED))


def arch_of(model_or_config) -> ArchInfo:
    cfg = getattr(model_or_config, "config", model_or_config)
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED:
        raise UnsupportedArchitecture(
            f"model type {mt!r} is not supported for expert offloading; supported: "
            f"{supported_list()}")
    return SUPPORTED[mt]


def tiny_config(model_type: str, **overrides):
    """A small random-weight config of `model_type` (no download); fp32, eager attention."""
    from transformers import AutoConfig

    if model_type not in SUPPORTED:
        raise UnsupportedArchitecture(f"no tiny config for {model_type!r}; supported: "
                                      f"{supported_list()}")
    kw = dict(SUPPORTED[model_type].tiny)
    kw.update(overrides)
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def scaled_config(spec, num_moe_layers: int | None = None, vocab_size: int | None = None):
    """HF config with the spec's per-layer shapes (see the module docstring for the rule)."""
    from transformers import AutoConfig

    mt = MODEL_TYPE_OF_SPEC.get(spec.name)
    if mt is None:
        raise UnsupportedArchitecture(
            f"model spec {spec.name!r} has no HF architecture here; supported specs: "
            f"{', '.join(sorted(MODEL_TYPE_OF_SPEC))}")
    n_layers = _kept_layers(spec, num_moe_layers)
    vocab = vocab_size or spec.vocab_size
    kw: dict[str, Any] = dict(_ATTN.get(spec.name, {}))
    h, E = spec.hidden_size, spec.num_experts
    if mt in ("switch_transformers", "nllb-moe"):
        kw.update(_encoder_decoder_shapes(spec, mt, n_layers), vocab_size=vocab, d_model=h,
                  num_experts=E, encoder_sparse_step=spec.moe_every,
                  decoder_sparse_step=spec.moe_every, expert_capacity=1 << 20)
    else:
        kw.update(vocab_size=vocab, hidden_size=h, num_hidden_layers=n_layers,
                  num_experts_per_tok=spec.top_k, **_decoder_moe_shapes(spec, mt))
    return AutoConfig.for_model(mt, **kw)


def _kept_layers(spec, num_moe_layers: int | None) -> int:
    """Layers kept: every layer, or the dense prefix then num_moe_layers MoE layers in the
    moe_every pattern."""
    n_moe = spec.num_moe_layers if spec.architecture == "decoder" else spec.num_moe_layers // 2
    if num_moe_layers is None:
        return spec.num_layers
    if not 1 <= num_moe_layers <= n_moe:
        raise ValueError(f"num_moe_layers must be in 1..{n_moe}, got {num_moe_layers}")
    return spec.moe_first_layer + (num_moe_layers - 1) * spec.moe_every + 1


def _encoder_decoder_shapes(spec, mt: str, n_layers: int) -> dict:
    if mt == "switch_transformers":
        return dict(d_ff=spec.expert_ffn_size, num_layers=n_layers,
                    num_decoder_layers=n_layers)
    return dict(encoder_ffn_dim=spec.expert_ffn_size, decoder_ffn_dim=spec.expert_ffn_size,
                encoder_layers=n_layers, decoder_layers=n_layers)


def _decoder_moe_shapes(spec, mt: str) -> dict:
    """The expert (and dense) widths and expert counts under each decoder family's names."""
    E, dense = spec.num_experts, spec.dense_ffn_size or spec.expert_ffn_size
    if mt in ("mixtral", "phimoe"):
        return dict(intermediate_size=spec.expert_ffn_size, num_local_experts=E)
    if mt == "olmoe":
        return dict(intermediate_size=spec.expert_ffn_size, num_experts=E)
    if mt in ("qwen2_moe", "qwen3_moe"):
        kw = dict(intermediate_size=dense, moe_intermediate_size=spec.expert_ffn_size,
                  num_experts=E, decoder_sparse_step=spec.moe_every,
                  mlp_only_layers=list(range(spec.moe_first_layer)))
        if mt == "qwen2_moe":
            kw["shared_expert_intermediate_size"] = spec.shared_expert_ffn_size
        return kw
    # deepseek_v2 / deepseek_v3
    return dict(intermediate_size=dense, moe_intermediate_size=spec.expert_ffn_size,
                n_routed_experts=E, n_shared_experts=spec.num_shared_experts,
                first_k_dense_replace=spec.moe_first_layer)


@dataclass
class MoEBlock:
    moe_index: int  # trace layer id
    stack: str  # "decoder" | "encoder"
    name: str  # module path
    block: torch.nn.Module
    router: torch.nn.Module
    experts: torch.nn.Module
    num_experts: int
    top_k: int
    arch: ArchInfo
    route: Callable = field(repr=False, default=None)


def moe_blocks(model) -> list[MoEBlock]:
    """MoE blocks in trace layer order (encoder stack first, then decoder)."""
    arch = arch_of(model)
    cfg = model.config
    found = [(n, m) for n, m in model.named_modules() if type(m).__name__ == arch.block_class]
    if not found:
        raise UnsupportedArchitecture(f"{arch.model_type}: no {arch.block_class} module found")
    enc = [(n, m) for n, m in found if ".encoder." in f".{n}."]
    dec = [(n, m) for n, m in found if ".encoder." not in f".{n}."]
    top_k = _top_k(arch, cfg)
    out = []
    for stack, group in (("encoder", enc), ("decoder", dec)):
        for name, mod in group:
            router = getattr(mod, arch.router_attr)
            experts = getattr(mod, arch.experts_attr)
            E = int(getattr(experts, "num_experts", None) or router.num_experts)
            out.append(MoEBlock(len(out), stack, name, mod, router, experts, E, top_k, arch,
                                _router_fn(arch, E, top_k)))
    return out


def _top_k(arch: ArchInfo, cfg) -> int:
    if arch.model_type == "switch_transformers":
        return 1
    if arch.model_type == "nllb-moe":
        return 2
    return int(cfg.num_experts_per_tok)


def _router_fn(arch: ArchInfo, E: int, k: int) -> Callable:
    if arch.model_type == "switch_transformers":
        def route(out):
            dispatch, top_prob, logits = out  # [B,S,E] capacity-masked one-hot, [B,S,1], [B,S,E]
            logits = logits.reshape(-1, E).float()
            ids = logits.argmax(-1, keepdim=True)
            kept = dispatch.reshape(-1, E).gather(1, ids).float()
            w = top_prob.reshape(-1, 1).float() * kept
            return ids, w, torch.softmax(logits, -1)
        return route
    if arch.model_type == "nllb-moe":
        def route(out):
            _, gates, logits = out  # [T,E] mask, [T,E] combine weights, [T,E] logits
            logits = logits.reshape(-1, E).float()
            first = logits.argmax(-1, keepdim=True)
            second = logits.scatter(1, first, float("-inf")).argmax(-1, keepdim=True)
            ids = torch.cat([first, second], 1)
            return ids, gates.reshape(-1, E).float().gather(1, ids), torch.softmax(logits, -1)
        return route
    sigmoid = arch.probs_fn == "sigmoid"

    def route(out):
        logits, w, ids = out  # [T,E], [T,k], [T,k]
        logits = logits.reshape(-1, E).float()
        probs = torch.sigmoid(logits) if sigmoid else F.softmax(logits, -1)
        return ids.reshape(-1, k).long(), w.reshape(-1, k).float(), probs
    return route
