"""Routing trace format v1: in-memory object, reader, writer and validator.

Layout (see docs/trace-format.md). R requests, S = sum of output lengths global steps,
L MoE layers, E routed experts, top-k k. A request with output length O has O steps:
step 0 is the prefill (all prompt tokens; for encoder-decoder models the encoder over the
prompt plus the decoder's first token) and steps 1..O-1 decode one token each. Routing of
step s of request r is global step g = step_offsets[r] + s. Block b = g * L + layer holds the
rows block_offsets[b]:block_offsets[b+1] of the per-token arrays (one row per token).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace

import numpy as np

from core.atomic import atomic_path
from core.trace_file import read_trace_file
from core.trace_format import (
    ARRAY_FIELDS,
    FORMAT_NAME,
    FORMAT_VERSION,
    PROJECTABLE,
    TraceError,
    canonical_json,
    id_dtype,
)
from core.trace_rows import all_finite, first_repeat


@dataclass
class Trace:
    meta: dict  # model shape, routing source, synthetic flag, generator params, embedder name
    request_ids: list[str]
    datasets: list[str]
    tasks: list[str]
    prompt_len: np.ndarray  # int32 [R]
    output_len: np.ndarray  # int32 [R]
    arrival_ms: np.ndarray  # float64 [R]
    step_offsets: np.ndarray  # int64 [R+1]
    block_offsets: np.ndarray  # int64 [S*L+1]
    topk: np.ndarray  # uint8/16 [N, k], ids ascending within a row is NOT required
    weights: np.ndarray | None = None  # float16 [N, k]
    probs: np.ndarray | None = None  # float16 [S*L, E], step-mean router probabilities
    spec_topk: np.ndarray | None = None  # [N, k] guess for layer+1 made at layer; E = none
    embeddings: np.ndarray | None = None  # float16 [R, D]
    has_embedding: np.ndarray | None = None  # bool [R]
    prompts: list[str | None] | None = None
    source: str = "<memory>"  # file name for error messages
    _sha: str | None = field(default=None, repr=False)
    # Per-token fields left out of this in-memory copy by project(); not missing from the trace.
    dropped_fields: tuple[str, ...] = field(default=(), repr=False)

    # ---- shape --------------------------------------------------------------------------
    @property
    def num_requests(self) -> int:
        return len(self.request_ids)

    @property
    def num_layers(self) -> int:
        return int(self.meta["num_moe_layers"])

    @property
    def num_experts(self) -> int:
        return int(self.meta["num_experts"])

    @property
    def top_k(self) -> int:
        return int(self.meta["top_k"])

    @property
    def synthetic(self) -> bool:
        return bool(self.meta.get("synthetic", False))

    @property
    def routing_source(self) -> str:
        return str(self.meta.get("routing_source", "unknown"))

    def block_rows(self, request: int, step: int, layer: int) -> np.ndarray:
        """Top-k ids [n_tokens, k] of one request's step at one MoE layer."""
        b = (int(self.step_offsets[request]) + step) * self.num_layers + layer
        return self.topk[self.block_offsets[b]:self.block_offsets[b + 1]]

    def missing_fields(self) -> list[str]:
        """Optional fields the trace does not have (fields dropped by project() it has)."""
        out = [name for name in ("weights", "probs", "spec_topk", "embeddings")
               if getattr(self, name) is None and name not in self.dropped_fields]
        if self.prompts is None:
            out.append("prompts")
        return out

    def project(self, keep) -> Trace:
        """A copy sharing this trace's arrays without the per-token fields (weights, probs,
        spec_topk) not in `keep`: a run holds only what its system reads. The copy keeps the
        whole trace's sha256 (computed first) and reports dropped fields as present."""
        drop = tuple(f for f in PROJECTABLE if f not in keep and getattr(self, f) is not None)
        if not drop:
            return self
        sha = self.content_sha256()
        return replace(self, **{f: None for f in drop}, _sha=sha,
                       dropped_fields=tuple(sorted({*self.dropped_fields, *drop})))

    def expected_tokens(self, request: int, step: int) -> list[int]:
        """Tokens per MoE layer in one step (ragged by stack for encoder-decoder models)."""
        stacks = self.meta["moe_layer_stacks"]
        enc_dec = "encoder" in stacks
        p = int(self.prompt_len[request])
        if step == 0:
            return [p if (s == "encoder" or not enc_dec) else 1 for s in stacks]
        return [0 if s == "encoder" else 1 for s in stacks]

    # ---- checksum -----------------------------------------------------------------------
    def content_sha256(self) -> str:
        """sha256 over the canonical meta, request table and every array (order fixed)."""
        if self._sha is None:
            h = hashlib.sha256()
            h.update(canonical_json(self._header(with_sha=False)).encode())
            for name in ARRAY_FIELDS:
                arr = getattr(self, name)
                if arr is not None:
                    arr = np.ascontiguousarray(arr)
                    h.update(f"{name}|{arr.dtype.str}|{arr.shape}".encode())
                    h.update(arr.reshape(-1).view(np.uint8))  # the bytes, not a copy
            self._sha = h.hexdigest()
        return self._sha

    def _header(self, with_sha: bool) -> dict:
        meta = {k: v for k, v in self.meta.items() if k != "content_sha256"}
        meta["format"], meta["version"] = FORMAT_NAME, FORMAT_VERSION
        head = {"meta": meta, "requests": {
            "id": self.request_ids, "dataset": self.datasets, "task": self.tasks,
            "prompt": self.prompts}}
        if with_sha:
            head["meta"]["content_sha256"] = self.content_sha256()
        return head

    # ---- validation ---------------------------------------------------------------------
    def validate(self) -> Trace:
        validate(self)
        return self


