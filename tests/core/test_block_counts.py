"""core.blocks.block_expert_counts: tokens per expert of every block, worked out by hand."""

from __future__ import annotations

import numpy as np
from helpers import meta_for, random_trace, tiny_model

from core.blocks import block_expert_counts
from core.trace import trace_from_routing


def test_counts_of_a_hand_made_trace():
    model = tiny_model(layers=2, experts=4, top_k=2)
    # one request: a 3-token prefill, then one decode step; [step][layer] -> [tokens, k]
    routing = [[[[0, 1], [1, 2], [1, 0]], [[3, 2], [2, 3], [0, 3]]],
               [[[2, 3]], [[1, 0]]]]
    tr = trace_from_routing(meta_for(model), [{
        "id": "r0", "dataset": "test", "task": "t", "prompt_len": 3, "output_len": 2,
        "arrival_ms": 0.0, "routing": routing}])
    want = np.array([[2, 3, 1, 0],   # step 0, layer 0: expert 1 in all three tokens
                     [1, 0, 2, 3],   # step 0, layer 1
                     [0, 0, 1, 1],   # step 1, layer 0
                     [1, 1, 0, 0]],  # step 1, layer 1
                    np.float32)
    got = block_expert_counts(tr)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_counts_match_a_count_of_every_token_choice():
    model = tiny_model(layers=3, experts=5, top_k=2)
    tr = random_trace(model, 4, prompt_len=6, output_len=5, seed=3)
    n_blocks = len(tr.block_offsets) - 1
    want = np.zeros((n_blocks, 5), np.float32)
    for b in range(n_blocks):
        for row in tr.topk[tr.block_offsets[b]:tr.block_offsets[b + 1]]:
            for e in row:
                want[b, e] += 1
    np.testing.assert_array_equal(block_expert_counts(tr), want)
