"""Task, dataset and group structure of the synthetic generator (workloads/structure.py) and
per-model presets (workloads/presets.py). Expected values are worked out by hand from the
definitions in those modules' docstrings."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import yaml
from helpers import conf_model

from analysis.characterize import request_sequences
from analysis.routing_structure import groups_by_dataset, request_profiles, task_similarity
from workloads import presets
from workloads.presets import DEFAULTS, resolve
from workloads.structure import group_of_tasks, group_weights, structure_prefs
from workloads.synthetic import SyntheticConfig, generate_trace
from workloads.workload_checks import WorkloadError

OFF = {"dataset_pref_std": 0.0, "group_pref_std": 0.0, "groups_per_dataset": 0}


def _resolved(**knobs) -> SyntheticConfig:
    return resolve(SyntheticConfig(**knobs), None)[0]


def test_group_weights_by_hand():
    # r = 0.5, G = 3: 1, 0.5, 0.25 over 1.75
    assert group_weights(3, 0.5) == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    assert group_weights(4, 1.0) == [0.25] * 4


def test_group_chain_transitions_and_shares():
    """Markov chain: P(g -> g) = stay + (1 - stay) w_g, P(g -> h) = (1 - stay) w_h, shares w.
    G = 5, r = 0.5: w_0 = 1 / 1.9375 = 0.5161; stay 0.3: P(0 -> 0) = 0.6613, P(0 -> 1) =
    0.7 * 0.2581 = 0.1806."""
    cfg = _resolved(groups_per_dataset=5, group_decay=0.5, group_stay=0.3, group_pref_std=1.0)
    g = group_of_tasks(cfg, "bigbench", 40000)
    shares = np.bincount(g, minlength=5) / len(g)
    assert shares == pytest.approx([16 / 31, 8 / 31, 4 / 31, 2 / 31, 1 / 31], abs=0.015)
    prev, nxt = g[:-1], g[1:]
    from0 = nxt[prev == 0]
    assert (from0 == 0).mean() == pytest.approx(0.3 + 0.7 * 16 / 31, abs=0.015)
    assert (from0 == 1).mean() == pytest.approx(0.7 * 8 / 31, abs=0.015)


def test_group_chain_reads_no_later_task():
    cfg = _resolved(groups_per_dataset=6, group_stay=0.5)
    assert np.array_equal(group_of_tasks(cfg, "flan", 30), group_of_tasks(cfg, "flan", 90)[:30])


def test_dataset_term_shared_within_dataset_only():
    """Group term off: tasks of one dataset share D exactly; other datasets do not."""
    cfg = _resolved(dataset_pref_std=0.5, group_pref_std=0.0, groups_per_dataset=0)
    s = structure_prefs(cfg, ["a", "b", "a", "b"], 3, 16)
    assert np.array_equal(s[0], s[2]) and np.array_equal(s[1], s[3])
    assert not np.allclose(s[0], s[1])
    # seeded by the slug, not the position in the mix
    t = structure_prefs(cfg, ["b", "a"], 3, 16)
    assert np.array_equal(t[1], s[0])
    assert not structure_prefs(replace(cfg, dataset_pref_std=0.0), ["a", "b"], 3, 16).any()


def _small_trace(model, **knobs):
    cfg = SyntheticConfig(num_requests=96, prompt_len=48, output_len=2,
                          tasks=[["alpha", 12], ["beta", 12]], **knobs)
    return generate_trace(model, cfg)


def test_dataset_contrast_on_and_off():
    """dataset_contrast = cos(same dataset, other task) - cos(other dataset): with the dataset
    term off every pair of tasks is exchangeable (expected 0); on, same-dataset pairs share
    D (expected > 0)."""
    model = conf_model("deepseek_v2_lite")
    out = {}
    for std in (0.0, 0.4):
        tr = _small_trace(model, **{**OFF, "dataset_pref_std": std})
        sim = task_similarity(request_profiles(request_sequences(tr), 64, 6), tr.tasks,
                              tr.datasets)
        out[std] = sim["dataset_contrast"]
    assert abs(out[0.0]) < 0.01
    assert out[0.4] > 0.03


def test_group_count_recovered():
    """4 equal groups (r = 1), a strong group term and weak task/request terms: K-means per
    dataset finds the 4 groups."""
    model = conf_model("deepseek_v2_lite")
    cfg = SyntheticConfig(num_requests=64, prompt_len=64, output_len=2, tasks=[["alpha", 64]],
                          groups_per_dataset=4, group_decay=1.0, group_stay=0.0,
                          group_pref_std=1.0, dataset_pref_std=0.0, task_pref_std=0.1,
                          request_pref_std=0.1)
    tr = generate_trace(model, cfg)
    got = groups_by_dataset(request_profiles(request_sequences(tr), 64, 6), tr.datasets)
    assert got["groups.alpha"] == 4
    truth = group_of_tasks(resolve(cfg, None)[0], "alpha", 64)
    assert got["largest_group_share.alpha"] == pytest.approx(np.bincount(truth).max() / 64)


def test_preset_precedence(tmp_path, monkeypatch):
    monkeypatch.setattr(presets, "PRESETS_DIR", tmp_path)
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(
        {"model": "toy", "generator": {"sticky_std": 0.5, "group_stay": 0.2}}))
    cfg, name = resolve(SyntheticConfig(sticky_std=0.3), "toy")
    assert (cfg.sticky_std, cfg.group_stay, cfg.task_pref_std) == (0.3, 0.2,
                                                                    DEFAULTS["task_pref_std"])
    assert name == "toy"
    cfg, name = resolve(SyntheticConfig(sticky_std=0.3, group_stay=0.1), "toy")
    assert (cfg.group_stay, name) == (0.1, None)  # nothing came from the preset
    assert resolve(SyntheticConfig(), "no_such_model")[1] is None


@pytest.mark.parametrize("doc, message", [
    ({"model": "toy", "generator": {"stickyness": 0.5}}, "generator.stickyness: not a preset"),
    ({"model": "toy", "generator": {}, "notes": 1}, "unknown key 'notes'"),
    ({"model": "other", "generator": {}}, "key 'model' must be 'toy'"),
])
def test_bad_preset_names_file_and_key(tmp_path, monkeypatch, doc, message):
    monkeypatch.setattr(presets, "PRESETS_DIR", tmp_path)
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(WorkloadError) as err:
        resolve(SyntheticConfig(), "toy")
    assert str(tmp_path / "toy.yaml") in str(err.value) and message in str(err.value)


def test_meta_records_values_and_preset():
    model = conf_model("mixtral_8x7b")
    tr = generate_trace(model, SyntheticConfig(num_requests=4, prompt_len=8, output_len=2))
    gen = tr.meta["generator"]
    want = presets.load_preset("mixtral_8x7b")
    assert gen["preset"] == "workloads/presets/mixtral_8x7b.yaml"
    assert gen["version"] == 4
    assert want["token_latent_std"] == 0.0 and "token_latent_std" not in gen  # off: absent
    assert all(gen[k] == v for k, v in want.items() if k != "token_latent_std")
    # every knob explicit: the preset supplies nothing, so it is not recorded
    off = generate_trace(model, SyntheticConfig(num_requests=4, prompt_len=8, output_len=2,
                                                **{**DEFAULTS, **OFF}))
    assert "preset" not in off.meta["generator"] and off.meta["generator"]["version"] == 3
    assert "group_stay" not in off.meta["generator"]


def test_gate_probabilities_agree_with_chosen_experts():
    """At a decode step (one token) the stored probs row is that token's softmax over all E:
    its k largest entries are the chosen experts and the weights are those entries
    renormalised (float16 rounding aside)."""
    model = conf_model("deepseek_v2_lite")
    tr = generate_trace(model, SyntheticConfig(num_requests=8, prompt_len=16, output_len=6))
    L, k = tr.num_layers, tr.top_k
    agree, total = 0, 0
    for r in range(tr.num_requests):
        for s in range(1, int(tr.output_len[r])):
            for layer in range(L):
                ids = tr.block_rows(r, s, layer)[0].astype(np.int64)
                p = tr.probs[(int(tr.step_offsets[r]) + s) * L + layer].astype(np.float64)
                agree += len(set(ids) & set(np.argsort(-p, kind="stable")[:k]))
                total += k
                w = tr.weights[tr.block_offsets[(int(tr.step_offsets[r]) + s) * L + layer]]
                assert np.allclose(w, p[ids] / p[ids].sum(), atol=2e-3)
    assert agree / total > 0.99


def test_prefix_of_requests_does_not_change():
    """No term reads a later request: the first chunk's routing is the same with more
    requests after it."""
    model = conf_model("switch_base_128")
    a = generate_trace(model, SyntheticConfig(num_requests=33, prompt_len=8, output_len=2))
    b = generate_trace(model, SyntheticConfig(num_requests=64, prompt_len=8, output_len=2))
    n = int(a.block_offsets[int(a.step_offsets[32]) * a.num_layers])
    assert np.array_equal(a.topk[:n], b.topk[:n])
