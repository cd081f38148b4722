"""Seed systems run their paper's rule with no rule of ours on; each improvement of ours is a
named variant (systems/variants.py) with its own yaml, class name and tuned knobs.

Expected values are written out from the papers and released code (docs/systems.md cites
each), not read from the code under test."""

from __future__ import annotations

import pytest
import yaml
from helpers import ROOT

from analysis.tune_variants import GRIDS, MEASURED_SEEDS, TUNING_SEEDS, choose, combos
from harness.runner.config import compose_config, system_names
from systems.variants import VARIANTS, seed_of

CONF = ROOT / "conf" / "system"

# knob -> the paper's (or, where it is silent, the released code's) value in the seed's yaml
PAPER_RULE = {
    "moe_infinity": {"own_weight": 0.0, "admit_margin": None, "match_top": 1,
                     "refetch_guard": False, "iteration_query": True,
                     "freq_decay_eviction": False},
    "fmoe": {"admission_margin": None, "count_smoothing": 0.0, "semantic_same_kind": False,
             "protect_prefetched": True, "online_update": True, "prefetch_distance": 3},
    "diff_moe": {"min_val": None, "recency_grid": [0.0], "max_val": 2.0, "threshold": 1.0,
                 "dec_in": 0.4, "dec_out": 0.2},
}
# variant -> the knobs of ours it switches on (values as chosen by tune-variants)
OURS = {
    "moe_infinity_hysteresis": {"own_weight": 0.5, "admit_margin": 24.0, "match_top": 4,
                                "refetch_guard": True},
    "fmoe_admission": {"admission_margin": 1.0, "count_smoothing": 0.25,
                       "semantic_same_kind": True},
    "diff_moe_floor_recency": {"min_val": 0.0, "recency_grid": [0.0, 0.25, 0.5, 0.75]},
}


def _yaml(name: str) -> dict:
    return yaml.safe_load((CONF / f"{name}.yaml").read_text())


@pytest.mark.parametrize("seed", sorted(PAPER_RULE))
def test_seed_yaml_sets_the_paper_rule(seed):
    conf = _yaml(seed)
    for knob, want in PAPER_RULE[seed].items():
        assert conf[knob] == want, f"{seed}.{knob}"


@pytest.mark.parametrize("variant", sorted(OURS))
def test_variant_yaml_switches_on_our_rules_and_differs_from_its_seed_only_there(variant):
    conf, seed = _yaml(variant), _yaml(seed_of(variant))
    for knob, want in OURS[variant].items():
        assert conf[knob] == want, f"{variant}.{knob}"
    differing = {k for k in conf if k != "_target_" and conf[k] != seed.get(k)}
    assert differing == set(OURS[variant])


def test_registry_names_every_variant_once_and_each_is_a_table1_row():
    names = [v for vs in VARIANTS.values() for v in vs]
    assert sorted(names) == sorted(OURS)
    assert set(VARIANTS) <= set(system_names()) and set(names) <= set(system_names())
    assert seed_of("fmoe_admission") == "fmoe" and seed_of("fmoe") is None


@pytest.mark.parametrize("variant", sorted(OURS))
def test_a_variant_reports_its_own_name(variant, tmp_path):
    from harness.runner.run import run_config

    cfg = compose_config(["experiment=table1", "workload.num_requests=2",
                          "workload.prompt_len=16", "workload.output_len=3",
                          "calibration_requests=2", "progress=false",
                          f"system={variant}"], run_name=variant, results_dir=str(tmp_path))
    result = run_config(cfg)
    assert result["status"] == "valid" and result["system"]["name"] == variant


def test_tuning_split_is_disjoint_from_measured_seeds_and_grids_cover_our_knobs():
    assert not set(TUNING_SEEDS) & set(MEASURED_SEEDS) and min(TUNING_SEEDS) >= 1000
    for variant, grid in GRIDS.items():
        assert set(grid) <= set(OURS[variant])  # only knobs of ours are tuned
        for knob in grid:  # the yaml carries a value of the grid
            assert _yaml(variant)[knob] in grid[knob]
    assert len(combos("moe_infinity_hysteresis")) == 5 * 3 * 2  # margins x weights x tops
    assert combos("diff_moe_floor_recency") == [{"min_val": -1.0}, {"min_val": 0.0},
                                                {"min_val": 0.5}]


def test_choose_takes_the_lowest_mean_tpot_and_the_first_of_ties():
    rows = [{"k": 1, "tpot_mean_ms": 25.0}, {"k": 2, "tpot_mean_ms": 24.5},
            {"k": 3, "tpot_mean_ms": 24.5}, {"k": 4, "tpot_mean_ms": 26.0}]
    assert choose(rows)["k"] == 2
