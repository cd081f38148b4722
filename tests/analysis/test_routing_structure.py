"""Routing structure (analysis/routing_structure.py), targets (analysis/routing_fidelity.py)
and the routing_fidelity experiment's table, on hand-made routings.

Hand decode window (one layer, E = 4, k = 2), decode tokens {0,1} {0,2} {0,1} {3,2}:
  counts e0..e3 = 3, 2, 2, 1 of 8 routings over 4 tokens
  reused (serves >= 1/3 of 4 tokens, i.e. >= 2 of them): e0, e1, e2 -> 3/4
  within 1 step: t0 {0,1} -> {0,2}: 1 of 2; t1 {0,2} -> {0,1}: 1; t2 {0,1} -> {3,2}: 0 -> 2/6
  within 2 steps: t0 {0,1} in {0,1,2}: 2; t1 {0,2} in {0,1,2,3}: 2 -> 4/4; within 4: no step
  entropy after 1 token: {0,1} -> 1 bit; after 2: (2,1,1)/4 -> 1.5; after 4: (3,2,2,1)/8 ->
  1.905639; growth (1.905639 - 1) / (log2 4 - log2 2) = 0.905639
  top 5 % of 4 experts = 1 expert: 3 of 8 routings -> 0.375 (uniform 0.25)
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import meta_for, random_trace

from analysis.repro.experiments.routing_fidelity import MODELS, table_of
from analysis.routing_calibration import model as model_spec
from analysis.routing_fidelity import load_targets, target_models, target_text, within
from analysis.routing_structure import (
    decode_sequences,
    entropy_growth,
    groups_by_dataset,
    hot_share,
    reused_share,
    task_similarity,
    teacher_forced,
    temporal_locality,
)
from core.trace import trace_from_routing

DEC = np.array([[[0, 1], [0, 2], [0, 1], [3, 2]]])  # [L=1, D=4, k=2]


def test_reused_share_by_hand():
    assert reused_share([DEC], E=4, min_steps=1) == pytest.approx(3 / 4)
    assert reused_share([DEC], E=4, min_steps=5) is None  # too few decode tokens


def test_temporal_locality_by_hand():
    st = temporal_locality([DEC], E=4, k=2)
    assert st["locality_within1"] == pytest.approx(2 / 6)
    assert st["locality_within2"] == pytest.approx(1.0)
    assert st["locality_within4"] is None
    assert st["locality_random1"] == pytest.approx(0.5)
    assert st["locality_random2"] == pytest.approx(0.75)


def test_entropy_growth_by_hand():
    st = entropy_growth([DEC], E=4, k=2, min_steps=1)
    assert st["entropy_iteration_bits"] == pytest.approx(1.0)
    assert st["entropy_steps2_bits"] == pytest.approx(1.5)
    assert st["entropy_steps4_bits"] == pytest.approx(1.905639, abs=1e-6)
    assert st["entropy_request_bits"] == pytest.approx(1.905639, abs=1e-6)
    assert st["entropy_steps8_bits"] is None
    assert st["entropy_growth"] == pytest.approx(0.905639, abs=1e-6)


def test_entropy_growth_skips_gaps():
    gap = np.array([[[0, 1], [-1, -1], [0, 2], [0, 1], [3, 2]]])  # a gap after token 0
    st = entropy_growth([gap], E=4, k=2, min_steps=1)
    assert st["entropy_steps2_bits"] == pytest.approx(1.5)  # tokens 0 and 2, not the gap


def test_hot_share_by_hand():
    st = hot_share([DEC], E=4)
    assert (st["hot5_share"], st["hot5_uniform"]) == (pytest.approx(0.375), 0.25)


def test_task_similarity_by_hand():
    # cosines: r0-r1 1 (same task); r0-r2, r1-r2 0 (same dataset, other task); every pair with
    # r3 1/sqrt(2) (other dataset)
    prof = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    st = task_similarity(prof, ["a", "a", "b", "c"], ["X", "X", "X", "Y"])
    assert st["cos_same_task"] == pytest.approx(1.0)
    assert st["cos_same_dataset"] == pytest.approx(0.0)
    assert st["cos_other_dataset"] == pytest.approx(2 ** -0.5)
    assert st["task_contrast"] == pytest.approx(1 - 2 ** -0.5)
    assert st["dataset_contrast"] == pytest.approx(-(2 ** -0.5))


def test_largest_group_share_and_transitions_by_hand():
    # eight requests in two exact groups, A A A B A A A B: k = 2 (silhouette 1); largest group
    # 6 of 8; out of A (left 6 times) 4 x A, 2 x B -> 4/6; B left once (< 5): not counted
    a, b = np.eye(6)[0], np.eye(6)[3]
    prof = np.stack([a, a, a, b, a, a, a, b])
    st = groups_by_dataset(prof, ["X"] * 8)
    assert st["groups.X"] == 2
    assert st["largest_group_share.X"] == pytest.approx(6 / 8)
    assert st["transition_max.X"] == pytest.approx(4 / 6)
    assert groups_by_dataset(prof[:7], ["X"] * 7) == {}  # fewer than 8 requests


def test_decode_sequences_and_teacher_forcing():
    meta = {"num_moe_layers": 2, "num_experts": 4, "top_k": 1,
            "moe_layer_stacks": ["decoder", "decoder"], "routing_source": "test",
            "synthetic": True}
    req = {"id": "r0", "dataset": "d", "task": "t", "prompt_len": 2, "output_len": 3,
           "arrival_ms": 0.0,
           "routing": [[[[0], [1]], [[2], [3]]], [[[1]], [[2]]], [[[3]], [[0]]]]}
    dec = decode_sequences(trace_from_routing(meta, [req]))
    assert dec[0][..., 0].tolist() == [[1, 3], [2, 0]]  # [L, D]: steps 1, 2 at each layer
    seqs = [np.arange(5).reshape(1, 5, 1), np.arange(3).reshape(1, 3, 1)]
    out = teacher_forced(seqs, 3)
    assert len(out) == 1 and out[0][0, :, 0].tolist() == [2, 3, 4]  # T = 3 is too short


def test_targets_load_and_name_a_source():
    assert set(MODELS) <= set(target_models())
    for name in target_models():
        targets = load_targets(name)
        assert all(str(t["source"]).strip() for t in targets), name
        assert len({t["statistic"] for t in targets}) == len(targets), name
        # a paper or a real sample, or marked as an estimate
        for t in targets:
            assert t["estimate"] or any(s in t["source"] for s in ("arXiv", "real")), t


def test_within_respects_bounds():
    upper = {"target": 0.3, "tolerance": 0.05, "bound": "upper"}
    assert within(0.34, upper) and not within(0.36, upper) and within(0.0, upper)
    lower = {"target": 0.05, "tolerance": 0.0, "bound": "lower"}
    assert within(0.05, lower) and not within(0.04, lower)
    two = {"target": 10.0, "tolerance": 5.0, "bound": None}
    assert within(15.0, two) and not within(4.9, two) and within(None, two) is None
    assert target_text(upper) == "<= 0.3 (+0.05)" and target_text(two) == "10 +- 5"


def test_experiment_table_on_a_tiny_trace():
    spec = model_spec("deepseek_v2_lite")
    tr = random_trace(spec, n_requests=4, prompt_len=3, output_len=10, seed=1)
    assert meta_for(spec)["num_experts"] == 64
    tab = table_of({"deepseek_v2_lite": tr})
    assert len(tab) == len(load_targets("deepseek_v2_lite"))
    row = tab[tab["statistic"] == "reused_share_decode"].iloc[0]
    assert row["synthetic"] == pytest.approx(reused_share(decode_sequences(tr), 64))
    assert row["within_tolerance"] in ("yes", "no")
    # four requests: no K-means (fewer than 8), so the group rows are n/a
    assert (tab[tab["statistic"] == "groups.all"]["within_tolerance"] == "n/a").all()


def test_characterize_prompts_select_by_request_id():
    from analysis.routing_report import select_prompts

    # ids with a gap (as the DeepSeek-V2-Lite sample lacks prompt 317): 2-5 are records 1-3
    assert select_prompts([1, 2, 3, 5, 6], 2, 5) == [1, 2, 3]
    assert select_prompts(["1", "2", "4"], 1, 3) == [0, 1]  # integer-like strings are ids
    # names that are not integers: 1-based file order
    assert select_prompts(["a", "b", "c"], 2, 3) == [1, 2]
