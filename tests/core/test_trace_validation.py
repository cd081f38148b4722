"""Trace validation: every message names the file, the request, the field, the step and the
layer; encoder-decoder token counts. Expected values are worked out from literal routing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hand_traces import E, K, build, requests_two

from core.trace import TraceError, read_trace, write_trace

# ---- validation messages name file, request and field ---------------------------------------

def expect_error(requests, *parts, meta=None):
    with pytest.raises(TraceError) as err:
        build(requests, meta=meta, source="bad.npz")
    msg = str(err.value)
    assert msg.startswith("bad.npz:"), msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


def test_expert_id_out_of_range_names_step_and_layer():
    reqs = requests_two()
    reqs[1]["routing"][1][1] = [[0, 4]]  # r1 step 1 layer 1: id 4 with E = 4
    expect_error(reqs, "'r1'", "field 'topk'", "step 1", "layer 1", "4")


def test_negative_expert_id_is_out_of_range():
    """A writer using signed ids (-1 as 'none') must not slip through validation."""
    tr = build()
    tr.topk = tr.topk.astype(np.int64)
    tr.topk[7] = [-1, 2]  # row 7 = r0 step 1 layer 1
    tr.source = "signed.npz"
    with pytest.raises(TraceError) as err:
        tr.validate()
    msg = str(err.value)
    for part in ("signed.npz", "'r0'", "field 'topk'", "step 1", "layer 1", "-1"):
        assert part in msg, (part, msg)


@pytest.mark.parametrize("req, step, layer, tokens, expected", [
    (0, 0, 1, 2, 3),  # prefill with one prompt token missing
    (1, 2, 0, 2, 1),  # decode step with two tokens
])
def test_wrong_token_count_names_step(req, step, layer, tokens, expected):
    reqs = requests_two()
    reqs[req]["routing"][step][layer] = [[0, 1], [2, 3], [1, 2]][:tokens]
    rid = reqs[req]["id"]
    expect_error(reqs, f"'{rid}'", "field 'topk'", f"step {step} layer {layer}",
                 f"{tokens} tokens, expected {expected}")


def test_duplicate_expert_in_a_token_topk():
    reqs = requests_two()
    reqs[1]["routing"][2][0] = [[3, 3]]
    expect_error(reqs, "'r1'", "field 'topk'", "step 2", "layer 0", "repeated")


@pytest.mark.parametrize("arrival", [-1.0, math.nan, math.inf])
def test_bad_arrival(arrival):
    reqs = requests_two()
    reqs[1]["arrival_ms"] = arrival
    expect_error(reqs, "'r1'", "arrival_ms")


def test_prompt_len_zero():
    reqs = requests_two()
    reqs[1]["prompt_len"] = 0
    reqs[1]["routing"][0] = [[], []]  # zero prompt tokens
    expect_error(reqs, "'r1'", "prompt_len")


def test_spec_topk_accepts_sentinel_but_not_beyond():
    tr = build()
    tr.spec_topk = np.full((14, K), E, dtype=np.uint8)  # E = "no guess"
    tr.validate()
    tr.spec_topk[11] = [E + 1, 0]  # rows: r0 0-7, r1 s0 8-9, r1 s1 10 (l0), 11 (l1)
    tr.source = "spec.npz"
    with pytest.raises(TraceError) as err:
        tr.validate()
    msg = str(err.value)
    for part in ("spec.npz", "'r1'", "field 'spec_topk'", "step 1", "layer 1", str(E + 1)):
        assert part in msg, (part, msg)


def test_topk_does_not_accept_the_sentinel():
    reqs = requests_two()
    reqs[0]["routing"][0][0][2] = [E, 0]  # r0 prefill layer 0, third token
    expect_error(reqs, "'r0'", "field 'topk'", "step 0 layer 0")


# ---- encoder-decoder ------------------------------------------------------------------------

ENC_DEC_META = {"num_moe_layers": 3, "num_experts": E, "top_k": K,
                "moe_layer_stacks": ["encoder", "decoder", "decoder"]}


def enc_dec_requests():
    """Prompt 3, output 3: encoder layer sees the 3 prompt tokens once (step 0), then nothing;
    each decoder layer sees 1 token per step."""
    return [{"id": "t0", "prompt_len": 3, "output_len": 3, "routing": [
        [[[0, 1], [1, 2], [2, 3]], [[0, 3]], [[1, 2]]],
        [[], [[2, 0]], [[3, 1]]],
        [[], [[1, 0]], [[0, 2]]],
    ]}]


def test_encoder_decoder_counts_validate(tmp_path):
    tr = build(enc_dec_requests(), meta=ENC_DEC_META)
    # blocks: step 0: 3, 1, 1; step 1: 0, 1, 1; step 2: 0, 1, 1
    assert tr.block_offsets.tolist() == [0, 3, 4, 5, 5, 6, 7, 7, 8, 9]
    assert tr.expected_tokens(0, 0) == [3, 1, 1]
    assert tr.expected_tokens(0, 2) == [0, 1, 1]
    assert tr.block_rows(0, 1, 0).shape == (0, K)
    sha = write_trace(tr, tmp_path / "encdec.npz")
    assert read_trace(tmp_path / "encdec.npz").content_sha256() == sha


def test_encoder_decoder_wrong_counts_are_rejected():
    reqs = enc_dec_requests()
    reqs[0]["routing"][1][0] = [[0, 1]]  # encoder layer must not run after step 0
    expect_error(reqs, "'t0'", "step 1 layer 0", "1 tokens, expected 0", meta=ENC_DEC_META)
    reqs = enc_dec_requests()
    reqs[0]["routing"][0][1] = [[0, 3], [1, 2], [2, 3]]  # decoder prefill is one token
    expect_error(reqs, "'t0'", "step 0 layer 1", "3 tokens, expected 1", meta=ENC_DEC_META)
