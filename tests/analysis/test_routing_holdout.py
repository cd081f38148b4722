"""moebench holdout-check (analysis/routing_holdout.py, analysis/holdout_report.py): the
split arithmetic, the within / rank-swap rules on hand-made numbers, the refusal to overwrite
the final report, the missing-shared-data error; the length matching on the real sample
(skipped without the shared data). Expected values are worked out by hand in each test."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import shared

from analysis.holdout_report import band, rank_swaps, ranks, stat_rows, system_rows, within_band
from analysis.repro.stats import Estimate, point
from analysis.routing_calibration import DEEPSEEK_SAMPLE
from analysis.routing_holdout import main, prompt_slice, split_slices

NO_317 = [*range(1, 317), *range(318, 1001)]  # the shared sample's 999 prompt ids


def test_prompt_ranges_map_to_0_based_record_slices():
    full = list(range(1, 1001))
    assert prompt_slice(full, (1, 400)) == (0, 400)
    assert prompt_slice(full, (401, 600)) == (400, 600)
    assert prompt_slice(full, (901, 1000)) == (900, 1000)
    # prompt 317 absent: prompt p > 317 is record p - 2
    assert split_slices(NO_317, "develop") == {"warmup": (399, 599), "measured": (599, 699)}
    assert split_slices(NO_317, "final") == {"warmup": (699, 899), "measured": (899, 999)}
    assert prompt_slice(NO_317, (301, 400)) == (300, 399)  # 99 prompts: 317 is missing
    with pytest.raises(ValueError, match="numbered from 1"):
        prompt_slice(full, (0, 10))
    with pytest.raises(ValueError, match="no prompt"):
        prompt_slice(full, (1001, 1100))


def test_band_is_the_tolerance_widened_to_the_real_interval():
    narrow = Estimate(100.0, 98.0, 102.0, 100, "bootstrap")
    assert band(narrow, 0.05) == pytest.approx((95.0, 105.0))
    assert within_band(104.9, narrow, 0.05) and not within_band(105.1, narrow, 0.05)
    wide = Estimate(100.0, 90.0, 103.0, 100, "bootstrap")  # wider below only
    assert band(wide, 0.05) == pytest.approx((90.0, 105.0))
    assert within_band(91.0, wide, 0.05) and not within_band(89.0, wide, 0.05)
    assert band(point(100.0), 0.10) == pytest.approx((90.0, 110.0))


def test_ranks_and_rank_swaps():
    assert ranks({"a": 10.0, "b": 20.0, "c": 10.0}) == {"a": 1, "b": 3, "c": 1}
    real = {"a": 10.0, "b": 20.0, "c": 30.0}
    assert rank_swaps(real, {"a": 15.0, "b": 12.0, "c": 40.0}) == [("a", "b")]
    assert rank_swaps(real, {"a": 1.0, "b": 2.0, "c": 3.0}) == []
    assert rank_swaps({"a": 10.0, "b": 10.0}, {"a": 5.0, "b": 6.0}) == []  # a tie is no swap


def _valid(tpot_ms: float, n: int = 25, hit: float = 0.9) -> dict:
    return {"status": "valid", "tpot_ms": np.full(n, tpot_ms), "hit_rate_decode": hit}


def test_system_rows_judge_each_system_and_flag_swaps():
    """Constant per-request TPOTs: the real bootstrap interval is the point itself, so the
    band is +-5 % (mean) and +-10 % (p99). fast: real 10, synthetic seeds 10.2, 10.4 -> 10.3
    (ratio 1.03, within both). slow: real 20, synthetic 23 (+15 %: outside both). mid: real
    15, synthetic 9 -> faster than fast on synthetic: the pair (fast, mid) swaps."""
    runs = {"real": {"fast": _valid(10.0), "slow": _valid(20.0), "mid": _valid(15.0),
                     "big": {"status": "oom", "reason": "too big"}},
            "synthetic": {"fast": {0: _valid(10.2), 1: _valid(10.4)},
                          "slow": {0: _valid(23.0), 1: _valid(23.0)},
                          "mid": {0: _valid(9.0), 1: _valid(9.0)},
                          "big": {0: {"status": "oom", "reason": "too big"}}}}
    rows, misses = system_rows(runs, ["fast", "slow", "mid", "big"])
    by = {r["system"]: r for r in rows}
    assert by["fast"]["tpot_mean_ratio"] == pytest.approx(1.03)
    assert by["fast"]["tpot_mean_within"] and by["fast"]["tpot_p99_within"]
    assert not by["slow"]["tpot_mean_within"] and not by["slow"]["tpot_p99_within"]
    assert (by["fast"]["rank_real"], by["fast"]["rank_synthetic"]) == (1, 2)
    assert (by["mid"]["rank_real"], by["mid"]["rank_synthetic"]) == (2, 1)
    assert by["fast"]["rank_swap"] and by["mid"]["rank_swap"] and not by["slow"]["rank_swap"]
    assert by["big"]["note"] == "too big" and "rank_real" not in by["big"]
    assert any(m.startswith("slow: tpot mean") and "+15.0 %" in m for m in misses)
    assert any(m.startswith("rank swap: fast vs mid") for m in misses)


def test_stat_rows_use_the_target_tolerance_around_the_real_heldout_value():
    """Real held-out 0.30; synthetic seeds 0.32, 0.36 -> 0.34: |0.34 - 0.30| = 0.04 <= 0.1,
    within. The fit target 0.5 +- 0.1 does not hold the real 0.30 (0.2 away). An upper bound
    of 0.05 above the real 0.30 refuses the synthetic 0.40. Estimates are left out."""
    targets = [{"statistic": "x", "target": 0.5, "tolerance": 0.1, "bound": None,
                "estimate": False, "source": "s"},
               {"statistic": "y", "target": 0.3, "tolerance": 0.05, "bound": "upper",
                "estimate": False, "source": "s"},
               {"statistic": "z", "target": 1.0, "tolerance": 0.0, "bound": "lower",
                "estimate": True, "source": "s"}]
    got = {"real": {"x": 0.30, "y": 0.30}, "synthetic": {0: {"x": 0.32, "y": 0.40},
                                                         1: {"x": 0.36, "y": 0.40}}}
    rows, misses = stat_rows(got, targets)
    assert [r["statistic"] for r in rows] == ["x", "y"]
    assert rows[0]["synthetic"] == pytest.approx(0.34)
    assert (rows[0]["within"], rows[0]["real_within_fit_target"]) == ("yes", "no")
    assert (rows[1]["within"], rows[1]["real_within_fit_target"]) == ("no", "yes")
    assert len(misses) == 1 and misses[0].startswith("y:")


def test_final_report_is_not_overwritten_without_force(tmp_path, capsys):
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "holdout.md").write_text("the final check\n")
    assert main(["--split", "final", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "run it once" in err and "--force" in err
    assert (tmp_path / "final" / "holdout.md").read_text() == "the final check\n"


def test_missing_shared_data_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MOEBENCH_SHARED_DATA", str(tmp_path / "nowhere"))
    assert main(["--split", "develop", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "nowhere" / "routing_deepseek_v2_lite_sample") in err
    assert "MOEBENCH_SHARED_DATA" in err
    assert not (tmp_path / "out").exists()


def test_synthetic_trace_takes_the_real_split_lengths_request_by_request(tmp_path):
    """The develop split's measured prompts 601-700 (records 599-698): the synthetic trace
    has their prompt and output lengths in order, and is labelled synthetic."""
    path = shared(*DEEPSEEK_SAMPLE)
    from analysis.routing_holdout import synthetic_traces
    from core.trace import read_trace
    from workloads.importers import main as import_routing

    real = tmp_path / "real.npz"
    assert import_routing([str(path), str(real), "--model", "deepseek_v2_lite", "--requests",
                           "599:699", "--decode-tokens", "8"]) == 0
    tr = read_trace(real)
    assert tr.request_ids[0] == "601" and tr.request_ids[-1] == "700"
    got = synthetic_traces(3, {"meas": tr, "cal": tr}, tmp_path)
    syn = read_trace(got["meas"])
    assert syn.synthetic and syn.meta["generator"]["seed"] == 3
    assert syn.prompt_len.tolist() == tr.prompt_len.tolist()
    assert syn.output_len.tolist() == tr.output_len.tolist()
    assert not syn.arrival_ms.any()  # the offline batch, as the real trace
    cal = read_trace(got["cal"])
    assert cal.request_ids[0].startswith("calibration/")