def _fail(tr: Trace, msg: str, request: int | None = None) -> TraceError:
    who = ""
    if request is not None and 0 <= request < len(tr.request_ids):
        who = f" request {tr.request_ids[request]!r} (index {request}):"
    return TraceError(f"{tr.source}:{who} {msg}")


def _locate_row(tr: Trace, row: int) -> tuple[int, int, int]:
    """(request, step, layer) of a per-token row."""
    b = int(np.searchsorted(tr.block_offsets, row, side="right")) - 1
    g, layer = divmod(b, tr.num_layers)
    r = int(np.searchsorted(tr.step_offsets, g, side="right")) - 1
    return r, g - int(tr.step_offsets[r]), layer


def validate(tr: Trace) -> None:
    """Every field against the format; the first problem raises a TraceError."""
    _check_meta(tr)
    _check_types(tr)
    _check_requests(tr)
    S = _check_offsets(tr)
    _check_routing(tr, S)
    _check_embeddings(tr)


def _check_meta(tr: Trace) -> None:
    """The model's shape in meta, and the types of the optional meta keys."""
    for key in ("num_moe_layers", "num_experts", "top_k"):
        value = tr.meta.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise _fail(tr, f"field 'meta.{key}': expected a positive integer, got {value!r}")
    stacks = tr.meta.get("moe_layer_stacks")
    if not isinstance(stacks, (list, tuple)) or not all(s in ("encoder", "decoder")
                                                        for s in stacks):
        raise _fail(tr, "field 'meta.moe_layer_stacks': expected a list of 'encoder'/'decoder'")
    for key, kind in _META_TYPES:
        if tr.meta.get(key) is not None and not isinstance(tr.meta[key], kind):
            raise _fail(tr, f"field 'meta.{key}': expected a {kind.__name__}, got {tr.meta[key]!r}")


