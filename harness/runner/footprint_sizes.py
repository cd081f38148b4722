"""What one trace split holds in memory and what replaying it records, from the config or from
a trace file's declared array sizes, before any of it exists (harness/runner/footprint.py).

Synthetic split of R requests, mean prompt P and output O tokens, for a model of L MoE layers,
E experts, top-k k (ids in `id` bytes: core.trace.id_dtype), each layer's prefill tokens n0
(P; 1 at a decoder layer of an encoder-decoder model) and decode tokens d (1; 0 at an encoder
layer), embedding dimension D:

    rows N = R * (sum(n0) + (O - 1) * sum(d))     per-token rows (core/trace.py)
    blocks B = R * O * L                          (step, layer) blocks
    topk, spec_topk [N, k] id; weights [N, k] float16; probs [B, E] float16;
    block_offsets [B + 1] int64; embeddings [R, D] float16; the request table

The generator's transients (workloads/synthetic.py, synthetic_route.py) are the larger of a
chunk's workspace (its 32 requests' [t_max, L, 32, k] keys, ids and weights, [32, O, L, E]
float32 probabilities, the block buffers; t_max the chunk's longest request) and the
embeddings' float64 temporaries. Replay accesses (one per (iteration, layer, expert) of the
union of the iteration's tokens, docs/engine.md) use the expected union of m tokens' top-k
under uniform routing, u(m) = E * (1 - (1 - k / E)**m): exactly k for one token, and within
1 % of the Table 1 trace's 1,884,374 accesses (skewed routing uses fewer experts, so it is an
upper estimate). With every request arriving at once the batch's requests run together
(core/schedule.py), so a decode step of g requests has u(g) accesses per layer; otherwise
requests are counted alone, the most accesses any schedule gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from core.checks import is_integer
from core.trace import PROJECTABLE, id_dtype

CHUNK_REQUESTS = 32  # workloads/synthetic.py: requests routed together (its workspace lanes)
BLOCK_POSITIONS = 8  # workloads/synthetic_route.py: positions per block buffer
# Python objects of a request beyond its arrays: three short strings (id, dataset, task) at
# ~60 bytes each, their list slots, its lengths in the generator's plan and shape list.
REQUEST_OBJECT_BYTES = 400
# Synthetic embeddings (workloads/synthetic.py) are drawn in float64: the task centroids
# [T, D] peak at CENTROID_ARRAYS arrays while drawn and normalised, then with the centroids
# held the requests' [R, D] at REQUEST_ARRAYS (draw, scale, sum, normalise). Measured at
# embed_dim 20,000-200,000: 2,044 MiB above the plain trace at R = 2,000, T = 290
# (6.6 arrays of [R, D]); 2,494 MiB at R = 29, T = 290 (5.6 of [T, D]); 1,684 at R = T = 290.
CENTROID_ARRAYS = 5.7
REQUEST_ARRAYS = 6.6
# A trace file's JSON header (request ids, datasets, tasks, prompts) as Python objects: a
# 10-character id is 13 bytes of JSON and a 59-byte str plus an 8-byte list slot.
HEADER_OBJECT_FACTOR = 5


@dataclass(frozen=True)
class TraceSize:
    """One split: bytes as generated or read with every field (full), as the run keeps it
    (kept: per-token fields the system does not read dropped), the transient bytes on top of
    `full` while it is built, and what replaying it gives the engine."""

    full_bytes: int
    kept_bytes: int
    build_bytes: int
    accesses: int
    blocks: int
    requests: int


def union_size(m: float, num_experts: int, top_k: int) -> float:
    """Expected distinct experts among m tokens' top-k choices under uniform routing."""
    if m <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** m)


def _layer_tokens(model) -> tuple[list[int], list[int]]:
    """Per MoE layer: (1 if its prefill tokens are the prompt else 0, decode tokens)."""
    stacks = list(model.moe_layer_stacks)
    enc_dec = "encoder" in stacks
    prompt = [1 if s == "encoder" or not enc_dec else 0 for s in stacks]
    return prompt, [0 if s == "encoder" else 1 for s in stacks]


def replay_accesses(model, requests: int, prompt_len: float, output_len: float,
                    batch: int) -> float:
    """Expected engine accesses: requests in groups of `batch` (1: each alone), each group
    one prefill iteration and output_len - 1 decode iterations."""
    E, k = model.num_experts, model.top_k
    prompt, dec = _layer_tokens(model)

    def group(g: int) -> float:
        return sum(union_size(g * (prompt_len if p else 1), E, k)
                   + (output_len - 1) * union_size(g * d, E, k) for p, d in zip(prompt, dec))

    full, rest = divmod(int(requests), max(1, int(batch)))
    return full * group(batch) + (group(rest) if rest else 0.0)


def _tail(table: dict, mean: float, requests: int) -> float:
    """The longest of `requests` draws, typically: the length table's quantile at
    1 - 1 / (requests + 1) (workloads/length_tables.py: quantiles of length / mean)."""
    from workloads.length_tables import GRID_N

    p = 1.0 - 1.0 / (requests + 1)
    return mean * float(np.interp(p, np.array(GRID_N) / 10000, table["quantiles"]))


