"""moe_infinity: prefetch order from the predicted EAM, eviction by predicted reuse, budget and
invariants (the collection itself: tests/systems/test_eamc.py). Expected values by hand."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import EvictableSet, FixedBackend, random_trace, tiny_model

from core.view import SystemContext
from harness.sim.engine import Engine
from systems.moe_infinity import rule
from systems.moe_infinity.system import MoEInfinity, released_layer_factor, released_priority


def _ctx(L=3, E=4, slots=12):
    return SystemContext(num_layers=L, num_experts=E, top_k=1, expert_bytes=1,
                         capacity_slots=slots, capacity_bytes=slots, max_batch=1,
                         moe_layer_stacks=("decoder",) * L, trace_fields=())


def _bound_with_history(*eams, own_weight=0.0, slots=12, max_proposal=8, **knobs):
    sys_ = MoEInfinity(eamc_capacity=4, max_proposal=max_proposal, own_weight=own_weight,
                       **knobs)
    sys_.bind(_ctx(slots=slots))
    for eam in eams:
        sys_.eamc.insert(np.asarray(eam, dtype=np.float32))
    return sys_


class _Req:
    index, prompt_len, output_len = 0, 1, 4


class _It:
    kind, members = "decode", ((0, 1),)

    def __init__(self, index=0):
        self.index = index


class _Routing:
    def __init__(self, layer, experts, counts, iteration=0):
        self.iteration, self.layer = _It(iteration), layer
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
    # layer 1 not reached yet: the matched P alone (its own row has no counts to blend)
    np.testing.assert_allclose(s.score[4:8], [0.25, 0.75, 0.0, 0.0])


def test_reuse_variance_blends_the_matched_and_own_estimates():
    s = _bound_with_history([[2, 0, 0, 0], [1, 3, 0, 0], [0, 0, 3, 1]], own_weight=0.5)
    s.on_request_start(_Req(), 0.0)
    s.on_layer_routed(_Routing(0, [0, 1], [1, 1]), 0.0)
    # layer 0: P = [1 0 0 0] (variance 0), own = [.5 .5 0 0] from 2 counts (variance
    # .5 * .5 / 2 = .125): score .5 P + .5 own, variance .25 * 0 + .25 * .125
    np.testing.assert_allclose(s.score[:4], [0.75, 0.25, 0.0, 0.0])
    np.testing.assert_allclose(s.var[:4], [0.03125, 0.03125, 0.0, 0.0])
    # layer 1 not reached: P's own variance, .25 * .75 / 4 for both routed experts
    np.testing.assert_allclose(s.var[4:8], [0.046875, 0.046875, 0.0, 0.0])


def test_eviction_takes_the_lowest_predicted_reuse_and_prefetch_never_evicts_better():
    s = _bound_with_history([[2, 0, 0, 0], [1, 3, 0, 0], [0, 0, 3, 1]], slots=4)
    s.on_request_start(_Req(), 0.0)
    s.on_layer_routed(_Routing(0, [0], [1]), 0.0)
    for key in (0, 5, 10, 11):  # scores 1, .75, .75, .25
        s.on_load(key, True, 0.0)
    # key 11 is in use by the running layer: next lowest are 5 and 10 (.75), ties: lowest key
    assert s.choose_victim(EvictableSet({0, 5, 10}), 4, True, 0.0) == 5
    assert s.resident[5] and s.n_resident == 4  # a pure query: the eviction comes next
    s.on_evict(5, 0.0)
    assert not s.resident[5] and s.n_resident == 3
    # a prefetch of key 4 (score .25) must not evict key 10 (score .75)
    assert s.choose_victim(EvictableSet({0, 10}), 4, False, 0.0) is None
    assert s.resident[10]
    # a demand fetch may
    assert s.choose_victim(EvictableSet({0, 10}), 4, True, 0.0) == 10
    assert s.choose_victim(EvictableSet({0}, full=False), 4, True, 0.0) is None  # free slot


# Stored EAM for the admission tests: P(layer 0) = [1 0 0 0], P(layer 1) = [.25 .5 .25 0],
# P(layer 2) = [0 0 .75 .25]; with own_weight 0 the scores are these shares: key 0: 1,
# key 4: .25, key 5: .5, key 6: .25, key 10: .75, key 11: .25, every other key 0. Their
# variances s (1 - s) / 4 (4 counts per row): key 4: .046875, key 5: .0625.
_ADMIT_EAM = [[4, 0, 0, 0], [1, 2, 1, 0], [0, 0, 3, 1]]


def _full_cache(margin):
    s = _bound_with_history(_ADMIT_EAM, slots=4, admit_margin=margin)
    s.on_request_start(_Req(), 0.0)
    for key in (0, 4, 10, 11):
        s.on_load(key, True, 0.0)
    s.on_layer_routed(_Routing(0, [0], [1]), 0.0)
    return s


def test_hysteresis_refuses_a_prefetch_within_the_margin():
    s = _full_cache(1.0)
    # victim: key 4 (.25, ties with key 11 -> lowest key). Key 5: gap .5 - .25 = .25, one
    # standard error sqrt(.0625 + .046875) = .3307 > .25: refused
    assert s.propose_prefetch(0.0) == []
    assert s.choose_victim(EvictableSet({0, 4, 10, 11}), 5, False, 0.0) is None
    assert s.resident[4] and s.n_resident == 4
    # a demand fetch ignores the margin
    assert s.choose_victim(EvictableSet({0, 4, 10, 11}), 5, True, 0.0) == 4


def test_without_admission_every_predicted_expert_is_proposed_and_evicts_the_lowest():
    # The paper's rule (admit_margin null): no comparison with the victim. At layer 0 of 3 the
    # non-resident keys with reuse > 0 are 5 (.5 * 2/3) and 6 (.25 * 2/3), highest first.
    s = _full_cache(None)
    assert s.propose_prefetch(0.0) == [5, 6]
    # key 7 (reuse 0) still evicts the lowest-reuse resident, key 4 (.25; ties 11, lowest key)
    assert s.choose_victim(EvictableSet({0, 4, 10, 11}), 7, False, 0.0) == 4
    assert s.describe()["admit_margin"] is None


def test_hysteresis_admits_a_prefetch_beyond_the_margin():
    s = _full_cache(0.5)
    # key 5: gap .25 > .5 * .3307 = .1654: proposed (key 6, gap 0, is not), admitted over key 4
    assert s.propose_prefetch(0.0) == [5]
    assert s.choose_victim(EvictableSet({0, 4, 10, 11}), 5, False, 0.0) == 4
    assert s.resident[4] and s.n_resident == 4  # a pure query: the eviction comes next
    s.on_evict(4, 0.0)
    assert not s.resident[4] and s.n_resident == 3


# Three stored EAMs (rows = layers). A query of one token to expert 0 at layer 0 has cosine
# 3/sqrt(10) = .949 with A, 0 with B, 2/sqrt(8) = .707 with C (layer 0 only).
_A = [[3, 1, 0, 0], [4, 0, 0, 0], [0, 0, 0, 4]]
_B = [[0, 1, 3, 0], [0, 4, 0, 0], [0, 0, 4, 0]]
_C = [[2, 2, 0, 0], [0, 0, 4, 0], [0, 4, 0, 0]]


@pytest.mark.parametrize("m, want", [
    (1, [[.75, .25, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]]),  # A alone
    (2, [[.625, .375, 0, 0], [.5, 0, .5, 0], [0, .5, 0, .5]]),  # A + C = [[5 3 0 0] ...]
    (3, [[5 / 12, 4 / 12, 3 / 12, 0], [1 / 3, 1 / 3, 1 / 3, 0], [0, 1 / 3, 1 / 3, 1 / 3]]),
])
def test_top_m_matches_are_summed_then_row_normalised(m, want):
    s = _bound_with_history(_A, _B, _C, match_top=m)
    s.on_request_start(_Req(), 0.0)
    s.on_layer_routed(_Routing(0, [0], [1]), 0.0)
    assert s.active[0].best == (0, 2, 1)[:m]
    np.testing.assert_allclose(s.score, np.ravel(want))


@pytest.mark.parametrize("iteration_query, want", [(True, (0,)), (False, (1,))])
def test_query_at_iteration_or_request_level(iteration_query, want):
    a = [[4, 0, 0, 0], [4, 0, 0, 0], [4, 0, 0, 0]]
    b = [[0, 4, 0, 0], [0, 4, 0, 0], [0, 4, 0, 0]]
    s = _bound_with_history(a, b, iteration_query=iteration_query, match_top=1)
    s.on_request_start(_Req(), 0.0)
    s.on_layer_routed(_Routing(0, [1], [5], iteration=0), 0.0)
    s.on_layer_routed(_Routing(0, [0], [1], iteration=1), 0.0)
    # iteration level: this iteration's [1 0 0 0] over layer 0: cos 1 with a, 0 with b.
    # request level: [1 5 0 0] over all layers: dots 4 with a, 20 with b (equal norms).
    assert s.active[0].best == want
    np.testing.assert_array_equal(s.active[0].eam[:4], [1, 5, 0, 0])  # learnt EAM: both


def test_released_layer_factor_by_hand():
    # L = 4, n = 2. Current layer 0 (first half): layers <= 0 get 1, layer 1: 1 - 1/2,
    # second half (i - 2) / 3: 0, 1/3. Current layer 3 (second half): 1 - i/2 for the first
    # half, 1 for layers 2, 3 (<= current).
    f = released_layer_factor(4, 1)
    for c, raw in ((0, [1, .5, 0, 1 / 3]), (3, [1, .5, 1, 1])):
        np.testing.assert_allclose(f[c], np.array(raw) / sum(raw) + 1e-6)


def test_released_priority_by_hand():
    reuse = np.array([.5, .25, .25, 0.0])  # sums to 1
    freq = np.array([2.0, 0.0, 1.0, 3.0])  # sums to 6
    got = released_priority(reuse, freq, np.ones(4))
    want = [(.5 + 1e-6) * (1 / 3 + 1e-6), (.25 + 1e-6) * 1e-6, (.25 + 1e-6) * (1 / 6 + 1e-6),
            1e-6 * (.5 + 1e-6)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert int(np.argmin(got)) == 1  # never visited since loaded: evicted first


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


@pytest.mark.parametrize("knobs", [
    {"iteration_query": False, "match_top": 2},
    {"admit_margin": 1.0, "match_top": 3},
    {"freq_decay_eviction": True, "admit_margin": 0.5},
])
@pytest.mark.parametrize("batch", [1, 3])
def test_rule_options_keep_the_invariants(knobs, batch):
    model = tiny_model(layers=3, experts=4, top_k=2)
    trace = random_trace(model, n_requests=5, prompt_len=4, output_len=5, seed=3)
    calib = random_trace(model, n_requests=4, prompt_len=4, output_len=5, seed=99)
    system = MoEInfinity(eamc_capacity=3, max_proposal=4, **knobs)
    engine = Engine(model, FixedBackend(), trace, system, 5 * model.expert_bytes, batch)
    system.warmup(calib)
    engine.run()
    engine.cache.check_invariants()
    assert engine.cache.peak_slots <= 5
    assert int(system.resident.sum()) == system.n_resident == len(engine.cache)


def test_bad_knobs_are_refused():
    with pytest.raises(ValueError, match="own_weight"):
        MoEInfinity(own_weight=1.5)
    with pytest.raises(ValueError, match="max_proposal"):
        MoEInfinity(max_proposal=-1)
    with pytest.raises(ValueError, match="eamc_capacity"):
        MoEInfinity(eamc_capacity=0).bind(_ctx())
    with pytest.raises(ValueError, match="^admit_margin"):
        MoEInfinity(admit_margin=-0.1)
    with pytest.raises(ValueError, match="^match_top"):
        MoEInfinity(match_top=0)
    with pytest.raises(ValueError, match="^iteration_query"):
        MoEInfinity(iteration_query=1)
    with pytest.raises(ValueError, match="^freq_decay_eviction"):
        MoEInfinity(freq_decay_eviction="yes")


def test_refetch_guard_keeps_an_expert_evicted_now_or_one_iteration_ago_out_of_prefetch():
    """The prefetch order of test_prefetch_order_... is [5, 10, 4, 11]. Key 5 evicted in
    iteration 3 is not proposed in iterations 3 and 4 (that copy would be churn) and is
    proposed again in iteration 5; without the guard it stays in the first place."""
    hist = [[2, 0, 0, 0], [1, 3, 0, 0], [0, 0, 3, 1]]
    for guard, expected in ((True, ([10, 4, 11], [10, 4, 11], [5, 10, 4, 11])),
                            (False, ([5, 10, 4, 11],) * 3)):
        s = _bound_with_history(hist, slots=4, refetch_guard=guard)
        s.on_request_start(_Req(), 0.0)
        s.on_layer_routed(_Routing(0, [0], [1], iteration=3), 0.0)
        s.on_load(5, True, 0.0)
        s.on_load(0, True, 0.0)
        assert s.choose_victim(EvictableSet({5}), 1, True, 0.0) == 5
        s.on_evict(5, 0.0)  # evicted in iteration 3
        got = []
        for it in (3, 4, 5):
            s.on_layer_routed(_Routing(0, [0], [1], iteration=it), 0.0)
            got.append([k for k in s.propose_prefetch(0.0) if k != 0])
        assert tuple(got) == expected, (guard, got)


# ---- the incremental and batched paths give the plain formulas' bits ---------------------
def _plain_reuse(s, st):
    """Score and variance of one request from scratch: the rule's formulas (rule.py) over
    the matched entries' EAMs and the request's own EAM."""
    L, E = s.ctx.num_layers, s.ctx.num_experts
    matched = s.eamc.rows[list(st.best), :L * E].reshape(-1, L, E)
    p, pvar = rule.predicted(matched)
    return rule.reuse(p, pvar, st.eam.reshape(L, E), s.own_weight)


class _Members:
    kind, members = "decode", ((0, 1),)

    def __init__(self, index):
        self.index = index


@pytest.mark.parametrize("iteration_query", [True, False])
def test_single_request_scores_and_variances_are_the_plain_formulas(iteration_query):
    rng = np.random.default_rng(3)
    s = _bound_with_history(*rng.integers(0, 6, size=(4, 3, 4)), own_weight=0.5,
                            iteration_query=iteration_query, match_top=2)
    s.on_request_start(_Req(), 0.0)
    for it in range(4):
        for layer in range(3):
            ids = sorted(rng.choice(4, size=2, replace=False).tolist())
            s.on_layer_routed(_Routing(layer, ids, [1, 2], iteration=it), 0.0)
            score, var = _plain_reuse(s, s.active[0])
            assert np.array_equal(s.score, score) and np.array_equal(s.var, var)


def test_batch_path_gives_the_single_request_bits():
    """Three requests through the batch path (one table, R = 3) and the same three one by
    one: every row array and match is bit for bit the same."""
    rng = np.random.default_rng(5)
    eams = rng.integers(0, 6, size=(5, 3, 4)).astype(float)
    batched, single = (_bound_with_history(*eams, own_weight=0.5, match_top=2)
                       for _ in range(2))
    tab = batched.table
    rows = [tab.new_state() for _ in range(3)]
    alone = [single.request_state() for _ in range(3)]
    for it in range(3):
        for layer in range(3):
            counts = rng.integers(0, 3, size=(3, 4)).astype(float)
            counts[:, layer % 4] += 1
            batched._observe_batch(rows, layer, counts, it == 0, it)
            from systems.moe_infinity import batch
            batch.predict(tab, [st for st in rows if st.stale], batched.eamc)
            batch.blend_rows(tab, rows)
            for st, c in zip(alone, counts):
                ids = np.flatnonzero(c).tolist()
                single.observe(st, layer, ids, c[ids].astype(int).tolist(), it == 0, it)
                st.table.predict_one(st, single.eamc)
                st.table.blend_one(st)
            for sb, ss in zip(rows, alone):
                assert sb.best == ss.best
                for name in ("eam", "q", "norm2", "own", "own_n", "mix", "blend", "parts"):
                    a, b = getattr(tab, name)[sb.row], getattr(ss.table, name)[ss.row]
                    assert np.array_equal(a, b), name
                n = batched.eamc.n
                assert np.array_equal(tab.dots[sb.row, :n], ss.table.dots[ss.row, :n])


def test_resident_ranks_lowest_is_the_brute_force_lowest():
    from systems.moe_infinity.ranks import ResidentRanks

    class _First(EvictableSet):  # the engine's Candidates walk
        def first_of(self, keys):
            return next((k for k in keys if k in self.keys), None)

    rng = np.random.default_rng(7)
    L, E = 4, 8
    r = ResidentRanks(L * E, E)
    resident = set()
    for step in range(60):
        if step % 10 == 0:
            r.set_scores(rng.integers(0, 5, L * E) / 4.0)  # ties on purpose
        r.set_layer(step % L, int(rng.integers(1, 2 * E)))
        for key in rng.choice(L * E, 3, replace=False).tolist():
            if key in resident:
                resident.discard(key)
                r.evict(key)
            else:
                resident.add(key)
                r.load(key)
        evictable = {k for k in resident if rng.random() < 0.6}
        for cands in (EvictableSet(evictable), _First(evictable), None):
            pool = resident if cands is None else evictable
            assert r.lowest(cands) == rule.lowest(r.score, pool)


@pytest.mark.parametrize("margin", [0.0, 0.25, 1.0])
def test_admission_filter_is_the_full_vector_rule(margin):
    """The proposal (threshold, then a few variances) proposes what the rule applied to every
    key proposes: allowed, prio > 0, gap > margin * sqrt(var + var_victim)."""
    rng = np.random.default_rng(11)
    s = _bound_with_history(*rng.integers(0, 6, size=(4, 3, 4)), slots=6,
                            admit_margin=margin, match_top=2, own_weight=0.5)
    s.on_request_start(_Req(), 0.0)
    for key in (0, 1, 2, 5, 9, 10):
        s.on_load(key, True, 0.0)
    for it in range(3):
        for layer in range(3):
            ids = sorted(rng.choice(4, size=2, replace=False).tolist())
            s.on_layer_routed(_Routing(layer, ids, [1, 1], iteration=it), 0.0)
            want = rule.proposal(s.score, s.weight[layer + 1], s.gate < s.it_now - 1, 8,
                                 s._lowest(), margin, s.var)
            assert s.propose_prefetch(0.0) == want
