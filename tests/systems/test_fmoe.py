"""fmoe (fMoE / FineMoE): each distinctive rule against hand-computed values, then engine runs.

Rules pinned: the delta selection (smallest most-probable set covering clip(1 - score, 0, 1),
at least top-k), the store's RDY de-duplication, semantic matching by iteration kind, the
incremental trajectory cosine, prefetch priority p / (l - l_now) with the batch merge,
eviction by lowest p * freq with prefetch protection, the modelled matching time, and the
fallbacks without `probs` or `embeddings`. Engine runs check the budget and invariants.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import EvictableSet, FixedBackend, meta_for, tiny_model

from core.trace import trace_from_routing
from core.view import SystemContext
from harness.runner.config import compose_config
from harness.runner.run import run_config
from harness.sim.engine import Engine
from harness.sim.recorder import LATE, MISS, PRELOAD
from systems.fmoe import rule
from systems.fmoe.maps import (
    DECODE,
    PREFILL,
    ExpertMapStore,
    TrajectoryState,
)
from systems.fmoe.maps_trajectory import SMALL_STORE
from systems.fmoe.predictions import Prediction
from systems.fmoe.system import FMoE, _topk_maps
from systems.on_demand import OnDemand

ROW = np.array([0.5, 0.25, 0.125, 0.125])  # exact in binary: sums below are exact


# ---- delta rule ---------------------------------------------------------------------------
@pytest.mark.parametrize("score,top_k,want", [
    (1.0, 1, [0]),          # delta 0: one expert, raised to top-k
    (0.9, 2, [0, 1]),       # delta 0.1: 0.5 covers it; top-k = 2 wins
    (0.4, 1, [0, 1]),       # delta 0.6: 0.5 < 0.6 <= 0.75
    (0.25, 1, [0, 1]),      # delta 0.75: 0.5 + 0.25 = 0.75 reaches it exactly
    (0.2, 1, [0, 1, 2]),    # delta 0.8: needs 0.875; the 0.125 tie goes to the lower id
    (-0.5, 1, [0, 1, 2, 3]),  # delta clipped to 1: every expert
])
def test_delta_selection(score, top_k, want):
    assert rule.select_experts(ROW, score, top_k).tolist() == want
    store = ExpertMapStore(1, 1, 4, 1)
    store.add(ROW[None, None, :], None, np.zeros(1, bool), np.zeros(1, np.int8))
    assert store.select(0, 0, score, top_k).tolist() == want  # precomputed path agrees


def test_delta_selection_sorts_by_probability():
    row = np.array([0.125, 0.5, 0.125, 0.25])
    assert rule.select_experts(row, 0.2, 1).tolist() == [1, 3, 0]


# ---- store: de-duplication and matching ---------------------------------------------------
def _store_ab(capacity=2):
    """L = 2, E = 2, d = 1 (RDY = sem / 2 + traj / 2); A and B stored with unit embeddings."""
    store = ExpertMapStore(capacity, 2, 2, 1)
    a, b = [[1, 0], [1, 0]], [[0, 1], [0, 1]]
    store.add(np.array([a, b], np.float32), np.array([[1, 0], [0, 1]], np.float16),
              np.ones(2, bool), np.array([DECODE, DECODE], np.int8))
    return store


def test_dedup_replaces_the_most_redundant_map():
    store = _store_ab()
    # C = [[1,0],[0,1]]: traj(C,A) = traj(C,B) = 1/2 (flattened cosine); sem(C,A) = 0 and
    # sem(C,B) = 1, so RDY(A) = 0/2 + 0.5/2 = 0.25 < RDY(B) = 1/2 + 0.5/2 = 0.75: B goes.
    store.add(np.array([[[1, 0], [0, 1]]], np.float32), np.array([[0, 1]], np.float16),
              np.ones(1, bool), np.array([DECODE], np.int8))
    assert store.n == 2 and store.replaced == 1
    assert store.maps[:, 0].tolist() == [[1, 0], [1, 0]]  # A kept
    assert store.maps[:, 1].tolist() == [[1, 0], [0, 1]]  # C in B's row
    # D = [[0,1],[1,0]] without an embedding: traj only; traj(D,A) = 1/2, traj(D,C) = 0.
    store.add(np.array([[[0, 1], [1, 0]]], np.float32), None, np.zeros(1, bool),
              np.array([DECODE], np.int8))
    assert store.maps[:, 0].tolist() == [[0, 1], [1, 0]] and not store.has_emb[0]


def test_chunked_insertion_equals_one_at_a_time():
    rng = np.random.default_rng(4)
    maps = rng.dirichlet(np.ones(6), size=(40, 3)).astype(np.float32)
    embs = rng.standard_normal((40, 5)).astype(np.float16)
    has, kinds = rng.random(40) < 0.7, (rng.random(40) < 0.5).astype(np.int8)
    one, many = ExpertMapStore(7, 3, 6, 1), ExpertMapStore(7, 3, 6, 1)
    for i in range(40):
        one.add(maps[i:i + 1], embs[i:i + 1], has[i:i + 1], kinds[i:i + 1])
    many.add(maps, embs, has, kinds, chunk=16)
    assert one.replaced == many.replaced == 33
    assert np.array_equal(one.maps, many.maps) and np.array_equal(one.has_emb, many.has_emb)


def test_semantic_matching_compares_the_same_iteration_kind():
    store = ExpertMapStore(2, 1, 2, 1)
    store.add(np.array([[[1, 0]], [[0, 1]]], np.float32),
              np.array([[1, 0], [0.6, 0.8]], np.float16), np.ones(2, bool),
              np.array([PREFILL, DECODE], np.int8))
    q = np.array([1, 0], np.float32)
    assert store.match_semantic(q, DECODE) == (1, pytest.approx(0.6, abs=1e-3))
    assert store.match_semantic(q, DECODE, same_kind=False) == (0, pytest.approx(1.0))


def test_trajectory_cosine_is_over_the_observed_prefix():
    rng = np.random.default_rng(1)
    maps = rng.dirichlet(np.ones(5), size=(9, 4)).astype(np.float32)  # 9 maps, L=4, E=5
    store = ExpertMapStore(9, 4, 5, 1)
    store.add(maps, None, np.zeros(9, bool), np.ones(9, np.int8))
    q = rng.dirichlet(np.ones(5), size=4).astype(np.float32)
    state = TrajectoryState(9, DECODE)
    want = rule.trajectory_match(maps, q, list(range(4)), 0)  # after layer pos: pos itself
    for pos in range(4):
        # the rule is the cosine over the prefix; the store's step is the rule, bit for bit
        prefix = maps[:, :pos + 1].reshape(9, -1)
        cos = prefix @ q[:pos + 1].ravel() / (
            np.linalg.norm(prefix, axis=1) * np.linalg.norm(q[:pos + 1]))
        assert want[pos][:2] == (pos, int(np.argmax(cos)))
        assert want[pos][2] == pytest.approx(float(cos.max()), 1e-5)
        assert (pos, *store.observe(state, pos, q[pos])) == want[pos]
    # match(): semantic for layers 0..d-1, then trajectory predictions for d..L-1.
    out = store.match(q, None, DECODE, distance=2)
    assert [layer for layer, _, _ in out] == [2, 3]


# ---- float32 filters: the matches and replacements of float64 products ----------------------
def _near_tie_maps(rng, n, L, E, base):
    """n maps [n, L, E] (float32, on the 2**-24 grid): among the first `base`, pairs one grid
    step apart (near ties, far below float32's rounding of a product); after them, exact
    repeats of earlier maps (ties: the first row wins)."""
    maps = rng.dirichlet(np.full(E, 0.5), size=(n, L)).astype(np.float16).astype(np.float32)
    maps[1:base:2] = maps[0:base - 1:2]
    maps[1:base:2, :, 0] += 2.0 ** -24
    maps[base:] = maps[rng.integers(0, base, n - base)]
    return maps


@pytest.mark.parametrize("half", [True, False])
def test_trajectory_filter_matches_float64_products(half):
    # A large store (float32 filter): every step's map and cosine equal those of float64
    # dot products over the prefix (argmax: the first on ties), alone and in a batch.
    rng = np.random.default_rng(7)
    L, E, n = 4, 8, 300
    assert n > SMALL_STORE
    maps = _near_tie_maps(rng, n, L, E, 200)
    store = ExpertMapStore(n, L, E, 1)
    store.add(maps, None, np.zeros(n, bool), np.ones(n, np.int8))
    queries = [maps[i] for i in range(0, 40, 2)] + [maps[i] for i in range(250, 260)]
    queries += [rng.dirichlet(np.ones(E), size=L).astype(np.float32) for _ in range(3)]
    if half:
        queries = [q.astype(np.float16) for q in queries]
    batch = TrajectoryState(n, DECODE, len(queries))
    singles = [TrajectoryState(n, DECODE) for _ in queries]
    wants = [rule.trajectory_match(maps, q, list(range(L)), 0) for q in queries]
    for pos in range(L):
        got = store.observe_many(batch, pos, np.stack([q[pos] for q in queries]))
        for i, q in enumerate(queries):
            want = wants[i][pos][1:]
            assert store.observe(singles[i], pos, q[pos]) == want
            assert (got[0][i], got[1][i]) == want


def test_replacement_filter_matches_float64_products():
    # Requests share an embedding (runs of equal rows), some maps repeat exactly: the store
    # keeps what the float64 rule keeps, in the same rows.
    rng = np.random.default_rng(11)
    L, E, n, cap = 3, 8, 500, 150
    maps = _near_tie_maps(rng, n, L, E, cap)
    embs = np.repeat(rng.standard_normal((n // 10, 6)), 10, axis=0).astype(np.float16)
    has = np.repeat(rng.random(n // 10) < 0.8, 10)
    store = ExpertMapStore(cap, L, E, 1)
    store.add(maps, embs, has, np.ones(n, np.int8), chunk=64)
    want, replaced = rule.stored_maps(maps, embs, has, cap, 1)
    assert store.replaced == replaced
    assert np.array_equal(store.maps.transpose(1, 0, 2), want.astype(np.float64))


# ---- priorities ---------------------------------------------------------------------------
def _bound(E=4, L=4, max_batch=1, **kw):
    system = FMoE(match_us_per_map=0.0, **kw)
    system.bind(SystemContext(num_layers=L, num_experts=E, top_k=1, expert_bytes=1,
                              capacity_slots=4, capacity_bytes=4, max_batch=max_batch,
                              moe_layer_stacks=("decoder",) * L, trace_fields=("probs",)))
    return system


def _pred(layer, probs: dict, E=4):
    row = np.zeros(E)
    row[list(probs)] = list(probs.values())
    ids = np.array(list(probs))
    return Prediction(layer, 0.0, layer * E + ids, row[ids], row)


def test_prefetch_priority_is_probability_over_layer_distance():
    s = _bound()
    s.kind, s.pos_now = DECODE, 1
    s.pending = [_pred(2, {0: 0.5, 1: 0.2}), _pred(3, {0: 0.9, 2: 0.3}), _pred(1, {3: 1.0})]
    # key 8: 0.5/1; key 12: 0.9/2 = 0.45; key 9: 0.2/1; key 14: 0.3/2 = 0.15; layer 1 passed.
    assert s.propose_prefetch(0.0) == [8, 12, 9, 14]


def test_batch_merge_keeps_each_key_at_its_best_priority():
    s = _bound(max_batch=2)
    s.kind, s.pos_now = DECODE, 0
    s.pending = [_pred(1, {0: 0.2, 1: 0.3}), _pred(1, {0: 0.6}), _pred(2, {2: 0.5})]
    # key 4: max(0.2, 0.6)/1 = 0.6; key 5: 0.3; key 10: 0.5/2 = 0.25.
    assert s.propose_prefetch(0.0) == [4, 5, 10]
    assert s.p[4:8] == [0.6, 0.3, 0.0, 0.0]  # eviction p: max over requests


def test_eviction_takes_the_lowest_p_times_freq():
    s = _bound(admission_margin=None)  # the paper's rule alone: every prefetch may evict
    for key in range(4):
        s.on_load(key, True, 0.0)
    s.p[:4], s.freq[:4] = [0.5, 0.1, 0.4, 0.9], [1, 6, 2, 1]
    s._rescore(np.arange(4))  # p * freq = 0.5, 0.6, 0.8, 0.9
    assert s.choose_victim(EvictableSet([0, 1, 2, 3], full=False), 9, True, 0.0) is None
    assert s.choose_victim(EvictableSet([1, 2, 3]), 9, True, 0.0) == 1  # 0 not evictable
    assert s.choose_victim(EvictableSet([0, 2, 3]), 9, True, 0.0) == 0
    # Key 2 is expected by a usable prediction (layer 0 is ahead of pos_now = -1): a prefetch
    # never evicts it; a demand fetch takes it only when nothing else is evictable.
    s.kind, s.pos_now, s.pending = DECODE, -1, [_pred(0, {2: 0.4})]
    s.propose_prefetch(0.0)
    assert s.choose_victim(EvictableSet([2]), 9, False, 0.0) is None
    assert s.choose_victim(EvictableSet([2, 3]), 9, False, 0.0) == 3
    assert s.choose_victim(EvictableSet([2]), 9, True, 0.0) == 2


def test_topk_count_maps_without_probs():
    model = tiny_model(layers=1, experts=4, top_k=2)
    tr = trace_from_routing(meta_for(model), [
        {"id": "r", "prompt_len": 2, "output_len": 1, "routing": [[[[0, 1], [1, 2]]]]}])
    assert _topk_maps(tr, 1, 1, 4).tolist() == [[[0.25, 0.5, 0.25, 0.0]]]


# ---- engine runs --------------------------------------------------------------------------
def _trace(model, n_requests, output_len, seed, embeddings=True, probs=True):
    """One token per step; each token's top-k = the top-k of a continuous random probability
    row, so every map is unique and a map matches itself with cosine 1."""
    rng = np.random.default_rng(seed)
    L, E, k = model.num_moe_layers, model.num_experts, model.top_k
    p = rng.dirichlet(np.ones(E), size=(n_requests, output_len, L))
    top = np.argsort(-p, axis=-1)[..., :k]
    reqs = [{"id": f"r{r}", "dataset": "t", "task": "t", "prompt_len": 1,
             "output_len": output_len, "routing": top[r, :, :, None, :].tolist()}
            for r in range(n_requests)]
    tr = trace_from_routing(meta_for(model), reqs)
    if probs:
        tr.probs = p.reshape(-1, E).astype(np.float16)
    if embeddings:
        tr.embeddings = rng.standard_normal((n_requests, 8)).astype(np.float16)
        tr.has_embedding, tr.meta["embedder"] = np.ones(n_requests, bool), "test"
    tr._sha = None
    return tr.validate()


def _run(system, model, trace, slots, calibration=None, max_batch=1, copy_ms=0.25):
    engine = Engine(model, FixedBackend(copy_ms=copy_ms), trace, system,
                    slots * model.expert_bytes, max_batch)
    if calibration is not None:
        system.warmup(calibration)
    rec = engine.run()
    assert rec.peak_cache_bytes <= slots * model.expert_bytes
    return rec.tables()


def test_history_of_the_same_routing_prefetches_every_layer_after_the_first():
    # Pins the mechanism (not a fair setup): the store holds these very maps, so each
    # trajectory match scores 1, delta = 0 and the prefetched top-k is exactly the routing.
    # At layer l (time t) layer l+1's experts are queued; layer l runs 2 ms, its dense 1 ms,
    # while 2 copies of 0.25 ms (after at most 2 demand copies) are done by t + 1.
    model = tiny_model(layers=4, experts=8, top_k=2)
    tr = _trace(model, 3, 5, seed=2)
    acc = _run(FMoE(prefetch_distance=1, match_us_per_map=0.0), model, tr, 32, tr)["accesses"]
    later = acc["layer"] >= 1
    assert not np.any(later & np.isin(acc["class"], [MISS, LATE]))


def test_matching_time_delays_predictions():
    # 15 stored maps * 240 us = 3.6 ms > the 3 ms between two layers' hooks: every trajectory
    # prediction arrives after its layer started, so layers >= 1 behave as fetch-on-demand
    # with a cache that holds everything: one miss per distinct (layer, expert).
    model = tiny_model(layers=4, experts=8, top_k=2)
    tr = _trace(model, 3, 5, seed=2)
    slow = _run(FMoE(prefetch_distance=1, match_us_per_map=240.0), model, tr, 32, tr)
    acc = slow["accesses"]
    keys = {(int(layer), int(e)) for layer, e in zip(acc["layer"], acc["expert"])
            if layer >= 1}
    assert int(np.sum((acc["layer"] >= 1) & (acc["class"] == MISS))) == len(keys)
    base = _run(OnDemand(), model, tr, 32)["accesses"]
    assert np.sum((base["layer"] >= 1) & (base["class"] == MISS)) == len(keys)


@pytest.mark.parametrize("slots", [2, 3, 5, 9, 20])
@pytest.mark.parametrize("max_batch", [1, 3])
def test_budget_and_invariants(slots, max_batch):
    model = tiny_model(layers=3, experts=6, top_k=2)
    tr, calib = _trace(model, 4, 6, seed=slots), _trace(model, 5, 6, seed=100 + slots)
    t = _run(FMoE(store_capacity=8), model, tr, slots, calib, max_batch=max_batch)
    assert len(t["accesses"]["class"]) > 0
    assert np.all(t["transfers"]["kind"] != PRELOAD)


def test_fallbacks_without_embeddings_or_probs_are_reported():
    model = tiny_model(layers=3, experts=6, top_k=2)
    tr = _trace(model, 3, 4, seed=5, embeddings=False, probs=False)
    system = FMoE(prefetch_distance=1, match_us_per_map=0.0)
    _run(system, model, tr, 6, _trace(model, 3, 4, seed=6, embeddings=False, probs=False))
    d = system.describe()
    assert d["requests_without_embedding"] == 3 and d["semantic_matching"].startswith("off")
    assert d["map_source"].startswith("topk_counts") and d["calibration_maps"] == 12
    assert d["trajectory_matches"] > 0


def test_same_config_same_result():
    model = tiny_model(layers=3, experts=6, top_k=2)
    tr, calib = _trace(model, 4, 5, seed=8), _trace(model, 4, 5, seed=9)
    a = _run(FMoE(), model, tr, 5, calib)
    b = _run(FMoE(), model, tr, 5, calib)
    for name in a:
        for col in a[name]:
            x, y = np.asarray(a[name][col]), np.asarray(b[name][col])
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), (name, col)


def test_run_config_warms_up_from_the_calibration_split(tmp_path):
    cfg = compose_config(["system=fmoe", "workload.num_requests=3", "workload.prompt_len=16",
                          "workload.output_len=4", "calibration_requests=5", "progress=false",
                          "system.store_capacity=12"], results_dir=str(tmp_path))
    result = run_config(cfg)
    assert result["status"] == "valid", result["reason"]
    d = result["system"]
    assert d["calibration_maps"] == 5 * 4 and d["store_maps"] == 12
    assert d["store_replacements"] == 5 * 4 + 3 * 4 - 12  # every map past capacity replaced
    assert result["trace"]["missing_fields_used_by_system"] == []


def test_bad_knobs_are_refused():
    with pytest.raises(ValueError, match="prefetch_distance"):
        FMoE(prefetch_distance=0)


def test_embedding_dimension_mismatch_is_a_clear_error():
    store = _store_ab()
    with pytest.raises(ValueError, match="field 'embeddings'"):
        store.match_semantic(np.ones(3, np.float32) / np.sqrt(3), DECODE)


def test_encoder_decoder_model_runs(tmp_path):
    # Switch: decode steps skip the encoder MoE layers, so decode trajectories cover the
    # decoder layers only.
    cfg = compose_config(["system=fmoe", "model=switch_base_128", "hardware=h200",
                          "workload.num_requests=2", "workload.prompt_len=8",
                          "workload.output_len=3", "calibration_requests=2", "progress=false",
                          "system.prefetch_distance=1"], results_dir=str(tmp_path))
    result = run_config(cfg)
    assert result["status"] == "valid", result["reason"]
    assert result["system"]["trajectory_matches"] > 0


def test_ablation_switches():
    """delta_rule=false: a prediction is the matched row's top-k (here 1 expert, where the
    rule at score 0.2 takes 3), keeping the match's score; semantic_matching=false: no
    semantic match is made (prompt embeddings still join the store)."""
    from systems.fmoe.predictions import from_store

    store = ExpertMapStore(1, 1, 4, 1)
    store.add(ROW[None, None, :], None, np.zeros(1, bool), np.zeros(1, np.int8))
    (rule,) = from_store(store, 0, [0], [0.2], 0.0, 1, 0.0)
    (top,) = from_store(store, 0, [0], [0.2], 0.0, 1, 0.0, delta=False)
    assert rule.keys == [0, 1, 2] and top.keys == [0] and top.score == 0.2
    from core.knobs import KnobError

    with pytest.raises(KnobError, match="delta_rule"):
        FMoE(delta_rule="yes")
    assert FMoE(semantic_matching=False).describe()["delta_rule"] is True


def test_semantic_matching_off_makes_no_semantic_match(tmp_path):
    base = ["experiment=table1", "system=fmoe", "workload.num_requests=3",
            "workload.prompt_len=16", "workload.output_len=3", "calibration_requests=3",
            "progress=false", "trace_cache_dir=null"]
    on = run_config(compose_config(base, results_dir=str(tmp_path / "on")))["system"]
    off = run_config(compose_config([*base, "system.semantic_matching=false"],
                                    results_dir=str(tmp_path / "off")))["system"]
    assert on["semantic_matches"] > 0 and off["semantic_matches"] == 0
    assert off["semantic_matching"].startswith("off: semantic_matching=false")
