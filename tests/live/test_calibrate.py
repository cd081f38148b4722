"""`moebench calibrate`: the link fit against hand-worked numbers, the scaled layer shapes, the
host CPU's expert fit against times made by SimBackend's own formula, and one --quick run end
to end (both profiles accepted by the simulator's spec loaders and by Hydra).

Whether the fitted CPU model predicts this machine's own times is a timing test: noisy on a
shared 2-core box, so it runs only with MOEBENCH_TIMING_TESTS=1."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from core.specs import hardware_spec_from_dict, host_spec_from_dict, model_spec_from_dict

torch = pytest.importorskip("torch", reason="calibrate needs the [torch] extra")

from helpers import ROOT  # noqa: E402

from harness.live.calibrate import fit_link, scaled_spec  # noqa: E402
from harness.live.calibrate_cpu import fit_cpu_expert, measure_host  # noqa: E402

# A DeepSeek-V2-Lite expert in bf16: 3 * 2048 * 1408 params, 2 bytes each.
PARAMS = 3 * 2048 * 1408
BYTES = 2 * PARAMS
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128]


def _cpu_ms(n: int, mem_gbps: float = 20.0, cpu_tflops: float = 0.5,
            overhead_us: float = 30.0) -> float:
    """SimBackend.cpu_expert_ms less the link: 17.3 MB / 20 GB/s = 0.865 ms of memory;
    34.6 MFLOP per token / 0.5 TFLOP/s = 0.0692 ms per token, so 1..8 tokens sit on the
    memory plateau and 16..128 on the FLOP line (crossover at 12.5 tokens)."""
    return max(BYTES / (mem_gbps * 1e6), 2 * n * PARAMS / (cpu_tflops * 1e9)) + overhead_us / 1e3


def test_fit_link_recovers_latency_and_bandwidth():
    # t = 10 us + bytes / (20 GB/s): 1 MB -> 0.01 + 0.05 ms, 4 MB -> 0.21 ms, 16 MB -> 0.81 ms.
    sizes = [1e6, 4e6, 16e6]
    fit = fit_link(sizes, [0.06, 0.21, 0.81])
    assert fit["latency_us"] == pytest.approx(10.0, abs=1e-6)
    assert fit["h2d_gbps"] == pytest.approx(20.0, rel=1e-9)


def test_fit_link_negative_intercept_refits_through_origin():
    # OLS through (1 MB, 0.099 ms), (2 MB, 0.199 ms): slope 1e-7 ms/B, intercept -1 us.
    # Through the origin: slope = (1e6*0.099 + 2e6*0.199) / (1e12 + 4e12) = 9.94e-8 ms/B,
    # i.e. 1 / 9.94e-8 / 1e6 = 10.0604 GB/s.
    fit = fit_link([1e6, 2e6], [0.099, 0.199])
    assert fit["intercept_us"] == pytest.approx(-1.0, abs=1e-6)
    assert fit["latency_us"] == 0.0
    assert fit["h2d_gbps"] == pytest.approx(10.0604, abs=1e-4)


def test_scaled_spec_quarter_width():
    spec = model_spec_from_dict(yaml.safe_load(
        (ROOT / "conf" / "model" / "deepseek_v2_lite.yaml").read_text()))
    small = scaled_spec(spec, 0.25, bits=32)
    # hidden 2048/4 = 512, expert FFN 1408/4 = 352, attention 13,762,560 / 16 = 860,160.
    assert (small.hidden_size, small.expert_ffn_size) == (512, 352)
    assert small.attention_params_per_layer == 860160
    assert small.expert_params == 3 * 512 * 352
    assert small.expert_bytes == 3 * 512 * 352 * 4
    assert (small.num_moe_layers, small.num_experts, small.top_k) == (26, 64, 6)


@pytest.mark.parametrize("stream_gbps", [None, 20.0, 13.0])
def test_fit_cpu_expert_recovers_known_parameters(stream_gbps):
    # Without a bandwidth, or with the true one, or a wrong one (13 GB/s predicts the plateau
    # worse than the plateau itself does), the fit returns the generating parameters.
    fit = fit_cpu_expert(TOKENS, [_cpu_ms(n) for n in TOKENS], BYTES, PARAMS, stream_gbps)
    assert fit["mem_gbps"] == pytest.approx(20.0, rel=0.01)
    assert fit["cpu_tflops"] == pytest.approx(0.5, rel=0.01)
    assert fit["cpu_expert_overhead_us"] == pytest.approx(30.0, rel=0.01)
    assert fit["worst_rel_err"] < 1e-9
    assert fit["fit_ms"] == pytest.approx([_cpu_ms(n) for n in TOKENS], rel=1e-9)


def test_fit_cpu_expert_other_parameters_and_unsorted_points():
    # 50 GB/s, 2 TFLOP/s, no overhead: memory 0.346 ms, 0.0173 ms per token (crossover 20).
    tokens = [128, 1, 64, 4, 16, 32]
    times = [_cpu_ms(n, 50.0, 2.0, 0.0) for n in tokens]
    fit = fit_cpu_expert(tokens, times, BYTES, PARAMS)
    assert (fit["mem_gbps"], fit["cpu_tflops"]) == (pytest.approx(50.0, rel=0.01),
                                                   pytest.approx(2.0, rel=0.01))
    assert fit["cpu_expert_overhead_us"] == pytest.approx(0.0, abs=0.01)
    assert fit["fit_ms"] == pytest.approx(times, rel=1e-9)  # in the caller's order


def test_fit_cpu_expert_all_flop_bound_takes_the_measured_bandwidth():
    # 32..128 tokens are all on the FLOP line: the times say nothing of memory, so the
    # measured bandwidth stands; without one there is nothing to fit memory from.
    tokens = [32, 64, 128]
    times = [_cpu_ms(n) for n in tokens]
    fit = fit_cpu_expert(tokens, times, BYTES, PARAMS, stream_gbps=20.0)
    assert fit["mem_from"] == "stream"
    assert (fit["mem_gbps"], fit["cpu_tflops"], fit["cpu_expert_overhead_us"]) == (
        pytest.approx(20.0), pytest.approx(0.5), pytest.approx(30.0))
    with pytest.raises(ValueError, match="3 points"):
        fit_cpu_expert([1, 2], [1.0, 1.0], BYTES, PARAMS)


@pytest.mark.skipif(not os.environ.get("MOEBENCH_TIMING_TESTS"),
                    reason="timing test: set MOEBENCH_TIMING_TESTS=1 (noisy on shared CPUs)")
def test_cpu_fit_predicts_this_machine():
    # The quick shapes (512 x 352 SwiGLU expert), 1 thread: the fitted formula is within 50 %
    # of every measured point.
    m = measure_host(torch, (512, 352, 3), quick=True, threads=1, dtype_choice="auto",
                     budget_s=0.1)
    assert m["fit"]["worst_rel_err"] < 0.5, m["points"]


def test_quick_calibrate_writes_profile_the_simulator_accepts(tmp_path, capsys):
    from moebench.cli import main

    before = torch.get_num_threads()
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--quick", "--threads", "1", "--cpu-threads", "1", "--out",
              str(tmp_path), "--name", "cal"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert "host memory copy into a separate preallocated tensor" in printed
    assert "least-squares fit" in printed and "latency" in printed
    profile_path = tmp_path / "hardware" / "cal.yaml"
    hw = hardware_spec_from_dict(yaml.safe_load(profile_path.read_text()))
    assert hw.name == "cal" and hw.h2d_gbps > 0 and hw.hbm_gbps > 0 and hw.peak_tflops > 0
    sweep = json.loads((tmp_path / "hardware" / "cal.sweep.json").read_text())
    assert sweep["threads"] == 1 and sweep["h2d_is_host_copy"] is True
    assert torch.get_num_threads() == 1
    assert [r["bytes"] for r in sweep["transfer"]] == [65536, 262144, 1048576, 4194304]
    assert [r["tokens"] for r in sweep["expert"]] == [1, 4, 16, 64]
    # Physics the measurement must show: 64x the bytes takes longer; 64 tokens take longer.
    assert sweep["transfer"][-1]["ms"] > sweep["transfer"][0]["ms"]
    assert sweep["expert"][-1]["ms"] > sweep["expert"][0]["ms"]
    assert sweep["wall_s"] < 30  # --quick is meant for tests (< 5 s on an idle 2-core CPU)
    torch.set_num_threads(before)
    # The documented way to use it: Hydra finds <out>/hardware/<name>.yaml on a search path.
    from harness.runner.config import compose_config

    cfg = compose_config(["hardware=cal", f"hydra.searchpath=[file://{tmp_path}]"])
    assert cfg["hardware"]["h2d_gbps"] == hw.h2d_gbps
    _check_host_profile(tmp_path, sweep, printed)


def _check_host_profile(tmp_path, sweep, printed):
    """The host CPU part of the quick run: host/cal.yaml, the sweep's "cpu" points, Hydra."""
    from harness.runner.config import compose_config

    text = (tmp_path / "hardware" / "host" / "cal.yaml").read_text()
    host = host_spec_from_dict(yaml.safe_load(text))
    assert host.name == "cal" and host.mem_gbps > 0 and host.cpu_tflops > 0
    assert 0 < host.reserve_gb < host.dram_gb and host.cpu_expert_overhead_us >= 0
    for key in ("dram_gb", "mem_gbps", "cpu_tflops", "cpu_expert_overhead_us"):
        assert f"{key}: " in text and "[R] measured here" in text.split(f"{key}: ")[1]
    assert "[G]" in text.split("reserve_gb: ")[1].splitlines()[0]
    assert "moebench calibrate --quick" in text and "set_num_threads(1)" in text
    cpu = sweep["cpu"]
    assert cpu["threads"] == 1 and cpu["dtype"] in ("bfloat16", "float32")
    assert [p["tokens"] for p in cpu["points"]] == [1, 4, 16, 64, 128]
    assert all(0 < p["min_ms"] <= p["ms"] and p["fit_ms"] > 0 for p in cpu["points"])
    assert cpu["expert"] == {"hidden": 512, "ffn": 352, "matrices": 3, "params": 3 * 512 * 352,
                             "bytes": 3 * 512 * 352 * (2 if cpu["dtype"] == "bfloat16" else 4)}
    assert sweep["host_profile"]["mem_gbps"] == host.mem_gbps
    assert "cpu expert" in printed and "worst relative error" in printed
    cfg = compose_config(["hardware=cal", "hardware/host=cal",
                          f"hydra.searchpath=[file://{tmp_path}]"])
    assert hardware_spec_from_dict(cfg["hardware"]).host == host


def test_calibrate_rejects_bad_arguments(tmp_path):
    from harness.live.calibrate import calibrate, main

    with pytest.raises(SystemExit):
        main(["--threads", "0"])
    with pytest.raises(SystemExit, match="no model spec"):
        calibrate(model="no_such_model", quick=True, out_dir=str(tmp_path))
    assert not (tmp_path / "hardware").exists()
