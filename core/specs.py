"""Model and hardware specs: plain data loaded from conf/model/*.yaml and conf/hardware/*.yaml.

Units: memory sizes named `*_gb` are GiB (2**30 bytes, as GPU vendors count memory);
rates named `*_gbps` are 10**9 bytes per second; `*_tflops` are 10**12 FLOP/s.
Every spec is validated strictly: an unknown or missing key, or a number that is zero,
negative or NaN where a positive number is required, raises SpecError naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from core.gpu_specs import PeerSpec, check_gpus, peer_spec_from_dict
from core.precision import is_lossy
from core.spec_base import GIB, SpecError, check_keys, name_keys, positive
from core.tier_specs import (
    HostSpec,
    NvmeSpec,
    dequant_table,
    host_spec_from_dict,
    nvme_spec_from_dict,
)

__all__ = ["GIB", "HardwareSpec", "HostSpec", "LayerSpec", "ModelSpec", "NvmeSpec", "SpecError",
           "hardware_spec_from_dict", "model_spec_from_dict"]


@dataclass(frozen=True)
class LayerSpec:
    """One transformer layer as the simulator sees it."""

    index: int  # position in the whole stack (encoder layers first)
    stack: str  # "decoder" or "encoder"
    moe_index: int  # index among MoE layers (trace layer id), -1 for dense layers
    dense_params: int  # resident parameters: attention, router, shared / dense FFN


@dataclass(frozen=True)
class ModelSpec:
    name: str
    display_name: str
    hf_id: str
    architecture: str  # "decoder" | "encoder_decoder"
    num_layers: int  # decoder layers (decoder-only) or decoder stack of an encoder-decoder
    encoder_layers: int
    moe_first_layer: int
    moe_every: int
    num_experts: int
    num_shared_experts: int
    top_k: int
    hidden_size: int
    expert_ffn_size: int
    shared_expert_ffn_size: int
    dense_ffn_size: int
    dense_residual_ffn_size: int
    ffn_matrices: int  # 3 for SwiGLU, 2 for ReLU FFNs
    attention_params_per_layer: int
    cross_attention_params_per_layer: int
    vocab_size: int
    tie_embeddings: bool
    kv_elems_per_token_per_layer: int
    expert_bits: float
    dense_bits: float
    layers: tuple[LayerSpec, ...] = field(repr=False)

    # ---- derived sizes ------------------------------------------------------------------
    @property
    def num_moe_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.moe_index >= 0)

    @property
    def moe_layer_stacks(self) -> tuple[str, ...]:
        """Stack ("encoder"/"decoder") of each MoE layer, in trace layer order."""
        return tuple(layer.stack for layer in self.layers if layer.moe_index >= 0)

    @property
    def expert_params(self) -> int:
        return self.ffn_matrices * self.hidden_size * self.expert_ffn_size

    @property
    def expert_bytes(self) -> int:
        return int(math.ceil(self.expert_params * self.expert_bits / 8))

    @property
    def dense_bytes(self) -> int:
        """All resident weights: every layer's dense part plus embeddings and LM head."""
        params = sum(layer.dense_params for layer in self.layers) + self.embedding_params
        return int(math.ceil(params * self.dense_bits / 8))

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def lm_head_bytes(self) -> int:
        return int(math.ceil(self.vocab_size * self.hidden_size * self.dense_bits / 8))

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token adds, summed over all attention layers."""
        n_attn = len(self.layers)
        return int(math.ceil(n_attn * self.kv_elems_per_token_per_layer * self.dense_bits / 8))

    @property
    def total_expert_bytes(self) -> int:
        return self.num_moe_layers * self.num_experts * self.expert_bytes

    def summary(self) -> dict:
        return {
            "name": self.name,
            "moe_layers": self.num_moe_layers,
            "experts": self.num_experts,
            "top_k": self.top_k,
            "expert_bytes": self.expert_bytes,
            "dense_bytes": self.dense_bytes,
            "total_expert_bytes": self.total_expert_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "expert_bits": self.expert_bits,
            "dense_bits": self.dense_bits,
            "lossy": is_lossy(self.expert_bits, self.dense_bits),  # core/precision.py
        }


_MODEL_REQUIRED = {
    "name", "display_name", "hf_id", "architecture", "num_layers", "moe_first_layer",
    "moe_every", "num_experts", "num_shared_experts", "top_k", "hidden_size",
    "expert_ffn_size", "ffn_matrices", "attention_params_per_layer", "vocab_size",
    "tie_embeddings", "kv_elems_per_token_per_layer", "expert_bits", "dense_bits",
}
_MODEL_OPTIONAL = {
    "encoder_layers", "shared_expert_ffn_size", "dense_ffn_size", "dense_residual_ffn_size",
    "cross_attention_params_per_layer",
}


def _stack_layers(spec: dict, stack: str, n: int, start_index: int, start_moe: int,
                  ) -> list[LayerSpec]:
    h, m = spec["hidden_size"], spec["ffn_matrices"]
    attn = spec["attention_params_per_layer"]
    if stack == "decoder" and spec["architecture"] == "encoder_decoder":
        attn += spec.get("cross_attention_params_per_layer", 0)
    moe_dense = (
        attn
        + h * spec["num_experts"]  # router
        + spec["num_shared_experts"] * m * h * spec.get("shared_expert_ffn_size", 0)
        + m * h * spec.get("dense_residual_ffn_size", 0)
    )
    dense_layer = attn + m * h * spec.get("dense_ffn_size", 0)
    layers, moe_index = [], start_moe
    for i in range(n):
        is_moe = i >= spec["moe_first_layer"] and (i - spec["moe_first_layer"]) % spec[
            "moe_every"] == 0
        layers.append(LayerSpec(start_index + i, stack, moe_index if is_moe else -1,
                                moe_dense if is_moe else dense_layer))
        moe_index += int(is_moe)
    return layers


def model_spec_from_dict(data: dict, where: str = "model") -> ModelSpec:
    data = dict(data)
    check_keys(where, data, _MODEL_REQUIRED, _MODEL_OPTIONAL)
    _check_names(data, where)
    _check_numbers(data, where)
    enc = data.get("encoder_layers", 0)
    if (data["architecture"] == "encoder_decoder") != (enc > 0):
        raise SpecError(f"{where}.encoder_layers: must be > 0 exactly when architecture is "
                        "encoder_decoder")
    layers = _stack_layers(data, "encoder", enc, 0, 0)
    n_enc_moe = sum(1 for layer in layers if layer.moe_index >= 0)
    layers += _stack_layers(data, "decoder", data["num_layers"], enc, n_enc_moe)
    if not any(layer.moe_index >= 0 for layer in layers):
        raise SpecError(f"{where}.moe_first_layer: no layer is MoE")
    values = {f.name: data.get(f.name, 0) for f in fields(ModelSpec) if f.name != "layers"}
    values["encoder_layers"] = enc
    return ModelSpec(**values, layers=tuple(layers))


def _check_names(data: dict, where: str) -> None:
    """The model's names, architecture and tie_embeddings flag."""
    for key in ("name", "display_name", "hf_id"):
        if not isinstance(data[key], str) or not data[key]:
            raise SpecError(f"{where}.{key}: expected a non-empty string")
    if data["architecture"] not in ("decoder", "encoder_decoder"):
        raise SpecError(f"{where}.architecture: expected 'decoder' or 'encoder_decoder', "
                        f"got {data['architecture']!r}")
    if not isinstance(data["tie_embeddings"], bool):
        raise SpecError(f"{where}.tie_embeddings: expected true/false")


