"""Per-block expert unions of a trace, as flat arrays for the engine's hot path.

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


def block_unions(trace, arr: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """Per trace block (global step * L + layer): ascending expert ids and token counts.

    `arr` defaults to trace.topk; ids >= E (the spec_topk sentinel) are dropped. Returns flat
    arrays of ids (uint16) and counts (int32) plus bounds int64 [n_blocks + 1] into them.
    """
    arr = trace.topk if arr is None else arr
    E = trace.num_experts
    W = E + 1  # one spare column per block for the sentinel id E
    n_blocks = len(trace.block_offsets) - 1
    # Union entries are at most min(rows * k, blocks * E); the outputs are allocated at that
    # bound, written at the front and shrunk in place at the end (pages never written are
    # never resident, and a chunk list plus its concatenation would hold everything twice).
    bound = min(arr.size, n_blocks * E)
    ids_out, cnt_out = np.empty(bound, np.uint16), np.empty(bound, np.int32)
    bounds = np.zeros(n_blocks + 1, dtype=np.int64)
    # Blocks per bincount: at most 2**18 / W blocks and 2**18 / k rows (one prefill block
    # can hold thousands of rows), so the int64 temporaries stay near 2 MB each.
    max_blocks, max_rows = max(1, (1 << 18) // W), max(1, (1 << 18) // max(arr.shape[1], 1))
    offsets = trace.block_offsets
    done, b0 = 0, 0
    while b0 < n_blocks:
        b1 = min(n_blocks, b0 + max_blocks,
                 max(b0 + 1, int(np.searchsorted(offsets, offsets[b0] + max_rows, "right")) - 1))
        r0, r1 = offsets[b0], offsets[b1]
        block_of_row = np.repeat(np.arange(b1 - b0), np.diff(trace.block_offsets[b0:b1 + 1]))
        flat = (block_of_row[:, None] * W + np.minimum(arr[r0:r1], E).astype(np.int64)).ravel()
        counts = np.bincount(flat, minlength=(b1 - b0) * W).reshape(-1, W)[:, :E].ravel()
        nz = np.flatnonzero(counts)  # [blocks * E] positions with tokens
        bounds[b0 + 1:b1 + 1] = done + np.searchsorted(
            nz // E, np.arange(1, b1 - b0 + 1), side="left")
        ids_out[done:done + len(nz)] = nz % E
        cnt_out[done:done + len(nz)] = counts[nz]
        done += len(nz)
        b0 = b1
    ids_out.resize(done, refcheck=False)  # realloc: shrinks in place
    cnt_out.resize(done, refcheck=False)
    return ids_out, cnt_out, bounds


def block_expert_counts(trace) -> np.ndarray:
    """Tokens per expert in every block (global step * L + layer): float32 [n_blocks, E].

    Dense, for warm-up passes over a calibration trace (the engine uses `block_unions`):
    its unions scattered into the rows, never an [N * k] index of every token's choice."""
    n_blocks, E = len(trace.block_offsets) - 1, trace.num_experts
    ids, counts, bounds = block_unions(trace)
    out = np.zeros((n_blocks, E), np.float32)
    block = np.repeat(np.arange(n_blocks), np.diff(bounds))  # [entries]
    out.reshape(-1)[block * E + ids] = counts  # integers: exact in float32
    return out


class BlockIndex:
    """Per-block expert unions of a trace for the engine: flat arrays of ids (uint16) and
    counts (int32), bounds int64 [n_blocks + 1]; the python accessors return lists."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.L = trace.num_layers
        self.step_off_array = np.ascontiguousarray(trace.step_offsets, dtype=np.int64)
        self.step_off = self.step_off_array.tolist()
        self.ids_array, self.cnts_array, self.bounds_array = block_unions(trace)
        self._spec = None

    @classmethod
    def of(cls, trace: Trace) -> BlockIndex:
        """The trace's index, built once and kept on the trace (the engine, the oracle family
        and the compute floor read the same one)."""
        index = trace.__dict__.get("_block_index")
        if index is None:
            index = trace.__dict__["_block_index"] = cls(trace)
        return index

    @staticmethod
    def forget(trace: Trace) -> None:
        """Drop the index kept on the trace: the next `of` builds it again (a benchmark that
        times several runs of one trace counts the index in each)."""
        trace.__dict__.pop("_block_index", None)

    def block(self, request: int, step: int, layer: int) -> int:
        return (self.step_off[request] + step) * self.L + layer

    def block_lists(self, b: int) -> tuple[list[int], list[int]]:
        """(ascending ids, tokens each) of block b, as python lists."""
        b0, b1 = self.bounds_array[b:b + 2].tolist()
        return self.ids_array[b0:b1].tolist(), self.cnts_array[b0:b1].tolist()

    def union(self, blocks: dict[int, int]) -> tuple[list[int], list[int], dict | None]:
        """Union over several blocks: (ascending ids, counts, first request per id)."""
        return _merge(self.ids_array, self.cnts_array, self.bounds_array, blocks,
                      with_owner=True)

    def spec_union(self, blocks: dict[int, int]):
        if self.trace.spec_topk is None:
            return None
        if self._spec is None:  # read in python only: the narrowest dtypes that hold it
            ids, cnts, bounds = block_unions(self.trace, self.trace.spec_topk)
            self._spec = (ids.astype(np.uint8) if self.trace.num_experts <= 256 else ids,
                          cnts.astype(np.uint16) if cnts.max(initial=0) < 2**16 else cnts,
                          bounds)
        ids, cnts, bounds = self._spec
        return _merge(ids, cnts, bounds, blocks, with_owner=False)[:2]


def _merge(ids: np.ndarray, cnts: np.ndarray, bounds: np.ndarray, blocks: dict[int, int],
           with_owner: bool):
    """Union of `blocks` (request -> block, in member order): ascending ids, summed counts
    and, with_owner, the first request (in member order) per id."""
    if len(blocks) == 1:
        (b,) = blocks.values()
        b0, b1 = bounds[b:b + 2].tolist()
        return ids[b0:b1].tolist(), cnts[b0:b1].tolist(), None
    spans = bounds[np.fromiter(blocks.values(), np.int64, len(blocks))[:, None] + [0, 1]]
    lens = spans[:, 1] - spans[:, 0]  # [members] union entries per block
    rows = np.repeat(spans[:, 0] - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
    got = ids[rows]  # [entries] in member order
    acc = np.bincount(got, weights=cnts[rows], minlength=1)  # exact: integer sums < 2**53
    experts = np.flatnonzero(acc)
    counts = acc[experts].astype(np.int64).tolist()
    if not with_owner:
        return experts.tolist(), counts, None
    _, first = np.unique(got, return_index=True)  # first entry per id, ids ascending
    owners = np.repeat(np.fromiter(blocks.keys(), np.int64, len(blocks)), lens)[first]
    return experts.tolist(), counts, dict(zip(experts.tolist(), owners.tolist()))
