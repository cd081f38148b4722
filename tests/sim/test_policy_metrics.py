"""Policy-quality metrics on cases small enough to work out by hand (docs/metrics.md,
"Policy quality"): a hand-computed engine timeline, a churn table with every edge of the
rule, and next-layer guesses scored by hand."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import meta_for, tiny_model
from metric_refs import churn_reference, spec_recall_reference
from test_engine import two_layer_timeline

from core.trace import trace_from_routing
from harness.sim.metrics import prefetch_churn, spec_recall, summarize
from harness.sim.recorder import DEMAND, PREFETCH


def test_timeline_metrics_by_hand():
    # The timeline of tests/sim/test_engine.py::test_two_layer_timeline_by_hand (8 slots, nothing
    # evicted). Transfers: key 0 demand, 6 / 7 prefetched at 2.5 / 4.0 (iteration 0, starts 0),
    # 5 prefetched at 6.5 (iteration 1, the decode, starts 6.5), 2 demand. Accesses: it 0:
    # miss (key 0), late (key 7); it 1: miss (key 2), hit (key 5). Key 6 is never used.
    model, trace, tables = two_layer_timeline()
    m = summarize(tables, trace.arrival_ms, model.expert_bytes)
    assert (m["hit_rate_prefill"], m["hit_rate_decode"], m["hit_rate"]) == (0.0, 0.5, 0.25)
    assert (m["prefetches_issued"], m["prefetches_used"], m["prefetches_unused"],
            m["prefetches_late"]) == (3, 2, 1, 1)
    assert m["prefetch_precision"] == pytest.approx(2 / 3)
    # would-be misses: 2 demand first uses + 2 prefetch first uses; 1 (key 5) became a hit
    assert m["prefetch_recall"] == 0.25
    assert m["prefetch_churn"] == 0.0
    assert m["prefetches_per_decode_token"] == 1.0  # key 5, one decode token
    assert m["unused_prefetch_bytes_per_token"] == model.expert_bytes / 2
    assert m["h2d_bytes"] == 5 * model.expert_bytes


def _tokens(rows):
    it, r, s, start = (np.array(c) for c in zip(*rows))
    return {"iteration": it, "request": r, "token_index": s,
            "iteration_start_ms": start.astype(float), "prefill": s == 0}


def test_churn_rule_by_hand():
    # it 0: prefill r0 (starts 0); it 1: prefill r1 (10); it 2: decode r0, r1 (20); it 3: (30).
    # Windows: [0, 10), [10, 20), [20, 30), [30, inf).
    tok = _tokens([(0, 0, 0, 0), (1, 1, 0, 10), (2, 0, 1, 20), (2, 1, 1, 20), (3, 0, 2, 30),
                   (3, 1, 2, 30)])
    rows = [  # key, kind, issue ms, evict ms; expected churn
        (5, DEMAND, 1, 5), (5, PREFETCH, 22, None),  # yes: r0's previous iteration is it 0
        (7, DEMAND, 2, 15), (7, PREFETCH, 25, None),  # yes: r1's previous iteration, it 1
        (9, DEMAND, 3, 8), (9, PREFETCH, 35, None),  # no: it 3's members last ran in it 2
        (11, PREFETCH, 31, 33), (11, PREFETCH, 36, None),  # first no (no earlier copy), yes
        (13, DEMAND, 4, 9), (13, PREFETCH, 12, None),  # no: r1's prefill has no previous
        (15, DEMAND, 4, 20), (15, PREFETCH, 40, None),  # yes: 20 opens it 2's window
        (19, DEMAND, 5, 30), (19, PREFETCH, 30, None),  # yes: same instant, same iteration
    ]
    tr = {"transfer_id": np.arange(len(rows)), "key": np.array([r[0] for r in rows]),
          "kind": np.array([r[1] for r in rows], dtype=np.int8),
          "issue_ms": np.array([r[2] for r in rows], dtype=float),
          "evict_ms": np.array([np.nan if r[3] is None else r[3] for r in rows])}
    churn = prefetch_churn(tr, tok)
    assert np.flatnonzero(churn).tolist() == [1, 3, 7, 11, 13]
    assert churn_reference(tr, tok) == (5, 8)


def _spec_trace(stacks, routing, spec):
    model = tiny_model(layers=3, experts=4, top_k=2)
    meta = {**meta_for(model), "moe_layer_stacks": stacks}
    trace = trace_from_routing(meta, [{"id": "a", "prompt_len": 2, "output_len": 2,
                                       "arrival_ms": 0.0, "routing": routing}])
    trace.spec_topk = np.array(spec, dtype=trace.topk.dtype)
    trace._sha = None
    return trace.validate()


def test_spec_recall_by_hand():
    # Rows in block order (step, layer, token); 4 = no guess. Scored tokens and true experts
    # of the next layer found in the guess:
    #   s0 L0 t0 {1,3} vs {1,2}: 1;  s0 L0 t1 {0,3} vs {0,3}: 2;  s0 L1 t0: no guess;
    #   s0 L1 t1 {1} vs {1,2}: 1;    s1 L0 {2,0} vs {2,1}: 1;      s1 L1 {3,2} vs {0,3}: 1.
    # 6 of 5 tokens x 2 true experts = 0.6; the last layer never guesses.
    routing = [[[[0, 1], [2, 3]], [[1, 2], [0, 3]], [[0, 1], [1, 2]]],
               [[[3, 0]], [[2, 1]], [[0, 3]]]]
    spec = [[1, 3], [0, 3], [4, 4], [1, 4], [4, 4], [4, 4], [2, 0], [3, 2], [4, 4]]
    trace = _spec_trace(["decoder"] * 3, routing, spec)
    assert spec_recall(trace) == pytest.approx(0.6)
    assert spec_recall_reference(trace) == pytest.approx(0.6)
    trace.spec_topk = None
    assert spec_recall(trace) is None


def test_spec_recall_skips_a_guess_into_another_stack():
    # Encoder L0 (2 prompt tokens at step 0, none at step 1), decoder L1, L2 (1 token each).
    # The L0 rows guess, but L1 is another stack with other tokens: only s0 L1 {0,3} vs {0,3}
    # (2 found) and s1 L1 {1,3} vs {1,2} (1 found) count: 3 of 4.
    routing = [[[[0, 1], [2, 3]], [[1, 2]], [[0, 3]]], [[], [[3, 0]], [[2, 1]]]]
    spec = [[1, 2], [0, 3], [0, 3], [4, 4], [1, 3], [4, 4]]
    trace = _spec_trace(["encoder", "decoder", "decoder"], routing, spec)
    assert spec_recall(trace) == pytest.approx(0.75)
    assert spec_recall_reference(trace) == pytest.approx(0.75)