def _check_numbers(data: dict, where: str) -> None:
    """The sizes and counts, checked and stored back into `data`, and how they relate."""
    ints = ["num_layers", "moe_every", "num_experts", "top_k", "hidden_size", "expert_ffn_size",
            "ffn_matrices", "attention_params_per_layer", "vocab_size",
            "kv_elems_per_token_per_layer"]
    for key in ints:
        data[key] = positive(where, key, data[key], integer=True)
    zero_ok = ["moe_first_layer", "num_shared_experts", "encoder_layers", "shared_expert_ffn_size",
               "dense_ffn_size", "dense_residual_ffn_size", "cross_attention_params_per_layer"]
    for key in zero_ok:
        if key in data:
            data[key] = positive(where, key, data[key], integer=True, zero_ok=True)
    for key in ("expert_bits", "dense_bits"):
        data[key] = positive(where, key, data[key])
    if data["top_k"] > data["num_experts"]:
        raise SpecError(f"{where}.top_k: {data['top_k']} exceeds num_experts {data['num_experts']}")
    if data["num_shared_experts"] and not data.get("shared_expert_ffn_size"):
        raise SpecError(f"{where}.shared_expert_ffn_size: required when num_shared_experts > 0")


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    display_name: str
    gpu_mem_gb: float  # GiB
    hbm_gbps: float  # device memory bandwidth, 1e9 B/s
    peak_tflops: float  # dense bf16 tensor throughput, 1e12 FLOP/s
    h2d_gbps: float  # host-to-device copy bandwidth, 1e9 B/s
    h2d_latency_us: float  # fixed cost per copy
    layer_overhead_us: float  # framework cost per layer per iteration (kernel launches etc.)
    expert_overhead_us: float  # framework cost per expert call
    iteration_overhead_us: float  # framework cost per forward pass (sampling, scheduling)
    runtime_reserve_gb: float  # GiB kept for CUDA context, activations, allocator slack
    # Optional parts (docs/hardware.md); absent: unbounded host memory, no CPU execution, no
    # NVMe tier, the GPU profile's own link, free dequantisation (refused for quantized experts)
    host: HostSpec | None = None  # conf/hardware/host: DRAM, CPU
    nvme: NvmeSpec | None = None  # conf/hardware/nvme: the tier below host memory
    link: str | None = None  # conf/hardware/link: the profile that set h2d_gbps / latency
    # ((expert bits, 1e9 parameters dequantised per s), ...) ascending by bits
    dequant_gparams_per_s: tuple[tuple[int, float], ...] = ()
    # Several GPUs of this kind (core/gpu_specs.py, docs/gpus.md): one unless a peer link
    # profile (conf/hardware/peer) is chosen, which sets 2
    num_gpus: int = 1
    peer: PeerSpec | None = None

    @property
    def gpu_mem_bytes(self) -> int:
        return int(self.gpu_mem_gb * GIB)

    @property
    def runtime_reserve_bytes(self) -> int:
        return int(self.runtime_reserve_gb * GIB)

    def dequant_rate(self, bits: float) -> float | None:
        """1e9 parameters per s this GPU dequantises experts of `bits` at; None: no entry."""
        return dict(self.dequant_gparams_per_s).get(int(bits)) if bits == int(bits) else None


