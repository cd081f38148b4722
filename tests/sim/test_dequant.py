"""The dequantisation cost of quantized experts (docs/quantization.md): one charge per expert
call at the hardware profile's rate for the width, nothing at 16 bits and above, and a run
whose width the profile lacks refused before anything is written."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from helpers import ROOT, conf_model

from core.specs import HostSpec, SpecError, hardware_spec_from_dict
from harness.runner.assembly import assemble
from harness.runner.config import compose_config
from harness.sim.backend_sim import SimBackend, dequant_ms

TINY = ["experiment=table1", "workload.num_requests=2", "workload.prompt_len=8",
        "workload.output_len=2", "calibration_requests=2", "progress=false"]


def _hw(name: str):
    path = ROOT / "conf" / "hardware" / f"{name}.yaml"
    return hardware_spec_from_dict(yaml.safe_load(path.read_text()), name)


def test_two_bit_expert_by_hand():
    # Mixtral-8x7B expert: 3 matrices x hidden 4096 x FFN 14336 = 176,160,768 params; at 2 bits
    # 44,040,192 B. conf/hardware/a100_80g_sxm.yaml: hbm 2039 GB/s = 2.039e9 B/ms, peak 312
    # TFLOP/s = 3.12e11 FLOP/ms, expert overhead 60 us, dequant_gparams_per_s "2": 479.8
    # (1e9 params/s = 4.798e8 params/ms).
    #   memory  44,040,192 / 2.039e9          = 0.0215989 ms
    #   compute 2 * 176,160,768 * 1 / 3.12e11 = 0.0011292 ms   (one token: memory-bound)
    #   dequant 176,160,768 / 4.798e8          = 0.3671546 ms
    #   total   0.0215989 + 0.06 + 0.3671546   = 0.4487535 ms
    model = replace(conf_model("mixtral_8x7b"), expert_bits=2)
    be = SimBackend(model, _hw("a100_80g_sxm"))
    assert model.expert_bytes == 44_040_192
    assert be.expert_ms(1) == pytest.approx(0.4487535, rel=1e-6)
    # 10,000 tokens: compute 2 * 176,160,768 * 1e4 / 3.12e11 = 11.292357 ms, + 0.06 + dequant
    assert be.expert_ms(10_000) == pytest.approx(11.292357 + 0.06 + 0.3671546, rel=1e-6)
    # the copy moves the packed bytes only: the dequantisation is compute-stream time
    assert be.expert_copy_ms == pytest.approx(0.01 + 44_040_192 / 2.5e7)


@pytest.mark.parametrize("bits", [16, 32])
def test_sixteen_bits_and_above_pay_nothing(bits):
    model = replace(conf_model("mixtral_8x7b"), expert_bits=bits)
    hw = _hw("a100_80g_sxm")
    assert dequant_ms(model, hw) == 0.0
    # bytes / HBM + the 60 us overhead, as before the dequantisation cost existed
    assert SimBackend(model, hw).expert_ms(1) == model.expert_bytes / 2.039e9 + 0.06


def test_cpu_experts_read_packed_weights():
    # kTransformers / llama.cpp CPU kernels compute on the packed weights: no dequant charge
    host = HostSpec("h", "a host", dram_gb=256, reserve_gb=8, mem_gbps=100, cpu_tflops=2,
                    cpu_expert_overhead_us=0)
    hw = replace(_hw("a100_80g_sxm"), host=host)
    q2 = replace(conf_model("mixtral_8x7b"), expert_bits=2)
    # memory 44,040,192 B / 1e8 B/ms = 0.44040192 ms (compute 2 * 176,160,768 / 2e9 FLOP/ms
    # = 0.176 ms is below it); one token's 4096 bf16 values over the link and back, 2 copies
    # of 10 us + 8192 B / 2.5e7 B/ms
    link = 2 * (0.01 + 8192 / 2.5e7)
    assert SimBackend(q2, hw).cpu_expert_ms(1) == pytest.approx(0.44040192 + link, rel=1e-9)


@pytest.mark.parametrize(("override", "match"), [
    ("model.expert_bits=5", r"model\.expert_bits=5 has no rate on rtx_a5000 \(widths listed: "
                            r"2, 3, 4, 8\)"),
    ("model.expert_bits=2.5", r"model\.expert_bits=2\.5 is not a whole number of bits"),
    ("hardware.dequant_gparams_per_s=null", r"model\.expert_bits=4 has no rate .*listed: none"),
])
def test_missing_width_refused_before_anything_is_written(tmp_path, override, match):
    bits = [] if "expert_bits" in override else ["model.expert_bits=4"]
    cfg = compose_config([*TINY, *bits, override], results_dir=str(tmp_path / "res"))
    with pytest.raises(SpecError, match=rf"^hardware\.dequant_gparams_per_s: {match}"):
        assemble(cfg)
    assert not (tmp_path / "res").exists()


def test_every_gpu_profile_has_the_usual_widths():
    for path in sorted((ROOT / "conf/hardware").glob("*.yaml")):
        hw = hardware_spec_from_dict(yaml.safe_load(path.read_text()), path.stem)
        assert all(hw.dequant_rate(b) for b in (2, 3, 4, 8)), path.name
        # a wider packing reads more bytes per parameter: never faster
        rates = [hw.dequant_rate(b) for b in (2, 3, 4, 8)]
        assert rates == sorted(rates, reverse=True), path.name
