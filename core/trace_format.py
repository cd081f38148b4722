"""The names of routing trace format v1 (docs/trace-format.md) that both the in-memory trace
(core/trace.py) and the file reader (core/trace_file.py) speak: format name and version, the
arrays a file holds, the id dtype and the error every check raises."""

from __future__ import annotations

import json

import numpy as np

FORMAT_NAME = "moe-offload-bench-trace"
FORMAT_VERSION = "1.0"
OPTIONAL_FIELDS = ("weights", "probs", "spec_topk", "embeddings", "prompts")
PROJECTABLE = ("weights", "probs", "spec_topk")  # the large per-token fields project() drops
ARRAY_FIELDS = ("prompt_len", "output_len", "arrival_ms", "step_offsets", "block_offsets", "topk",
           "weights", "probs", "spec_topk", "embeddings", "has_embedding")


class TraceError(ValueError):
    """A trace file or object is malformed; the message names file, request and field."""


def id_dtype(num_experts: int) -> np.dtype:
    """Smallest unsigned dtype holding expert ids and the sentinel id E."""
    return np.dtype(np.uint8) if num_experts < 255 else np.dtype(np.uint16)


def canonical_json(obj) -> str:
    """The header's JSON as written and as hashed into the content sha256."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
