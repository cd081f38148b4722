"""The gpus experiment (analysis/repro/experiments/gpus.py): its table on a small hand-made
frame shaped like analysis/repro/frame.run_rows (expected values worked by hand), its figure,
its setting and its place in the suite."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.repro.experiments import gpus
from analysis.repro.registry import EXPERIMENTS, names

EXPERT_BYTES = 352321536
TARGET = {"shard_expert": "systems.placements.shard_expert.ShardExpert",
          "replicate_hot": "systems.placements.replicate_hot.ReplicateHot"}


def _run(system, n, tpot, seed, placement=None, status="valid", **metrics):
    """One run: Mixtral, `n` GPUs, 100 tokens; bytes in metrics as given (one GPU: h2d)."""
    m = {"tpot_ms": {"mean": tpot}, "hit_rate": 0.5, "tokens": 100, "compute_floor_ms": 36.0,
         "decode_stall_ms_per_token": tpot - 30.0, "expert_bytes": EXPERT_BYTES,
         "peak_expert_cache_bytes": 59 * n * EXPERT_BYTES, **metrics}
    cfg = {"model": {"name": "mixtral_8x7b"}, "hardware": {"num_gpus": n},
           "placement": {"_target_": TARGET[placement]} if placement else None}
    result = {"config": cfg, "system": {"name": system}, "seed": seed, "metrics": m,
              "memory": {"expert_cache_bytes": 59 * EXPERT_BYTES}}
    return {"run": f"{system}-{n}-{placement}-{seed}", "system": system, "status": status,
            "routing": "synthetic", "requests": 6, "model": "mixtral_8x7b", "_result": result}


def _frame():
    rows = []
    for seed in (0, 1):
        rows += [
            _run("lru", 1, 800.0 + 100 * seed, seed, h2d_bytes=2e12),
            _run("lru", 2, 400.0, seed, "shard_expert", host_link_bytes=1e12,
                 a2a_bytes=4e8, peer_messages=5000, h2d_bytes=1e12),
            _run("lru", 2, 500.0 + 100 * seed, seed, "replicate_hot",
                 host_link_bytes=1.2e12, peer_copy_bytes=3e10, peer_fetches=85,
                 a2a_bytes=2e8, peer_messages=4000, h2d_bytes=1.2e12),
        ]
    rows.append(_run("lru", 2, 1.0, 2, "shard_expert", status="failed"))  # no row's value
    return pd.DataFrame(rows)


def test_placement_of_names_the_placement_and_one_gpu():
    one = {"hardware": {"num_gpus": 1}, "placement": {"_target_": TARGET["shard_expert"]}}
    assert gpus.placement_of(one) == gpus.ONE_GPU  # every placement is one GPU's run
    two = {"hardware": {"num_gpus": 2}, "placement": {"_target_": TARGET["replicate_hot"]}}
    assert gpus.placement_of(two) == "replicate_hot"


def test_table_rows_bytes_and_speedup():
    tab, header, notes = gpus.table(_frame())
    assert list(tab.columns) == list(gpus.COLUMNS)
    assert [(p, n) for p, n in zip(tab["placement"], tab["num_gpus"])] == [
        (gpus.ONE_GPU, 1), ("shard_expert", 2), ("replicate_hot", 2)]
    one, shard, hot = (tab.iloc[i] for i in range(3))
    assert one["seeds"] == 2 and one["tpot_mean_ms"] == pytest.approx(850.0)
    assert one["tpot_ci95_ms"] == pytest.approx(12.706 * 70.711 / 2**0.5, rel=1e-3)
    assert one["host_link_gb_per_token"] == pytest.approx(20.0)  # h2d on one GPU: 2e12 / 100
    assert one["speedup_vs_1gpu"] == pytest.approx(1.0)
    # per seed 800 / 400 and 900 / 400, averaged; the failed seed 2 is no row's
    assert shard["seeds"] == 2 and shard["speedup_vs_1gpu"] == pytest.approx(2.125)
    assert shard["host_link_gb_per_token"] == pytest.approx(10.0)
    assert shard["a2a_gb_per_token"] == pytest.approx(0.004)
    assert shard["peer_messages_per_token"] == pytest.approx(50.0)
    assert shard["peer_copy_gb_per_token"] == 0.0 and shard["peer_fetches_per_token"] == 0.0
    assert shard["peak_resident_experts"] == pytest.approx(118.0)
    assert shard["cache_gib_per_gpu"] == pytest.approx(59 * EXPERT_BYTES / 2**30)
    assert hot["speedup_vs_1gpu"] == pytest.approx((800 / 500 + 900 / 600) / 2)
    assert hot["peer_copy_gb_per_token"] == pytest.approx(0.3)
    assert hot["peer_fetches_per_token"] == pytest.approx(0.85)
    assert "SIMULATED" in header[0] and "synthetic routing" in header[2]
    assert any("No claim is judged" in n for n in notes)
    assert any("Not modelled" in n for n in notes)


def test_figure_builds_and_says_simulated():
    from analysis.sweepstats import pyplot

    runs = _frame()
    fig = gpus.figure(gpus.table(runs)[0], runs)
    assert any("SIMULATED" in t.get_text() for t in fig.texts)
    assert len(fig.axes) == 2  # one model: TPOT above, host-link bytes below
    pyplot().close(fig)


def test_no_claims_and_registered_last():
    assert gpus.claims(None, None, None) == []
    assert names()[-1] == "gpus" and EXPERIMENTS["gpus"].seeds == (0, 1, 2)


def test_setting_one_gpu_by_default_and_the_sweeps_name_a_placement(tmp_path):
    from harness.runner.config import compose_config

    cfg = compose_config(["experiment=gpus"], results_dir=str(tmp_path))
    assert cfg["hardware"]["num_gpus"] == 1 and cfg.get("placement") is None
    assert cfg["hardware"]["peer"]["name"] == "nvlink_3090_bridge"
    assert cfg["hardware"]["name"] == "rtx_3090" and cfg["max_batch"] == 1
    one, many = EXPERIMENTS["gpus"].sweeps
    assert "hardware.num_gpus=1" in one.overrides
    assert not any(o.startswith("placement=") for o in one.overrides)
    assert "hardware.num_gpus=2,4,6" in many.overrides
    assert "placement=shard_expert,shard_layer,replicate_hot" in many.overrides
