"""moe_infinity's expert activation matrix collection (systems/moe_infinity/eamc.py):
replacement of the most similar entry, cosine over the layers seen, the kept collection sum,
ranking ties and per-request EAMs. Expected values by hand."""

from __future__ import annotations

import numpy as np
from helpers import random_trace, tiny_model

from systems.moe_infinity.eamc import EAMC, request_eams, top_ranked


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
    # the whole collection's counts, kept across the replacement: [3,1,0] + [0,1,0]
    np.testing.assert_array_equal(c.sum_counts, [3, 2, 0])
    share, _ = c.predicted()
    np.testing.assert_array_equal(share, [0.6, 0.4, 0.0])


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


def test_top_ranked_breaks_ties_by_lowest_index():
    v = np.array([0.5, 0.9, 0.5, 0.1, 0.5])
    assert top_ranked(np.arange(5), v, 2).tolist() == [1, 0]
    assert top_ranked(np.arange(5), v, 3).tolist() == [1, 0, 2]
    assert top_ranked(np.array([4, 2, 3]), v, 2).tolist() == [2, 4]


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


def test_eamc_grows_its_columns_and_keeps_every_entry():
    rng = np.random.default_rng(2)
    c = EAMC(100, 2, 3)
    eams = rng.integers(0, 5, size=(70, 2, 3)).astype(float)
    for e in eams:
        c.insert(e)
    assert c.cols.shape[1] == 100 and c.n == 70
    for k in (0, 63, 64, 69):
        np.testing.assert_array_equal(c.entry(k), eams[k])
    q = eams[5].ravel()
    want = [q @ e.ravel() / np.sqrt(q @ q * (e.ravel() @ e.ravel())) for e in eams]
    np.testing.assert_allclose(c.cosine(q), want)
