"""Next-layer guesses of synthetic traces (field `spec_topk`) made from the past only.

A real system guesses layer l+1's experts while layer l runs. It then knows this token's
routing at layer l (and before), the request's earlier tokens, and whatever it learned from
other traffic; not layer l+1's router output. The guess here uses exactly that:

- A transition table fitted once per seed on a dedicated split, `spec-fit` (FIT_REQUESTS
  prefill-heavy requests of FIT_PROMPT_LEN + FIT_OUTPUT_LEN tokens, never the measured or
  calibration requests): from every token's k experts at layer l and its k experts at l+1,
  counted over all k x k pairs, add-one smoothed: P(j at l+1 | i at l) and P(j at l+1).
- For a token at layer l, naive Bayes over its k layer-l experts i: score_j = log P(j) +
  sum_i [log P(j | i) - log P(j)] (nats), plus uniform noise of std `spec_noise_nats`
  (workload knob; 0 = none); the guess is the k largest scores, largest first, ties to the
  lower id. The table holds T[l][i, j] = log P(j | i) - log P(j) + log P(j) / k, so that
  score_j is the sum of the k rows.

Tried on another seed and not used (docs/routing.md): the request's own history (its experts
at l+1 in earlier steps) as an extra term, and layer l-1's experts; neither raised recall
once the table is well fitted. Without the log P(j) term recall is 0.004 higher with the
default coupling but below random (0.090) without it. Nothing here reads the generator's
scores or its cross-layer source map: the table is estimated from routed experts of other
requests, like any history-based predictor.

Portable (docs/trace-format.md): logs come from core.numerics.log and the table is stored
as integers (PMI_SCALE steps per nat), so the scores, noise and selection are integer
arithmetic; the
selection packs the id into the low bits of the key (distinct keys: the sorted order is
unique).
"""

from __future__ import annotations

import math

import numpy as np

from core import numerics
from core.blocks import linked_layers, next_layer_rows, row_layers

FIT_SPLIT = "spec-fit"
# 128 requests of 64 + 8 tokens (8,192 prompt tokens): recall within 0.001 of a table fitted
# on 4x as many tokens (docs/routing.md); many short requests beat few long ones, whose
# tokens share a request-level preference.
FIT_REQUESTS, FIT_PROMPT_LEN, FIT_OUTPUT_LEN = 128, 64, 8
PMI_SCALE = 256  # integer score steps per nat
MAX_NOISE_NATS = 32.0  # keeps noise * 2**16 in int32 (the knob's upper bound)
BLOCK_ROWS = 2048  # rows per pass: the [rows, E] keys stay in cache


def fit_table(topk: np.ndarray, block_counts: np.ndarray, stacks: tuple[str, ...],
              E: int) -> np.ndarray:
    """Score table int32 [L, E, E] (PMI_SCALE steps per nat; rows of unlinked layers 0) from a
    trace's topk [N, k] and rows per block [S * L]: the same token's experts at l and l+1."""
    L = len(stacks)
    layer = row_layers(block_counts, L)
    linked = linked_layers(stacks)
    rows, nxt = next_layer_rows(block_counts, stacks)  # the same token at l and l + 1
    at_l, at_next = topk[rows].astype(np.int64), topk[nxt].astype(np.int64)
    key = (layer[rows, None, None] * E + at_l[:, :, None]) * E + at_next[:, None, :]
    counts = np.bincount(key.ravel(), minlength=L * E * E).reshape(L, E, E).astype(np.float64)
    cond = (counts + 1) / (counts.sum(-1, keepdims=True) + E)  # P(j | i), add-one smoothed
    col = counts.sum(1)  # [L, E]: k x (tokens with j at l+1)
    marg = (col + 1) / (col.sum(-1, keepdims=True) + E)
    log_marg = numerics.log(marg)[:, None, :]
    score = numerics.log(cond) - log_marg + log_marg / topk.shape[1]
    table = np.rint(score * PMI_SCALE).astype(np.int32)
    table[~linked] = 0
    return table


def guess_rows(topk: np.ndarray, layer: np.ndarray, table: np.ndarray, linked: np.ndarray,
               noise_nats: float, rng: np.random.Generator | None) -> np.ndarray:
    """spec_topk [N, k] (topk's dtype): per row, the k largest of sum_i table[layer, i, :] over
    the row's own experts i (plus noise), largest first; E where the layer is not linked.
    `rng` draws the noise (uint16 per row and expert, row order) when noise_nats > 0."""
    N, k = topk.shape
    E = table.shape[-1]
    id_bits = max(1, (E - 1).bit_length())
    low = np.int32((1 << id_bits) - 1)
    # Keys: score << id_bits | (low - id), so ties go to the lower id and every key is
    # distinct. The table is shifted once; offset keeps scores >= 0 (keys sort as scores).
    flat = (table.reshape(-1, E) << id_bits).astype(np.int32)
    offset = k * max(0, -int(table.min()))
    tail = ((offset << id_bits) | (low - np.arange(E))).astype(np.int32)  # [E]
    # noise = floor(w * M / 2**16) for w uniform in [0, 2**16): uniform on [0, M), std
    # M / sqrt(12) score steps
    mult = int(round(noise_nats * PMI_SCALE * math.sqrt(12)))
    out = np.full((N, k), E, topk.dtype)
    for r0 in range(0, N, BLOCK_ROWS):
        ids = topk[r0:r0 + BLOCK_ROWS].astype(np.int64)
        base = layer[r0:r0 + BLOCK_ROWS] * E
        key = flat.take(base + ids[:, 0], axis=0)
        for i in range(1, k):
            key += flat.take(base + ids[:, i], axis=0)
        key += tail
        if mult:
            w = rng.bit_generator.random_raw(-(-key.size // 4)).view(np.uint16)
            noise = (w[:key.size].astype(np.int32) * np.int32(mult)) >> 16
            key += (noise << id_bits).reshape(key.shape)
        # a sort of distinct keys has one result (numpy's SIMD sort is faster than partition)
        top = np.sort(key, axis=1)[:, :-k - 1:-1]  # k largest, largest first
        guess = (low - (top & low)).astype(topk.dtype)
        ok = linked[layer[r0:r0 + BLOCK_ROWS]]
        out[r0:r0 + BLOCK_ROWS][ok] = guess[ok]
    return out
