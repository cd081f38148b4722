"""moe_infinity: EAMC replacement, cosine over the layers seen, prefetch order from the
predicted EAM, eviction by predicted reuse, budget and invariants. Expected values by hand."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import EvictableSet, FixedBackend, random_trace, tiny_model

from harness.engine import Engine
from systems.base import SystemContext
from systems.moe_infinity import EAMC, MoEInfinity, request_eams


def _ctx(L=3, E=4, slots=12):
    return SystemContext(num_layers=L, num_experts=E, top_k=1, expert_bytes=1,
                         capacity_slots=slots, capacity_bytes=slots, max_batch=1,
                         moe_layer_stacks=("decoder",) * L, trace_fields=())


def test_eamc_replaces_the_most_similar_entry_when_full():
    c = EAMC(2, 1, 3)
    c.insert(np.array([[1.0, 0.0, 0.0]]))
    c.insert(np.array([[0.0, 1.0, 0.0]]))
    # cos([3,1,0], [1,0,0]) = 3/sqrt(10) = 0.949 > cos([3,1,0], [0,1,0]) = 1/sqrt(10) = 0.316
    assert c.insert(np.array([[3.0, 1.0, 0.0]])) == 0
    assert c.replaced == 1 and c.n == 2
    np.testing.assert_array_equal(c.entry(0), [[3, 1, 0]])
    np.testing.assert_array_equal(c.entry(1), [[0, 1, 0]])
    assert c.prefix[0, 0] == 10.0 and c.prefix[0, 1] == 1.0  # 3^2 + 1^2


def test_cosine_is_over_the_layers_seen_so_far():
    c = EAMC(2, 2, 2)
    c.insert(np.array([[1.0, 0.0], [0.0, 1.0]]))  # X
    c.insert(np.array([[1.0, 0.0], [1.0, 0.0]]))  # Y
    partial = np.array([1.0, 0.0, 0.0, 0.0])  # only layer 0 seen
    np.testing.assert_allclose(c.cosine(partial, upto_layer=0), [1.0, 1.0])
    assert c.query(partial, upto_layer=0) == (0, 1.0)  # tie -> lowest slot
    full = np.array([1.0, 0.0, 1.0, 0.0])
    # cos(full, X) = 1 / (sqrt 2 * sqrt 2) = 0.5; cos(full, Y) = 1
    np.testing.assert_allclose(c.cosine(full), [0.5, 1.0])
    assert c.query(full)[0] == 1


def _bound_with_history(eam, own_weight=0.0, slots=12, max_proposal=8):
    sys_ = MoEInfinity(eamc_capacity=4, max_proposal=max_proposal, own_weight=own_weight)
    sys_.bind(_ctx(slots=slots))
    sys_.eamc.insert(np.asarray(eam, dtype=np.float32))
    return sys_


class _Req:
    index, prompt_len, output_len = 0, 1, 4


class _It:
    kind, members = "decode", ((0, 1),)


class _Routing:
    def __init__(self, layer, experts, counts):
        self.iteration, self.layer = _It(), layer
        self.experts, self.counts = experts, counts


def test_prefetch_order_follows_predicted_probability_and_layer_distance():
    # Stored EAM, rows = layers: P(layer 1) = [.25 .75 0 0], P(layer 2) = [0 0 .75 .25].
    s = _bound_with_history([[2, 0, 0, 0], [1, 3, 0, 0], [0, 0, 3, 1]])
    s.on_request_start(_Req(), 0.0)
    s.on_layer_routed(_Routing(0, [0], [1]), 0.0)
    # At layer 0 (L = 3): weight 1 - 1/3 for layer 1, 1 - 2/3 for layer 2, 0 for layer 0.
    # key 5: .75*2/3 = .5; key 10: .75/3 = .25; key 4: .25*2/3 = .167; key 11: .25/3 = .083
    assert s.propose_prefetch(0.0) == [5, 10, 4, 11]
    assert s.propose_prefetch(0.0) is None  # consumed


def test_own_weight_blends_the_requests_own_eam():
    s = _bound_with_history([[2, 0, 0, 0], [1, 3, 0, 0], [0, 0, 3, 1]], own_weight=0.5)
    s.on_request_start(_Req(), 0.0)
    s.on_layer_routed(_Routing(0, [1], [1]), 0.0)
    # own EAM: layer 0 = [0 1 0 0]; matched P(layer 0) = [1 0 0 0] -> blend [.5 .5 0 0]
    np.testing.assert_allclose(s.score[:4], [0.5, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(s.score[4:8], [0.125, 0.375, 0.0, 0.0])


def test_eviction_takes_the_lowest_predicted_reuse_and_prefetch_never_evicts_better():
    s = _bound_with_history([[2, 0, 0, 0], [1, 3, 0, 0], [0, 0, 3, 1]], slots=4)
    s.on_request_start(_Req(), 0.0)
    s.on_layer_routed(_Routing(0, [0], [1]), 0.0)
    for key in (0, 5, 10, 11):  # scores 1, .75, .75, .25
        s.on_load(key, True, 0.0)
    # key 11 is in use by the running layer: next lowest are 5 and 10 (.75), ties: lowest key
    assert s.choose_victim(EvictableSet({0, 5, 10}), 4, True, 0.0) == 5
    assert not s.resident[5] and s.n_resident == 3
    # a prefetch of key 4 (score .25) must not evict key 10 (score .75)
    assert s.choose_victim(EvictableSet({0, 10}), 4, False, 0.0) is None
    assert s.resident[10]
    # a demand fetch may
    assert s.choose_victim(EvictableSet({0, 10}), 4, True, 0.0) == 10
    assert s.choose_victim(EvictableSet({0}, full=False), 4, True, 0.0) is None  # free slot


def test_request_eams_count_tokens_over_prefill_and_decode():
    model = tiny_model(layers=2, experts=4, top_k=2)
    tr = random_trace(model, n_requests=2, prompt_len=3, output_len=4, seed=1)
    eams = request_eams(tr)
    for r, eam in enumerate(eams):
        want = np.zeros((2, 4))
        for s in range(4):
            for layer in range(2):
                for row in tr.block_rows(r, s, layer):
                    want[layer, row] += 1
        np.testing.assert_array_equal(eam, want)
        assert eam.sum() == (3 + 3) * 2 * 2  # (prompt + 3 decode tokens) x layers x top-k


@pytest.mark.parametrize("slots", [2, 3, 5, 8])
@pytest.mark.parametrize("batch", [1, 3])
def test_budget_and_invariants(slots, batch):
    model = tiny_model(layers=3, experts=4, top_k=2)
    trace = random_trace(model, n_requests=5, prompt_len=4, output_len=5, seed=slots)
    calib = random_trace(model, n_requests=4, prompt_len=4, output_len=5, seed=99)
    system = MoEInfinity(eamc_capacity=3, max_proposal=4)
    engine = Engine(model, FixedBackend(), trace, system, slots * model.expert_bytes, batch)
    system.warmup(calib)
    assert system.eamc.n == 3 and system.eamc.replaced == 1
    rec = engine.run()
    engine.cache.check_invariants()
    assert engine.cache.peak_slots <= slots
    assert len(rec.tables()["accesses"]["class"]) > 0
    d = system.describe()  # 4 calibration + 5 finished requests into 3 slots: 6 replacements
    assert d["eamc_entries"] == 3 and d["eamc_replacements"] == 6


def test_bad_knobs_are_refused():
    with pytest.raises(ValueError, match="own_weight"):
        MoEInfinity(own_weight=1.5)
    with pytest.raises(ValueError, match="max_proposal"):
        MoEInfinity(max_proposal=-1)
    with pytest.raises(ValueError, match="eamc_capacity"):
        MoEInfinity(eamc_capacity=0).bind(_ctx())