_HW_ZERO_OK = {"h2d_latency_us", "layer_overhead_us", "expert_overhead_us",
               "iteration_overhead_us", "runtime_reserve_gb"}
_HW_OPTIONAL = {"host", "nvme", "link", "dequant_gparams_per_s", "num_gpus", "peer"}


def hardware_spec_from_dict(data: dict, where: str = "hardware") -> HardwareSpec:
    data = dict(data)
    names = {f.name for f in fields(HardwareSpec)} - _HW_OPTIONAL
    check_keys(where, data, names, _HW_OPTIONAL)
    name_keys(where, data)
    for key in names - {"name", "display_name"}:
        data[key] = positive(where, key, data[key], zero_ok=key in _HW_ZERO_OK)
    if data.get("host") is not None:
        data["host"] = host_spec_from_dict(data["host"], f"{where}.host")
    if data.get("nvme") is not None:
        data["nvme"] = nvme_spec_from_dict(data["nvme"], f"{where}.nvme")
    if data.get("link") is not None:
        name_keys(where, data, ("link",))
    if data.get("peer") is not None:
        data["peer"] = peer_spec_from_dict(data["peer"], f"{where}.peer")
    data["num_gpus"] = check_gpus(data.get("num_gpus", 1), data.get("peer"), where)
    data["dequant_gparams_per_s"] = dequant_table(data.get("dequant_gparams_per_s"),
                                                  f"{where}.dequant_gparams_per_s")
    return HardwareSpec(**data)
