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

from core.blocks import BlockIndex
from core.schedule import schedule_is_timing_independent, static_schedule

NEVER = 1 << 62  # the next use of a key that is not used again


class AccessSequence:
    """keys [n]; block_starts [B + 1] (first position of each block, then n); block_iteration,
    block_layer [B]; iteration_kinds, iteration_starts [I (+ 1)] (first position of iteration
    i, then n); next_use [n] (the next position of the same key, NEVER if none)."""

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
        self.next_use = [NEVER] * len(keys)
        self._positions: dict[int, list[int]] = {}
        for p, key in enumerate(keys):
            occ = self._positions.setdefault(key, [])
            if occ:
                self.next_use[occ[-1]] = p
            occ.append(p)

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
    index = BlockIndex(trace)
    L, E = trace.num_layers, trace.num_experts
    keys: list[int] = []
    blocks: list[tuple[int, int, int]] = []  # (first position, iteration, layer)
    schedule = static_schedule(trace.arrival_ms, trace.output_len, max_batch)
    for it, (_, members) in enumerate(schedule):
        for layer in range(L):
            union, _, _ = index.union({r: index.block(r, s, layer) for r, s in members})
            if union:
                blocks.append((len(keys), it, layer))
                keys.extend(layer * E + e for e in union)
    return AccessSequence(keys, blocks, [kind for kind, _ in schedule])
