"""fmoe's rules beyond the paper, against hand-computed values: the eviction fallback without
`probs` (smoothed count maps, ties to the least recently used), prefetch admission, and the
`prefetch: false` twin that keeps the maps' eviction guidance (docs/systems.md, fmoe)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import EvictableSet, FixedBackend, random_trace, tiny_model

from core.knobs import KnobError
from core.view import SystemContext
from harness.sim.engine import Engine
from systems.fmoe import rule
from systems.fmoe.eviction import EvictionScores
from systems.fmoe.maps import DECODE
from systems.fmoe.predictions import Prediction
from systems.fmoe.system import FMoE


def _bound(fields=("probs",), top_k=1, E=4, L=2, **kw):
    system = FMoE(match_us_per_map=0.0, **kw)
    system.bind(SystemContext(num_layers=L, num_experts=E, top_k=top_k, expert_bytes=1,
                              capacity_slots=L * E, capacity_bytes=L * E, max_batch=1,
                              moe_layer_stacks=("decoder",) * L, trace_fields=fields))
    return system


def _victims(system, keys, demand=True):
    """choose_victim until nothing is left: the eviction order of `keys`."""
    left, order = set(keys), []
    while left:
        key = system.choose_victim(EvictableSet(left), 99, demand, 0.0)
        system.on_evict(key, 0.0)
        order.append(key)
        left.discard(key)
    return order


def test_fallback_orders_every_resident_without_probs():
    # No probs: the stored map of layer 1 is a top-k count share (2 tokens, k = 1: experts 0
    # and 1). With count_smoothing 0.5 the eviction p of layer 1 is 0.5 * share + 0.5 / 4 =
    # [0.375, 0.375, 0.125, 0.125]; layer 0 has no prediction and keeps the prior 1/4.
    s = _bound(fields=(), count_smoothing=0.5, protect_prefetched=False)
    maps = np.zeros((1, 2, 4), np.float32)
    maps[0, 1, :2] = 0.5
    s.store.add(maps, None, np.zeros(1, bool), np.array([DECODE], np.int8))
    s.kind, s.pos_now = DECODE, 0
    s.pending = [s._prediction(1, 0, 1.0, 0.0)]
    s.propose_prefetch(0.0)
    assert s.p == [0.25] * 4 + [0.375, 0.375, 0.125, 0.125]
    for key in range(8):
        s.on_load(key, True, 0.0)
    s.freq[:] = [1, 2, 1, 4, 2, 1, 2, 8]
    s.last_use[:] = [5, 1, 3, 7, 2, 1, 4, 6]
    s._rescore(np.arange(8))
    # p * freq = [0.25, 0.5, 0.25, 1.0, 0.75, 0.375, 0.25, 1.0]: every resident above 0.
    # Ties go to the least recently used: 0.25 -> keys 2 (last use 3), 6 (4), 0 (5);
    # 1.0 -> keys 7 (6), 3 (7). Key order would have given 0, 2, 6, ... 3, 7.
    assert np.all(s.vscore[:8] > 0)
    assert _victims(s, range(8)) == [2, 6, 0, 5, 1, 4, 7, 3]


def test_fallback_victims_spread_over_layers_by_traffic_not_key():
    # Three layers with the same traffic (uniform random top-2 of 8, no probs); embeddings
    # give every layer a prediction (semantic for layer 0, trajectory for 1 and 2). Equal
    # traffic, so each layer should lose about a third of the victims. The rule before the
    # fallback (p = 0 for every unnamed expert, ties to the lowest key) took 120, 112 and 0
    # of this run's victims from layers 0, 1, 2.
    model = tiny_model(layers=3, experts=8, top_k=2)
    traces = []
    for seed in (3, 4):
        tr = random_trace(model, 6, 1, 12, seed=seed)
        rng = np.random.default_rng(seed + 2)
        tr.embeddings = rng.standard_normal((tr.num_requests, 8)).astype(np.float16)
        tr.has_embedding, tr.meta["embedder"], tr._sha = np.ones(tr.num_requests, bool), "t", None
        traces.append(tr.validate())
    system = FMoE(prefetch_distance=1, match_us_per_map=0.0)
    engine = Engine(model, FixedBackend(copy_ms=0.25), traces[0], system,
                    16 * model.expert_bytes, 1)
    system.warmup(traces[1])
    tr = engine.run().tables()["transfers"]
    victims = np.bincount(tr["key"][~np.isnan(tr["evict_ms"])] // 8, minlength=3)
    assert system.describe()["map_source"].startswith("topk_counts")
    share = victims / victims.sum()
    assert victims.sum() > 150 and np.all((share > 0.2) & (share < 0.47)), victims


def _admission_case(margin):
    """Layer 1 predicted with probabilities {0: 0.375, 1: 0.125} by a match of score 0.75, at
    top-k 2: expected use 0.75 * min(1, 2 * 0.375) = 0.5625 for key 4 and 0.75 * 0.25 = 0.1875
    for key 5. Resident key 1 (layer 0) was used in 3 of its layer's 8 visits: rate 0.375."""
    s = _bound(top_k=2, admission_margin=margin)
    row = np.array([0.375, 0.125, 0.25, 0.25])
    s.kind, s.pos_now = DECODE, 0
    s.pending = [Prediction(1, 0.0, np.array([4, 5]), row[:2], row, 0.75)]
    assert s.propose_prefetch(0.0) == [4, 5]
    s.on_load(1, True, 0.0)
    s.freq[1], s.visits[0] = 3, 8
    s._rescore(np.array([1]))
    return s


