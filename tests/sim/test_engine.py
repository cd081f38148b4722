"""Engine mechanics: a hand-computed timeline, invariants, and the online guarantee."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FixedBackend, meta_for, random_trace, tiny_model

from core.trace import trace_from_routing
from harness.sim.engine import Engine
from harness.sim.metrics import summarize
from harness.sim.recorder import DEMAND, HIT, LATE, MISS, PREFETCH, PRELOAD
from systems.base import System
from systems.layer_offload import LayerOffload
from systems.lru import LRU
from systems.on_demand import OnDemand
from systems.oracle.system import Oracle


class Scripted(System):
    """Proposes fixed prefetch lists at given (iteration, layer) points or ("end", iteration)."""

    name = "scripted"

    def __init__(self, script):
        self.script, self.pending = script, None

    def on_layer_routed(self, routing, now_ms):
        self.pending = self.script.get((routing.iteration.index, routing.layer))

    def on_step_end(self, iteration, now_ms):
        self.pending = self.script.get(("end", iteration.index))

    def propose_prefetch(self, now_ms):
        out, self.pending = self.pending, None
        return out


def two_layer_timeline():
    """(model, trace, tables) of the run worked by hand below (also
    tests/sim/test_policy_metrics.py).

    2 MoE layers, 4 experts, top-1; one request: prefill of 1 token then 1 decode step.
    Routing: iteration 0 -> experts 0 (layer 0), 3 (layer 1); iteration 1 -> 2, 1.
    Dense 1 ms, expert 1 ms, copy 1.5 ms, 8 slots. Keys: layer * 4 + expert."""
    model = tiny_model(layers=2, experts=4, top_k=1)
    req = {"id": "a", "prompt_len": 1, "output_len": 2, "arrival_ms": 0.0,
           "routing": [[[[0]], [[3]]], [[[2]], [[1]]]]}
    trace = trace_from_routing(meta_for(model), [req])
    system = Scripted({(0, 0): [6, 7], ("end", 0): [5]})
    engine = Engine(model, FixedBackend(copy_ms=1.5), trace, system,
                    capacity_bytes=8 * model.expert_bytes)
    return model, trace, engine.run().tables()


def test_two_layer_timeline_by_hand():
    _, _, t = two_layer_timeline()
    # Worked by hand:
    # it 0: dense L0 0..1. Routing at 1 queues [6, 7]; expert 0 is missing and its demand
    #   fetch goes ahead of the queued prefetches: key 0 copies 1..2.5. Expert 0 runs
    #   2.5..3.5 (miss, stall 1.5). Key 6 copies 2.5..4, key 7 4..5.5 (queued, in order).
    #   Dense L1 3.5..4.5; expert 3 (key 7) is in flight: late, runs 5.5..6.5 (stall 1).
    #   Step end at 6.5 proposes [5]: the idle copy engine copies key 5 6.5..8.
    # it 1: dense L0 6.5..7.5. Expert 2 missing: its demand cannot preempt the in-flight
    #   key 5, so it copies 8..9.5; runs 9.5..10.5 (miss, stall 2). Dense L1 10.5..11.5;
    #   expert 1 (key 5, prefetched during compute) is a hit, runs 11.5..12.5.
    tr = t["transfers"]
    assert tr["key"].tolist() == [0, 6, 7, 5, 2]
    assert tr["kind"].tolist() == [DEMAND, PREFETCH, PREFETCH, PREFETCH, DEMAND]
    assert tr["proposed_ms"].tolist() == [1.0, 1.0, 1.0, 6.5, 7.5]
    assert tr["issue_ms"].tolist() == [1.0, 2.5, 4.0, 6.5, 7.5]
    assert tr["start_ms"].tolist() == [1.0, 2.5, 4.0, 6.5, 8.0]
    assert tr["ready_ms"].tolist() == [2.5, 4.0, 5.5, 8.0, 9.5]
    acc = t["accesses"]
    assert acc["layer"].tolist() == [0, 1, 0, 1]
    assert acc["expert"].tolist() == [0, 3, 2, 1]
    assert acc["class"].tolist() == [MISS, LATE, MISS, HIT]
    assert acc["need_ms"].tolist() == [1.0, 4.5, 7.5, 11.5]
    assert acc["start_ms"].tolist() == [2.5, 5.5, 9.5, 11.5]
    assert acc["stall_ms"].tolist() == [1.5, 1.0, 2.0, 0.0]
    assert t["tokens"]["time_ms"].tolist() == [6.5, 12.5]


class Preloads(System):
    name = "preloads"

    def initial_residents(self):
        return [0, 5, 0]  # deduplicated


def test_preloads_are_timed_counted_copies_before_serving():
    # Keys 0 and 5 copy back to back from time 0 (copy 1.5 ms): 0..1.5 and 1.5..3. Serving
    # starts at 3 although the request arrived at 0: dense 3..4, expert 0 (hit) 4..5, dense
    # 5..6, expert 1 (key 5, hit) 6..7. Both copies count as host-to-device bytes.
    model = tiny_model(layers=2, experts=4, top_k=1)
    req = {"id": "a", "prompt_len": 1, "output_len": 1, "arrival_ms": 0.0,
           "routing": [[[[0]], [[1]]]]}
    trace = trace_from_routing(meta_for(model), [req])
    t = Engine(model, FixedBackend(copy_ms=1.5), trace, Preloads(),
               capacity_bytes=4 * model.expert_bytes).run().tables()
    tr = t["transfers"]
    assert tr["key"].tolist() == [0, 5] and tr["kind"].tolist() == [PRELOAD, PRELOAD]
    assert tr["issue_ms"].tolist() == tr["start_ms"].tolist() == [0.0, 1.5]
    assert tr["ready_ms"].tolist() == [1.5, 3.0]
    assert t["tokens"]["iteration_start_ms"].tolist() == [3.0]
    assert t["tokens"]["time_ms"].tolist() == [7.0]
    assert t["accesses"]["class"].tolist() == [HIT, HIT]
    m = summarize(t, trace.arrival_ms, model.expert_bytes)
    assert m["h2d_bytes"] == m["preload_bytes"] == 2 * model.expert_bytes
    assert m["queue_ms"]["mean"] == 3.0 and m["ttft_ms"]["mean"] == 7.0


def _check_timeline(tables, capacity_slots):
    acc, tr = tables["accesses"], tables["transfers"]
    loads = tr["kind"] != 2
    # Every access runs only once its expert is resident.
    assert np.all(acc["start_ms"] >= acc["ready_ms"])
    assert np.all(acc["start_ms"] >= acc["need_ms"])
    # One copy engine: copies never overlap, each starts no earlier than it was issued.
    starts, readies = tr["start_ms"][loads], tr["ready_ms"][loads]
    order = np.argsort(starts, kind="stable")
    assert np.all(starts[order][1:] >= readies[order][:-1] - 1e-9)
    assert np.all(tr["start_ms"] >= tr["issue_ms"])
    # A demand fetch never waits for a prefetch that started after the demand was issued.
    for i in np.flatnonzero(tr["kind"] == DEMAND):
        later = (tr["kind"] == PREFETCH) & (tr["start_ms"] > tr["issue_ms"][i]) & (
            tr["start_ms"] < tr["start_ms"][i])
        assert not later.any()
    # Occupancy (slots reserved at issue, freed at eviction) never exceeds the budget.
    events = [(t_, 1) for t_ in tr["issue_ms"]] + [
        (t_, -1) for t_ in tr["evict_ms"] if not np.isnan(t_)]
    level = 0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):
        level += d
        assert level <= capacity_slots


@pytest.mark.parametrize("make", [OnDemand, LRU, LayerOffload, Oracle])
@pytest.mark.parametrize("slots", [3, 5, 12])
def test_invariants_hold_even_below_one_layer(make, slots):
    # 4 experts, top-2, prompt of 3 tokens: a prefill step can need all 4 experts of a layer,
    # more than 3 slots, so the engine must still make progress one expert at a time.
    model = tiny_model(layers=3, experts=4, top_k=2)
    trace = random_trace(model, n_requests=3, prompt_len=3, output_len=4, seed=slots,
                         with_spec=True)
    if make is LRU and slots < model.num_moe_layers:
        pytest.skip("lru needs one slot per layer")
    engine = Engine(model, FixedBackend(), trace, make(), slots * model.expert_bytes)
    rec = engine.run()
    engine.cache.check_invariants()
    assert not engine.cache.in_use
    assert engine.cache.peak_slots <= slots
    t = rec.tables()
    _check_timeline(t, slots)
    # Every (iteration, layer) union is accessed exactly once per expert.
    acc = t["accesses"]
    keys = set(zip(acc["iteration"].tolist(), acc["layer"].tolist(), acc["expert"].tolist()))
    assert len(keys) == len(acc["expert"])


@pytest.mark.parametrize("make", [OnDemand, LRU, LayerOffload])
def test_online_systems_do_not_see_future_routing(make):
    # Two traces equal up to request 1's step 2; every decision made before that routing is
    # revealed (transfers issued, accesses recorded) must be identical.
    model = tiny_model(layers=3, experts=6, top_k=2)
    a = random_trace(model, n_requests=2, prompt_len=2, output_len=5, seed=1, with_spec=True)
    b = random_trace(model, n_requests=2, prompt_len=2, output_len=5, seed=1, with_spec=True)
    L = model.num_moe_layers
    first_changed_block = (int(b.step_offsets[1]) + 2) * L
    row0 = int(b.block_offsets[first_changed_block])
    b.topk[row0:] = (b.topk[row0:] + 1) % model.num_experts
    b.spec_topk[row0:] = np.where(b.spec_topk[row0:] < model.num_experts,
                                  (b.spec_topk[row0:] + 1) % model.num_experts,
                                  b.spec_topk[row0:])
    b._sha = None
    b.validate()
    cap = 7 * model.expert_bytes
    ta = Engine(model, FixedBackend(), a, make(), cap).run().tables()
    tb = Engine(model, FixedBackend(), b, make(), cap).run().tables()
    # Time the changed routing is revealed: the need time of that block's first access.
    it_b = tb["accesses"]["iteration"]
    req_b, step_b = tb["accesses"]["request"], tb["accesses"]["step"]
    changed = (req_b == 1) & (step_b >= 2)
    t_reveal = float(tb["accesses"]["need_ms"][changed].min())
    assert it_b[changed].min() > 0
    for name, col in (("transfers", "issue_ms"), ("accesses", "need_ms")):
        ma, mb = ta[name][col] < t_reveal, tb[name][col] < t_reveal
        assert ma.sum() == mb.sum() > 0
        for key in ta[name]:
            if key in ("evict_ms", "first_use_access"):  # these record later events
                continue
            assert np.array_equal(ta[name][key][ma], tb[name][key][mb]), (name, key)
    assert ta["transfers"]["issue_ms"].size != tb["transfers"]["issue_ms"].size or not (
        np.array_equal(ta["accesses"]["expert"], tb["accesses"]["expert"]))


def test_only_oracle_systems_receive_the_trace():
    model = tiny_model()
    trace = random_trace(model, 1, 2, 2, seed=0)
    seen = {}

    class Probe(System):
        name = "probe"

        def bind(self, ctx):
            super().bind(ctx)
            seen[type(self).oracle] = ctx.trace

    Engine(model, FixedBackend(), trace, Probe(), 8 * model.expert_bytes).run()
    assert seen[False] is None
    Probe.oracle = True
    Engine(model, FixedBackend(), trace, Probe(), 8 * model.expert_bytes).run()
    assert seen[True] is trace


def _view_trace():
    """2 MoE layers, 4 experts, top-1; one request: a 2-token prefill, then 1 decode step.
    Routing (step, layer): (0, 0) -> tokens [0], [2]; (0, 1) -> [3], [3]; (1, 0) -> [1];
    (1, 1) -> [2]."""
    model = tiny_model(layers=2, experts=4, top_k=1)
    req = {"id": "a", "prompt_len": 2, "output_len": 2, "arrival_ms": 0.0,
           "routing": [[[[0], [2]], [[3], [3]]], [[[1]], [[2]]]]}
    return model, trace_from_routing(meta_for(model), [req])


def test_routing_view_reads_only_the_running_layer():
    from core.blocks import BlockIndex
    from core.view import IterationInfo, RoutingError, RoutingView

    _, trace = _view_trace()
    view = RoutingView(BlockIndex(trace))
    it0 = IterationInfo(0, "prefill", ((0, 0),), 0.0)
    with pytest.raises(RoutingError, match="before anything was revealed"):
        view.rows("topk", 0, 0, 0)
    # Blocks are (global step * L + layer): step 0 layer 0 is block 0, layer 1 block 1.
    r0 = view.reveal(it0, 0, [0, 2], [1, 1], {0: 0})
    assert r0.per_request()[0].ravel().tolist() == [0, 2]
    assert view.rows("topk", 0, 0, 0).ravel().tolist() == [0, 2]
    with pytest.raises(RoutingError, match="past now"):  # a later layer of this iteration
        view.rows("topk", 0, 1, 0)
    with pytest.raises(RoutingError, match="past now"):  # a later iteration
        view.per_request(1, 0)
    with pytest.raises(RoutingError, match="request 1 is not in iteration 0"):
        view.probs(0, 0, 1)
    with pytest.raises(RoutingError, match="field must be"):
        view.rows("embeddings", 0, 0, 0)
    r1 = view.reveal(it0, 1, [3], [2], {0: 1})
    assert r1.per_request()[0].ravel().tolist() == [3, 3]
    with pytest.raises(RoutingError, match="no longer revealed"):  # kept past its layer
        r0.per_request()
    with pytest.raises(RoutingError, match="no longer revealed"):
        r0.weights(0)


def test_probs_rows_gathers_the_members_rows_in_their_order():
    from core.blocks import BlockIndex
    from core.specs import model_spec_from_dict
    from core.view import IterationInfo, RoutingError, RoutingView
    from harness.runner.config import compose_config
    from harness.runner.run import load_routing

    cfg = compose_config(["experiment=table1", "workload.num_requests=2", "progress=false",
                          "trace_cache_dir=null"])
    trace = load_routing(cfg, model_spec_from_dict(cfg["model"], "model"), "measure")
    view = RoutingView(BlockIndex(trace))
    it = IterationInfo(0, "decode", ((0, 1), (1, 1)), 0.0)
    routing = view.reveal(it, 0, [], [], {0: 5, 1: 3})
    got = routing.probs_rows([1, 0])
    assert got.dtype == np.float16 and got.shape == (2, trace.num_experts)
    assert np.array_equal(got, np.stack([trace.probs[3], trace.probs[5]]))
    assert np.array_equal(got[1], routing.probs(0))
    with pytest.raises(RoutingError, match="request 2 is not in iteration 0"):
        routing.probs_rows([0, 2])


def test_systems_read_routing_only_while_its_layer_runs():
    from core.view import RoutingError

    model, trace = _view_trace()
    seen, errors = [], []

    class Keeper(System):
        name = "keeper"
        kept = None

        def on_layer_routed(self, routing, now_ms):
            if self.kept is not None:  # the previous layer's routing, kept: no longer readable
                try:
                    self.kept.per_request()
                except RoutingError as exc:
                    errors.append(str(exc))
            seen.append((routing.iteration.index, routing.layer,
                         routing.per_request()[0].ravel().tolist()))
            self.kept = routing

    Engine(model, FixedBackend(), trace, Keeper(), 8 * model.expert_bytes).run()
    assert seen == [(0, 0, [0, 2]), (0, 1, [3, 3]), (1, 0, [1]), (1, 1, [2])]
    assert errors == [
        "routing of iteration 0, layer 0 is no longer revealed (now: iteration 0, layer 1)",
        "routing of iteration 0, layer 1 is no longer revealed (now: iteration 1, layer 0)",
        "routing of iteration 1, layer 0 is no longer revealed (now: iteration 1, layer 1)"]


@pytest.mark.parametrize("make", [OnDemand, LRU, Oracle])
def test_lean_all_ready_path_records_what_the_per_expert_path_records(make):
    # An executor with only run() (expert time: 1 ms + 0.25 ms per token, so counts matter)
    # takes the generic Executor.run_ready; the cost-model SimExecutor overrides it with an
    # inlined loop. Both must give the same tables, row for row.
    from harness.sim.executor import Executor, SimExecutor

    class PerExpert(Executor):
        def run(self, expert, count, ready_ms, now_ms):
            start = max(ready_ms, now_ms)
            return start, start + 1.0 + 0.25 * count

    class Backend(FixedBackend):
        def expert_ms(self, n_tokens):
            return 1.0 + 0.25 * n_tokens

    model = tiny_model(layers=3, experts=6, top_k=2)
    trace = random_trace(model, n_requests=3, prompt_len=3, output_len=6, seed=4,
                         with_spec=True)
    tables = []
    for executor in (SimExecutor(Backend()), PerExpert()):
        # the executor is the python layer step's (the compiled core inlines the cost model)
        engine = Engine(model, Backend(), trace, make(), 9 * model.expert_bytes, core="python")
        engine.step.executor = executor
        tables.append(engine.run().tables())
    a, b = tables
    assert a["accesses"]["class"].size > 0 and (a["accesses"]["class"] == HIT).any()
    for name in a:
        for col in a[name]:
            assert np.array_equal(a[name][col], b[name][col], equal_nan=True), (name, col)


def test_recorder_columns_across_flushes_and_bytes_per_access():
    """Rows that cross many buffer flushes come back as written (block bounds included), and
    recording holds well under 64 bytes per access (no Python object per access)."""
    import tracemalloc

    from harness.sim.recorder import Recorder

    n_blocks, per = 9000, 7  # 63,000 accesses: several flushes of the access buffer
    tracemalloc.start()
    rec = Recorder(expert_bytes=10)
    for b in range(n_blocks):
        it, layer = b // 3, b % 3
        if layer == 0:
            rec.iteration(it, "prefill" if it == 0 else "decode", it * 2.0, it * 2.0 + 1.5,
                          [(0, it)])
        for j in range(per):
            tid = rec.transfer(b * per + j, 1, 0.0, 0.5 * b, 0.5 * b, 0.5 * b + 0.25)
            rec.add_access((j, 2, tid, b + 0.125, b + 0.375, 0))
        rec.block(it, layer)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    n = n_blocks * per
    assert rec.num_accesses == n
    # Columns: 29 bytes an access, 41 + 8 (evict ms) a transfer, one transfer per access here,
    # ~7 % array over-allocation; plus two list buffers of at most 2**16 values, each a pointer
    # and at most a 32-byte object. The old flat lists held ~300 bytes per access here.
    assert held < 1.07 * (29 + 49) * n + 2 * (1 << 16) * 40
    acc = rec.tables()["accesses"]
    k = np.arange(n)
    assert np.array_equal(acc["expert"], (k % per).astype(np.int32))
    assert acc["expert"].dtype == np.int32 and acc["class"].dtype == np.int8
    assert np.array_equal(acc["layer"], ((k // per) % 3).astype(np.int32))
    assert np.array_equal(acc["iteration"], k // (per * 3))
    assert np.array_equal(acc["transfer_id"], k)
    assert np.array_equal(acc["stall_ms"], np.full(n, 0.25))
    assert np.array_equal(acc["ready_ms"], 0.5 * (k // per) + 0.25)
    assert np.array_equal(acc["step"], (k // (per * 3)).astype(np.int32))
    assert acc["prefill"].sum() == per * 3