def _lengths(w, requests: int) -> tuple[float, float, float, float]:
    """(mean prompt, mean output, longest prompt, longest output) tokens of a synthetic
    split: the config's, a fitted length table's, or an Azure replay's table (its mean over
    the whole trace stands for the replayed window)."""
    from workloads.arrivals import AZURE_KINDS, MAX_REQUEST_TOKENS
    from workloads.length_tables import LENGTH_TABLES

    arr = w.arrivals if isinstance(w.arrivals, dict) else {}
    source, means = None, (float(w.prompt_len), float(w.output_len))
    if arr.get("process") == "azure" and arr.get("lengths", True) is True:
        kind = arr.get("kind", "conv")
        source = f"azure_{kind if kind in AZURE_KINDS else 'conv'}"
        means = tuple(LENGTH_TABLES[source][part]["mean"] for part in ("prompt", "output"))
    elif w.lengths == "fitted" and w.length_source in LENGTH_TABLES:
        source = w.length_source
    if source is None:
        return (*means, *means)
    table = LENGTH_TABLES[source]
    return (*means, *(min(MAX_REQUEST_TOKENS, _tail(table[part], mean, requests))
                      for part, mean in zip(("prompt", "output"), means)))


def request_count(w) -> int:
    """workload.num_requests, capped by workload.arrivals.max_requests where set."""
    n = int(w.num_requests)
    cap = w.arrivals.get("max_requests") if isinstance(w.arrivals, dict) else None
    return min(n, int(cap)) if is_integer(cap) and cap >= 1 else n


def synthetic_size(w, model, fields, batch: int) -> TraceSize:
    """Sizes of the synthetic split `w` (a checked workloads.synthetic.SyntheticConfig) for a
    system reading the per-token `fields`."""
    L, E, k = model.num_moe_layers, model.num_experts, model.top_k
    R = request_count(w)
    p_mean, o_mean, p_max, o_max = _lengths(w, R)
    ids = id_dtype(E).itemsize
    prompt, dec = _layer_tokens(model)

    def rows_of(p: float, o: float) -> float:  # one request's rows, all layers
        return sum(p if at_prompt else 1 for at_prompt in prompt) + (o - 1) * sum(dec)

    rows, blocks = R * rows_of(p_mean, o_mean), R * o_mean * L
    per_token = {"topk": rows * k * ids, "weights": rows * k * 2, "spec_topk": rows * k * ids,
                 "probs": blocks * E * 2}
    D = int(w.embed_dim)
    # block_offsets [B + 1], step_offsets [R + 1] int64; per request int32 prompt and output
    # lengths, float64 arrival, bool has_embedding, float16 embedding [D], its objects
    table = (blocks + 1 + R + 1) * 8 + R * (4 + 4 + 8 + 1 + D * 2 + REQUEST_OBJECT_BYTES)
    full = sum(per_token.values()) + table
    dropped = sum(per_token[f] for f in PROJECTABLE if f not in fields)
    # One chunk of n requests: keys int32, ids and weights float16 [t_max, L, n, k]; steps and
    # liveness [t_max, n, L]; probabilities float32 [n, o_max, L, E]; block buffers [8, L, 32,
    # E] (two float32, two uint16, int32 ids); its rows' indices int64, listed and joined.
    # They sit beside the trace rows of the chunks before (np.empty pages are resident once
    # written), so the last chunk's peak holds the trace less its own rows.
    n = min(CHUNK_REQUESTS, R)
    both = any(p and d for p, d in zip(prompt, dec))  # a layer sees the prompt and decodes
    t_max = p_max + o_max - 1 if both else max(p_max, o_max)
    workspace = (t_max * L * n * (k * (4 + ids + 2) + 6) + n * o_max * L * E * 4
                 + BLOCK_POSITIONS * L * CHUNK_REQUESTS * E * 16 + n * rows_of(p_max, o_max) * 16)
    routing = full * (R - n) / R + workspace
    embeddings = 0.0
    if w.prompts is None:  # else the embedder's float32 [R, D], within `table`'s bound
        T = sum(int(c) for _, c in w.tasks)
        embeddings = D * 8 * max(CENTROID_ARRAYS * T, T + REQUEST_ARRAYS * R)
    # validation's per-block counts int64 [B] x3 and the guesses' row layers int16 [N]
    checks = blocks * 8 * 3 + rows * 2
    static = w.arrivals is None and float(w.arrival_ms) == 0.0
    return TraceSize(int(full), int(full - dropped),
                     int(max(routing - full, embeddings, checks)),
                     round(replay_accesses(model, R, p_mean, o_mean, batch if static else 1)),
                     int(blocks), R)


def file_size(arrays: dict, model, fields) -> TraceSize | None:
    """Sizes of a trace file from its declared arrays ({member: (shape, dtype)},
    core.trace_file.declared_arrays); None where the arrays the estimate reads are missing or
    misshapen (the reader names the field). Accesses are counted with every request alone
    (the file's arrivals are not read): the most any schedule gives."""
    shapes = {f: tuple(int(x) for x in s) for f, (s, _) in arrays.items()}
    nbytes = {f: math.prod(s) * arrays[f][1].itemsize for f, s in shapes.items()}
    if (len(shapes.get("prompt_len", ())) != 1 or len(shapes.get("block_offsets", ())) != 1
            or len(shapes.get("topk", ())) != 2):
        return None
    header = nbytes.get("header_json", 0)
    data = sum(b for f, b in nbytes.items() if f != "header_json")
    dropped = sum(nbytes.get(f, 0) for f in PROJECTABLE if f not in fields)
    R, blocks = shapes["prompt_len"][0], max(0, shapes["block_offsets"][0] - 1)
    rows = shapes["topk"][0]
    L, E, k = model.num_moe_layers, model.num_experts, model.top_k
    prompt, dec = _layer_tokens(model)
    decode_rows = min(rows, max(0, blocks // max(L, 1) - R) * sum(dec))  # one token each
    mean_prefill = (rows - decode_rows) / max(1, R * L)  # rows of a request's prefill block
    accesses = R * L * union_size(mean_prefill, E, k) + decode_rows * k
    objects = header * HEADER_OBJECT_FACTOR
    return TraceSize(data + header + objects, data - dropped + objects,
                     blocks * 8 * 3, round(accesses), blocks, R)