def test_admission_evicts_only_a_victim_valued_below_the_incoming():
    s = _admission_case(0.25)
    only_1 = EvictableSet([1])
    assert s.choose_victim(only_1, 4, False, 0.0) is None  # 0.5625 - 0.375 < 0.25
    assert s.choose_victim(only_1, 4, True, 0.0) == 1  # a demand fetch is never declined
    s = _admission_case(0.25)
    s.visits[0] = 16  # rate 3 / 16 = 0.1875
    assert s.choose_victim(only_1, 5, False, 0.0) is None  # 0.1875 - 0.1875 < 0.25
    assert s.choose_victim(only_1, 4, False, 0.0) == 1  # 0.5625 - 0.1875 = 0.375 >= 0.25
    assert s.describe()["admission_declined"] == 1
    s = _admission_case(0.0)
    s.visits[0] = 16
    assert s.choose_victim(only_1, 5, False, 0.0) == 1  # equal value: margin 0 admits
    s = _admission_case(None)  # the paper's rule: every prefetch may evict
    assert s.choose_victim(only_1, 5, False, 0.0) == 1


def test_without_prefetch_the_maps_still_guide_eviction():
    # prefetch: false must differ from prefetch: true only by the copies. A system whose
    # proposals are all withheld makes every other decision of prefetch: true, so both runs
    # evict the same experts at the same times.
    class Withheld(FMoE):
        def propose_prefetch(self, now_ms):
            super().propose_prefetch(now_ms)
            return []

    model = tiny_model(layers=3, experts=6, top_k=2)
    tr, calib = random_trace(model, 4, 3, 6, seed=11), random_trace(model, 4, 3, 6, seed=12)
    tables = []
    kw = {"prefetch_distance": 1, "match_us_per_map": 0.0}
    for system in (FMoE(prefetch=False, **kw), Withheld(**kw)):
        engine = Engine(model, FixedBackend(copy_ms=0.25), tr, system, 7 * model.expert_bytes, 1)
        system.warmup(calib)
        tables.append(engine.run().tables()["transfers"])
        assert not np.allclose(system.p, 1 / 6)  # predictions were applied
    for col in ("key", "kind", "issue_ms", "evict_ms"):
        assert np.array_equal(tables[0][col], tables[1][col], equal_nan=True), col


@pytest.mark.parametrize("counted", [False, True])
def test_edited_victim_order_is_the_sorted_order(counted):
    # The kept prefix of the victim order, edited per change (uses, new probabilities,
    # protections, loads, evictions), is always the start of the fully sorted order.
    rng = np.random.default_rng(3 + counted)
    L, E = 4, 8
    sc = EvictionScores(L, E)

    def full():
        return rule.victim_order(sc.p, sc.freq, sc.last_use, sc.resident,
                                 [x > 0 for x in sc.penalty])

    for step in range(3000):
        op, layer = rng.integers(5), int(rng.integers(L))
        keys = rng.choice(L * E, rng.integers(1, 6), replace=False).tolist()
        if op == 0:
            sc.route(layer, rng.choice(E, 3, replace=False).tolist(), step + 1)
        elif op == 1:
            rows = [rng.choice([0.0, 0.25, 0.5, 1.0], E).tolist()
                    for _ in range(rng.integers(1, 4))]
            sc.set_p(layer, rows, bool(rng.integers(2)))
        elif op == 2:
            sc.protect(keys[:2], keys[2:], counted)
        else:
            (sc.load if op == 3 else sc.evict)(keys[0])
        if step % 3 == 0:
            prefix = sc.order(deeper=step % 300 == 0) or sc.order()
            assert prefix == full()[:len(prefix)], step


@pytest.mark.parametrize("kw,name", [({"admission_margin": -0.1}, "admission_margin"),
                                     ({"admission_margin": "0.4"}, "admission_margin"),
                                     ({"count_smoothing": 1.5}, "count_smoothing")])
def test_new_knobs_are_checked(kw, name):
    with pytest.raises(KnobError, match=f"^{name}"):
        FMoE(**kw)