def _check_requests(tr: Trace) -> None:
    """The request table: one entry per request, unique ids, lengths >= 1, arrivals."""
    R, L = len(tr.request_ids), tr.num_layers
    for name in ("datasets", "tasks"):
        if len(getattr(tr, name)) != R:
            raise _fail(tr, f"field '{name}': {len(getattr(tr, name))} entries for {R} requests")
    if len(set(tr.request_ids)) != R:
        raise _fail(tr, "field 'request_ids': ids are not unique")
    if len(tr.meta.get("moe_layer_stacks", [])) != L:
        raise _fail(tr, f"field 'meta.moe_layer_stacks': expected {L} entries")
    for name in ("prompt_len", "output_len", "arrival_ms"):
        arr = getattr(tr, name)
        if arr.shape != (R,):
            raise _fail(tr, f"field '{name}': shape {arr.shape}, expected ({R},)")
    bad = np.flatnonzero((tr.prompt_len < 1) | (tr.output_len < 1))
    if bad.size:
        raise _fail(tr, "field 'prompt_len'/'output_len': lengths must be >= 1", int(bad[0]))
    bad = np.flatnonzero(~np.isfinite(tr.arrival_ms) | (tr.arrival_ms < 0))
    if bad.size:
        raise _fail(tr, "field 'arrival_ms': must be finite and >= 0", int(bad[0]))


def _check_offsets(tr: Trace) -> int:
    """Step and block offsets against the lengths and the layer stacks; returns S, the
    number of global steps."""
    R, L = len(tr.request_ids), tr.num_layers
    expect_steps = np.concatenate([[0], np.cumsum(tr.output_len, dtype=np.int64)])
    if tr.step_offsets.shape != (R + 1,) or not np.array_equal(tr.step_offsets, expect_steps):
        raise _fail(tr, "field 'step_offsets': must be the cumulative output lengths")
    S = int(expect_steps[-1])
    if tr.block_offsets.shape != (S * L + 1,) or tr.block_offsets[0] != 0:
        raise _fail(tr, f"field 'block_offsets': shape {tr.block_offsets.shape}, "
                        f"expected ({S * L + 1},) starting at 0")
    counts = np.diff(tr.block_offsets).reshape(S, L)
    expected = _expected_counts(tr, S)
    bad_steps = np.flatnonzero((counts != expected).any(axis=1))
    if bad_steps.size:
        g = int(bad_steps[0])
        r = int(np.searchsorted(tr.step_offsets, g, side="right")) - 1
        lay = int(np.flatnonzero(counts[g] != expected[g])[0])
        raise _fail(tr, f"field 'topk': step {g - int(tr.step_offsets[r])} layer {lay} has "
                        f"{counts[g, lay]} tokens, expected {expected[g, lay]}", r)
    return S


def _check_routing(tr: Trace, S: int) -> None:
    """The per-token arrays (topk, weights, spec_topk) and the per-block probs."""
    N, L, E, k = int(tr.block_offsets[-1]), tr.num_layers, tr.num_experts, tr.top_k
    if tr.topk.ndim != 2 or tr.topk.shape != (N, k):
        raise _fail(tr, f"field 'topk': shape {tr.topk.shape}, expected ({N}, {k})")
    _check_ids(tr, tr.topk, "topk", E, sentinel_ok=False)
    dup = first_repeat(tr.topk, _CHECK_ROWS)
    if dup is not None:
        r, s, lay = _locate_row(tr, dup)
        raise _fail(tr, f"field 'topk': step {s} layer {lay}: repeated expert id in a "
                        "token's top-k", r)
    if tr.weights is not None:
        if tr.weights.shape != (N, k) or not all_finite(tr.weights, False, _CHECK_ROWS):
            raise _fail(tr, f"field 'weights': shape {tr.weights.shape} (expected ({N}, {k})) "
                            "or non-finite values")
    if tr.spec_topk is not None:
        if tr.spec_topk.shape != (N, k):
            raise _fail(tr, f"field 'spec_topk': shape {tr.spec_topk.shape}, "
                            f"expected ({N}, {k})")
        _check_ids(tr, tr.spec_topk, "spec_topk", E, sentinel_ok=True)
    if tr.probs is not None:
        if tr.probs.shape != (S * L, E) or not all_finite(tr.probs, True, _CHECK_ROWS):
            raise _fail(tr, f"field 'probs': shape {tr.probs.shape} (expected ({S * L}, {E})) "
                            "or values not finite and >= 0")


