"""The engine-order access sequence of a trace, the one future the oracle family reads.

One key (layer * num_experts + expert id) per access: iterations in the static schedule's
order (core/schedule.py), MoE layers ascending, then the ascending ids of the union of the
iteration's tokens at that layer (the engine's access set, docs/metrics.md). Blocks are the
non-empty (iteration, layer) steps in that order. It is the engine's sequence only when the
schedule does not depend on timing (`schedule_is_timing_independent`): max_batch = 1 or
every request arriving at once; `access_sequence` raises otherwise.

Shared by systems/oracle.py, systems/belady*.py, systems/evictors/belady.py and
analysis/gap.py, so the plan, the evictor and the counterfactual replays see one sequence.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from core.blocks import BlockIndex
from core.schedule import schedule_is_timing_independent, static_schedule

NEVER = 1 << 62  # the next use of a key that is not used again


class AccessSequence:
    """keys [n]; block_starts [B + 1] (first position of each block, then n); block_iteration,
    block_layer [B]; iteration_kinds, iteration_starts [I (+ 1)] (first position of iteration
    i, then n); next_use [n] (the next position of the same key, NEVER if none). Lists of
    python ints; the next-use chain comes from one stable sort of the keys."""

    def __init__(self, keys: list[int], blocks: list[tuple[int, int, int]],
                 iteration_kinds: list[str]):
        n_iterations = len(iteration_kinds)
        self.keys = keys
        self.iteration_kinds = iteration_kinds  # "prefill" or "decode" per iteration
        self.block_starts = [p for p, _, _ in blocks] + [len(keys)]
        self.block_iteration = [i for _, i, _ in blocks]
        self.block_layer = [layer for _, _, layer in blocks]
        self._block_at = {(i, layer): b for b, (_, i, layer) in enumerate(blocks)}
        starts, b = [], 0
        for i in range(n_iterations + 1):  # an iteration without a block starts where the next does
            while b < len(blocks) and blocks[b][1] < i:
                b += 1
            starts.append(self.block_starts[b])
        self.iteration_starts = starts
        # Positions grouped by key, ascending within a key [n]: the next use of the position
        # order[i] is order[i + 1] when both hold the same key.
        arr = np.asarray(keys, dtype=np.int64)
        self._order = np.argsort(arr, kind="stable")
        grouped = arr[self._order]
        nxt = np.full(len(keys), NEVER, dtype=np.int64)
        same = grouped[1:] == grouped[:-1]
        nxt[self._order[:-1][same]] = self._order[1:][same]
        self.next_use = nxt.tolist()
        self._grouped = grouped
        self._positions: dict[int, list[int]] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.block_iteration)

    def block_at(self, iteration: int, layer: int) -> int | None:
        """The block of (iteration, layer), None when that step routed to no expert."""
        return self._block_at.get((iteration, layer))

    def block_keys(self, b: int) -> list[int]:
        return self.keys[self.block_starts[b]:self.block_starts[b + 1]]

    def next_at(self, key: int, pos: int) -> int:
        """The first position >= pos that accesses `key`, NEVER if none."""
        if self._positions is None:  # built on first use: only some readers ask
            cuts = np.flatnonzero(np.diff(self._grouped)) + 1
            groups = np.split(self._order, cuts)
            firsts = self._grouped[np.concatenate(([0], cuts))] if len(self._grouped) else []
            self._positions = {int(k): g.tolist() for k, g in zip(firsts, groups)}
        occ = self._positions.get(key)
        if not occ:
            return NEVER
        i = bisect_left(occ, pos)
        return occ[i] if i < len(occ) else NEVER

    def blocks(self):
        """(block, iteration, layer, keys) in order."""
        for b in range(self.num_blocks):
            yield b, self.block_iteration[b], self.block_layer[b], self.block_keys(b)


def access_sequence(trace, max_batch: int) -> AccessSequence:
    """The trace's access sequence at `max_batch` (ValueError when timing changes the
    schedule, so no offline sequence is the engine's)."""
    if not schedule_is_timing_independent(trace.arrival_ms, max_batch):
        raise ValueError("the oracle family needs a schedule that does not depend on timing: "
                         "max_batch = 1 or every request arriving at the same time")
    index = BlockIndex.of(trace)
    schedule = static_schedule(trace.arrival_ms, trace.output_len, max_batch)
    kinds = [kind for kind, _ in schedule]
    if all(len(members) == 1 for _, members in schedule):
        keys, blocks = _single_member(index, schedule, trace.num_experts)
    else:
        keys, blocks = _merged(index, schedule, trace.num_experts)
    return AccessSequence(keys, blocks, kinds)


def _single_member(index: BlockIndex, schedule, E: int):
    """One request per iteration (batch 1): the blocks' unions in schedule order, gathered
    at once. Returns keys and (first position, iteration, layer) per non-empty block."""
    L = index.L
    steps = np.array([index.step_off[r] + s for _, ((r, s),) in schedule], dtype=np.int64)
    blk = (steps[:, None] * L + np.arange(L)).ravel()  # [I * L] blocks in engine order
    lo, hi = index.bounds_array[blk], index.bounds_array[blk + 1]
    keep = hi > lo
    blk, lo, lens = blk[keep], lo[keep], (hi - lo)[keep]
    starts = np.concatenate(([0], np.cumsum(lens)))  # [B + 1] first position of each block
    rows = np.repeat(lo - starts[:-1], lens) + np.arange(starts[-1])  # [n] union rows
    layer = blk % L
    keys = np.repeat(layer, lens) * E + index.ids_array[rows]
    iteration = np.flatnonzero(keep) // L
    return keys.tolist(), list(zip(starts[:-1].tolist(), iteration.tolist(), layer.tolist()))


def _merged(index: BlockIndex, schedule, E: int):
    """Several requests per iteration: the union of their blocks per layer, in python."""
    keys: list[int] = []
    blocks: list[tuple[int, int, int]] = []  # (first position, iteration, layer)
    for it, (_, members) in enumerate(schedule):
        for layer in range(index.L):
            union, _, _ = index.union({r: index.block(r, s, layer) for r, s in members})
            if union:
                blocks.append((len(keys), it, layer))
                keys.extend(layer * E + e for e in union)
    return keys, blocks
