"""Per-block expert unions of a trace, as python lists for the engine's hot path.

A block is one (global step, MoE layer) of a trace (docs/trace-format.md); its union is the
set of experts any of its tokens routed to, with the number of tokens per expert.
"""

from __future__ import annotations

import numpy as np

from core.trace import Trace


def linked_layers(stacks) -> np.ndarray:
    """bool [L]: MoE layer l has a next layer that the same token passes (same stack)."""
    return np.array([i + 1 < len(stacks) and stacks[i + 1] == stacks[i]
                     for i in range(len(stacks))], bool)


def row_layers(block_counts: np.ndarray, L: int) -> np.ndarray:
    """Layer of every trace row int64 [N] from the rows per (step, layer) block [S * L]."""
    return np.repeat(np.arange(len(block_counts)) % L, block_counts)


def next_layer_rows(block_counts: np.ndarray, stacks) -> tuple[np.ndarray, np.ndarray]:
    """(rows, nxt) int64: every trace row at a linked layer l and the same token's row at
    l + 1. Block (g, l + 1) holds the same tokens right after block (g, l)."""
    layer = row_layers(block_counts, len(stacks))
    rows = np.flatnonzero(linked_layers(stacks)[layer])
    return rows, rows + np.repeat(block_counts, block_counts)[rows]


def block_unions(trace, arr: np.ndarray | None = None) -> tuple[list[int], list[int], np.ndarray]:
    """Per trace block (global step * L + layer): ascending expert ids and token counts.

    `arr` defaults to trace.topk; ids >= E (the spec_topk sentinel) are dropped. Returns flat
    python lists of ids and counts plus bounds [n_blocks + 1] into them.
    """
    arr = trace.topk if arr is None else arr
    E = trace.num_experts
    W = E + 1  # one spare column per block for the sentinel id E
    n_blocks = len(trace.block_offsets) - 1
    ids_out, cnt_out, bounds = [], [], np.zeros(n_blocks + 1, dtype=np.int64)
    chunk = max(1, 4_000_000 // W)  # blocks per bincount, bounds memory
    for b0 in range(0, n_blocks, chunk):
        b1 = min(n_blocks, b0 + chunk)
        r0, r1 = trace.block_offsets[b0], trace.block_offsets[b1]
        block_of_row = np.repeat(np.arange(b1 - b0), np.diff(trace.block_offsets[b0:b1 + 1]))
        flat = (block_of_row[:, None] * W + np.minimum(arr[r0:r1], E).astype(np.int64)).ravel()
        counts = np.bincount(flat, minlength=(b1 - b0) * W).reshape(-1, W)[:, :E].ravel()
        nz = np.flatnonzero(counts)  # [blocks * E] positions with tokens
        bounds[b0 + 1:b1 + 1] = len(ids_out) + np.searchsorted(
            nz // E, np.arange(1, b1 - b0 + 1), side="left")
        ids_out.extend((nz % E).tolist())
        cnt_out.extend(counts[nz].tolist())
    return ids_out, cnt_out, bounds


def block_expert_counts(trace) -> np.ndarray:
    """Tokens per expert in every block (global step * L + layer): float32 [n_blocks, E].

    Dense, for warm-up passes over a calibration trace (the engine uses `block_unions`)."""
    n_blocks, E = len(trace.block_offsets) - 1, trace.num_experts
    block_of_row = np.repeat(np.arange(n_blocks), np.diff(trace.block_offsets))  # [N]
    flat = (block_of_row[:, None] * E + trace.topk.astype(np.int64)).ravel()  # [N * k]
    return np.bincount(flat, minlength=n_blocks * E).reshape(n_blocks, E).astype(np.float32)


class BlockIndex:
    """Per-block expert unions of a trace as python lists, for the engine's hot path."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.L = trace.num_layers
        self.step_off = trace.step_offsets.tolist()
        ids, cnts, bounds = block_unions(trace)
        self.ids, self.cnts, self.bounds = ids, cnts, bounds.tolist()
        self._spec = None

    def block(self, request: int, step: int, layer: int) -> int:
        return (self.step_off[request] + step) * self.L + layer

    def union(self, blocks: dict[int, int]) -> tuple[list[int], list[int], dict | None]:
        """Union over several blocks: (ascending ids, counts, first request per id)."""
        return _merge(self.ids, self.cnts, self.bounds, blocks, with_owner=True)

    def spec_union(self, blocks: dict[int, int]):
        if self.trace.spec_topk is None:
            return None
        if self._spec is None:
            ids, cnts, bounds = block_unions(self.trace, self.trace.spec_topk)
            self._spec = (ids, cnts, bounds.tolist())
        ids, cnts, bounds = self._spec
        return _merge(ids, cnts, bounds, blocks, with_owner=False)[:2]


def _merge(ids, cnts, bounds, blocks, with_owner):
    if len(blocks) == 1:
        (b,) = blocks.values()
        return ids[bounds[b]:bounds[b + 1]], cnts[bounds[b]:bounds[b + 1]], None
    acc: dict[int, int] = {}
    owner: dict[int, int] = {}
    for r, b in blocks.items():
        for e, c in zip(ids[bounds[b]:bounds[b + 1]], cnts[bounds[b]:bounds[b + 1]]):
            acc[e] = acc.get(e, 0) + c
            if with_owner and e not in owner:
                owner[e] = r
    experts = sorted(acc)
    return experts, [acc[e] for e in experts], owner if with_owner else None
