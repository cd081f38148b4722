"""Model and hardware yamls in conf/ against the numbers in the reference documents.

Expected values are literals copied from ../shared/reference/paper_numbers.md (section B table
and totals; section C for hardware) and model_configs_sources.md (its "bytes/exp bf16" and
"routed total(B)" table). They are not derived from the code under test.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

from core.specs import SpecError, hardware_spec_from_dict, model_spec_from_dict

CONF = ROOT / "conf"
MODEL_FILES = sorted((CONF / "model").glob("*.yaml"))
HARDWARE_FILES = sorted((CONF / "hardware").glob("*.yaml"))

# Total parameters in units of 1e9, paper_numbers.md B totals ("total ...B").
EXPECTED_TOTAL_B = {
    "deepseek_v2_lite": 15.71,
    "mixtral_8x7b": 46.70,
    "qwen15_moe_a27b": 14.32,
    "phi35_moe": 41.87,
    "switch_base_128": 7.44,
    "switch_large_128": 26.34,
    "nllb_moe_54b": 54.48,
    "arctic": 476.82,
    "olmoe_1b_7b": 6.92,
    "qwen3_30b_a3b": 30.53,
    "deepseek_v3": 671.03,  # main model, excluding the MTP module
}
TOTAL_REL_TOL = 0.015

# Bytes of one routed expert in bf16, model_configs_sources.md table, "bytes/exp bf16".
EXPECTED_EXPERT_BYTES_BF16 = {
    "deepseek_v2_lite": 17301504,
    "mixtral_8x7b": 352321536,
    "qwen15_moe_a27b": 17301504,
    "phi35_moe": 157286400,
    "switch_base_128": 9437184,
    "switch_large_128": 16777216,
    "nllb_moe_54b": 67108864,
    "arctic": 209190912,
    "olmoe_1b_7b": 12582912,
    "qwen3_30b_a3b": 9437184,
    "deepseek_v3": 88080384,
}

# All routed-expert parameters in units of 1e9, model_configs_sources.md, "routed total(B)".
EXPECTED_ROUTED_TOTAL_B = {
    "deepseek_v2_lite": 14.39,
    "mixtral_8x7b": 45.10,
    "qwen15_moe_a27b": 12.46,
    "phi35_moe": 40.27,
    "switch_base_128": 7.25,
    "switch_large_128": 25.77,
    "nllb_moe_54b": 51.54,
    "arctic": 468.59,
    "olmoe_1b_7b": 6.44,
    "qwen3_30b_a3b": 28.99,
    "deepseek_v3": 653.91,
}

# (MoE layers, routed experts, top-k, hidden, expert ffn), paper_numbers.md B table.
EXPECTED_SHAPE = {
    "deepseek_v2_lite": (26, 64, 6, 2048, 1408),
    "mixtral_8x7b": (32, 8, 2, 4096, 14336),
    "qwen15_moe_a27b": (24, 60, 4, 2048, 1408),
    "phi35_moe": (32, 16, 2, 4096, 6400),
    "switch_base_128": (12, 128, 1, 768, 3072),  # 6 enc + 6 dec
    "switch_large_128": (24, 128, 1, 1024, 4096),  # 12 + 12
    "nllb_moe_54b": (12, 128, 2, 2048, 8192),  # 6 + 6
    "arctic": (35, 128, 2, 7168, 4864),
    "olmoe_1b_7b": (16, 64, 8, 2048, 1024),
    "qwen3_30b_a3b": (48, 128, 8, 2048, 768),
    "deepseek_v3": (58, 256, 8, 7168, 2048),
}

# MoE layers per stack for the encoder-decoder models, paper_numbers.md B ("6 enc + 6 dec",
# "12 + 12", "6 + 6"), and which in-stack indices are sparse (B: "HF marks Switch layers
# i%2==1 and NLLB layers (i+1)%4==0").
EXPECTED_ENC_DEC = {
    "switch_base_128": (6, 6, [1, 3, 5, 7, 9, 11]),
    "switch_large_128": (12, 12, list(range(1, 24, 2))),
    "nllb_moe_54b": (6, 6, [3, 7, 11, 15, 19, 23]),
}

# Leading dense layers, paper_numbers.md B: DeepSeek-V2-Lite "layer 0 dense",
# DeepSeek-V3 "layers 0-2 dense".
EXPECTED_DENSE_PREFIX = {"deepseek_v2_lite": 1, "deepseek_v3": 3}

# Checkpoint precision: Switch and NLLB ship fp32 (model_configs_sources.md); Diff-MoE's
# fp32 expert sizes, paper_numbers.md A3: 18,874,368 B (switch-base), 33,554,432 B
# (switch-large).
EXPECTED_FP32_EXPERT_BYTES = {"switch_base_128": 18874368, "switch_large_128": 33554432}

# Hardware, paper_numbers.md C and hardware_sources.md: (memory GB, memory bandwidth GB/s,
# PCIe generation of the host link).
EXPECTED_HARDWARE = {
    "rtx_a5000": (24, 768, 4),
    "rtx_3090": (24, 936.2, 4),
    "rtx_4090": (24, 1008, 4),
    "a100_80g_pcie": (80, 1935, 4),
    "h100_pcie": (80, 2000, 5),
    "h200": (141, 4800, 5),
    # Mixtral-Offloading Table 2's devices: memory and PCIe generation from its header
    # (paper_numbers.md A4); the three bandwidths below are estimates ([G] in their yaml),
    # not read in a source: this only guards the files against typos.
    "a100_80g_sxm": (80, 2039, 4),
    "rtx_3080_mobile": (16, 448, 4),
    "rtx_3060": (12, 360, 3),
    "t4": (16, 320, 3),
    # From the sources their yamls cite (hardware_sources.md for the H100
    # SXM; spec pages for the L4 and the RTX PRO 6000)
    "h100_sxm": (80, 3350, 5),
    "l4": (24, 300, 4),
    "rtx_pro_6000": (96, 1792, 5),
}
# Nominal x16 link rate per direction: Gen3 8 GT/s * 128/130 * 16 / 8 = 15.75 GB/s [C], Gen4
# "32+32 GB/s", Gen5 "128 GB/s bidirectional" (hardware_sources.md). A copy rate above it is
# impossible.
LINK_GBPS = {3: 15.75, 4: 32.0, 5: 64.0}
# Lowest measured pinned H2D on a Gen4 host in hardware_sources.md: A10 single stream ~19.6,
# A100 PCIe 19.4 at 10 MB. A Gen4 card configured below that is a typo.
GEN4_MEASURED_MIN_GBPS = 19.4


def _load(path: Path) -> dict:
    with path.open() as f:
        data = yaml.safe_load(f)
    assert isinstance(data, dict), f"{path} is not a mapping"
    return data


def _model(name: str):
    return model_spec_from_dict(_load(CONF / "model" / f"{name}.yaml"), name)


def _total_params(spec) -> int:
    return (sum(layer.dense_params for layer in spec.layers) + spec.embedding_params
            + spec.num_moe_layers * spec.num_experts * spec.expert_params)


# ---- model yamls --------------------------------------------------------------------------


def test_model_files_match_the_expected_set():
    assert {p.stem for p in MODEL_FILES} == set(EXPECTED_TOTAL_B)


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.stem)
def test_model_yaml_validates_and_name_matches_file(path):
    spec = model_spec_from_dict(_load(path), str(path))
    assert spec.name == path.stem
    assert spec.num_moe_layers > 0


@pytest.mark.parametrize("name", sorted(EXPECTED_TOTAL_B))
def test_total_parameters_match_reference(name):
    total_b = _total_params(_model(name)) / 1e9
    assert total_b == pytest.approx(EXPECTED_TOTAL_B[name], rel=TOTAL_REL_TOL)


@pytest.mark.parametrize("name", sorted(EXPECTED_ROUTED_TOTAL_B))
def test_routed_expert_parameters_match_reference(name):
    spec = _model(name)
    routed_b = spec.num_moe_layers * spec.num_experts * spec.expert_params / 1e9
    assert routed_b == pytest.approx(EXPECTED_ROUTED_TOTAL_B[name], abs=0.006)


@pytest.mark.parametrize("name", sorted(EXPECTED_SHAPE))
def test_moe_shape_matches_reference(name):
    spec = _model(name)
    got = (spec.num_moe_layers, spec.num_experts, spec.top_k, spec.hidden_size,
           spec.expert_ffn_size)
    assert got == EXPECTED_SHAPE[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_EXPERT_BYTES_BF16))
def test_expert_bytes_at_16_bits_match_reference(name):
    data = _load(CONF / "model" / f"{name}.yaml")
    data["expert_bits"] = 16
    assert model_spec_from_dict(data, name).expert_bytes == EXPECTED_EXPERT_BYTES_BF16[name]


@pytest.mark.parametrize("bits", [32, 8, 4, 3, 2])
@pytest.mark.parametrize("name", ["deepseek_v2_lite", "mixtral_8x7b", "switch_base_128",
                                  "deepseek_v3"])
def test_expert_bytes_scale_with_expert_bits(name, bits):
    data = _load(CONF / "model" / f"{name}.yaml")
    data["expert_bits"] = bits
    spec = model_spec_from_dict(data, name)
    assert spec.expert_bytes * 16 == EXPECTED_EXPERT_BYTES_BF16[name] * bits
    assert spec.total_expert_bytes == spec.num_moe_layers * spec.num_experts * spec.expert_bytes


def test_four_bit_expert_is_a_quarter_of_bf16():
    data = _load(CONF / "model" / "mixtral_8x7b.yaml")
    data["expert_bits"] = 4
    assert model_spec_from_dict(data, "mixtral").expert_bytes == 352321536 // 4


@pytest.mark.parametrize("name", sorted(EXPECTED_FP32_EXPERT_BYTES))
def test_fp32_checkpoints_ship_at_32_bits(name):
    spec = _model(name)
    assert spec.expert_bits == 32
    assert spec.expert_bytes == EXPECTED_FP32_EXPERT_BYTES[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_ENC_DEC))
def test_encoder_decoder_moe_layers_per_stack(name):
    n_enc, n_dec, sparse = EXPECTED_ENC_DEC[name]
    spec = _model(name)
    assert spec.architecture == "encoder_decoder"
    stacks = spec.moe_layer_stacks
    assert (stacks.count("encoder"), stacks.count("decoder")) == (n_enc, n_dec)
    assert stacks == ("encoder",) * n_enc + ("decoder",) * n_dec  # trace order
    for stack in ("encoder", "decoder"):
        layers = [layer for layer in spec.layers if layer.stack == stack]
        first = layers[0].index
        assert [layer.index - first for layer in layers if layer.moe_index >= 0] == sparse
    assert [layer.moe_index for layer in spec.layers if layer.moe_index >= 0] == list(
        range(n_enc + n_dec))


@pytest.mark.parametrize("name", sorted(EXPECTED_DENSE_PREFIX))
def test_leading_dense_layers(name):
    spec = _model(name)
    n = EXPECTED_DENSE_PREFIX[name]
    assert [layer.moe_index for layer in spec.layers[: n + 1]] == [-1] * n + [0]
    assert all(layer.moe_index >= 0 for layer in spec.layers[n:])


def test_decoder_only_models_have_only_decoder_layers():
    for path in MODEL_FILES:
        spec = model_spec_from_dict(_load(path), str(path))
        if spec.architecture == "decoder":
            assert spec.encoder_layers == 0
            assert set(spec.moe_layer_stacks) == {"decoder"}


# ---- hardware yamls -----------------------------------------------------------------------


def test_hardware_files_match_the_expected_set():
    assert {p.stem for p in HARDWARE_FILES} == set(EXPECTED_HARDWARE)


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_hardware_yaml_validates_and_matches_reference(path):
    hw = hardware_spec_from_dict(_load(path), str(path))
    assert hw.name == path.stem
    mem_gb, hbm_gbps, gen = EXPECTED_HARDWARE[path.stem]
    assert hw.gpu_mem_gb == mem_gb
    assert hw.hbm_gbps == hbm_gbps
    assert hw.h2d_gbps < LINK_GBPS[gen]
    if gen == 4:
        assert hw.h2d_gbps >= GEN4_MEASURED_MIN_GBPS
    assert hw.runtime_reserve_gb < hw.gpu_mem_gb


# ---- strict validation --------------------------------------------------------------------

MODEL_BASE = "mixtral_8x7b"
HARDWARE_BASE = "rtx_a5000"
MODEL_POSITIVE_INT_KEYS = ["num_layers", "hidden_size", "num_experts", "top_k"]
MODEL_POSITIVE_FLOAT_KEYS = ["expert_bits", "dense_bits"]
HARDWARE_POSITIVE_KEYS = ["gpu_mem_gb", "h2d_gbps", "hbm_gbps", "peak_tflops"]
HARDWARE_ZERO_OK_KEYS = ["h2d_latency_us", "runtime_reserve_gb"]


def _model_data() -> dict:
    return _load(CONF / "model" / f"{MODEL_BASE}.yaml")


def _hardware_data() -> dict:
    return _load(CONF / "hardware" / f"{HARDWARE_BASE}.yaml")


def _assert_spec_error(fn, data: dict, key: str) -> None:
    with pytest.raises(SpecError) as excinfo:
        fn(data, "where")
    assert key in str(excinfo.value)


@pytest.mark.parametrize(("fn", "base"), [(model_spec_from_dict, _model_data),
                                          (hardware_spec_from_dict, _hardware_data)],
                         ids=["model", "hardware"])
@pytest.mark.parametrize("key", ["bogus_key", "expert_size_mb"])
def test_unknown_key_is_an_error(fn, base, key):
    data = base()
    data[key] = 1
    _assert_spec_error(fn, data, key)


@pytest.mark.parametrize("key", ["num_layers", "hidden_size", "expert_bits", "top_k",
                                 "tie_embeddings", "architecture"])
def test_missing_model_key_is_an_error(key):
    data = _model_data()
    del data[key]
    _assert_spec_error(model_spec_from_dict, data, key)


@pytest.mark.parametrize("key", ["gpu_mem_gb", "h2d_gbps", "h2d_latency_us", "name"])
def test_missing_hardware_key_is_an_error(key):
    data = _hardware_data()
    del data[key]
    _assert_spec_error(hardware_spec_from_dict, data, key)


@pytest.mark.parametrize("value", [0, -1, -0.5])
@pytest.mark.parametrize("key", MODEL_POSITIVE_INT_KEYS + MODEL_POSITIVE_FLOAT_KEYS)
def test_non_positive_model_value_is_an_error(key, value):
    data = _model_data()
    data[key] = value
    _assert_spec_error(model_spec_from_dict, data, key)


@pytest.mark.parametrize("value", [0, -1, -0.5])
@pytest.mark.parametrize("key", HARDWARE_POSITIVE_KEYS)
def test_non_positive_hardware_value_is_an_error(key, value):
    data = _hardware_data()
    data[key] = value
    _assert_spec_error(hardware_spec_from_dict, data, key)


@pytest.mark.parametrize("key", HARDWARE_ZERO_OK_KEYS)
def test_zero_allowed_hardware_keys_accept_zero_but_not_negative(key):
    data = _hardware_data()
    data[key] = 0
    assert getattr(hardware_spec_from_dict(data, "where"), key) == 0
    data[key] = -1
    _assert_spec_error(hardware_spec_from_dict, data, key)


def test_negative_moe_first_layer_is_an_error():
    data = _model_data()
    data["moe_first_layer"] = -1
    _assert_spec_error(model_spec_from_dict, data, "moe_first_layer")


@pytest.mark.parametrize("key", MODEL_POSITIVE_FLOAT_KEYS + MODEL_POSITIVE_INT_KEYS[:2])
def test_nan_model_value_is_an_error(key):
    data = _model_data()
    data[key] = math.nan
    _assert_spec_error(model_spec_from_dict, data, key)


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("key", HARDWARE_POSITIVE_KEYS + HARDWARE_ZERO_OK_KEYS)
def test_nan_or_inf_hardware_value_is_an_error(key, value):
    data = _hardware_data()
    data[key] = value
    _assert_spec_error(hardware_spec_from_dict, data, key)


def test_yaml_nan_literal_is_rejected():
    # A yaml `.nan` reaches the validator as float('nan'), the path a typo would take.
    data = _model_data()
    data.update(yaml.safe_load("expert_bits: .nan"))
    _assert_spec_error(model_spec_from_dict, data, "expert_bits")
