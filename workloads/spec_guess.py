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
BLOCK_ROWS = 2048  # rows per pass (a multiple of 4): the [rows, E] keys stay in cache


def fit_table(topk: np.ndarray, block_counts: np.ndarray, stacks: tuple[str, ...],
              E: int) -> np.ndarray:
    """Score table int32 [L, E, E] (PMI_SCALE steps per nat; rows of unlinked layers 0) from a
    trace's topk [N, k] and rows per block [S * L]: the same token's experts at l and l+1."""
    L = len(stacks)
    layer = row_layers(block_counts, L)
    linked = linked_layers(stacks)
    rows, nxt = next_layer_rows(block_counts, stacks)  # the same token at l and l + 1
    counts = np.zeros(L * E * E, np.int64)  # pair counts, added block by block (exact)
    for r0 in range(0, len(rows), BLOCK_ROWS):
        r, x = rows[r0:r0 + BLOCK_ROWS], nxt[r0:r0 + BLOCK_ROWS]
        at_l = (layer[r, None] * E + topk[r]) * E  # [b, k] int64
        key = at_l[:, :, None] + topk[x][:, None, :]  # every (i at l, j at l + 1): [b, k, k]
        counts += np.bincount(key.ravel(), minlength=L * E * E)
    counts = counts.reshape(L, E, E).astype(np.float64)
    cond = (counts + 1) / (counts.sum(-1, keepdims=True) + E)  # P(j | i), add-one smoothed
    col = counts.sum(1)  # [L, E]: k x (tokens with j at l+1)
    marg = (col + 1) / (col.sum(-1, keepdims=True) + E)
    log_marg = numerics.log(marg)[:, None, :]
    score = numerics.log(cond) - log_marg + log_marg / topk.shape[1]
    table = np.rint(score * PMI_SCALE).astype(np.int32)
    table[~linked] = 0
    return table


def compact_row_layers(block_counts: np.ndarray, L: int) -> np.ndarray:
    """core.blocks.row_layers as int16 [N]: a quarter of its memory on a large trace."""
    return np.repeat((np.arange(len(block_counts)) % L).astype(np.int16), block_counts)


def guess_rows(topk: np.ndarray, layer: np.ndarray, table: np.ndarray, linked: np.ndarray,
               noise_nats: float, rng: np.random.Generator | None) -> np.ndarray:
    """spec_topk [N, k] (topk's dtype): per row, the k largest of sum_i table[layer, i, :] over
    the row's own experts i (plus noise), largest first; E where the layer is not linked.
    layer: any integer dtype [N]. `rng` draws the noise (uint16 per row and expert, row
    order) when noise_nats > 0."""
    N, k = topk.shape
    E = table.shape[-1]
    id_bits = max(1, (E - 1).bit_length())
    low = np.int32((1 << id_bits) - 1)
    # Keys: (score + offset) << id_bits | (low - id), so ties go to the lower id and every
    # key is distinct; offset keeps scores >= 0 (keys sort as scores). Scores are sums of k
    # table rows, exact in any integer type that holds them: int16 when it does (half the
    # bytes for the k row gathers), else int32.
    narrow = k * int(np.abs(table).max(initial=0)) < 2**15
    flat = table.reshape(-1, E).astype(np.int16 if narrow else np.int32)
    offset = k * max(0, -int(table.min(initial=0)))
    tail = ((offset << id_bits) | (low - np.arange(E))).astype(np.int32)  # [E]
    tail = np.tile(tail, BLOCK_ROWS)  # [rows * E]: one long add, not one per row
    # noise = floor(w * M / 2**16) for w uniform in [0, 2**16): uniform on [0, M), std
    # M / sqrt(12) score steps
    mult = int(round(noise_nats * PMI_SCALE * math.sqrt(12)))
    out = np.empty((N, k), topk.dtype)  # every row is written below
    score, part = (np.empty((BLOCK_ROWS, E), flat.dtype) for _ in range(2))
    key = np.empty((BLOCK_ROWS, E), np.int32)
    for r0 in range(0, N, BLOCK_ROWS):
        b = min(BLOCK_ROWS, N - r0)
        lay = layer[r0:r0 + b]
        at = lay.astype(np.intp)[:, None] * E + topk[r0:r0 + b]  # table rows [b, k]
        np.take(flat, at[:, 0], axis=0, out=score[:b], mode="clip")
        for i in range(1, k):
            score[:b] += np.take(flat, at[:, i], axis=0, out=part[:b], mode="clip")
        np.copyto(key[:b], score[:b])
        key[:b] <<= id_bits
        key.reshape(-1)[:b * E] += tail[:b * E]
        if mult:  # a block's draw: BLOCK_ROWS * E is a multiple of 4, so blocks chain
            w = rng.bit_generator.random_raw(-(-b * E // 4)).view(np.uint16)
            noise = (w[:b * E].astype(np.int32) * np.int32(mult)) >> 16
            key[:b] += (noise << id_bits).reshape(b, E)
        # a sort of distinct keys has one result (numpy's SIMD sort is faster than partition)
        key[:b].sort(axis=1)
        top = key[:b, :-k - 1:-1]  # k largest, largest first
        out[r0:r0 + b] = low - (top & low)
    out[~linked[layer]] = E  # no next layer: no guess
    return out