def _check_embeddings(tr: Trace) -> None:
    """Embeddings with their mask and embedder name, and the prompt texts."""
    R = len(tr.request_ids)
    if tr.embeddings is not None:
        if tr.embeddings.ndim != 2 or tr.embeddings.shape[0] != R:
            raise _fail(tr, f"field 'embeddings': shape {tr.embeddings.shape}, expected ({R}, D)")
        if tr.has_embedding is None or tr.has_embedding.shape != (R,):
            raise _fail(tr, "field 'has_embedding': required with embeddings, shape (R,)")
        bad = np.flatnonzero(~np.isfinite(tr.embeddings).all(axis=1))
        if bad.size:  # NaN would silently change every cosine that fmoe matches with
            raise _fail(tr, "field 'embeddings': values must be finite", int(bad[0]))
        if not tr.meta.get("embedder"):
            raise _fail(tr, "field 'meta.embedder': required when embeddings are present")
    if tr.prompts is not None and len(tr.prompts) != R:
        raise _fail(tr, f"field 'prompts': {len(tr.prompts)} entries for {R} requests")


# Optional meta keys that readers interpret, with their JSON type (None is "not given").
_META_TYPES = (("synthetic", bool), ("routing_source", str), ("embedder", str))
# dtype kinds per array (topk and spec_topk: _check_ids); names of the kinds for messages
_DTYPES = (("prompt_len", "iu"), ("output_len", "iu"), ("arrival_ms", "fiu"),
           ("step_offsets", "iu"), ("block_offsets", "iu"), ("weights", "f"), ("probs", "f"),
           ("embeddings", "f"), ("has_embedding", "b"))
_KIND_NAMES = {"iu": "integers", "fiu": "numbers", "f": "floats", "b": "bools"}
_CHECK_ROWS = 1 << 16  # rows per pass of core/trace_rows.py: small temporaries, in cache


def _check_types(tr: Trace) -> None:
    """Element types of the request table and dtypes of the arrays."""
    for name in ("request_ids", "datasets", "tasks", "prompts"):
        col = getattr(tr, name)
        if col is None and name == "prompts":
            continue
        if not isinstance(col, (list, tuple)):
            raise _fail(tr, f"field '{name}': expected a list, got {type(col).__name__}")
        bad = next((i for i, x in enumerate(col) if not isinstance(x, str)
                    and not (x is None and name == "prompts")), None)
        if bad is not None:
            raise _fail(tr, f"field '{name}': entry {bad} is {col[bad]!r}, expected a string"
                            + (" or null" if name == "prompts" else ""))
    for name, kinds in _DTYPES:
        arr = getattr(tr, name)
        if arr is not None and (not isinstance(arr, np.ndarray) or arr.dtype.kind not in kinds):
            raise _fail(tr, f"field '{name}': dtype {getattr(arr, 'dtype', type(arr).__name__)}, "
                            f"expected {_KIND_NAMES[kinds]}")


def _expected_counts(tr: Trace, S: int) -> np.ndarray:
    """Tokens per (global step, layer) implied by prompt lengths and the layer stacks."""
    L = tr.num_layers
    stacks = np.array(tr.meta["moe_layer_stacks"])
    enc = stacks == "encoder"
    enc_dec = bool(enc.any())
    out = np.ones((S, L), dtype=np.int64)
    out[:, enc] = 0
    first = tr.step_offsets[:-1]
    prefill = np.repeat(tr.prompt_len.astype(np.int64)[:, None], L, axis=1)
    if enc_dec:
        prefill[:, ~enc] = 1
    out[first] = prefill
    return out


