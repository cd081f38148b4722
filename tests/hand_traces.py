"""The hand-written decoder traces of the trace-format tests (tests/core/test_trace_format.py,
test_trace_validation.py): two requests whose rows per (step, layer) are worked out by hand."""

from __future__ import annotations

from core.trace import Trace, trace_from_routing

E, K = 4, 2  # experts, top-k of the hand-written decoder traces
META = {"num_moe_layers": 2, "num_experts": E, "top_k": K,
        "moe_layer_stacks": ["decoder", "decoder"]}


def requests_two():
    """r0: prompt 3, output 2; r1: prompt 1, output 3. Rows per (step, layer) by hand."""
    return [
        {"id": "r0", "dataset": "mmlu", "task": "algebra", "prompt_len": 3, "output_len": 2,
         "arrival_ms": 0.0, "prompt": "two plus two",
         "routing": [
             [[[0, 1], [1, 2], [2, 3]], [[3, 0], [0, 2], [1, 3]]],  # step 0: 3 tokens
             [[[0, 1]], [[2, 3]]],  # step 1: 1 token
         ]},
        {"id": "r1", "dataset": "flan", "task": "qa", "prompt_len": 1, "output_len": 3,
         "arrival_ms": 5.5, "prompt": "why",
         "routing": [
             [[[3, 2]], [[1, 0]]],
             [[[2, 1]], [[0, 3]]],
             [[[1, 3]], [[2, 0]]],
         ]},
    ]


def build(requests=None, meta=None, source="hand.npz") -> Trace:
    return trace_from_routing(dict(meta or META), requests or requests_two(), source=source)
