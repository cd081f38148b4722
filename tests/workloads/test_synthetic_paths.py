"""The synthetic generator's speed paths (row blocks, layer-major copies, float16 rounding,
small softmaxes, validation in blocks) against their plain references: none may move a bit
(docs/trace-format.md, "Portable determinism")."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import BEFORE_STRUCTURE, conf_model

from workloads.synthetic import SyntheticConfig, generate_trace

SMALL_TASKS = [["bigbench", 4], ["flan", 4], ["mmlu", 4]]  # 12 tasks: several requests each


@pytest.mark.parametrize("name, sha", [
    ("deepseek_v2_lite", "afe22039381a7391fc3ff2d55046a52a354c3cc5cbfe5ddded70b3a2a2155f2e"),
    ("switch_base_128", "c1859e08dbb4aba6a342f251519af01546364a149872588f25d3fc74c3bed521")])
def test_blocking_does_not_change_the_trace(name, sha, monkeypatch):
    """Two chunks (the second short), guess noise on: the shas were computed with the
    per-position generator (before workloads/synthetic_route.py), so positions per block,
    rows per guess block and the padding rows skipped leave every byte as it was."""
    from workloads import spec_guess, synthetic_route

    cfg = SyntheticConfig(num_requests=33, prompt_len=21, output_len=3, tasks=SMALL_TASKS,
                          spec_noise_nats=0.5, **BEFORE_STRUCTURE)
    for positions, rows in ((synthetic_route.BLOCK_POSITIONS, spec_guess.BLOCK_ROWS), (1, 4),
                            (5, 12)):
        monkeypatch.setattr(synthetic_route, "BLOCK_POSITIONS", positions)
        monkeypatch.setattr(spec_guess, "BLOCK_ROWS", rows)
        assert generate_trace(conf_model(name), cfg).content_sha256() == sha, (positions, rows)


def test_layer_major_copies_equal_copy_layers():
    from workloads.cross_layer import copy_layers, copy_layers_layer_major

    rng = np.random.default_rng(3)
    T, c, L, E = 3, 4, 6, 8
    src = np.stack([rng.permutation(E) for _ in range(L - 1)])
    threshold = np.array([0, 243, 243, 0, 128, 255], np.uint8)  # 0: a stack boundary
    w = rng.integers(0, 2**16, (T, c, L, E), dtype=np.uint16)
    u8 = rng.integers(0, 256, (T, c, L, E), dtype=np.uint8)
    expect = w.copy()
    for t in range(T):  # the reference: one position at a time
        copy_layers(expect[t], u8[t], (src, threshold))
    lm, fresh = w.transpose(2, 0, 1, 3).copy(), u8.transpose(2, 0, 1, 3).astype(np.uint16)
    copy_layers_layer_major(lm, fresh, np.empty((T, c, E), np.uint16), (src, threshold))
    assert np.array_equal(lm.transpose(1, 2, 0, 3), expect)


def test_float16_rounding_equals_numpy_cast():
    from workloads.half import to_float16

    rng = np.random.default_rng(4)
    bits = np.concatenate([rng.integers(0, 0x3F800001, 10**6),  # [0, 1]
                           np.arange(0x33000000 - 9, 0x33000000 + 9),  # half of 2**-24
                           np.arange(0x387FC000 - 9, 0x38800000 + 9),  # subnormal -> normal
                           np.arange(0x477FE000 - 9, 0x477FE001)]).astype(np.uint32)
    x = bits.view(np.float32)
    assert np.array_equal(to_float16(x).view(np.uint16), x.astype(np.float16).view(np.uint16))
    odd = np.array([np.inf, np.nan, -1.0, -0.0, 65520.0], np.float32)  # numpy's cast
    with np.errstate(over="ignore"):
        assert np.array_equal(to_float16(odd), odd.astype(np.float16), equal_nan=True)


@pytest.mark.parametrize("k", range(1, 9))
def test_softmax_over_few_equals_numpy_sum(k):
    from workloads.synthetic_route import _softmax_few, softmax

    x = np.random.default_rng(k).uniform(-30, 0, (5000, k)).astype(np.float32)
    assert np.array_equal(_softmax_few(x.copy()), softmax(x.copy()))


def test_validation_in_row_blocks(monkeypatch):
    """validate checks rows in blocks: a repeat in a later block is still found first."""
    import core.trace as ct

    monkeypatch.setattr(ct, "_CHECK_ROWS", 3)
    meta = {"num_moe_layers": 1, "num_experts": 4, "top_k": 2, "moe_layer_stacks": ["decoder"]}
    routing = [[[[0, 1], [1, 2], [2, 3], [3, 0], [1, 1], [2, 2]]], [[[0, 3]]]]
    req = {"id": "r0", "prompt_len": 6, "output_len": 2, "routing": routing}
    with pytest.raises(ct.TraceError, match="step 0 layer 0: repeated expert id"):
        ct.trace_from_routing(meta, [req])
    routing[0][0][4:] = [[1, 3], [2, 0]]
    tr = ct.trace_from_routing(meta, [req])
    tr.probs = np.full((2, 4), 0.25, np.float16)
    tr.probs[1, 3] = -0.0  # not < 0
    tr.validate()
    tr.probs[1, 2] = -0.25
    with pytest.raises(ct.TraceError, match="field 'probs'"):
        tr.validate()