def _check_ids(tr: Trace, arr: np.ndarray, name: str, E: int, sentinel_ok: bool) -> None:
    if arr.dtype.kind not in "iu":
        raise _fail(tr, f"field '{name}': dtype {arr.dtype}, expected integer expert ids")
    limit = E + 1 if sentinel_ok else E
    if not arr.size or (int(arr.max()) < limit and int(arr.min()) >= 0):
        return  # the common case, without [N, k] temporaries; else find the first bad row
    bad = (arr >= limit) | (arr < 0)  # signed arrays from other writers may hold -1
    over = np.flatnonzero(bad.any(axis=1)) if arr.size else np.empty(0, int)
    if over.size:
        row = int(over[0])
        r, s, lay = _locate_row(tr, row)
        value = int(arr[row][bad[row]][0])
        raise _fail(tr, f"field '{name}': step {s} layer {lay}: expert id "
                        f"{value} out of range [0, {limit})", r)


def trace_from_routing(meta: dict, requests: list[dict], source: str = "<memory>") -> Trace:
    """Build a Trace from nested per-request routing (small traces, importers and tests).

    requests: dicts with id, dataset, task, prompt_len, output_len, arrival_ms and
    `routing` = [step][layer] -> array-like [n_tokens, k] of expert ids (optional `prompt`).
    meta needs num_moe_layers, num_experts, top_k and moe_layer_stacks.
    """
    E = int(meta["num_experts"])
    rows, offsets = [], [0]
    for req in requests:
        for step in req["routing"]:
            for block in step:
                arr = np.asarray(block, dtype=np.int64).reshape(-1, int(meta["top_k"]))
                rows.append(arr)
                offsets.append(offsets[-1] + len(arr))
    out_len = np.array([r["output_len"] for r in requests], dtype=np.int32)
    prompts = [r.get("prompt") for r in requests]
    return Trace(
        meta=dict(meta), request_ids=[r["id"] for r in requests],
        datasets=[r.get("dataset", "") for r in requests],
        tasks=[r.get("task", "") for r in requests],
        prompt_len=np.array([r["prompt_len"] for r in requests], dtype=np.int32),
        output_len=out_len,
        arrival_ms=np.array([r.get("arrival_ms", 0.0) for r in requests], dtype=np.float64),
        step_offsets=np.concatenate([[0], np.cumsum(out_len, dtype=np.int64)]),
        block_offsets=np.array(offsets, dtype=np.int64),
        topk=(np.concatenate(rows) if rows else np.zeros((0, int(meta["top_k"])))).astype(
            id_dtype(E)),
        prompts=prompts if any(p is not None for p in prompts) else None, source=source,
    ).validate()


# ---- file I/O ---------------------------------------------------------------------------

def write_trace(tr: Trace, path: str | os.PathLike, compress: bool = True) -> str:
    """Write atomically (hidden temporary sibling + rename, core/atomic.py); returns the
    content sha256. compress=False stores the arrays uncompressed (the same format, read by
    the same reader): ~25 % larger, ~50x faster to write (the runner's trace cache)."""
    if tr.dropped_fields:
        raise TraceError(f"{tr.source}: an in-memory projection without "
                         f"{', '.join(tr.dropped_fields)} cannot be written as the trace")
    tr.validate()
    tr._sha = None  # arrays may have been edited since the checksum was last computed
    arrays = {name: getattr(tr, name) for name in ARRAY_FIELDS if getattr(tr, name) is not None}
    header = canonical_json(tr._header(with_sha=True)).encode()
    arrays["header_json"] = np.frombuffer(header, dtype=np.uint8)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        (np.savez_compressed if compress else np.savez)(fh, **arrays)
    return tr.content_sha256()


def read_trace(path: str | os.PathLike) -> Trace:
    """Read (core/trace_file.py: bounded sizes, known members only, header types, version),
    validate, check the checksum. Errors name the file."""
    meta, reqs, arrays = read_trace_file(path)
    name = os.path.basename(os.fspath(path))
    tr = Trace(meta=meta, request_ids=list(reqs["id"]), datasets=list(reqs["dataset"]),
               tasks=list(reqs["task"]), prompts=reqs.get("prompt"), source=name, **arrays)
    tr.validate()
    if meta["content_sha256"] != tr.content_sha256():
        raise TraceError(f"{name}: field 'meta.content_sha256' does not match the content "
                         "(file corrupted or edited)")
    return tr
