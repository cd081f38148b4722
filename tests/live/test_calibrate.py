"""`moebench calibrate`: the link fit against hand-worked numbers, the scaled layer shapes, and
one --quick run end to end (profile accepted by the simulator's spec loader and by Hydra)."""

from __future__ import annotations

import json

import pytest
import yaml

from core.specs import hardware_spec_from_dict, model_spec_from_dict

torch = pytest.importorskip("torch", reason="calibrate needs the [torch] extra")

from helpers import ROOT  # noqa: E402

from harness.live.calibrate import fit_link, scaled_spec  # noqa: E402


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


def test_quick_calibrate_writes_profile_the_simulator_accepts(tmp_path, capsys):
    from moebench.cli import main

    before = torch.get_num_threads()
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--quick", "--threads", "1", "--out", str(tmp_path), "--name", "cal"])
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


def test_calibrate_rejects_bad_arguments(tmp_path):
    from harness.live.calibrate import calibrate, main

    with pytest.raises(SystemExit):
        main(["--threads", "0"])
    with pytest.raises(SystemExit, match="no model spec"):
        calibrate(model="no_such_model", quick=True, out_dir=str(tmp_path))
    assert not (tmp_path / "hardware").exists()
